// Presence checks (see presence_checks.hpp).
#include "modules/gpu_health/presence_checks.hpp"

namespace gns::gpu_health {

Findings JudgeGpuLost(const gpu_inventory::GpuHealthReading& gpu, const PresenceSettings& settings) {
  Findings out;
  if (!settings.gpu_lost) return out;
  Finding f{"GpuLost", std::nullopt};
  if (gpu.lost) {
    f.holds = Condition{"GpuLost", Component::kGpu, Severity::kFatal, RecommendedAction::kRestartBm,
                        GpuName(gpu) + ": NVML says the GPU is lost (fallen off the bus)", "79"};
  }
  out.push_back(std::move(f));
  return out;
}

std::optional<Finding> JudgeMissingFromNvml(std::optional<uint32_t> pci_gpus, std::size_t nvml_gpus,
                                            const PresenceSettings& settings) {
  if (!settings.missing_from_nvml || !pci_gpus) return std::nullopt;
  Finding f{"GpuMissingFromNvml", std::nullopt};
  if (*pci_gpus > nvml_gpus) {
    f.holds = Condition{"GpuMissingFromNvml", Component::kGpu, Severity::kNonFatal, RecommendedAction::kRestartBm,
                        std::to_string(*pci_gpus) + " NVIDIA GPUs on the PCI bus, NVML sees " +
                            std::to_string(nvml_gpus) + ": " + std::to_string(*pci_gpus - nvml_gpus) +
                            " missing from NVML",
                        ""};
  }
  return f;
}

}  // namespace gns::gpu_health
