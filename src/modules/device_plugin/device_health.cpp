// Advertised device health.
#include "modules/device_plugin/device_health.hpp"

namespace gns::device_plugin {

bool DeviceHealthTracker::OnInventory(const gpu_inventory::GpuInventory& inventory) {
  if (inventory.available) {
    // NVML came back (after a release for a GPU reset, or a recovered failure): XID marks
    // from before were about the GPUs' previous life.
    if (!inventory_available_) xid_marks_.clear();
    gpus_ = inventory.gpus;
    inventory_error_.clear();
  } else {
    inventory_error_ = inventory.error.empty() ? "GPU inventory unavailable" : inventory.error;
  }
  inventory_available_ = inventory.available;
  return Recompute();
}

bool DeviceHealthTracker::OnNvmlXid(const gpu_inventory::XidObservation& xid) {
  if (!critical_xids_.count(xid.xid)) return false;
  xid_marks_[xid.uuid] = "critical XID " + std::to_string(xid.xid) + " reported by NVML";
  return Recompute();
}

bool DeviceHealthTracker::OnDeviceHealth(const gpu_health::DeviceHealth& health) {
  health_[health.uuid] = health;
  if (health.healthy) xid_marks_.erase(health.uuid);  // the health module cleared the device
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
    } else if (const auto h = health_.find(gpu.uuid); h != health_.end() && !h->second.healthy) {
      d.healthy = false;
      d.reason = h->second.reason;
    } else if (const auto m = xid_marks_.find(gpu.uuid); m != xid_marks_.end()) {
      d.healthy = false;
      d.reason = m->second;
    }
    next.push_back(std::move(d));
  }
  if (next == advertised_) return false;
  advertised_ = std::move(next);
  return true;
}

}  // namespace gns::device_plugin
