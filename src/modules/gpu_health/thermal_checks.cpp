// Thermal and power checks (see thermal_checks.hpp).
#include "modules/gpu_health/thermal_checks.hpp"

#include <algorithm>
#include <cstdio>

namespace gns::gpu_health {
namespace {

struct Reason {
  std::string_view check;
  uint64_t bit;
  std::string_view what;
  Severity severity;
  std::string_view code;
};

constexpr std::array<Reason, 4> kReasons{{
    {"ClockEventHwSlowdown", clock_event::kHwSlowdown, "HW slowdown", Severity::kNonFatal, ""},
    {"ClockEventHwThermal", clock_event::kHwThermalSlowdown, "HW thermal slowdown", Severity::kNonFatal,
     "DCGM_FR_CLOCKS_EVENT_THERMAL"},
    {"ClockEventHwPowerBrake", clock_event::kHwPowerBrakeSlowdown, "HW power brake slowdown", Severity::kNonFatal,
     "DCGM_FR_CLOCKS_EVENT_POWER"},
    {"ClockEventSwThermal", clock_event::kSwThermalSlowdown, "SW thermal slowdown", Severity::kWarning, ""},
}};

std::string PerMinute(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

}  // namespace

Findings ThermalChecks::Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms) {
  Findings out;
  const auto& thermal = gpu.thermal;
  const std::string who = GpuName(gpu);
  State& state = gpus_[gpu.uuid];
  if (const auto reasons = thermal.clock_event_reasons; reasons && settings_.clock_event_rate.enabled) {
    const auto& rate = settings_.clock_event_rate;
    // The time this reading stands for: since the previous one, at most the window (a loop
    // that slept long does not make one reading a whole window's worth).
    const int64_t span = state.last_at && at_ms > *state.last_at ? std::min<int64_t>(at_ms - *state.last_at, rate.window.count()) : 0;
    state.last_at = at_ms;
    const std::array<bool, 4> enabled{settings_.hw_slowdown, settings_.hw_thermal, settings_.hw_power_brake,
                                      settings_.sw_thermal};
    const double window_minutes = std::chrono::duration<double, std::ratio<60>>(rate.window).count();
    for (std::size_t i = 0; i < kReasons.size(); ++i) {
      const Reason& r = kReasons[i];
      if ((*reasons & r.bit) != 0) state.active_ms[i] += static_cast<uint64_t>(span);
      const uint64_t grew_ms = state.windows[i].Add(state.active_ms[i], at_ms, rate.window);
      if (!enabled[i]) continue;
      const double events = static_cast<double>(grew_ms) / 60000.0;  // one per minute active
      Finding f{std::string(r.check), std::nullopt};
      if (events >= rate.Threshold()) {
        f.holds = Condition{std::string(r.check), Component::kThermal, r.severity, RecommendedAction::kNone,
                            who + ": " + std::string(r.what) + " at " + PerMinute(events / window_minutes) +
                                "/min over " + std::to_string(rate.window.count() / 60000) + " min (threshold " +
                                PerMinute(rate.per_minute) + "/min)",
                            std::string(r.code)};
      }
      out.push_back(std::move(f));
    }
  }
  if (const auto violation = thermal.power_violation_ns; violation && settings_.power_violation) {
    const auto window = settings_.power_violation_window;
    const uint64_t grew_ns = state.power_violation.Add(*violation, at_ms, window);
    const double window_ns = std::chrono::duration<double, std::nano>(window).count();
    const double percent = window_ns > 0 ? 100.0 * static_cast<double>(grew_ns) / window_ns : 0.0;
    Finding f{"PowerViolation", std::nullopt};
    if (percent >= settings_.power_violation_percent) {
      f.holds = Condition{"PowerViolation", Component::kThermal, Severity::kWarning, RecommendedAction::kNone,
                          who + ": power-capped " + PerMinute(percent) + " % of the last " +
                              std::to_string(window.count() / 60000) + " min (" +
                              std::to_string(grew_ns / 1'000'000) + " ms; threshold " +
                              PerMinute(settings_.power_violation_percent) + " %)",
                          ""};
    }
    out.push_back(std::move(f));
  }
  if (settings_.thermal_margin) {
    std::string what;
    bool judged = false;
    if (thermal.gpu_temperature_c && thermal.slowdown_threshold_c && *thermal.slowdown_threshold_c != 0) {
      judged = true;
      if (*thermal.gpu_temperature_c + settings_.margin_c >= *thermal.slowdown_threshold_c) {
        what = "GPU at " + std::to_string(*thermal.gpu_temperature_c) + " °C, slowdown at " +
               std::to_string(*thermal.slowdown_threshold_c) + " °C";
      }
    }
    if (thermal.memory_temperature_c && thermal.memory_max_c && *thermal.memory_max_c != 0) {
      judged = true;
      if (*thermal.memory_temperature_c + settings_.margin_c >= *thermal.memory_max_c) {
        what += (what.empty() ? "" : "; ") + std::string("memory at ") + std::to_string(*thermal.memory_temperature_c) +
                " °C, maximum " + std::to_string(*thermal.memory_max_c) + " °C";
      }
    }
    if (judged) {
      Finding f{"ThermalMargin", std::nullopt};
      if (!what.empty()) {
        f.holds = Condition{"ThermalMargin", Component::kThermal, Severity::kWarning, RecommendedAction::kNone,
                            who + ": within " + std::to_string(settings_.margin_c) + " °C of slowdown: " + what,
                            "DCGM_FR_TEMP_VIOLATION"};
      }
      out.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace gns::gpu_health
