// XidPolicy: ignore, unknown XIDs, catalog verdicts, critical and threshold overrides,
// the per-(GPU, XID) rate limit, clock steps, and bounded state under floods of identical and
// of distinct occurrences, one occurrence reported by both NVML and the kernel log.
#include "modules/gpu_health/xid_policy.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace gns::gpu_health {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

constexpr const char* kCatalog =
    "version: 1\n"
    "xids:\n"
    "  - {xid: 13, mnemonic: GR_EXCEPTION, description: d, fatal: false, action: RESTART_APP}\n"
    "  - {xid: 31, mnemonic: MMU_ERR_FLT, description: d, fatal: false, action: RESTART_APP}\n"
    "  - {xid: 43, mnemonic: RESETCHANNEL, description: d, fatal: false, action: NONE}\n"
    "  - {xid: 48, mnemonic: ECC_DBE, description: d, fatal: true, action: COMPONENT_RESET}\n"
    "  - {xid: 79, mnemonic: FALLEN_OFF_BUS, description: d, fatal: true, action: RESTART_BM}\n";

constexpr const char* kGpuA = "GPU-455d8f70-2051-db6c-0430-ffc457bff834";
constexpr const char* kGpuB = "GPU-52f37cd4-d92a-7b6d-2b9f-9ab862e27708";

XidPolicy MakePolicy(const std::string& overrides = "") {
  return XidPolicy(XidCatalog::LoadString(kCatalog, "catalog.yaml"),
                   LoadSiteOverridesString(overrides, "site.yaml"));
}

Timestamp At(std::chrono::microseconds t) { return t; }

TEST(XidPolicy, CatalogVerdicts) {
  XidPolicy policy = MakePolicy();

  const XidDecision dbe = policy.Decide(kGpuA, 48, At(seconds(1)));
  EXPECT_EQ(dbe.verdict, Verdict::kFatal);
  EXPECT_EQ(dbe.action, RecommendedAction::kComponentReset);
  EXPECT_TRUE(dbe.known_xid);
  EXPECT_EQ(dbe.mnemonic, "ECC_DBE");
  EXPECT_TRUE(dbe.emit);
  EXPECT_EQ(dbe.suppressed_before, 0u);
  EXPECT_EQ(dbe.threshold, 0u);

  const XidDecision app = policy.Decide(kGpuA, 13, At(seconds(1)));
  EXPECT_EQ(app.verdict, Verdict::kNonFatal);
  EXPECT_EQ(app.action, RecommendedAction::kRestartApp);
  EXPECT_TRUE(app.emit);

  const XidDecision benign = policy.Decide(kGpuA, 43, At(seconds(1)));
  EXPECT_EQ(benign.verdict, Verdict::kNonFatal);
  EXPECT_EQ(benign.action, RecommendedAction::kNone);
}

TEST(XidPolicy, ForgetGpuDropsItsGpuInstancesAndNoOtherGpu) {
  XidPolicy policy = MakePolicy();
  const std::string gi3 = std::string(kGpuA) + "/gi3";  // how the judge keys a GPU instance
  policy.Decide(kGpuA, 48, At(seconds(1)));
  policy.Decide(gi3, 48, At(seconds(1)));
  policy.Decide(kGpuB, 48, At(seconds(1)));
  policy.Decide(std::string(kGpuA) + "x", 48, At(seconds(1)));  // another id with A's as prefix
  ASSERT_EQ(policy.TrackedKeys(), 4u);
  policy.ForgetGpu(kGpuA);
  EXPECT_EQ(policy.TrackedKeys(), 2u);
  // Forgotten: the GPU instance's next occurrence is a first one again (emitted).
  EXPECT_TRUE(policy.Decide(gi3, 48, At(seconds(2))).emit);
  EXPECT_FALSE(policy.Decide(kGpuB, 48, At(seconds(2))).emit);  // kept: within its window
}

TEST(XidPolicy, UnknownXidIsFatalContactSupport) {
  XidPolicy policy = MakePolicy();
  const XidDecision d = policy.Decide(kGpuA, 777, At(seconds(1)));
  EXPECT_FALSE(d.known_xid);
  EXPECT_EQ(d.verdict, Verdict::kFatal);
  EXPECT_EQ(d.action, RecommendedAction::kContactSupport);
  EXPECT_EQ(d.mnemonic, "UNKNOWN_XID");
  EXPECT_TRUE(d.emit);
}

TEST(XidPolicy, IgnoredXidLeavesNoState) {
  XidPolicy policy = MakePolicy("ignore: [48, 777]\n");
  for (int i = 0; i < 1000; ++i) {
    const XidDecision d = policy.Decide(kGpuA, 48, At(seconds(i)));
    EXPECT_EQ(d.verdict, Verdict::kIgnored);
    EXPECT_EQ(d.action, RecommendedAction::kNone);
    EXPECT_FALSE(d.emit);
  }
  EXPECT_EQ(policy.Decide(kGpuA, 777, At(seconds(1))).verdict, Verdict::kIgnored);
  EXPECT_EQ(policy.TrackedKeys(), 0u);
  // Not ignored: still fatal.
  EXPECT_EQ(policy.Decide(kGpuA, 79, At(seconds(1))).verdict, Verdict::kFatal);
}

TEST(XidPolicy, CriticalOverridesTheCatalog) {
  XidPolicy policy = MakePolicy("critical:\n  - 31\n  - {xid: 13, action: RESTART_BM}\n  - 79\n");
  const XidDecision page_fault = policy.Decide(kGpuA, 31, At(seconds(1)));
  EXPECT_EQ(page_fault.verdict, Verdict::kFatal);
  // RESTART_APP does not take the device out of service: a reset does.
  EXPECT_EQ(page_fault.action, RecommendedAction::kComponentReset);
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(1))).action, RecommendedAction::kRestartBm);
  EXPECT_EQ(policy.Decide(kGpuA, 79, At(seconds(1))).action, RecommendedAction::kRestartBm);
}

TEST(XidPolicy, ThresholdCountsWithinTheWindow) {
  XidPolicy policy = MakePolicy("thresholds:\n  - {xid: 13, count: 3, window: 10m}\n");

  XidDecision d = policy.Decide(kGpuA, 13, At(minutes(0)));
  EXPECT_EQ(d.verdict, Verdict::kBelowThreshold);
  EXPECT_EQ(d.action, RecommendedAction::kNone);
  EXPECT_EQ(d.count_in_window, 1u);
  EXPECT_EQ(d.threshold, 3u);
  EXPECT_TRUE(d.emit);

  d = policy.Decide(kGpuA, 13, At(minutes(1)));
  EXPECT_EQ(d.verdict, Verdict::kBelowThreshold);
  EXPECT_EQ(d.count_in_window, 2u);
  EXPECT_FALSE(d.emit);  // same verdict inside the dedup window

  // Another GPU counts on its own.
  d = policy.Decide(kGpuB, 13, At(minutes(1)));
  EXPECT_EQ(d.count_in_window, 1u);
  EXPECT_TRUE(d.emit);

  d = policy.Decide(kGpuA, 13, At(minutes(2)));
  EXPECT_EQ(d.verdict, Verdict::kFatal);
  EXPECT_EQ(d.action, RecommendedAction::kComponentReset);
  EXPECT_EQ(d.count_in_window, 3u);
  EXPECT_TRUE(d.emit);  // an escalation is never held back
  EXPECT_EQ(d.suppressed_before, 1u);

  // At 10m the occurrence from 0m has left the window (it must be strictly inside).
  d = policy.Decide(kGpuA, 13, At(minutes(10)));
  EXPECT_EQ(d.count_in_window, 3u);  // 1m, 2m, 10m
  EXPECT_EQ(d.verdict, Verdict::kFatal);

  // Much later only the new occurrence counts; the dedup window has passed, so it is emitted.
  d = policy.Decide(kGpuA, 13, At(minutes(30)));
  EXPECT_EQ(d.count_in_window, 1u);
  EXPECT_EQ(d.verdict, Verdict::kBelowThreshold);
  EXPECT_TRUE(d.emit);
  EXPECT_EQ(policy.TrackedTimestamps(), 2u);  // one live entry each for GPU A and GPU B
}

TEST(XidPolicy, ThresholdOnAFatalXidDelaysIt) {
  XidPolicy policy = MakePolicy("thresholds:\n  - {xid: 48, count: 2, window: 1h}\n");
  EXPECT_EQ(policy.Decide(kGpuA, 48, At(minutes(0))).verdict, Verdict::kBelowThreshold);
  const XidDecision d = policy.Decide(kGpuA, 48, At(minutes(59)));
  EXPECT_EQ(d.verdict, Verdict::kFatal);
  EXPECT_EQ(d.action, RecommendedAction::kComponentReset);
}

TEST(XidPolicy, DedupEmitsOncePerWindowWithTheSuppressedCount) {
  XidPolicy policy = MakePolicy("dedup_window: 1m\n");
  EXPECT_TRUE(policy.Decide(kGpuA, 79, At(seconds(0))).emit);
  for (int s = 1; s < 60; ++s) EXPECT_FALSE(policy.Decide(kGpuA, 79, At(seconds(s))).emit) << s;
  const XidDecision d = policy.Decide(kGpuA, 79, At(seconds(60)));
  EXPECT_TRUE(d.emit);
  EXPECT_EQ(d.suppressed_before, 59u);
  // A different XID on the same GPU is a different stream.
  EXPECT_TRUE(policy.Decide(kGpuA, 48, At(seconds(61))).emit);
}

TEST(XidPolicy, ClockStepBackDoesNotReopenTheWindow) {
  XidPolicy policy = MakePolicy("dedup_window: 1m\n");
  EXPECT_TRUE(policy.Decide(kGpuA, 48, At(minutes(10))).emit);
  // The clock jumps back an hour: treated as "now", so still inside the window.
  const XidDecision d = policy.Decide(kGpuA, 48, At(minutes(10) - hours(1)));
  EXPECT_FALSE(d.emit);
  EXPECT_TRUE(policy.Decide(kGpuA, 48, At(minutes(11))).emit);
}

TEST(XidPolicy, NvmlAndKernelReportsOfOneOccurrenceCountOnce) {
  XidPolicy policy = MakePolicy("thresholds: [{xid: 13, count: 3, window: 10m}]\n");
  constexpr auto kNvml = XidSource::kNvml;
  constexpr auto kKernel = XidSource::kKernel;
  // Kernel first, NVML 300 ms later (either order): one occurrence.
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(10)), kKernel).count_in_window, 1u);
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(10) + milliseconds(300)), kNvml).verdict, Verdict::kDuplicate);
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(20)), kNvml).count_in_window, 2u);
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(20) - milliseconds(500)), kKernel).verdict, Verdict::kDuplicate);
  // Two real occurrences in quick succession, each seen by both: two, not four, not three.
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(seconds(30)), kKernel).count_in_window, 1u);
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(seconds(30) + milliseconds(100)), kKernel).count_in_window, 2u);
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(seconds(30) + milliseconds(400)), kNvml).verdict, Verdict::kDuplicate);
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(seconds(30) + milliseconds(450)), kNvml).verdict, Verdict::kDuplicate);
  // A third occurrence reaches the threshold: the fold did not hide real ones.
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(seconds(31)), kNvml).verdict, Verdict::kFatal);
}

TEST(XidPolicy, SameSourceTwiceOrOtherSourceTooLateAreTwoOccurrences) {
  XidPolicy policy = MakePolicy("thresholds: [{xid: 13, count: 5, window: 10m}]\ncross_source_window: 1s\n");
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(10)), XidSource::kNvml).count_in_window, 1u);
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(seconds(10)), XidSource::kNvml).count_in_window, 2u);
  // 1.5 s after the last NVML report: outside the window, a new occurrence.
  EXPECT_EQ(policy.Decide(kGpuA, 13, At(milliseconds(11500)), XidSource::kKernel).count_in_window, 3u);
  // Another GPU or another XID never matches.
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(milliseconds(11600)), XidSource::kNvml).verdict, Verdict::kBelowThreshold);
  EXPECT_EQ(policy.Decide(kGpuA, 48, At(milliseconds(11600)), XidSource::kNvml).verdict, Verdict::kFatal);
}

TEST(XidPolicy, UnmatchedReportsOfASilentSourceStayBounded) {
  XidPolicy policy = MakePolicy();
  // NVML reports a flood the kernel log never echoes: only the newest few wait for a match.
  for (int i = 0; i < 1000; ++i) policy.Decide(kGpuA, 13, At(seconds(100) + milliseconds(i)), XidSource::kNvml);
  int duplicates = 0;
  for (int i = 0; i < 10; ++i) {
    duplicates += policy.Decide(kGpuA, 13, At(seconds(101)), XidSource::kKernel).verdict == Verdict::kDuplicate;
  }
  EXPECT_EQ(duplicates, static_cast<int>(XidPolicy::kMaxUnmatched));
}

TEST(XidPolicy, ForgetGpuRestartsItsCounts) {
  XidPolicy policy = MakePolicy("thresholds:\n  - {xid: 13, count: 2, window: 10m}\n");
  (void)policy.Decide(kGpuA, 13, At(minutes(0)));
  (void)policy.Decide(kGpuA, 48, At(minutes(0)));
  (void)policy.Decide(kGpuB, 13, At(minutes(0)));
  EXPECT_EQ(policy.TrackedKeys(), 3u);
  policy.ForgetGpu(kGpuA);
  EXPECT_EQ(policy.TrackedKeys(), 1u);
  const XidDecision d = policy.Decide(kGpuA, 13, At(minutes(1)));
  EXPECT_EQ(d.count_in_window, 1u);  // the reset wiped the earlier occurrence
  EXPECT_TRUE(d.emit);
  EXPECT_EQ(policy.Decide(kGpuB, 13, At(minutes(1))).verdict, Verdict::kFatal);
}

TEST(XidPolicy, MillionIdenticalEventsStayBounded) {
  XidPolicy policy = MakePolicy("dedup_window: 5m\n");
  constexpr int kEvents = 1'000'000;
  int emitted = 0;
  uint64_t reported_suppressed = 0;
  for (int i = 0; i < kEvents; ++i) {
    // One per millisecond: 1000 s of flood, i.e. windows starting at 0, 300, 600 and 900 s.
    const XidDecision d = policy.Decide(kGpuA, 48, At(milliseconds(i)));
    if (d.emit) {
      ++emitted;
      reported_suppressed += d.suppressed_before;
    }
  }
  EXPECT_EQ(emitted, 4);
  // Everything not emitted is accounted for, apart from the tail still waiting for the next
  // emission (from 900 s to the end).
  EXPECT_EQ(reported_suppressed, 3u * 299'999u);
  EXPECT_EQ(policy.TrackedKeys(), 1u);
  EXPECT_EQ(policy.TrackedTimestamps(), 0u);
}

TEST(XidPolicy, MillionIdenticalThresholdEventsStayBounded) {
  XidPolicy policy =
      MakePolicy("thresholds:\n  - {xid: 13, count: 3, window: 10m}\ndedup_window: 5m\n");
  int emitted = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    if (policy.Decide(kGpuA, 13, At(milliseconds(i))).emit) ++emitted;
  }
  // Below threshold at 0 ms, escalation to fatal at 2 ms, then one per window (300, 600, 900 s).
  EXPECT_EQ(emitted, 5);
  EXPECT_EQ(policy.TrackedKeys(), 1u);
  EXPECT_EQ(policy.TrackedTimestamps(), 3u);  // the ring never grows past the count
}

TEST(XidPolicy, FloodOfDistinctKeysIsCapped) {
  XidPolicy policy = MakePolicy("thresholds:\n  - {xid: 13, count: 5, window: 1h}\n");
  constexpr std::size_t kGpus = 200'000;
  for (std::size_t i = 0; i < kGpus; ++i) {
    (void)policy.Decide("0000:" + std::to_string(i), 13, At(seconds(static_cast<int64_t>(i))));
  }
  EXPECT_EQ(policy.TrackedKeys(), XidPolicy::kMaxTrackedKeys);
  EXPECT_EQ(policy.Evictions(), kGpus - XidPolicy::kMaxTrackedKeys);
  EXPECT_LE(policy.TrackedTimestamps(), XidPolicy::kMaxTrackedKeys * 5);
  // The most recent GPU survived the evictions and still has its count.
  const XidDecision d =
      policy.Decide("0000:" + std::to_string(kGpus - 1), 13, At(seconds(kGpus)));
  EXPECT_EQ(d.count_in_window, 2u);
}

}  // namespace
}  // namespace gns::gpu_health
