// gpu-health's polled checks judged once, outside the daemon: what `gpu-node-supervisor scan`
// prints on a node an operator suspects (gpud's `scan`). The same checks with the same default
// thresholds as the module (ChecksConfig's defaults), so a scan and the running daemon agree.
//
// One pass judges states (a pending remap, a link down, a lost GPU, a PCIe width below its
// maximum). Counter checks are rates over a window: with `previous` (an earlier pass of the same
// GPUs) they are judged as the growth between the two passes; without it they say nothing.
#pragma once

#include "modules/gpu_inventory/api/health_sample.hpp"
#include "preflight/unit_state.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_health {

struct ScanFinding {
  std::string check;      // RowRemapPending, NvLinkDown, …
  bool holds = false;     // false: judged, and clear (or not judged: `judged`)
  bool judged = true;     // false: nothing to judge it on (`message` says why)
  std::string severity;   // warning | non-fatal | fatal (when holds)
  std::string component;  // GPU, memory, NVLink, … (when holds)
  std::string action;     // NVSentinel's recommended action (when holds)
  std::string message;    // what, which GPU, the numbers (when holds)
};

struct ScanGpu {
  uint32_t index = 0;
  std::string uuid;
  std::string pci;
  bool healthy = true;  // no non-fatal or fatal condition holds
  std::vector<ScanFinding> findings;
  std::vector<std::string> failed_functions;  // NVML calls that failed (not NOT_SUPPORTED)
};

struct ScanReport {
  bool ok = false;      // the pass was read (NVML answered)
  std::string error;    // why not
  bool healthy = false; // ok, and no GPU (nor the node) has a non-fatal or fatal condition
  std::vector<ScanGpu> gpus;
  std::optional<ScanFinding> node;  // GpuMissingFromNvml: PCI bus against NVML
  std::vector<ScanFinding> services;  // the host services (ScanHostServices), node-wide
  std::optional<uint32_t> pci_gpu_count;
  int64_t pass_micros = 0;
};

// Judges `sample` (after `previous`, when given) for `known_gpus` GPUs of the inventory.
[[nodiscard]] ScanReport Scan(const gpu_inventory::HealthSample& sample, std::size_t known_gpus,
                              const gpu_inventory::HealthSample* previous = nullptr);

// The host services (nvidia-persistenced, nvidia-fabricmanager) judged as the module judges
// them, from what `read` says of each unit (the CLI: one blocking D-Bus read each). A unit that
// cannot be read is "not judged" and leaves `healthy` as it is.
void ScanHostServices(ScanReport& report, const std::function<imex_health::UnitState(const std::string& unit)>& read);

[[nodiscard]] nlohmann::json ToJson(const ScanReport& report);
// One line per GPU and check: "GPU 0  GPU-…  0000:3b:00.0  RowRemapPending  FAIL fatal COMPONENT_RESET  …".
[[nodiscard]] std::string ToTable(const ScanReport& report);

}  // namespace gns::gpu_health
