// The thermal and power checks of one GPU (HealthGroup kHealthThermal). Anchors: gpud's
// hw-slowdown component (clock event reasons as a rate: ≥ 0.6 per minute over 10 minutes) and
// temperature component (margin to the slowdown threshold), DCGM's thermal and power watches.
//
// | check                  | holds when                                          | severity  | action |
// |------------------------|-----------------------------------------------------|-----------|--------|
// | ClockEventHwSlowdown   | HW_SLOWDOWN at ≥ 0.6/min over 10 min                | non-fatal | NONE   |
// | ClockEventHwThermal    | HW_THERMAL_SLOWDOWN at ≥ 0.6/min over 10 min        | non-fatal | NONE   |
// | ClockEventHwPowerBrake | HW_POWER_BRAKE_SLOWDOWN at ≥ 0.6/min over 10 min    | non-fatal | NONE   |
// | ClockEventSwThermal    | SW_THERMAL_SLOWDOWN at ≥ 0.6/min over 10 min        | warning   | NONE   |
// | ThermalMargin          | GPU (or memory) within `marginC` of its slowdown (max) temperature | warning | NONE |
// | PowerViolation         | power-capped ≥ 10 % of the time over 10 min         | warning   | NONE   |
//
// The rate: NVML gives the reasons active now, not events; gpud samples them once a minute and
// counts a sample with the reason as one event. Here a reading with the reason counts for the
// time since the previous reading (one event per minute of it), so the rate means the same at
// any interval: 0.6/min over 10 min is the reason active for 6 of the last 10 minutes. gpud
// marks the GPU Unhealthy for the hardware reasons (a GPU throttled by its own protection is
// not fit for work); no remedy of ours cools a room or fixes a PSU, so the action is NONE (the
// GPU is taken out of scheduling, nothing is reset). A software thermal slowdown is the driver
// keeping its target: reported only.
//
// PowerViolation: nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER) is the time (ns, cumulative
// since the driver loaded) the GPU ran below its clocks to stay within its power limit. Its
// growth within the window, as a share of the window, is the time power-capped (a window not yet
// full of readings counts as the whole window: it can only understate). gpud's power component
// reports this time as a warning and marks nothing Unhealthy: a GPU held at its power limit
// works, slower, and the limit is the operator's choice. Here too: a warning (reported,
// cleared after the hysteresis), no action. 10 % over 10 minutes is our threshold (gpud gives
// none).
// Pure; keeps per GPU a window per reason. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

#include <array>
#include <map>
#include <string>

namespace gns::gpu_health {

// nvmlClocksEventReason* (nvml.h).
namespace clock_event {
inline constexpr uint64_t kHwSlowdown = 0x8;
inline constexpr uint64_t kSwThermalSlowdown = 0x20;
inline constexpr uint64_t kHwThermalSlowdown = 0x40;
inline constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
}  // namespace clock_event

class ThermalChecks {
 public:
  struct Settings {
    bool hw_slowdown = true;
    bool hw_thermal = true;
    bool hw_power_brake = true;
    bool sw_thermal = true;
    RateSetting clock_event_rate{true, 0.6, std::chrono::minutes(10)};
    bool thermal_margin = true;
    uint32_t margin_c = 5;
    bool power_violation = true;
    double power_violation_percent = 10.0;  // of the window's time, power-capped
    std::chrono::milliseconds power_violation_window{std::chrono::minutes(10)};
  };

  explicit ThermalChecks(Settings settings) : settings_(settings) {}

  Findings Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms);
  void Forget(const std::string& uuid) { gpus_.erase(uuid); }

 private:
  struct State {
    std::optional<int64_t> last_at;
    std::array<uint64_t, 4> active_ms{};  // cumulative time each reason was active
    std::array<CounterWindow, 4> windows;
    CounterWindow power_violation;  // ns
  };
  Settings settings_;
  std::map<std::string, State, std::less<>> gpus_;
};

}  // namespace gns::gpu_health
