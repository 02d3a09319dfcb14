// NVLink checks (see nvlink_checks.hpp).
#include "modules/gpu_health/nvlink_checks.hpp"

#include <algorithm>

namespace gns::gpu_health {

Findings NvLinkChecks::Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms) {
  Findings out;
  if (gpu.nvlinks.empty()) return out;  // no NVLink on this GPU: nothing to judge
  State& state = gpus_[gpu.uuid];
  const bool any_active =
      std::any_of(gpu.nvlinks.begin(), gpu.nvlinks.end(), [](const auto& link) { return link.active; });
  std::string down;
  for (const auto& link : gpu.nvlinks) {
    if (link.active) {
      state.seen_active.insert(link.link);
    } else if (any_active || state.seen_active.count(link.link) != 0) {
      down += (down.empty() ? "" : ", ") + std::to_string(link.link);
    }
  }
  const std::string who = GpuName(gpu);
  if (settings_.nvlink_down) {
    Finding f{"NvLinkDown", std::nullopt};
    if (!down.empty()) {
      f.holds = Condition{"NvLinkDown", Component::kNvLink, Severity::kNonFatal, RecommendedAction::kComponentReset,
                          who + ": NVLink " + down + " down (" + std::to_string(gpu.nvlinks.size()) + " links)",
                          "DCGM_FR_NVLINK_DOWN"};
    }
    out.push_back(std::move(f));
  }
  if (settings_.error_rate.enabled) {
    uint64_t sum = 0;
    bool any = false;
    for (const auto& link : gpu.nvlinks) {
      for (const auto& counter : {link.replay, link.recovery, link.crc_flit, link.crc_data}) {
        if (!counter) continue;
        sum += *counter;
        any = true;
      }
    }
    if (any) {
      const uint64_t grew = state.errors.Add(sum, at_ms, settings_.error_rate.window);
      Finding f{"NvLinkErrorRate", std::nullopt};
      if (static_cast<double>(grew) >= settings_.error_rate.Threshold()) {
        f.holds = Condition{"NvLinkErrorRate", Component::kNvLink, Severity::kWarning, RecommendedAction::kNone,
                            who + ": " + std::to_string(grew) + " NVLink replay/recovery/CRC errors within " +
                                std::to_string(settings_.error_rate.window.count() / 1000) + " s",
                            "DCGM_FR_NVLINK_ERROR_THRESHOLD"};
      }
      out.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace gns::gpu_health
