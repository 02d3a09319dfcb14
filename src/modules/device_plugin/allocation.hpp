#pragma once
// The device plugin's decisions, free of gRPC and of the loop so they can be tested alone:
// what Allocate hands the runtime for a set of GPUs, and which GPUs GetPreferredAllocation
// picks for the best locality.

#include "modules/gpu_inventory/messages.hpp"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gns::device_plugin {

enum class DeviceListStrategy { kEnvVar, kCdiCri };

struct AllocationSettings {
  DeviceListStrategy strategy = DeviceListStrategy::kEnvVar;
  bool pass_device_specs = false;
  std::string cdi_kind = "nvidia.com/gpu";  // CDI names are "<kind>=<uuid>"
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

struct ContainerAllocation {
  std::map<std::string, std::string> envs;
  std::vector<DeviceSpecOut> devices;
  std::vector<std::string> cdi_devices;
};

// What Allocate needs to know of one device ID.
struct DeviceFacts {
  bool healthy = false;
  uint32_t minor = 0;
};
using DeviceLookup = std::function<std::optional<DeviceFacts>(const std::string& id)>;

// Fills `out` for one container's device IDs. Returns an error message naming every unknown
// or unhealthy ID (empty on success): the caller answers INVALID_ARGUMENT with it.
std::string AllocateContainer(const AllocationSettings& settings, const DeviceLookup& lookup,
                              const std::vector<std::string>& ids, ContainerAllocation& out);

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

}  // namespace gns::device_plugin
