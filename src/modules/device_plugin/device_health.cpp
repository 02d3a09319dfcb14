// Advertised device health.
#include "modules/device_plugin/device_health.hpp"

namespace gns::device_plugin {

bool DeviceHealthTracker::OnInventory(const gpu_inventory::GpuInventory& inventory) {
  if (inventory.available) {
    gpus_ = inventory.gpus;
    inventory_error_.clear();
  } else {
    inventory_error_ = inventory.error.empty() ? "GPU inventory unavailable" : inventory.error;
  }
  inventory_available_ = inventory.available;
  return Recompute();
}

bool DeviceHealthTracker::OnDeviceHealth(const gpu_health::DeviceHealth& health) {
  health_[health.uuid] = health;
  return Recompute();
}

const gpu_inventory::GpuInfo* DeviceHealthTracker::Find(const std::string& id) const {
  for (const auto& g : gpus_)
    if (g.uuid == id) return &g;
  return nullptr;
}

bool DeviceHealthTracker::Recompute() {
  std::vector<AdvertisedDevice> next;
  next.reserve(gpus_.size());
  for (const auto& gpu : gpus_) {
    AdvertisedDevice d{gpu.uuid, true, gpu.numa_node, {}};
    if (!inventory_available_) {
      d.healthy = false;
      d.reason = inventory_error_;
    } else if (gpu.released) {
      d.healthy = false;
      d.reason = "NVML handles released" + (gpu.release_reason.empty() ? std::string{} : ": " + gpu.release_reason);
    } else if (const auto h = health_.find(gpu.uuid); h != health_.end() && !h->second.healthy) {
      d.healthy = false;
      d.reason = h->second.reason;
    }
    next.push_back(std::move(d));
  }
  if (next == advertised_) return false;
  advertised_ = std::move(next);
  return true;
}

}  // namespace gns::device_plugin
