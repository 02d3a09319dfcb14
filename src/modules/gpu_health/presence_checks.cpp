// Presence checks (see presence_checks.hpp).
#include "modules/gpu_health/presence_checks.hpp"

#include "loop/pci_address.hpp"

#include <set>

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
                                            const PresenceSettings& settings,
                                            const std::vector<std::string>& pci_addresses,
                                            const std::vector<std::string>& nvml_addresses) {
  if (!settings.missing_from_nvml || !pci_gpus) return std::nullopt;
  Finding f{"GpuMissingFromNvml", std::nullopt};
  if (*pci_gpus <= nvml_gpus) return f;
  std::set<PciAddress> known;
  for (const auto& text : nvml_addresses) {
    if (const auto pci = ParsePciAddress(text)) known.insert(*pci);
  }
  std::string missing;  // the addresses on the bus NVML does not list, as sysfs writes them
  for (const auto& text : pci_addresses) {
    const auto pci = ParsePciAddress(text);
    if (!pci || known.count(*pci) != 0) continue;
    missing += (missing.empty() ? "" : ", ") + pci->ToString();
  }
  std::string message = std::to_string(*pci_gpus) + " NVIDIA GPUs on the PCI bus, NVML sees " +
                        std::to_string(nvml_gpus) + ": " + std::to_string(*pci_gpus - nvml_gpus) +
                        " missing from NVML";
  if (!missing.empty()) message += " (not in NVML: " + missing + ")";
  f.holds = Condition{"GpuMissingFromNvml", Component::kGpu, Severity::kNonFatal, RecommendedAction::kRestartBm,
                      std::move(message), ""};
  return f;
}

}  // namespace gns::gpu_health
