// What every polled check (memory_checks, nvlink_checks, fabric_checks, pcie_checks,
// thermal_checks, presence_checks, host_checks) says of one GPU: for each of its checks either
// a condition that holds (with its severity and NVSentinel's recommended action), "judged and
// clear", or nothing at all (the reading was missing: no judgement). The check book
// (check_book) turns these findings into held conditions with hysteresis; the module combines
// them with the XID verdict.
//
// Also the two small tools the checks share: CounterWindow (a cumulative counter's growth over
// a sliding window: counters become rates, never absolute thresholds) and RateSetting.
//
// Pure values, no I/O, no clock: times are the sample's (HealthSample::taken_unix_ms).
#pragma once

#include "modules/gpu_health/xid_catalog.hpp"
#include "modules/gpu_inventory/api/health_sample.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gns::gpu_health {

// How a condition weighs on the verdict.
enum class Severity {
  kWarning,   // reported (HealthEvent, metrics, /debug/state); the GPU stays Healthy
  kNonFatal,  // Unhealthy while it holds; clears after N clean passes (hysteresis)
  kFatal,     // Unhealthy until a reset, a new boot or set-healthy (as a fatal XID)
};
[[nodiscard]] std::string_view SeverityName(Severity severity) noexcept;

// What part of the machine a condition is about (metrics label, /debug/state).
enum class Component { kGpu, kMemory, kNvLink, kFabric, kPcie, kThermal, kHost };
[[nodiscard]] std::string_view ComponentName(Component component) noexcept;
[[nodiscard]] std::optional<Component> ParseComponentName(std::string_view name) noexcept;

struct Condition {
  std::string check;  // stable name: RowRemapPending, NvLinkDown, …; the HealthEvent's checkName
  Component component = Component::kGpu;
  Severity severity = Severity::kWarning;
  RecommendedAction action = RecommendedAction::kNone;
  std::string message;     // what, which GPU, the numbers
  std::string error_code;  // DCGM's failure name (DCGM_FR_…) where one exists, else empty
};

// One check's word on one GPU in one pass.
struct Finding {
  std::string check;
  std::optional<Condition> holds;  // nullopt: judged, and the condition does not hold
};
// A check with nothing to judge (a reading NVML could not give) adds no finding at all.
using Findings = std::vector<Finding>;

// "GPU 1 (GPU-…, 0000:3b:00.0)": how messages name a GPU.
[[nodiscard]] std::string GpuName(const gpu_inventory::GpuHealthReading& gpu);

// A rate threshold: `per_minute` or more over `window` (a count of per_minute × window minutes
// within the window).
struct RateSetting {
  bool enabled = true;
  double per_minute = 1.0;
  std::chrono::milliseconds window{std::chrono::minutes(10)};
  // The growth within the window at which the rate holds (at least 1).
  [[nodiscard]] double Threshold() const;
};

// The growth of a cumulative counter within a sliding window of readings. A counter that went
// down (a driver reload, a GPU reset) starts the window again: the readings before it no longer
// count. Bounded: at most kMaxReadings readings are kept (the oldest go first).
class CounterWindow {
 public:
  static constexpr std::size_t kMaxReadings = 512;
  // Adds a reading taken at `at_ms` and returns the growth since the oldest reading still in
  // the window (0 for the first one).
  uint64_t Add(uint64_t value, int64_t at_ms, std::chrono::milliseconds window);
  [[nodiscard]] std::size_t size() const { return readings_.size(); }

 private:
  std::deque<std::pair<int64_t, uint64_t>> readings_;  // (at_ms, value), oldest first
};

}  // namespace gns::gpu_health
