// The polled checks as pure parts: each check's evaluator (the fault → its condition; below
// the threshold, or no reading → none; rates over a window), the schedule of the groups, the
// check book (hysteresis for non-fatal conditions, latches for fatal ones) and the verdict that
// lays the conditions over the XID verdict.
#include "modules/gpu_health/check_book.hpp"
#include "modules/gpu_health/health_checks.hpp"
#include "modules/gpu_health/verdict_book.hpp"

#include <gtest/gtest.h>

namespace gns::gpu_health::checks_test {
namespace {

namespace inv = gpu_inventory;
using std::chrono::minutes;
using std::chrono::seconds;

constexpr const char* kUuid = "GPU-11111111-2222-3333-4444-555555555555";
constexpr int64_t kT0 = 1'700'000'000'000;
constexpr int64_t kMinute = 60'000;

inv::GpuHealthReading Gpu() {
  inv::GpuHealthReading gpu;
  gpu.uuid = kUuid;
  gpu.pci_bus_id = "00000000:3B:00.0";
  gpu.index = 1;
  return gpu;
}

const Finding* FindCheck(const Findings& findings, std::string_view check) {
  for (const auto& f : findings) {
    if (f.check == check) return &f;
  }
  return nullptr;
}

// Holds: judged, and the condition holds.
bool Holds(const Findings& findings, std::string_view check) {
  const Finding* f = FindCheck(findings, check);
  return f != nullptr && f->holds.has_value();
}
// Clear: judged, and it does not hold.
bool Clear(const Findings& findings, std::string_view check) {
  const Finding* f = FindCheck(findings, check);
  return f != nullptr && !f->holds.has_value();
}
bool NotJudged(const Findings& findings, std::string_view check) { return FindCheck(findings, check) == nullptr; }

// --- CounterWindow -----------------------------------------------------------------------

TEST(CounterWindow, GrowthWithinTheWindowOnly) {
  CounterWindow w;
  EXPECT_EQ(w.Add(100, kT0, minutes(10)), 0u);
  EXPECT_EQ(w.Add(105, kT0 + 5 * kMinute, minutes(10)), 5u);
  EXPECT_EQ(w.Add(110, kT0 + 10 * kMinute, minutes(10)), 10u);
  // The reading at kT0 left the window: growth since kT0 + 5 min.
  EXPECT_EQ(w.Add(111, kT0 + 11 * kMinute, minutes(10)), 6u);
}

TEST(CounterWindow, ACounterThatWentDownStartsAgain) {
  CounterWindow w;
  w.Add(1000, kT0, minutes(10));
  EXPECT_EQ(w.Add(3, kT0 + kMinute, minutes(10)), 0u);  // reset, not a huge negative growth
  EXPECT_EQ(w.Add(5, kT0 + 2 * kMinute, minutes(10)), 2u);
}

TEST(CounterWindow, BoundedReadings) {
  CounterWindow w;
  for (int i = 0; i < 10'000; ++i) w.Add(static_cast<uint64_t>(i), kT0 + i, std::chrono::hours(1));
  EXPECT_LE(w.size(), CounterWindow::kMaxReadings);
}

// --- memory -------------------------------------------------------------------------------

TEST(MemoryChecks, APendingRemapIsFatalAndAsksForAReset) {
  MemoryChecks checks({});
  auto gpu = Gpu();
  gpu.remapped_rows = inv::RemappedRows{0, 2, true, false};
  const Findings f = checks.Judge(gpu, kT0);
  ASSERT_TRUE(Holds(f, "RowRemapPending"));
  const Condition& c = *FindCheck(f, "RowRemapPending")->holds;
  EXPECT_EQ(c.severity, Severity::kFatal);
  EXPECT_EQ(c.action, RecommendedAction::kComponentReset);
  EXPECT_EQ(c.component, Component::kMemory);
  EXPECT_EQ(c.error_code, "DCGM_FR_PENDING_ROW_REMAP");
  EXPECT_NE(c.message.find(kUuid), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("2 rows remapped for uncorrectable"), std::string::npos) << c.message;
  EXPECT_TRUE(Clear(f, "RowRemapFailed"));
}

TEST(MemoryChecks, AFailedRemapAsksForSupport) {
  MemoryChecks checks({});
  auto gpu = Gpu();
  gpu.remapped_rows = inv::RemappedRows{0, 0, false, true};
  const Findings f = checks.Judge(gpu, kT0);
  ASSERT_TRUE(Holds(f, "RowRemapFailed"));
  EXPECT_EQ(FindCheck(f, "RowRemapFailed")->holds->action, RecommendedAction::kContactSupport);
  EXPECT_TRUE(Clear(f, "RowRemapPending"));
}

TEST(MemoryChecks, NoReadingNoJudgement) {
  MemoryChecks checks({});
  const Findings f = checks.Judge(Gpu(), kT0);  // every memory reading nullopt
  EXPECT_TRUE(f.empty());
}

TEST(MemoryChecks, HealthyRemapperIsJudgedClear) {
  MemoryChecks checks({});
  auto gpu = Gpu();
  gpu.remapped_rows = inv::RemappedRows{3, 0, false, false};
  gpu.remap_histogram = inv::RowRemapHistogram{600, 2, 0, 0, 0};
  const Findings f = checks.Judge(gpu, kT0);
  EXPECT_TRUE(Clear(f, "RowRemapPending"));
  EXPECT_TRUE(Clear(f, "RowRemapFailed"));
  EXPECT_TRUE(Clear(f, "RowRemapSparesExhausted"));
  gpu.remap_histogram->none = 1;
  const Findings g = checks.Judge(gpu, kT0 + kMinute);
  ASSERT_TRUE(Holds(g, "RowRemapSparesExhausted"));
  EXPECT_EQ(FindCheck(g, "RowRemapSparesExhausted")->holds->severity, Severity::kWarning);
}

TEST(MemoryChecks, DisabledChecksSayNothing) {
  MemoryChecks::Settings settings;
  settings.row_remap_pending = false;
  MemoryChecks checks(settings);
  auto gpu = Gpu();
  gpu.remapped_rows = inv::RemappedRows{0, 0, true, false};
  EXPECT_TRUE(NotJudged(checks.Judge(gpu, kT0), "RowRemapPending"));
}

TEST(MemoryChecks, UncorrectableErrorsJudgedByGrowthNotByTheCumulativeValue) {
  MemoryChecks checks({});
  auto gpu = Gpu();
  gpu.ecc.uncorrected_volatile = 4;  // before we started: the XID judge saw its XID 48
  EXPECT_TRUE(NotJudged(checks.Judge(gpu, kT0), "EccUncorrectableVolatile")) << "the first reading is the baseline";
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + kMinute), "EccUncorrectableVolatile"));
  gpu.ecc.uncorrected_volatile = 5;
  const Findings f = checks.Judge(gpu, kT0 + 2 * kMinute);
  ASSERT_TRUE(Holds(f, "EccUncorrectableVolatile"));
  EXPECT_EQ(FindCheck(f, "EccUncorrectableVolatile")->holds->severity, Severity::kFatal);
  EXPECT_EQ(FindCheck(f, "EccUncorrectableVolatile")->holds->error_code, "DCGM_FR_VOLATILE_DBE_DETECTED");
}

TEST(MemoryChecks, CorrectableErrorsAreARateOverTheWindow) {
  MemoryChecks::Settings settings;
  settings.ecc_correctable_rate = RateSetting{true, 1.0, minutes(10)};  // 10 within 10 minutes
  MemoryChecks checks(settings);
  auto gpu = Gpu();
  gpu.ecc.corrected_volatile = 1'000'000;  // a large lifetime count is no rate
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "EccCorrectableRate"));
  gpu.ecc.corrected_volatile = 1'000'009;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + 5 * kMinute), "EccCorrectableRate")) << "9 < 10";
  gpu.ecc.corrected_volatile = 1'000'010;
  const Findings f = checks.Judge(gpu, kT0 + 9 * kMinute);
  ASSERT_TRUE(Holds(f, "EccCorrectableRate"));
  EXPECT_EQ(FindCheck(f, "EccCorrectableRate")->holds->severity, Severity::kWarning);
  // Twenty minutes later with no new error the window holds no growth.
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + 29 * kMinute), "EccCorrectableRate"));
}

TEST(MemoryChecks, RetiredPages) {
  MemoryChecks checks({});
  auto gpu = Gpu();
  gpu.retired_pages = inv::RetiredPages{10, 2, true};
  Findings f = checks.Judge(gpu, kT0);
  EXPECT_TRUE(Holds(f, "RetiredPagesPending"));
  EXPECT_TRUE(Clear(f, "RetiredPagesLimit"));
  gpu.retired_pages = inv::RetiredPages{60, 4, false};
  f = checks.Judge(gpu, kT0 + kMinute);
  EXPECT_TRUE(Clear(f, "RetiredPagesPending"));
  ASSERT_TRUE(Holds(f, "RetiredPagesLimit"));
  EXPECT_EQ(FindCheck(f, "RetiredPagesLimit")->holds->action, RecommendedAction::kContactSupport);
}

// --- NVLink -------------------------------------------------------------------------------

inv::NvLinkReading Link(uint32_t n, bool active, uint64_t replay = 0) {
  inv::NvLinkReading link;
  link.link = n;
  link.active = active;
  link.replay = replay;
  return link;
}

TEST(NvLinkChecks, ALinkDownBesideActiveOnes) {
  NvLinkChecks checks({});
  auto gpu = Gpu();
  gpu.nvlinks = {Link(0, true), Link(1, true), Link(2, false)};
  const Findings f = checks.Judge(gpu, kT0);
  ASSERT_TRUE(Holds(f, "NvLinkDown"));
  const Condition& c = *FindCheck(f, "NvLinkDown")->holds;
  EXPECT_EQ(c.severity, Severity::kNonFatal);
  EXPECT_EQ(c.action, RecommendedAction::kComponentReset);
  EXPECT_NE(c.message.find("NVLink 2 down"), std::string::npos) << c.message;
}

TEST(NvLinkChecks, AGpuWhoseLinksWereNeverUpHasNoNvLinkToLose) {
  NvLinkChecks checks({});
  auto gpu = Gpu();
  gpu.nvlinks = {Link(0, false), Link(1, false)};
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "NvLinkDown"));
  // Once seen up, losing every link is a fault.
  gpu.nvlinks = {Link(0, true), Link(1, true)};
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + kMinute), "NvLinkDown"));
  gpu.nvlinks = {Link(0, false), Link(1, false)};
  EXPECT_TRUE(Holds(checks.Judge(gpu, kT0 + 2 * kMinute), "NvLinkDown"));
}

TEST(NvLinkChecks, NoLinksNoJudgement) {
  NvLinkChecks checks({});
  EXPECT_TRUE(checks.Judge(Gpu(), kT0).empty());
}

TEST(NvLinkChecks, ErrorCountersAreARate) {
  NvLinkChecks::Settings settings;
  settings.error_rate = RateSetting{true, 10.0, minutes(10)};  // 100 within 10 minutes
  NvLinkChecks checks(settings);
  auto gpu = Gpu();
  gpu.nvlinks = {Link(0, true, 5'000'000), Link(1, true, 0)};
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "NvLinkErrorRate")) << "a large cumulative count is no rate";
  gpu.nvlinks = {Link(0, true, 5'000'050), Link(1, true, 49)};
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + kMinute), "NvLinkErrorRate")) << "99 < 100";
  gpu.nvlinks = {Link(0, true, 5'000'051), Link(1, true, 49)};
  const Findings f = checks.Judge(gpu, kT0 + 2 * kMinute);
  ASSERT_TRUE(Holds(f, "NvLinkErrorRate"));
  EXPECT_EQ(FindCheck(f, "NvLinkErrorRate")->holds->severity, Severity::kWarning);
}

// --- fabric -------------------------------------------------------------------------------

inv::FabricReading Fabric(uint8_t state, int32_t status = 0, uint32_t mask = 0) {
  inv::FabricReading f;
  f.state = state;
  f.status = status;
  f.health_mask = mask;
  return f;
}

TEST(FabricChecks, NotSupportedOrMissingIsNoJudgement) {
  FabricChecks checks({});
  auto gpu = Gpu();
  EXPECT_TRUE(checks.Judge(gpu, kT0).empty());
  gpu.fabric = Fabric(0);
  EXPECT_TRUE(checks.Judge(gpu, kT0).empty());
}

TEST(FabricChecks, AFailedRegistration) {
  FabricChecks checks({});
  auto gpu = Gpu();
  gpu.fabric = Fabric(3, 999);
  const Findings f = checks.Judge(gpu, kT0);
  ASSERT_TRUE(Holds(f, "FabricNotRegistered"));
  EXPECT_EQ(FindCheck(f, "FabricNotRegistered")->holds->severity, Severity::kNonFatal);
  EXPECT_TRUE(NotJudged(f, "FabricDegraded")) << "the mask means nothing before registration";
}

TEST(FabricChecks, AnUnfinishedRegistrationGetsItsGrace) {
  FabricChecks::Settings settings;
  settings.registration_grace = minutes(5);
  FabricChecks checks(settings);
  auto gpu = Gpu();
  gpu.fabric = Fabric(2);
  EXPECT_TRUE(NotJudged(checks.Judge(gpu, kT0), "FabricNotRegistered"));
  EXPECT_TRUE(NotJudged(checks.Judge(gpu, kT0 + 4 * kMinute), "FabricNotRegistered"));
  EXPECT_TRUE(Holds(checks.Judge(gpu, kT0 + 5 * kMinute), "FabricNotRegistered"));
  gpu.fabric = Fabric(3, 0, 2);  // completed, DEGRADED_BW false
  const Findings f = checks.Judge(gpu, kT0 + 6 * kMinute);
  EXPECT_TRUE(Clear(f, "FabricNotRegistered"));
  EXPECT_TRUE(Clear(f, "FabricDegraded"));
  EXPECT_TRUE(Clear(f, "FabricRecovery"));
}

TEST(FabricChecks, TheHealthMask) {
  FabricChecks checks({});
  auto gpu = Gpu();
  gpu.fabric = Fabric(3, 0, fabric_mask::kTrue << fabric_mask::kDegradedBwShift);
  Findings f = checks.Judge(gpu, kT0);
  ASSERT_TRUE(Holds(f, "FabricDegraded"));
  EXPECT_EQ(FindCheck(f, "FabricDegraded")->holds->action, RecommendedAction::kRestartBm);
  EXPECT_NE(FindCheck(f, "FabricDegraded")->holds->message.find("degraded bandwidth"), std::string::npos);
  gpu.fabric = Fabric(3, 0, fabric_mask::kTrue << fabric_mask::kRouteRecoveryShift);
  f = checks.Judge(gpu, kT0);
  EXPECT_TRUE(Clear(f, "FabricDegraded"));
  ASSERT_TRUE(Holds(f, "FabricRecovery"));
  EXPECT_EQ(FindCheck(f, "FabricRecovery")->holds->severity, Severity::kWarning);
  gpu.fabric = Fabric(3, 0, 3u << fabric_mask::kIncorrectConfigurationShift);
  EXPECT_TRUE(Holds(checks.Judge(gpu, kT0), "FabricDegraded"));
  gpu.fabric = Fabric(3, 0, 1u << fabric_mask::kIncorrectConfigurationShift);  // NONE
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "FabricDegraded"));
}

// --- PCIe ---------------------------------------------------------------------------------

TEST(PcieChecks, ANarrowerLinkThanBefore) {
  PcieChecks checks({});
  auto gpu = Gpu();
  gpu.pcie.width = 16;
  gpu.pcie.generation = 5;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "PcieLinkDegraded"));
  gpu.pcie.generation = 1;  // idle: a lower generation is power management, not a fault
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + kMinute), "PcieLinkDegraded"));
  gpu.pcie.width = 8;
  const Findings f = checks.Judge(gpu, kT0 + 2 * kMinute);
  ASSERT_TRUE(Holds(f, "PcieLinkDegraded"));
  EXPECT_NE(FindCheck(f, "PcieLinkDegraded")->holds->message.find("x8, expected x16"), std::string::npos);
  EXPECT_EQ(FindCheck(f, "PcieLinkDegraded")->holds->severity, Severity::kNonFatal);
}

TEST(PcieChecks, BelowTheMaximumFromTheFirstReading) {
  PcieChecks checks({});
  auto gpu = Gpu();
  gpu.pcie.width = 8;
  gpu.pcie.max_width = 16;
  EXPECT_TRUE(Holds(checks.Judge(gpu, kT0), "PcieLinkDegraded"));
  gpu.pcie = {};
  EXPECT_TRUE(checks.Judge(gpu, kT0).empty()) << "no PCIe reading: no judgement";
}

TEST(PcieChecks, ReplaysAreARate) {
  PcieChecks::Settings settings;
  settings.replay_rate = RateSetting{true, 8.0, minutes(10)};  // 80 within 10 minutes
  PcieChecks checks(settings);
  auto gpu = Gpu();
  gpu.pcie.replay_counter = 100'000;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "PcieReplayRate"));
  gpu.pcie.replay_counter = 100'079;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + 5 * kMinute), "PcieReplayRate"));
  gpu.pcie.replay_counter = 100'080;
  EXPECT_TRUE(Holds(checks.Judge(gpu, kT0 + 6 * kMinute), "PcieReplayRate"));
}

// --- thermal ------------------------------------------------------------------------------

TEST(ThermalChecks, HwSlowdownAtGpudsRate) {
  ThermalChecks checks({});  // 0.6/min over 10 min: 6 minutes of the last 10
  auto gpu = Gpu();
  gpu.thermal.clock_event_reasons = 0;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "ClockEventHwSlowdown"));
  // Read every 30 s: the reason active for 5.5 minutes is below the rate ...
  int64_t at = kT0;
  gpu.thermal.clock_event_reasons = clock_event::kHwSlowdown;
  for (int i = 0; i < 11; ++i) {
    at += 30'000;
    EXPECT_TRUE(Clear(checks.Judge(gpu, at), "ClockEventHwSlowdown")) << i;
  }
  // ... 6 minutes reach it.
  at += 30'000;
  const Findings f = checks.Judge(gpu, at);
  ASSERT_TRUE(Holds(f, "ClockEventHwSlowdown"));
  EXPECT_EQ(FindCheck(f, "ClockEventHwSlowdown")->holds->severity, Severity::kNonFatal);
  EXPECT_TRUE(Clear(f, "ClockEventHwThermal"));
  EXPECT_TRUE(Clear(f, "ClockEventSwThermal"));
  // Cleared: 10 minutes without the reason.
  gpu.thermal.clock_event_reasons = 0;
  Findings g;
  for (int i = 0; i < 20; ++i) g = checks.Judge(gpu, at += 30'000);
  EXPECT_TRUE(Clear(g, "ClockEventHwSlowdown"));
}

TEST(ThermalChecks, TheRateMeansTheSameAtAnyInterval) {
  ThermalChecks checks({});
  auto gpu = Gpu();
  gpu.thermal.clock_event_reasons = 0;
  checks.Judge(gpu, kT0);
  gpu.thermal.clock_event_reasons = clock_event::kSwThermalSlowdown;
  // Read every 3 minutes: two readings with the reason stand for 6 minutes.
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + 3 * kMinute), "ClockEventSwThermal"));
  const Findings f = checks.Judge(gpu, kT0 + 6 * kMinute);
  ASSERT_TRUE(Holds(f, "ClockEventSwThermal"));
  EXPECT_EQ(FindCheck(f, "ClockEventSwThermal")->holds->severity, Severity::kWarning);
}

TEST(ThermalChecks, Margin) {
  ThermalChecks checks({});
  auto gpu = Gpu();
  EXPECT_TRUE(checks.Judge(gpu, kT0).empty());
  gpu.thermal.gpu_temperature_c = 80;
  gpu.thermal.slowdown_threshold_c = 90;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "ThermalMargin"));
  gpu.thermal.gpu_temperature_c = 85;
  EXPECT_TRUE(Holds(checks.Judge(gpu, kT0), "ThermalMargin"));
  gpu.thermal.gpu_temperature_c = 60;
  gpu.thermal.memory_temperature_c = 93;
  gpu.thermal.memory_max_c = 95;
  const Findings f = checks.Judge(gpu, kT0);
  ASSERT_TRUE(Holds(f, "ThermalMargin"));
  EXPECT_NE(FindCheck(f, "ThermalMargin")->holds->message.find("memory at 93"), std::string::npos);
}

// Power violation time (ns, cumulative) as a share of the window: capped 1 of 10 minutes holds
// (10 %), half a minute does not; a counter that went down (driver reload) starts again.
TEST(ThermalChecks, PowerViolationAsAShareOfTheWindow) {
  ThermalChecks checks({});
  auto gpu = Gpu();
  constexpr uint64_t kSecondNs = 1'000'000'000;
  gpu.thermal.power_violation_ns = 500 * kSecondNs;  // before we started: the baseline
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0), "PowerViolation"));
  gpu.thermal.power_violation_ns = 530 * kSecondNs;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + kMinute), "PowerViolation")) << "30 s of 10 min: 5 %";
  gpu.thermal.power_violation_ns = 560 * kSecondNs;
  const Findings f = checks.Judge(gpu, kT0 + 2 * kMinute);
  ASSERT_TRUE(Holds(f, "PowerViolation")) << "60 s of 10 min: 10 %";
  EXPECT_EQ(FindCheck(f, "PowerViolation")->holds->severity, Severity::kWarning);
  EXPECT_EQ(FindCheck(f, "PowerViolation")->holds->action, RecommendedAction::kNone);
  EXPECT_NE(FindCheck(f, "PowerViolation")->holds->message.find("power-capped 10.00 % of the last 10 min"),
            std::string::npos)
      << FindCheck(f, "PowerViolation")->holds->message;
  // Eleven minutes on with no more violation time: the growth left the window.
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + 13 * kMinute), "PowerViolation"));
  // The counter went down: a new baseline, not a negative growth.
  gpu.thermal.power_violation_ns = 10 * kSecondNs;
  EXPECT_TRUE(Clear(checks.Judge(gpu, kT0 + 14 * kMinute), "PowerViolation"));
  // Not read: no judgement; switched off: none either.
  gpu.thermal.power_violation_ns.reset();
  EXPECT_TRUE(NotJudged(checks.Judge(gpu, kT0 + 15 * kMinute), "PowerViolation"));
  ThermalChecks::Settings off;
  off.power_violation = false;
  ThermalChecks quiet(off);
  gpu.thermal.power_violation_ns = 0;
  EXPECT_TRUE(NotJudged(quiet.Judge(gpu, kT0), "PowerViolation"));
}

// --- presence and host --------------------------------------------------------------------

TEST(PresenceChecks, ALostGpu) {
  auto gpu = Gpu();
  EXPECT_TRUE(Clear(JudgeGpuLost(gpu, {}), "GpuLost"));
  gpu.lost = true;
  const Findings f = JudgeGpuLost(gpu, {});
  ASSERT_TRUE(Holds(f, "GpuLost"));
  EXPECT_EQ(FindCheck(f, "GpuLost")->holds->severity, Severity::kFatal);
  EXPECT_EQ(FindCheck(f, "GpuLost")->holds->action, RecommendedAction::kRestartBm);
}

TEST(PresenceChecks, AGpuMissingFromNvml) {
  EXPECT_FALSE(JudgeMissingFromNvml(std::nullopt, 8, {}).has_value());
  const auto same = JudgeMissingFromNvml(8, 8, {});
  ASSERT_TRUE(same.has_value());
  EXPECT_FALSE(same->holds.has_value());
  const auto missing = JudgeMissingFromNvml(8, 7, {});
  ASSERT_TRUE(missing && missing->holds);
  EXPECT_NE(missing->holds->message.find("1 missing from NVML"), std::string::npos);
}

// The missing GPU by its PCI address: sysfs's form against NVML's, compared as addresses.
TEST(PresenceChecks, AGpuMissingFromNvmlIsNamedByItsPciAddress) {
  const std::vector<std::string> on_bus{"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0"};
  const std::vector<std::string> nvml{"00000000:18:00.0", "00000000:3B:00.0"};
  const auto missing = JudgeMissingFromNvml(3, 2, {}, on_bus, nvml);
  ASSERT_TRUE(missing && missing->holds);
  EXPECT_NE(missing->holds->message.find("1 missing from NVML (not in NVML: 0000:2a:00.0)"), std::string::npos)
      << missing->holds->message;
  EXPECT_EQ(missing->holds->message.find("3b:00.0"), std::string::npos) << "NVML lists it (upper case, 8-digit domain)";
  // Two missing: both named, in the bus's order.
  const auto two = JudgeMissingFromNvml(3, 1, {}, on_bus, {"00000000:3B:00.0"});
  ASSERT_TRUE(two && two->holds);
  EXPECT_NE(two->holds->message.find("(not in NVML: 0000:18:00.0, 0000:2a:00.0)"), std::string::npos)
      << two->holds->message;
  // As many on the bus as NVML knows: clear, whatever the addresses say.
  const auto same = JudgeMissingFromNvml(2, 2, {}, {"0000:18:00.0", "0000:2a:00.0"}, nvml);
  ASSERT_TRUE(same.has_value());
  EXPECT_FALSE(same->holds.has_value());
  // The bus's addresses not read: the counts alone.
  const auto unnamed = JudgeMissingFromNvml(3, 2, {}, {}, nvml);
  ASSERT_TRUE(unnamed && unnamed->holds);
  EXPECT_EQ(unnamed->holds->message.find("not in NVML:"), std::string::npos) << "no addresses: the counts alone";
}

TEST(HealthChecks, TheMissingGpuIsNamedAgainstThePassAndTheInventory) {
  HealthChecks checks(ChecksConfig{});
  inv::HealthSample sample;
  sample.ok = true;
  sample.groups = inv::kHealthHost;
  auto gpu = Gpu();
  gpu.pci_bus_id = "00000000:18:00.0";
  sample.gpus = {gpu};
  sample.pci_gpu_count = 3;
  sample.pci_gpu_addresses = {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0"};
  // 0000:3b:00.0 is out for a reset: in the inventory, not in the pass.
  const auto found = checks.Judge(sample, 2, {"00000000:18:00.0", "00000000:3B:00.0"});
  ASSERT_TRUE(found.node && found.node->holds);
  EXPECT_NE(found.node->holds->message.find("(not in NVML: 0000:2a:00.0)"), std::string::npos)
      << found.node->holds->message;
}

TEST(HostChecks, PersistenceModeOff) {
  auto gpu = Gpu();
  EXPECT_TRUE(JudgeHost(gpu, {}).empty());
  gpu.persistence_mode = true;
  EXPECT_TRUE(Clear(JudgeHost(gpu, {}), "PersistenceModeOff"));
  gpu.persistence_mode = false;
  const Findings f = JudgeHost(gpu, {});
  ASSERT_TRUE(Holds(f, "PersistenceModeOff"));
  EXPECT_EQ(FindCheck(f, "PersistenceModeOff")->holds->severity, Severity::kWarning);
  EXPECT_TRUE(JudgeHost(gpu, HostSettings{false}).empty());
}

// --- the pass: only the groups read --------------------------------------------------------

TEST(HealthChecks, OnlyTheGroupsThePassReadAreJudged) {
  HealthChecks checks(ChecksConfig{});
  inv::HealthSample sample;
  sample.ok = true;
  sample.groups = inv::kHealthThermal;
  sample.taken_unix_ms = kT0;
  auto gpu = Gpu();
  gpu.remapped_rows = inv::RemappedRows{0, 0, true, false};  // stale: not read in this pass
  gpu.thermal.gpu_temperature_c = 89;
  gpu.thermal.slowdown_threshold_c = 90;
  sample.gpus = {gpu};
  auto found = checks.Judge(sample, 1);
  ASSERT_EQ(found.gpus.size(), 1u);
  EXPECT_TRUE(NotJudged(found.gpus[0].findings, "RowRemapPending"));
  EXPECT_TRUE(Holds(found.gpus[0].findings, "ThermalMargin"));
  EXPECT_TRUE(Clear(found.gpus[0].findings, "GpuLost")) << "presence is judged in every pass";
  sample.groups = inv::kHealthMemory;
  found = checks.Judge(sample, 1);
  EXPECT_TRUE(Holds(found.gpus[0].findings, "RowRemapPending"));
}

TEST(HealthChecks, ALostGpusOtherReadingsAreNotJudged) {
  HealthChecks checks(ChecksConfig{});
  inv::HealthSample sample;
  sample.ok = true;
  sample.groups = inv::kHealthAll;
  auto gpu = Gpu();
  gpu.lost = true;
  gpu.remapped_rows = inv::RemappedRows{0, 0, true, false};
  sample.gpus = {gpu};
  sample.pci_gpu_count = 2;
  const auto found = checks.Judge(sample, 2);
  ASSERT_EQ(found.gpus.size(), 1u);
  EXPECT_TRUE(Holds(found.gpus[0].findings, "GpuLost"));
  EXPECT_TRUE(NotJudged(found.gpus[0].findings, "RowRemapPending"));
  // The other GPU is out for a reset (not in the sample) but in the inventory: not missing.
  ASSERT_TRUE(found.node.has_value());
  EXPECT_FALSE(found.node->holds.has_value());
}

// --- the schedule -------------------------------------------------------------------------

TEST(CheckSchedule, OneWakeUpForTheNextGroupDueAndNeighboursRideAlong) {
  using T = CheckSchedule::Time;
  const T t0{std::chrono::hours(1)};
  std::array<std::chrono::milliseconds, 6> intervals{seconds(60), seconds(60), seconds(30),
                                                     seconds(60), seconds(30), std::chrono::milliseconds(0)};
  CheckSchedule schedule(intervals);
  EXPECT_EQ(schedule.Enabled(), 0x1fu);
  ASSERT_TRUE(schedule.NextDue().has_value());
  EXPECT_LE(*schedule.NextDue(), t0) << "never run: due at once";
  EXPECT_EQ(schedule.Due(t0), 0x1fu) << "every enabled group in the first pass; host is off";
  schedule.Ran(0x1f, t0);
  EXPECT_EQ(*schedule.NextDue(), t0 + seconds(30));
  EXPECT_EQ(schedule.Due(t0 + seconds(10)), 0u);
  EXPECT_EQ(schedule.Due(t0 + seconds(30)), inv::kHealthFabric | inv::kHealthThermal);
  schedule.Ran(inv::kHealthFabric | inv::kHealthThermal, t0 + seconds(30));
  EXPECT_EQ(*schedule.NextDue(), t0 + seconds(60));
  EXPECT_EQ(schedule.Due(t0 + seconds(60)), 0x1fu) << "30 s and 60 s groups share the minute's wake-up";
  // A wake-up a little late or early still takes the groups due within a tenth of their interval.
  schedule.Ran(0x1f, t0 + seconds(60));
  EXPECT_EQ(schedule.Due(t0 + seconds(87)), inv::kHealthFabric | inv::kHealthThermal);
}

TEST(CheckSchedule, PassesOfAGridOrLongerLandOnTheLoopsWakeGridAndShortOnesKeepTheirTime) {
  using T = CheckSchedule::Time;
  const T t0{std::chrono::hours(1)};  // a multiple of the 10 s grid
  std::array<std::chrono::milliseconds, 6> intervals{seconds(60), std::chrono::milliseconds(0), seconds(30),
                                                     std::chrono::milliseconds(0), seconds(5),
                                                     std::chrono::milliseconds(0)};
  CheckSchedule schedule(intervals);
  // A pass that ran 3.7 s past a grid point (a start, an NVML event's pass).
  const T ran = t0 + std::chrono::milliseconds(3700);
  schedule.Ran(inv::kHealthMemory | inv::kHealthFabric, ran);
  schedule.Ran(inv::kHealthThermal, ran);
  EXPECT_EQ(*schedule.NextDue(), ran + seconds(5)) << "a 5 s group keeps its own time";
  schedule.Ran(inv::kHealthThermal, ran + seconds(5));
  schedule.Ran(inv::kHealthThermal, ran + seconds(10));
  schedule.Ran(inv::kHealthThermal, ran + seconds(15));
  schedule.Ran(inv::kHealthThermal, ran + seconds(20));
  schedule.Ran(inv::kHealthThermal, ran + seconds(25));
  // 3.7 + 30 = 33.7 s: the nearest grid point is 30 s, where the 30 s group is due.
  EXPECT_EQ(*schedule.NextDue(), t0 + seconds(30));
  EXPECT_EQ(schedule.Due(t0 + seconds(30)) & inv::kHealthFabric, inv::kHealthFabric);
  EXPECT_EQ(schedule.Due(t0 + seconds(30)) & inv::kHealthMemory, 0u) << "the 60 s group is due at 60 s";
  schedule.Ran(inv::kHealthFabric | inv::kHealthThermal, t0 + seconds(30));
  EXPECT_EQ(*schedule.NextDue(), t0 + seconds(35)) << "the 5 s group again";
  schedule.Ran(inv::kHealthThermal, t0 + seconds(35));
  schedule.Ran(inv::kHealthThermal, t0 + seconds(40));
  schedule.Ran(inv::kHealthThermal, t0 + seconds(45));
  schedule.Ran(inv::kHealthThermal, t0 + seconds(50));
  schedule.Ran(inv::kHealthThermal, t0 + seconds(55));
  // 3.7 + 60 = 63.7 s -> 60 s, and the 30 s group from 30 s -> 60 s: one wake-up for both.
  EXPECT_EQ(*schedule.NextDue(), t0 + seconds(60));
  EXPECT_EQ(schedule.Due(t0 + seconds(60)), inv::kHealthMemory | inv::kHealthFabric | inv::kHealthThermal);
}

TEST(CheckSchedule, EveryGroupOff) {
  CheckSchedule schedule({});
  EXPECT_FALSE(schedule.NextDue().has_value());
  EXPECT_EQ(schedule.Enabled(), 0u);
}

// --- the check book -----------------------------------------------------------------------

Finding Holding(std::string check, Severity severity, RecommendedAction action) {
  return Finding{check, Condition{check, Component::kGpu, severity, action, check + " holds", ""}};
}
Finding Cleared(std::string check) { return Finding{std::move(check), std::nullopt}; }

TEST(CheckBook, ANonFatalConditionClearsAfterCleanPasses) {
  CheckBook book(3);
  auto changes = book.Apply(kUuid, "0000:3b:00", {Holding("NvLinkDown", Severity::kNonFatal, RecommendedAction::kComponentReset)}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_TRUE(changes[0].appeared);
  EXPECT_TRUE(book.Apply(kUuid, "", {Holding("NvLinkDown", Severity::kNonFatal, RecommendedAction::kComponentReset)}, kT0 + 1).empty())
      << "still holding: no change";
  EXPECT_TRUE(book.Apply(kUuid, "", {Cleared("NvLinkDown")}, kT0 + 2).empty());
  EXPECT_TRUE(book.Apply(kUuid, "", {Cleared("NvLinkDown")}, kT0 + 3).empty());
  // A flap resets the count.
  EXPECT_TRUE(book.Apply(kUuid, "", {Holding("NvLinkDown", Severity::kNonFatal, RecommendedAction::kComponentReset)}, kT0 + 4).empty());
  EXPECT_TRUE(book.Apply(kUuid, "", {Cleared("NvLinkDown")}, kT0 + 5).empty());
  EXPECT_TRUE(book.Apply(kUuid, "", {Cleared("NvLinkDown")}, kT0 + 6).empty());
  // No judgement (a missing reading) neither holds nor clears.
  EXPECT_TRUE(book.Apply(kUuid, "", {}, kT0 + 7).empty());
  ASSERT_NE(book.Of(kUuid), nullptr);
  changes = book.Apply(kUuid, "", {Cleared("NvLinkDown")}, kT0 + 8);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_FALSE(changes[0].appeared);
  EXPECT_EQ(changes[0].why, "cleared after 3 clean pass(es)");
  EXPECT_EQ(book.Of(kUuid), nullptr);
}

TEST(CheckBook, AFatalConditionIsLatchedUntilHealed) {
  CheckBook book(1);
  book.Apply(kUuid, "", {Holding("RowRemapPending", Severity::kFatal, RecommendedAction::kComponentReset)}, kT0);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(book.Apply(kUuid, "", {Cleared("RowRemapPending")}, kT0 + i).empty());
  ASSERT_NE(book.Of(kUuid), nullptr);
  EXPECT_EQ(book.Fatal().size(), 1u);
  const auto healed = book.Heal(kUuid, "GPU reset occurred");
  ASSERT_EQ(healed.size(), 1u);
  EXPECT_EQ(healed[0].why, "GPU reset occurred");
  EXPECT_EQ(book.Of(kUuid), nullptr);
  EXPECT_TRUE(book.Fatal().empty());
}

TEST(CheckBook, RestoreTakesFatalConditionsOnlyAndNeverOverANewerOne) {
  CheckBook book;
  HeldCondition fatal{Condition{"RowRemapPending", Component::kMemory, Severity::kFatal,
                                RecommendedAction::kComponentReset, "saved", ""},
                      "0000:3b:00", kT0, 0};
  HeldCondition non_fatal = fatal;
  non_fatal.condition.severity = Severity::kNonFatal;
  EXPECT_FALSE(book.Restore(kUuid, non_fatal));
  EXPECT_TRUE(book.Restore(kUuid, fatal));
  EXPECT_FALSE(book.Restore(kUuid, fatal));
  EXPECT_EQ(book.Of(kUuid)->at("RowRemapPending").condition.message, "saved");
}

// --- the combined verdict -----------------------------------------------------------------

TEST(CombinedVerdict, AConditionMakesTheGpuUnhealthyWithItsAction) {
  CheckBook book;
  EXPECT_FALSE(CombinedVerdict(kUuid, nullptr, book.Of(kUuid)).has_value());
  book.Apply(kUuid, "0000:3b:00", {Holding("ThermalMargin", Severity::kWarning, RecommendedAction::kNone)}, kT0);
  EXPECT_FALSE(CombinedVerdict(kUuid, nullptr, book.Of(kUuid)).has_value()) << "a warning leaves the GPU Healthy";
  book.Apply(kUuid, "0000:3b:00", {Holding("RowRemapPending", Severity::kFatal, RecommendedAction::kComponentReset)}, kT0 + 5);
  const auto v = CombinedVerdict(kUuid, nullptr, book.Of(kUuid));
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->healthy);
  EXPECT_EQ(v->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(v->reason, "RowRemapPending: RowRemapPending holds");
  EXPECT_EQ(v->xid, 0u);
  EXPECT_EQ(v->check, "RowRemapPending") << "the verdict names the check that made it";
  EXPECT_EQ(v->pci, "0000:3b:00");
  EXPECT_EQ(v->since_unix_ms, kT0 + 5);
}

TEST(CombinedVerdict, TheHighestRankedActionWinsAndNamesTheReason) {
  VerdictBook xids;
  const DeviceHealth* xid =
      xids.MarkUnhealthy(kUuid, "0000:3b:00", "XID 48 (DBE)", 48, RecommendedAction::kComponentReset, kT0);
  CheckBook book;
  book.Apply(kUuid, "", {Holding("PcieLinkDegraded", Severity::kNonFatal, RecommendedAction::kRestartBm)}, kT0 + 10);
  auto v = CombinedVerdict(kUuid, xid, book.Of(kUuid));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->recommended_action, "RESTART_BM");
  EXPECT_EQ(v->reason, "PcieLinkDegraded: PcieLinkDegraded holds");
  EXPECT_EQ(v->xid, 0u);
  EXPECT_EQ(v->since_unix_ms, kT0) << "Unhealthy since the XID";
  // A condition that ranks lower than the XID leaves the XID's verdict.
  CheckBook milder;
  milder.Apply(kUuid, "", {Holding("NvLinkDown", Severity::kNonFatal, RecommendedAction::kComponentReset)}, kT0 + 10);
  v = CombinedVerdict(kUuid, xid, milder.Of(kUuid));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->reason, "XID 48 (DBE)") << "an XID wins a tie";
  EXPECT_EQ(v->xid, 48u);
  EXPECT_EQ(v->check, "") << "the XID is the cause, not the milder check";
  // Among conditions of one rank, a fatal one names the reason.
  CheckBook two;
  two.Apply(kUuid, "",
            {Holding("NvLinkDown", Severity::kNonFatal, RecommendedAction::kComponentReset),
             Holding("RowRemapPending", Severity::kFatal, RecommendedAction::kComponentReset)},
            kT0);
  v = CombinedVerdict(kUuid, nullptr, two.Of(kUuid));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->reason.rfind("RowRemapPending", 0), 0u) << v->reason;
}

}  // namespace
}  // namespace gns::gpu_health::checks_test
