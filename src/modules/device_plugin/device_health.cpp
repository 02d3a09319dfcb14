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
  health_[health.RetainKey()] = health;
  return Recompute();
}

const gpu_inventory::GpuInfo* DeviceHealthTracker::Find(const std::string& id) const {
  for (const auto& g : gpus_)
    if (g.uuid == id) return &g;
  return nullptr;
}

const AdvertisedDevice* DeviceHealthTracker::HealthOf(const std::string& uuid) const {
  for (const auto& d : advertised_)
    if (d.id == uuid) return &d;
  for (const auto& d : mig_advertised_)
    if (d.id == uuid) return &d;
  return nullptr;
}

bool DeviceHealthTracker::Recompute() {
  std::vector<AdvertisedDevice> next, next_mig;
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
    // MIG devices inherit their GPU's state; gpu-health's verdict on one GPU instance marks
    // that MIG device alone.
    for (const auto& mig : gpu.mig_devices) {
      AdvertisedDevice m{mig.uuid, d.healthy, gpu.numa_node, d.reason};
      gpu_health::DeviceHealth key;
      key.uuid = gpu.uuid;
      key.gpu_instance = mig.gpu_instance;
      const auto h = health_.find(key.RetainKey());
      if (m.healthy && h != health_.end() && !h->second.healthy) {
        m.healthy = false;
        m.reason = h->second.reason;
      }
      next_mig.push_back(std::move(m));
    }
    next.push_back(std::move(d));
  }
  if (next == advertised_ && next_mig == mig_advertised_) return false;
  advertised_ = std::move(next);
  mig_advertised_ = std::move(next_mig);
  return true;
}

}  // namespace gns::device_plugin
