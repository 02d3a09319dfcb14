// PCIe checks (see pcie_checks.hpp).
#include "modules/gpu_health/pcie_checks.hpp"

#include <algorithm>

namespace gns::gpu_health {

Findings PcieChecks::Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms) {
  Findings out;
  const auto& pcie = gpu.pcie;
  State& state = gpus_[gpu.uuid];
  const std::string who = GpuName(gpu);
  if (settings_.link_degraded && pcie.width && *pcie.width != 0) {
    // The reference: what NVML says this GPU and slot can do, or the widest this process saw.
    const uint32_t expected = std::max(state.widest, pcie.max_width.value_or(0));
    state.widest = std::max(state.widest, *pcie.width);
    Finding f{"PcieLinkDegraded", std::nullopt};
    if (*pcie.width < expected) {
      f.holds = Condition{"PcieLinkDegraded", Component::kPcie, Severity::kNonFatal, RecommendedAction::kRestartBm,
                          who + ": PCIe link x" + std::to_string(*pcie.width) + ", expected x" + std::to_string(expected) +
                              (pcie.generation ? " (gen " + std::to_string(*pcie.generation) + ")" : ""),
                          ""};
    }
    out.push_back(std::move(f));
  }
  if (settings_.replay_rate.enabled && pcie.replay_counter) {
    const uint64_t grew = state.replays.Add(*pcie.replay_counter, at_ms, settings_.replay_rate.window);
    Finding f{"PcieReplayRate", std::nullopt};
    if (static_cast<double>(grew) >= settings_.replay_rate.Threshold()) {
      f.holds = Condition{"PcieReplayRate", Component::kPcie, Severity::kWarning, RecommendedAction::kNone,
                          who + ": " + std::to_string(grew) + " PCIe replays within " +
                              std::to_string(settings_.replay_rate.window.count() / 1000) + " s",
                          "DCGM_FR_PCI_REPLAY_RATE"};
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace gns::gpu_health
