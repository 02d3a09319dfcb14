#pragma once
// A ResourceClaim as the ComputeDomain controller's workload template makes it, already
// allocated by the scheduler to the `channel-0` device of `node`'s pool: what the DRA plugin's
// tests and benchmark seed into the simulated API server before the kubelet prepares it.

#include <nlohmann/json.hpp>

#include <string>

namespace gns::sim {

inline nlohmann::json AllocatedChannelClaim(const std::string& ns, const std::string& name, const std::string& node,
                                            const nlohmann::json& parameters,
                                            const std::string& driver = "compute-domain.nvidia.com") {
  using nlohmann::json;
  return json{
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", name}, {"namespace", ns}}},
      {"spec",
       {{"devices",
         {{"requests",
           json::array({{{"name", "channel"},
                         {"exactly", {{"deviceClassName", "compute-domain-default-channel.nvidia.com"}}}}})}}}}},
      {"status",
       {{"allocation",
         {{"devices",
           {{"results", json::array({{{"request", "channel"},
                                      {"driver", driver},
                                      {"pool", node},
                                      {"device", "channel-0"}}})},
            {"config", json::array({{{"source", "FromClaim"},
                                     {"requests", json::array({"channel"})},
                                     {"opaque", {{"driver", driver}, {"parameters", parameters}}}}})}}}}}}}};
}

}  // namespace gns::sim
