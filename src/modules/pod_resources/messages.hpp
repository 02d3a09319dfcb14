#pragma once
// Bus messages of the `pod-resources` module: which pods hold which GPUs on this node, as the
// kubelet's PodResourcesLister reports it (retained, shown in /debug/state). Consumers (gpu-reset:
// "which pods hold GPU X"; gpu-health: name the pods an unhealthy GPU hits) read the latest map
// with `bus.Latest<GpuPodMap>()` and `Holders(uuid)`.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gns::pod_resources {

// One container of one pod holding a device.
struct PodContainerRef {
  std::string namespace_name;
  std::string name;
  std::string uid;  // from the API (the node's pod informer); "" while the API has not shown the pod
  std::string container;
  std::string resource;  // "nvidia.com/gpu"
  bool operator==(const PodContainerRef&) const = default;
};

// A DRA claim prepared for a container (PodResources `dynamic_resources`).
struct PodClaimRef {
  std::string namespace_name;  // the pod's
  std::string name;
  std::string container;
  std::string claim;  // "claimNamespace/claimName"
  std::string driver;
  std::vector<std::string> devices;  // "pool/device"
  bool operator==(const PodClaimRef&) const = default;
};

struct GpuPodMap {
  static constexpr std::string_view kTopic = "pod-resources.gpu-pods";
  static constexpr bool kRetained = true;

  // True once a List answered; the map is then the kubelet's answer of `listed_at_ms`. While
  // false (socket absent, kubelet down) the map is empty or the last good one, and `error` says
  // why: a consumer that must not act on a stale map (gpu-reset) checks `fresh`.
  bool listed = false;
  bool fresh = false;  // the last List call succeeded
  std::string error;   // the last List failure; "" when fresh
  int64_t listed_at_ms = 0;  // wall-clock milliseconds of the last successful List
  uint64_t lists = 0;        // successful List calls since start
  std::size_t allocatable = 0;  // devices of our resources in GetAllocatableResources
  // GPU UUID -> every container holding it (sorted by namespace, name, container).
  std::map<std::string, std::vector<PodContainerRef>> gpus;
  std::vector<PodClaimRef> claims;

  // The holders of `uuid`; empty when none (or the map is not listed yet).
  const std::vector<PodContainerRef>& Holders(std::string_view uuid) const {
    static const std::vector<PodContainerRef> kNone;
    const auto it = gpus.find(std::string(uuid));
    return it == gpus.end() ? kNone : it->second;
  }
  bool operator==(const GpuPodMap&) const = default;
};

// One Allocate the kubelet made (an event): the devices now belong to a container being admitted.
// pod-resources re-lists the kubelet's PodResourcesLister on it. The device plugin publishes it;
// it is declared here, beside the map it refreshes, so pod-resources needs nothing of the device
// plugin (whose health comes from gpu-health, which reads this module's GpuPodMap): no loop.
// The topic keeps its name.
struct DevicesAllocated {
  static constexpr std::string_view kTopic = "device-plugin.allocated";
  std::string resource_name;
  std::vector<std::string> device_ids;  // every container's, in request order
};

inline void to_json(nlohmann::json& j, const PodContainerRef& r) {
  j = nlohmann::json{{"namespace", r.namespace_name}, {"name", r.name},           {"uid", r.uid},
                     {"container", r.container},      {"resource", r.resource}};
}

inline void to_json(nlohmann::json& j, const PodClaimRef& r) {
  j = nlohmann::json{{"namespace", r.namespace_name}, {"name", r.name},     {"container", r.container},
                     {"claim", r.claim},              {"driver", r.driver}, {"devices", r.devices}};
}

inline void to_json(nlohmann::json& j, const GpuPodMap& m) {
  j = nlohmann::json{{"listed", m.listed}, {"fresh", m.fresh},
                     {"error", m.error},   {"listedAtMs", m.listed_at_ms},
                     {"lists", m.lists},   {"allocatable", m.allocatable},
                     {"gpus", m.gpus},     {"dynamicResources", m.claims}};
}

}  // namespace gns::pod_resources
