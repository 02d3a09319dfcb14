#pragma once
// The pure core of `pod-resources`: read a PodResourcesLister.List answer (checking what a
// kubelet may get wrong), build the GPU -> pods map, the `dgxc.nvidia.com/devices` annotation
// each pod should carry (NVSentinel's metadata-collector format, read by its node-drainer), and
// the annotation writes that bring the node's pods there. No I/O; unit-tested on its own.

#include "modules/dra_gpu/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/pod_resources/messages.hpp"
#include "podresources/v1/api.pb.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gns::pod_resources {

// The annotation NVSentinel's node-drainer reads: {"devices":{"<resource>":["GPU-…",…]}}.
inline constexpr std::string_view kDevicesAnnotation = "dgxc.nvidia.com/devices";

struct HeldDevice {
  std::string container;
  std::string resource;
  std::string id;
};

struct PodView {
  std::string namespace_name;
  std::string name;
  std::vector<HeldDevice> devices;  // only our resources, only usable IDs
  std::vector<PodClaimRef> claims;
  std::string Key() const { return namespace_name + "/" + name; }
};

struct ListView {
  std::vector<PodView> pods;  // sorted by key, one per pod
  // Each thing in the answer that was left out, and why (for the log and a counter).
  std::vector<std::string> problems;
};

// Time-slicing replicas of one device are listed as "<device id>::<n>" (the device plugin's
// IDs, ours and NVIDIA's). The device a listed ID stands for: the part before "::<digits>", or
// the ID itself.
inline constexpr std::string_view kReplicaSeparator = "::";
std::string_view PhysicalDeviceId(std::string_view id);

// Whether a device ID names a device of this node; empty: every non-empty ID is accepted.
using KnownDevice = std::function<bool(std::string_view id)>;

// Whether `name` is one of `resources`: equal to an entry, or starting with an entry's text
// before its final '*' ("nvidia.com/mig-*": every MIG profile the device plugin advertises).
bool IsOurResource(const std::set<std::string>& resources, std::string_view name);

// `resources`: the resource names whose devices are GPUs (nvidia.com/gpu); others are ignored.
ListView ReadList(const v1::ListPodResourcesResponse& response, const std::set<std::string>& resources,
                  const KnownDevice& known);

// How many devices of `resources` the kubelet can allocate (GetAllocatableResources).
std::size_t CountAllocatable(const v1::AllocatableResourcesResponse& response, const std::set<std::string>& resources);

// "ns/name" -> the annotation value, for every pod that holds at least one device.
std::map<std::string, std::string> DesiredAnnotations(const ListView& view);
// {"devices":{resource:[ids sorted]}} as compact JSON.
std::string AnnotationValue(const std::map<std::string, std::set<std::string>>& by_resource);
// True when both are the same JSON document (a value written by another writer with other
// spacing or order counts as the same).
bool SameAnnotation(const std::string& a, const std::string& b);

// The pod's UID as the API knows it ("" if unknown).
using UidLookup = std::function<std::string(const std::string& namespace_name, const std::string& name)>;
std::map<std::string, std::vector<PodContainerRef>> BuildGpuMap(const ListView& view, const UidLookup& uid);
std::vector<PodClaimRef> AllClaims(const ListView& view);

// ---------------------------------------------------------------- holders other than by GPU ID
// gpu-reset asks who holds a GPU: the containers under the GPU's own ID (BuildGpuMap), and those
// on its MIG devices or with a DRA claim on it, which the map holds under other names.

// The DRA driver whose devices are GPUs (dra-gpu here; NVIDIA's GPU kubelet plugin upstream).
// compute-domain.nvidia.com's channels are no GPU: its claims hold none.
inline constexpr std::string_view kGpuDraDriver = "gpu.nvidia.com";

// A gpu.nvidia.com device name is read with dra-gpu's own parser (dra_gpu::ParseDeviceName, its
// messages.hpp): "gpu-<minor>" or "gpu-<minor>-mig-<giProfileId>-<start>-<size>", by minor, not
// the NVML index (upstream names by minor). Any other name cannot be placed on a GPU. A MIG
// device's name carries its placement, not its UUID: the MIG device is the inventory's MIG
// device at that place on that GPU (GpuTopology::mig_by_place).

// The node's GPUs as gpu-inventory shows them, to tell which GPU a device is on.
struct GpuTopology {
  bool known = false;                                  // an inventory was published
  std::map<uint32_t, std::string> uuid_by_minor;       // minor -> GPU UUID
  std::map<std::string, std::string> parent_of_mig;    // MIG UUID -> its GPU's UUID
  // A MIG device by its place, as a gpu.nvidia.com name carries it (parent minor, GPU instance
  // profile id, placement start and size; `mig` set) -> its MIG UUID. Only MIG devices whose
  // placement gpu-inventory read; of several compute instances of one GPU instance the first,
  // the one dra-gpu offers under that name.
  std::map<dra_gpu::DeviceNameParts, std::string> mig_by_place;
  bool operator==(const GpuTopology&) const = default;

  // Adds one GPU and its MIG devices as gpu-inventory reports them.
  void Add(const gpu_inventory::GpuInfo& gpu);
};

// A gpu.nvidia.com claim dra-gpu has prepared on this node (its DraGpuState).
struct PreparedGpuClaim {
  std::string claim;                 // "namespace/name"
  std::vector<std::string> devices;  // device names: gpu-<minor>[-…]
  bool operator==(const PreparedGpuClaim&) const = default;
};

struct IndirectHolders {
  std::map<std::string, std::vector<PodContainerRef>> via;  // GpuPodMap::via
  std::map<std::string, std::vector<OtherHolder>> pending;  // GpuPodMap::pending
  std::vector<OtherHolder> unplaced;                        // GpuPodMap::unplaced
};

// `gpus`: BuildGpuMap's; `claims`: the listed claims (AllClaims); `prepared`: dra-gpu's prepared
// claims, each counted as pending on its GPUs while no listed pod shows it (the kubelet records a
// claim for its pod after the prepare returns, and pod-resources lists again on dra-gpu's change:
// between the two only dra-gpu knows the GPU is taken). A claim on a MIG device holds its GPU and
// that MIG device (`via` / `pending` under the MIG UUID too); one whose placement is no MIG
// device of that GPU in the inventory (a layout changed under a claim) may hold any of them: it
// is pending on each.
IndirectHolders BuildIndirectHolders(const std::map<std::string, std::vector<PodContainerRef>>& gpus,
                                     const std::vector<PodClaimRef>& claims,
                                     const std::vector<PreparedGpuClaim>& prepared, const GpuTopology& topology,
                                     const UidLookup& uid);

// A pod of this node as the API (the informer cache, plus our own acknowledged writes) shows it.
struct PodAnnotationState {
  std::string namespace_name;
  std::string name;
  std::string uid;
  std::optional<std::string> current;  // the annotation's value; nullopt: absent
};

struct AnnotationWrite {
  std::string namespace_name;
  std::string name;
  std::string uid;
  std::optional<std::string> value;  // nullopt: remove the annotation
  std::string Key() const { return namespace_name + "/" + name; }
};

// The writes that make every pod in `pods` (keyed "ns/name") carry `desired`'s value, and no
// pod outside `desired` carry the annotation. Pods the kubelet reports but the API does not
// show yet are left for later (their informer event triggers another plan).
std::vector<AnnotationWrite> PlanAnnotationWrites(const std::map<std::string, std::string>& desired,
                                                  const std::map<std::string, PodAnnotationState>& pods);

// The JSON merge patch for one write: sets or removes (null) the annotation; carries the UID
// (when known) so a pod recreated under the same name is never patched by mistake.
nlohmann::json AnnotationPatch(const AnnotationWrite& write);

}  // namespace gns::pod_resources
