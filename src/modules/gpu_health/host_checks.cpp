// Host checks (see host_checks.hpp).
#include "modules/gpu_health/host_checks.hpp"

namespace gns::gpu_health {

Findings JudgeHost(const gpu_inventory::GpuHealthReading& gpu, const HostSettings& settings) {
  Findings out;
  if (!settings.persistence_mode_off || !gpu.persistence_mode) return out;
  Finding f{"PersistenceModeOff", std::nullopt};
  if (!*gpu.persistence_mode) {
    f.holds = Condition{"PersistenceModeOff", Component::kHost, Severity::kWarning, RecommendedAction::kNone,
                        GpuName(gpu) + ": persistence mode is off", ""};
  }
  out.push_back(std::move(f));
  return out;
}

}  // namespace gns::gpu_health
