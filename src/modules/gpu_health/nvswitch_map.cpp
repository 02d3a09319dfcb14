// The NVSwitch port map (see nvswitch_map.hpp).
#include "modules/gpu_health/nvswitch_map.hpp"

namespace gns::gpu_health {

std::size_t NvSwitchPortMap::Update(const std::vector<gpu_inventory::GpuInfo>& gpus) {
  for (const auto& gpu : gpus) {
    for (const auto& l : gpu.nvswitch_links) {
      const std::pair<uint64_t, uint32_t> key{l.nvswitch.DeviceKey(), l.port};
      const auto it = ports_.find(key);
      if (it == ports_.end() && ports_.size() >= kMaxPorts) continue;
      Gpu& entry = it != ports_.end() ? it->second : ports_[key];
      entry.uuid = gpu.uuid;
      entry.index = gpu.index;
      entry.pci = gpu.pci.ToString();
      entry.link = l.link;
    }
  }
  return ports_.size();
}

const NvSwitchPortMap::Gpu* NvSwitchPortMap::Find(const PciAddress& nvswitch, uint32_t port) const {
  const auto it = ports_.find({nvswitch.DeviceKey(), port});
  return it == ports_.end() ? nullptr : &it->second;
}

}  // namespace gns::gpu_health
