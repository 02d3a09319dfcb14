#pragma once
// One grid of the steady clock that lax periodic work at rest snaps its deadlines to, so that
// timers due near each other fire in one wake-up of the loop instead of one each (the kernel's
// round_jiffies, for our own timers).
//
// At rest the loop wakes for little besides its own periodic work: the heartbeat, a leader lease
// renewal, the polled GPU checks, gpu-inventory's refresh. Each had its own phase, so each was a
// wake-up of its own. Work whose period is at least the grid may run up to half a grid early or
// late without harm (a 10 s lease renewal inside a 20 s renew deadline, a 60 s check): it snaps
// to the nearest grid point, and every such timer due at that point fires in the same wake-up.
// Shorter periods (tests, `make run`'s quick checks) keep their exact deadlines.

#include "loop/clock.hpp"

#include <chrono>

namespace gns {

inline constexpr std::chrono::milliseconds kWakeGrid{10000};

// The grid point nearest to `due` (ties go later) when `period` is at least the grid; `due`
// itself otherwise. Grid points are the multiples of kWakeGrid since the clock's epoch, so every
// caller of one clock lands on the same points.
inline Clock::SteadyTime SnapToWakeGrid(Clock::SteadyTime due, std::chrono::nanoseconds period) {
  if (period < kWakeGrid) return due;
  const auto grid = std::chrono::duration_cast<Clock::SteadyTime::duration>(kWakeGrid);
  const auto since_epoch = due.time_since_epoch();
  auto below = since_epoch - since_epoch % grid;
  if (since_epoch % grid < Clock::SteadyTime::duration::zero()) below -= grid;  // (before the epoch)
  const auto above = below + grid;
  return Clock::SteadyTime(since_epoch - below < above - since_epoch ? below : above);
}

}  // namespace gns
