// The polled checks together (see health_checks.hpp).
#include "modules/gpu_health/health_checks.hpp"

#include "loop/wake_grid.hpp"

#include <algorithm>

namespace gns::gpu_health {

std::string_view GroupName(std::size_t index) noexcept {
  static constexpr std::array<std::string_view, 6> kNames{"memory", "nvlink", "fabric", "pcie", "thermal", "host"};
  return index < kNames.size() ? kNames[index] : "unknown";
}

// A group's next pass: its interval after the last, on the loop's wake grid for intervals of at
// least a grid (the defaults, 30-60 s), so that at rest a pass shares the heartbeat's wake-up.
CheckSchedule::Time CheckSchedule::DueAt(std::size_t group) const {
  return SnapToWakeGrid(*last_[group] + intervals_[group], intervals_[group]);
}

uint32_t CheckSchedule::Due(Time now) const {
  uint32_t due = 0;
  for (std::size_t i = 0; i < intervals_.size(); ++i) {
    if (intervals_[i].count() <= 0) continue;
    if (!last_[i] || DueAt(i) - intervals_[i] / 10 <= now) due |= 1u << i;
  }
  return due;
}

void CheckSchedule::Ran(uint32_t groups, Time now) {
  for (std::size_t i = 0; i < intervals_.size(); ++i) {
    if ((groups & (1u << i)) != 0) last_[i] = now;
  }
}

std::optional<CheckSchedule::Time> CheckSchedule::NextDue() const {
  std::optional<Time> next;
  for (std::size_t i = 0; i < intervals_.size(); ++i) {
    if (intervals_[i].count() <= 0) continue;
    const Time at = last_[i] ? DueAt(i) : Time::min();
    if (!next || at < *next) next = at;
  }
  return next;
}

uint32_t CheckSchedule::Enabled() const {
  uint32_t on = 0;
  for (std::size_t i = 0; i < intervals_.size(); ++i) on |= intervals_[i].count() > 0 ? 1u << i : 0;
  return on;
}

HealthChecks::HealthChecks(const ChecksConfig& config)
    : config_(config),
      memory_(config.memory),
      nvlink_(config.nvlink),
      fabric_(config.fabric),
      pcie_(config.pcie),
      thermal_(config.thermal) {}

HealthChecks::PassFindings HealthChecks::Judge(const gpu_inventory::HealthSample& sample, std::size_t known_gpus,
                                               const std::vector<std::string>& known_pci) {
  namespace inv = gpu_inventory;
  PassFindings out;
  const int64_t at = sample.taken_unix_ms;
  for (const inv::GpuHealthReading& gpu : sample.gpus) {
    if (gpu.uuid.empty()) continue;
    GpuFindings g{gpu.uuid, gpu.pci_bus_id, JudgeGpuLost(gpu, config_.presence)};
    auto take = [&g](Findings more) {
      for (auto& f : more) g.findings.push_back(std::move(f));
    };
    // A lost GPU's other readings are what was read before it was lost: not judged.
    if (!gpu.lost) {
      if ((sample.groups & inv::kHealthMemory) != 0) take(memory_.Judge(gpu, at));
      if ((sample.groups & inv::kHealthNvLink) != 0) take(nvlink_.Judge(gpu, at));
      if ((sample.groups & inv::kHealthFabric) != 0) take(fabric_.Judge(gpu, at));
      if ((sample.groups & inv::kHealthPcie) != 0) take(pcie_.Judge(gpu, at));
      if ((sample.groups & inv::kHealthThermal) != 0) take(thermal_.Judge(gpu, at));
      if ((sample.groups & inv::kHealthHost) != 0) take(JudgeHost(gpu, config_.host));
    }
    out.gpus.push_back(std::move(g));
  }
  std::vector<std::string> nvml_pci = known_pci;
  for (const inv::GpuHealthReading& gpu : sample.gpus) {
    if (!gpu.pci_bus_id.empty()) nvml_pci.push_back(gpu.pci_bus_id);
  }
  out.node = JudgeMissingFromNvml(sample.pci_gpu_count, std::max(known_gpus, sample.gpus.size()), config_.presence,
                                  sample.pci_gpu_addresses, nvml_pci);
  return out;
}

void HealthChecks::Forget(const std::string& uuid) {
  memory_.Forget(uuid);
  nvlink_.Forget(uuid);
  fabric_.Forget(uuid);
  pcie_.Forget(uuid);
  thermal_.Forget(uuid);
}

void HealthChecks::ForgetAll() {
  memory_ = MemoryChecks(config_.memory);
  nvlink_ = NvLinkChecks(config_.nvlink);
  fabric_ = FabricChecks(config_.fabric);
  pcie_ = PcieChecks(config_.pcie);
  thermal_ = ThermalChecks(config_.thermal);
}

}  // namespace gns::gpu_health
