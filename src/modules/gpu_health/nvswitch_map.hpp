// Which GPU of ours sits behind an NVSwitch port, for the SXid reports of the kernel log:
// (switch PCI address, port) → GPU, from gpu-inventory's GpuInfo::nvswitch_links (read when its
// NVML session opens, not per line). Addresses are compared numerically (PciAddress::DeviceKey).
//
// Kept for the life of the process: an inventory read again replaces the ports it names and
// leaves the others, because the NVLink wiring of a baseboard does not change while the node
// runs, but a link that fell (SXid 20034 "LTSSM Fault Up") is inactive at the next read and NVML
// no longer names its far end — its later SXids must still find their GPU. A port the inventory
// now gives to another GPU moves to it. One owner (the module's loop), not thread-safe.
#pragma once

#include "loop/pci_address.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gns::gpu_health {

class NvSwitchPortMap {
 public:
  // More (switch, port) pairs than any NVSwitch system has (8 GPUs x 18 links): beyond, new
  // ports are not learned.
  static constexpr std::size_t kMaxPorts = 1024;

  struct Gpu {
    std::string uuid;
    uint32_t index = 0;  // NVML index, for the reason text
    std::string pci;     // the GPU's PCI address (PciAddress::ToString)
    uint32_t link = 0;   // the GPU's NVLink into the port
  };

  // Learns the inventory's ports (see above). Returns how many (switch, port) pairs are known.
  std::size_t Update(const std::vector<gpu_inventory::GpuInfo>& gpus);
  // nullptr when no GPU of ours is known on that port.
  [[nodiscard]] const Gpu* Find(const PciAddress& nvswitch, uint32_t port) const;
  [[nodiscard]] std::size_t size() const noexcept { return ports_.size(); }

 private:
  std::map<std::pair<uint64_t, uint32_t>, Gpu> ports_;  // (switch DeviceKey, port) → GPU
};

}  // namespace gns::gpu_health
