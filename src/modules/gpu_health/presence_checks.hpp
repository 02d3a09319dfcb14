// Presence checks: is each GPU still there, and does NVML see every GPU on the PCI bus? Read in
// every pass whatever its groups. Anchors: gpud's gpu-counts component, NVSentinel's
// syslog-health-monitor ("GPU has fallen off the bus"), NVML_ERROR_GPU_IS_LOST.
//
// | check               | holds when                                                  | severity  | action     |
// |---------------------|-------------------------------------------------------------|-----------|------------|
// | GpuLost             | an NVML call of the pass answered GPU_IS_LOST               | fatal     | RESTART_BM |
// | GpuMissingFromNvml  | more NVIDIA GPUs on the PCI bus than NVML sees (node-wide)  | non-fatal | RESTART_BM |
//
// GpuLost is XID 79's fault seen through NVML: the same action as the catalog gives XID 79
// (a GPU off the bus comes back only with a reboot). GpuMissingFromNvml holds on the count (more
// on the bus than NVML knows, the GPUs out for a reset counted as known) and names the missing
// GPUs: the PCI addresses on the bus that no GPU of NVML's (the pass's, the inventory's) has,
// compared as addresses (NVML writes "00000000:3B:00.0", sysfs "0000:3b:00.0"). NVML does not
// see that GPU, so there is no UUID to hang a verdict on: it is a condition of the node, reported
// as a HealthEvent without a GPU entity, in /debug/state and the metrics; no GPU's verdict
// changes for it. A GPU handed to a VM (vfio-pci) is on the bus and not in NVML: disable the
// check on such nodes.
// Pure. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_health {

struct PresenceSettings {
  bool gpu_lost = true;
  bool missing_from_nvml = true;
};

// GpuLost of one GPU.
Findings JudgeGpuLost(const gpu_inventory::GpuHealthReading& gpu, const PresenceSettings& settings);

// GpuMissingFromNvml of the node: `pci_gpus` NVIDIA GPUs on the PCI bus (nullopt: not read,
// no judgement), `nvml_gpus` the GPUs NVML knows. `pci_addresses`: those on the bus;
// `nvml_addresses`: those NVML knows (any form ParsePciAddress reads; unreadable ones are
// skipped). The message names every address on the bus not among NVML's; when none can be
// named (addresses not read) it gives the counts alone.
std::optional<Finding> JudgeMissingFromNvml(std::optional<uint32_t> pci_gpus, std::size_t nvml_gpus,
                                            const PresenceSettings& settings,
                                            const std::vector<std::string>& pci_addresses = {},
                                            const std::vector<std::string>& nvml_addresses = {});

}  // namespace gns::gpu_health
