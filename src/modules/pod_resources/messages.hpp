#pragma once
// Bus messages of the `pod-resources` module: which pods hold which GPUs on this node, as the
// kubelet's PodResourcesLister reports it (retained, shown in /debug/state). Consumers (gpu-reset:
// "which pods hold GPU X"; gpu-health: name the pods an unhealthy GPU hits) read the latest map
// with `bus.Latest<GpuPodMap>()` and `Holders(uuid)`; gpu-reset also counts `OtherHolders(uuid)`.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
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
  std::string resource;  // "nvidia.com/gpu"; a DRA claim's driver ("gpu.nvidia.com")
  // How it holds a GPU other than by the GPU's own ID (only in GpuPodMap::via): the DRA claim
  // ("claimNamespace/claimName") and/or the device it holds on that GPU (a MIG UUID, or the
  // claim's "pool/device").
  std::string claim = {};
  std::string device = {};
  bool operator==(const PodContainerRef&) const = default;
};

// A holder of a GPU that is not a container the kubelet lists on it: a gpu.nvidia.com claim
// dra-gpu has prepared whose pod the kubelet's List does not show yet, or a device whose GPU
// cannot be told (no inventory yet, a gpu.nvidia.com device not named as dra-gpu names them, a minor
// that is not this node's). No pod is known to be on that GPU through it, so gpu-reset waits for
// it or fails on it, and never evicts because of it.
struct OtherHolder {
  std::string pod;     // "namespace/name" when a listed pod holds it; "" otherwise
  std::string claim;   // "claimNamespace/claimName" of a DRA claim; "" for a device-plugin device
  std::string device;  // as named where it was seen: "pool/gpu-3", "gpu-3", "MIG-…"
  std::string why;
  bool operator==(const OtherHolder&) const = default;
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
  // Device-plugin device ID (GPU UUID or MIG UUID; a time-slicing replica under its device) ->
  // every container holding it (sorted by namespace, name, container).
  std::map<std::string, std::vector<PodContainerRef>> gpus;
  std::vector<PodClaimRef> claims;
  // GPU UUID -> the containers holding it other than under its own ID in `gpus`: through one of
  // its MIG devices (`device` the MIG UUID), or through a gpu.nvidia.com DRA claim on the GPU or
  // on a MIG device of it (`resource` the driver, `claim` and `device` set). A reset of a GPU
  // resets every MIG device on it, so all of these hold it. MIG UUID -> the gpu.nvidia.com
  // claims on that MIG device (its name carries its placement: matched with the inventory's).
  std::map<std::string, std::vector<PodContainerRef>> via;
  // GPU or MIG UUID -> gpu.nvidia.com claims dra-gpu has prepared on it that no listed pod shows
  // yet; for a MIG UUID also a claim on a MIG device of its GPU whose placement matches no MIG
  // device of the inventory (it may be this one).
  std::map<std::string, std::vector<OtherHolder>> pending;
  // Holders whose GPU cannot be told: each may hold any GPU of the node.
  std::vector<OtherHolder> unplaced;

  // The containers holding `uuid` (a GPU's or a MIG device's): by its own ID, through its MIG
  // devices and through DRA claims on it or, for a GPU, on its MIG devices (sorted, each once);
  // empty when none (or the map is not listed yet).
  std::vector<PodContainerRef> Holders(std::string_view uuid) const {
    std::vector<PodContainerRef> out;
    for (const auto* by : {&gpus, &via}) {
      if (const auto it = by->find(std::string(uuid)); it != by->end()) out.insert(out.end(), it->second.begin(), it->second.end());
    }
    const auto key = [](const PodContainerRef& r) {
      return std::tie(r.namespace_name, r.name, r.container, r.resource, r.claim, r.device, r.uid);
    };
    std::sort(out.begin(), out.end(), [&](const PodContainerRef& a, const PodContainerRef& b) { return key(a) < key(b); });
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  // What else may hold `uuid`: claims prepared on it without a listed pod, and every holder
  // whose GPU cannot be told.
  std::vector<OtherHolder> OtherHolders(std::string_view uuid) const {
    std::vector<OtherHolder> out;
    if (const auto it = pending.find(std::string(uuid)); it != pending.end()) out = it->second;
    out.insert(out.end(), unplaced.begin(), unplaced.end());
    return out;
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
  if (!r.claim.empty()) j["claim"] = r.claim;
  if (!r.device.empty()) j["device"] = r.device;
}

inline void to_json(nlohmann::json& j, const OtherHolder& h) {
  j = nlohmann::json{{"pod", h.pod}, {"claim", h.claim}, {"device", h.device}, {"why", h.why}};
}

inline void to_json(nlohmann::json& j, const PodClaimRef& r) {
  j = nlohmann::json{{"namespace", r.namespace_name}, {"name", r.name},     {"container", r.container},
                     {"claim", r.claim},              {"driver", r.driver}, {"devices", r.devices}};
}

inline void to_json(nlohmann::json& j, const GpuPodMap& m) {
  j = nlohmann::json{{"listed", m.listed}, {"fresh", m.fresh},
                     {"error", m.error},   {"listedAtMs", m.listed_at_ms},
                     {"lists", m.lists},   {"allocatable", m.allocatable},
                     {"gpus", m.gpus},     {"dynamicResources", m.claims},
                     {"via", m.via},       {"pending", m.pending},
                     {"unplaced", m.unplaced}};
}

}  // namespace gns::pod_resources
