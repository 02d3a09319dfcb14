#pragma once
// The device plugin's decisions, free of gRPC and of the loop so they can be tested alone:
// what Allocate hands the runtime for a set of GPUs, and which GPUs GetPreferredAllocation
// picks for the best locality.

#include "modules/gpu_inventory/messages.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gns::device_plugin {

// How Allocate tells the runtime which devices a container gets (upstream's
// deviceListStrategy; several may be on at once).
struct DeviceListStrategies {
  bool envvar = true;           // NVIDIA_VISIBLE_DEVICES=<ids>
  bool volume_mounts = false;   // /dev/null mounted at /var/run/nvidia-container-devices/<id>
  bool cdi_annotations = false; // cdi.k8s.io/<key>: <CDI names>
  bool cdi_cri = false;         // the CRI's CDIDevice field
  bool operator==(const DeviceListStrategies&) const = default;
};

inline constexpr const char* kVisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES";
inline constexpr const char* kVolumeMountsRoot = "/var/run/nvidia-container-devices";
inline constexpr const char* kVolumeMountsHostPath = "/dev/null";
inline constexpr const char* kCdiAnnotationPrefix = "cdi.k8s.io/";

struct AllocationSettings {
  DeviceListStrategies strategies;
  bool pass_device_specs = false;
  std::string cdi_kind = "nvidia.com/gpu";  // CDI names are "<kind>=<device id>"
  // Control device nodes that exist on the host (e.g. /dev/nvidiactl), added with
  // pass_device_specs; the caller checks which exist.
  std::vector<std::string> control_devices;
};

struct DeviceSpecOut {
  std::string container_path;
  std::string host_path;
  std::string permissions;
  auto operator<=>(const DeviceSpecOut&) const = default;
};

struct MountOut {
  std::string container_path;
  std::string host_path;
  bool read_only = true;
  auto operator<=>(const MountOut&) const = default;
};

struct ContainerAllocation {
  std::map<std::string, std::string> envs;
  std::vector<DeviceSpecOut> devices;
  std::vector<std::string> cdi_devices;
  std::vector<MountOut> mounts;
  std::map<std::string, std::string> annotations;
};

// What Allocate needs to know of one device ID.
struct DeviceFacts {
  bool healthy = false;
  uint32_t minor = 0;
  // The device the runtime is told about (a time-sliced replica's physical device); empty: the
  // requested ID itself.
  std::string physical_id = {};
  bool replica = false;
  // With pass_device_specs, a MIG device's GPU- and compute-instance capability nodes
  // (/dev/nvidia-caps/nvidia-cap<N>), or why they were not found (the request is then refused:
  // without them the container cannot use the MIG device).
  std::vector<std::string> cap_nodes = {};
  std::string cap_error = {};
};
using DeviceLookup = std::function<std::optional<DeviceFacts>(const std::string& id)>;

// The resource's rules for one container request.
struct RequestRules {
  std::string resource = "nvidia.com/gpu";
  bool fail_requests_greater_than_one = false;  // time-slicing: at most one replica per container
  std::size_t healthy_devices = SIZE_MAX;       // healthy devices the resource advertises
  std::string annotation_key = "nvidia-device-plugin";  // cdi.k8s.io/<annotation_key>
};

// Fills `out` for one container's device IDs. Returns an error message (empty on success): a
// shared resource asked for more than one replica (upstream's wording), a request larger than
// the healthy devices, or every unknown or unhealthy ID named. The caller answers
// INVALID_ARGUMENT with it. Replicas of one physical device are passed once.
std::string AllocateContainer(const AllocationSettings& settings, const DeviceLookup& lookup,
                              const std::vector<std::string>& ids, ContainerAllocation& out,
                              const RequestRules& rules = {});

struct TopologyDevice {
  std::string id;
  int numa_node = -1;
  gpu_inventory::PciAddress pci;
  std::set<std::string> nvlink_peers;
};

struct Preferred {
  std::vector<std::string> ids;  // sorted
  std::string error;             // set instead of ids for an impossible request
};

// Must-include devices first, then the completion with the best locality: most pairs on the
// same NUMA node, then most NVLink-connected pairs, then the smallest PCI bus distance; ties
// go to the lexicographically smallest ID set, so the answer is deterministic.
Preferred PreferredAllocation(const std::vector<TopologyDevice>& topology, const std::vector<std::string>& available,
                              const std::vector<std::string>& must_include, int size);

// For MIG devices and shared replicas: must-include devices first, then one at a time the
// available ID of the least loaded group (`group_of`: the physical device a replica shares, or
// the GPU a MIG device is cut from). A group's load is its devices in use — advertised but not
// available, i.e. allocated to running containers (or unhealthy) — plus those this request took;
// ties go to the group this request took fewer from, then to the smaller ID, so the answer is
// deterministic. Four one-replica requests on two idle 4-replica GPUs alternate between them.
Preferred PreferredSpread(const std::vector<std::string>& advertised, const std::vector<std::string>& available,
                          const std::vector<std::string>& must_include, int size,
                          const std::function<std::string(const std::string& id)>& group_of);

}  // namespace gns::device_plugin
