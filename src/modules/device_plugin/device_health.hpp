#pragma once
// Which devices the plugin advertises, and whether each is Healthy — from the GPU inventory
// (NVML availability) and gpu-health's per-device verdicts. gpu-health is the one judge of
// XIDs, whichever source reported them (NVML events or the kernel log); this tracker only
// follows its retained DeviceHealth. Never stale Healthy capacity: while NVML is unusable every
// known device is advertised Unhealthy (NVIDIA DP #1641), and a GPU whose NVML handles are
// released for its reset (GpuInfo::released) is Unhealthy alone.

#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <map>
#include <string>
#include <vector>

namespace gns::device_plugin {

struct AdvertisedDevice {
  std::string id;  // GPU UUID
  bool healthy = false;
  int numa_node = -1;
  std::string reason;  // why unhealthy
  bool operator==(const AdvertisedDevice&) const = default;
};

class DeviceHealthTracker {
 public:
  // Each returns true when the advertised list changed.
  bool OnInventory(const gpu_inventory::GpuInventory& inventory);
  bool OnDeviceHealth(const gpu_health::DeviceHealth& health);

  // Whole GPUs, in inventory order.
  const std::vector<AdvertisedDevice>& Devices() const { return advertised_; }
  // MIG devices of MIG-enabled GPUs, in inventory order. A MIG device is Unhealthy when its GPU
  // is (NVML down, released, a whole-GPU verdict) or gpu-health's verdict names its GPU instance.
  const std::vector<AdvertisedDevice>& MigDevices() const { return mig_advertised_; }
  // The health of a GPU or MIG device by UUID; nullptr when unknown.
  const AdvertisedDevice* HealthOf(const std::string& uuid) const;
  const gpu_inventory::GpuInfo* Find(const std::string& id) const;
  const std::vector<gpu_inventory::GpuInfo>& Gpus() const { return gpus_; }

 private:
  bool Recompute();

  std::vector<gpu_inventory::GpuInfo> gpus_;  // last known, kept while NVML is down
  bool inventory_available_ = false;
  std::string inventory_error_ = "GPU inventory not known yet";
  std::map<std::string, gpu_health::DeviceHealth> health_;  // RetainKey → latest from gpu-health
  std::vector<AdvertisedDevice> advertised_;
  std::vector<AdvertisedDevice> mig_advertised_;
};

}  // namespace gns::device_plugin
