// Clique derivation from fabric info.
#include "modules/gpu_inventory/clique.hpp"

#include <cstdio>
#include <map>
#include <utility>

namespace gns::gpu_inventory {

std::string FormatClusterUuid(const unsigned char* bytes, std::size_t size) {
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < size; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", bytes[i]);
    out += hex;
  }
  return out;
}

namespace {

constexpr std::string_view kZeroCluster = "all-zero cluster UUID";

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::string_view FabricStateName(uint32_t state) {
  switch (state) {
    case 0: return "not supported";
    case 1: return "not started";
    case 2: return "in progress";
    case 3: return "completed";
    default: return "unknown state";
  }
}

}  // namespace

NodeClique ComputeClique(const std::vector<GpuInfo>& gpus, const std::vector<std::string>& fabric_errors) {
  NodeClique clique;
  if (!fabric_errors.empty()) {
    clique.reason = "fabric info unreadable: " + JoinNames(fabric_errors);
    return clique;
  }
  if (gpus.empty()) {
    clique.reason = "no GPUs";
    return clique;
  }

  // "<cluster>.<clique>" → the GPUs that report it, in index order.
  std::map<std::string, std::vector<std::string>> groups;
  // Why each non-attached GPU does not count, for the reason text.
  std::map<std::string, std::vector<std::string>> not_attached;
  for (const auto& gpu : gpus) {
    if (!gpu.fabric) {
      not_attached["no fabric support"].push_back(gpu.uuid);
    } else if (!gpu.fabric->Attached()) {
      std::string why = "fabric " + std::string(FabricStateName(gpu.fabric->state));
      if (gpu.fabric->state == 3) why += " with status " + std::to_string(gpu.fabric->status);
      not_attached[why].push_back(gpu.uuid);
    } else if (gpu.fabric->ZeroClusterUuid()) {
      not_attached[std::string(kZeroCluster)].push_back(gpu.uuid);
    } else {
      groups[gpu.fabric->cluster_uuid + "." + std::to_string(gpu.fabric->clique_id)].push_back(gpu.uuid);
    }
  }

  if (groups.empty()) {
    if (not_attached.size() == 1 && not_attached.begin()->first == kZeroCluster) {
      clique.reason = "no multi-node NVLink: the fabric reports an all-zero cluster UUID on every GPU (" +
                      std::to_string(gpus.size()) + " of " + std::to_string(gpus.size()) +
                      "), as on an NVSwitch node without multi-node NVLink; such a node is in no clique";
      return clique;
    }
    clique.reason = "no fabric-attached GPU (";
    bool first = true;
    for (const auto& [why, uuids] : not_attached) {
      if (!first) clique.reason += "; ";
      first = false;
      clique.reason += why + ": " + std::to_string(uuids.size()) + " of " + std::to_string(gpus.size());
    }
    clique.reason += ")";
    return clique;
  }
  if (groups.size() > 1) {
    clique.reason = "fabric-attached GPUs disagree on the clique:";
    for (const auto& [id, uuids] : groups) clique.reason += " " + id + " (" + JoinNames(uuids) + ");";
    clique.reason.pop_back();
    return clique;
  }
  clique.clique_id = groups.begin()->first;
  return clique;
}

}  // namespace gns::gpu_inventory
