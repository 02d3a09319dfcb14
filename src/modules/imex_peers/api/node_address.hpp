// A Node's address as imex-peers writes it into the peers file: shared with the `preflight`
// subcommand, which checks the same addresses from the CLI.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gns::imex_peers {

// A Node's first address of `type` (InternalIP, Hostname) from status.addresses; "" if none.
inline std::string NodeAddressOf(const nlohmann::json& node, const std::string& type) {
  const auto list = node.value("/status/addresses"_json_pointer, nlohmann::json::array());
  for (const auto& a : list.is_array() ? list : nlohmann::json::array()) {
    if (a.is_object() && a.value("type", "") == type && a.contains("address") && a["address"].is_string()) {
      return a["address"].get<std::string>();
    }
  }
  return {};
}

}  // namespace gns::imex_peers
