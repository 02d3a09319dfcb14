#pragma once
// Which extended resources the plugin registers and which device IDs each advertises, from the
// GPU inventory, the MIG strategy and the time-slicing settings (pure: no gRPC, no loop).
//
// MIG strategies (NVIDIA k8s-device-plugin's names and rules):
//   none   every GPU is one `nvidia.com/gpu` device, MIG mode or not;
//   single every GPU must have MIG enabled with MIG devices of one profile; they are the
//          `nvidia.com/gpu` devices (any other layout is an error: nothing is advertised);
//   mixed  GPUs without MIG are `nvidia.com/gpu`; MIG devices are `nvidia.com/mig-<profile>`,
//          one resource (one registration, one socket) per profile.
// Sharing (time-slicing or MPS, one of them): a resource listed with `replicas: N` advertises N
// devices per physical device, with IDs `<id>::<n>` (n = 0..N-1); its name gets `.shared` with
// renameByDefault, or the resource's own `rename`. MPS shares whole GPUs only: a MIG device in
// an MPS-shared resource is an error (nothing is advertised for it).

#include "modules/gpu_inventory/messages.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gns::device_plugin {

enum class MigStrategy { kNone, kSingle, kMixed };
enum class DeviceIdStrategy { kUuid, kIndex };

enum class SharingStrategy { kTimeSlicing, kMps };

struct SharedResource {
  std::string name;     // resource before renaming, e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb
  std::string rename;   // empty: renameByDefault decides
  int replicas = 1;
};

// sharing.timeSlicing or sharing.mps (upstream's schema; the config allows one of them).
struct SharingSettings {
  SharingStrategy strategy = SharingStrategy::kTimeSlicing;
  bool rename_by_default = false;
  bool fail_requests_greater_than_one = false;  // forced on for MPS
  std::vector<SharedResource> resources;
  const SharedResource* Find(const std::string& name) const;
};

struct PlanSettings {
  std::string gpu_resource = "nvidia.com/gpu";  // the whole-GPU resource name
  std::string gpu_socket = "nvidia-gpu.sock";   // its socket; others are derived (SocketFor)
  MigStrategy mig_strategy = MigStrategy::kNone;
  DeviceIdStrategy id_strategy = DeviceIdStrategy::kUuid;
  SharingSettings sharing;
};

// One device that can be handed to a container: a whole GPU or a MIG device.
struct PhysicalDevice {
  std::string uuid;         // GPU-… or MIG-…
  std::string parent_uuid;  // the GPU's UUID (the same as uuid for a whole GPU)
  std::string id;           // as the deviceIDStrategy names it: the UUID, or "<gpu index>[:<mig slot>]"
  uint32_t gpu_index = 0;
  uint32_t minor = 0;
  int numa_node = -1;
  bool mig = false;
  uint32_t gpu_instance = 0;
  uint32_t compute_instance = 0;
  std::string profile;  // MIG profile, empty for a whole GPU
  bool operator==(const PhysicalDevice&) const = default;
};

// A device ID the kubelet sees, and the physical device behind it.
struct PlannedDevice {
  std::string id;  // the physical id, or "<physical id>::<replica>"
  PhysicalDevice physical;
  bool operator==(const PlannedDevice&) const = default;
};

struct ResourcePlan {
  std::string name;    // e.g. nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared
  std::string socket;  // file name in the kubelet's device-plugins directory
  int replicas = 1;    // > 1: shared (time-sliced, or through MPS when `mps`)
  bool mps = false;
  bool fail_requests_greater_than_one = false;
  std::vector<PlannedDevice> devices;
  const PlannedDevice* Find(const std::string& id) const;
  bool operator==(const ResourcePlan&) const = default;
};

struct Plan {
  std::vector<ResourcePlan> resources;  // sorted by name; the whole-GPU resource may be absent
  std::string error;                    // set when the inventory does not fit the strategy
  const ResourcePlan* Find(const std::string& name) const;
  bool operator==(const Plan&) const = default;
};

// "nvidia-<name after the slash>.sock" (upstream's convention), or `gpu_socket` for the
// whole-GPU resource.
std::string SocketFor(const PlanSettings& settings, const std::string& resource);

Plan MakePlan(const std::vector<gpu_inventory::GpuInfo>& gpus, const PlanSettings& settings);

// Every physical device the plan advertises, once, in resource then device order.
std::vector<PhysicalDevice> PhysicalDevices(const Plan& plan);

// The replica suffix separator of time-sliced IDs.
inline constexpr std::string_view kReplicaSeparator = "::";

}  // namespace gns::device_plugin
