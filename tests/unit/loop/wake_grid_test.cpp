// The loop's wake grid (loop/wake_grid.hpp): lax periodic deadlines snap to shared points.
#include "loop/wake_grid.hpp"

#include <gtest/gtest.h>

namespace gns {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using T = Clock::SteadyTime;

TEST(WakeGrid, ADeadlineOfAGridOrLongerGoesToTheNearestGridPoint) {
  const T base{std::chrono::hours(5)};  // a grid point
  EXPECT_EQ(SnapToWakeGrid(base + milliseconds(4999), seconds(10)), base);
  EXPECT_EQ(SnapToWakeGrid(base + milliseconds(5000), seconds(10)), base + kWakeGrid) << "a tie goes later";
  EXPECT_EQ(SnapToWakeGrid(base + milliseconds(13700), seconds(60)), base + kWakeGrid);
  EXPECT_EQ(SnapToWakeGrid(base, seconds(30)), base);
}

TEST(WakeGrid, ShorterPeriodsKeepTheirExactDeadline) {
  const T due{std::chrono::hours(5) + milliseconds(1234)};
  EXPECT_EQ(SnapToWakeGrid(due, milliseconds(9999)), due);
  EXPECT_EQ(SnapToWakeGrid(due, milliseconds(100)), due);
}

TEST(WakeGrid, TwoPeriodsOfDifferentPhaseMeetOnTheSamePoints) {
  // A renewal every 10 s that began 3.2 s after a grid point and a 30 s pass that began 7.9 s
  // after one: after the first snap both run on the grid, so every third renewal shares the pass's
  // wake-up instead of each having its own.
  const T base{std::chrono::hours(2)};
  T renew = base + milliseconds(3200);
  T pass = base + milliseconds(7900);
  renew = SnapToWakeGrid(renew + seconds(10), seconds(10));
  pass = SnapToWakeGrid(pass + seconds(30), seconds(30));
  EXPECT_EQ(renew, base + seconds(10));
  EXPECT_EQ(pass, base + seconds(40));
  for (int i = 0; i < 3; ++i) renew = SnapToWakeGrid(renew + seconds(10), seconds(10));
  EXPECT_EQ(renew, pass);
}

TEST(WakeGrid, ATimerOfAGridPeriodStaysOnTheGridAndItsFirstWaitIsHalfToOneAndAHalfGrids) {
  // The heartbeat: each tick snaps now + interval.
  const T base{std::chrono::hours(3)};
  EXPECT_EQ(SnapToWakeGrid(base + milliseconds(100) + kWakeGrid, kWakeGrid), base + kWakeGrid);
  EXPECT_EQ(SnapToWakeGrid(base + milliseconds(5100) + kWakeGrid, kWakeGrid), base + 2 * kWakeGrid);
  const T tick = base + 2 * kWakeGrid;
  EXPECT_EQ(SnapToWakeGrid(tick + milliseconds(3) + kWakeGrid, kWakeGrid), tick + kWakeGrid)
      << "a tick that ran 3 ms late is still followed on the grid";
}

}  // namespace
}  // namespace gns
