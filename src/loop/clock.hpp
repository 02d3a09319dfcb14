#pragma once
// Injectable time. Logic that depends on "now" (rate limits, windows, stability periods)
// reads it from a Clock so tests can move time by hand instead of sleeping.

#include <atomic>
#include <chrono>

namespace gns {

class Clock {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;
  using WallTime = std::chrono::system_clock::time_point;

  virtual ~Clock() = default;
  virtual SteadyTime Now() const = 0;
  virtual WallTime WallNow() const = 0;
};

class SystemClock final : public Clock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
  WallTime WallNow() const override { return std::chrono::system_clock::now(); }
};

// A clock that only moves when told to.
class ManualClock final : public Clock {
 public:
  SteadyTime Now() const override { return SteadyTime(steady_.load()); }
  WallTime WallNow() const override { return WallTime(wall_.load()); }
  void Advance(std::chrono::nanoseconds d) {
    steady_.store(steady_.load() + d);
    wall_.store(wall_.load() + std::chrono::duration_cast<WallTime::duration>(d));
  }

 private:
  std::atomic<SteadyTime::duration> steady_{std::chrono::hours(1)};
  std::atomic<WallTime::duration> wall_{std::chrono::seconds(1'700'000'000)};
};

}  // namespace gns
