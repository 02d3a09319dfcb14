// The XID policy's rules beyond one occurrence (issue 26): escalation across boots (the boot
// history, through a checkpoint and a kill -9), cancellation (`clears`: 163 clears 162), the
// lookback window, and the site's per-XID keys in the catalog's format. Times are passed in.
#include "modules/gpu_health/health_checkpoint.hpp"
#include "modules/gpu_health/verdict_book.hpp"
#include "modules/gpu_health/xid_boot_history.hpp"
#include "modules/gpu_health/xid_judge.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

// A namespace of its own: the test group is one unity unit with the judge's test.
namespace gns::gpu_health::policy_rules_test {
namespace {

constexpr const char* kA = "GPU-455d8f70-2051-db6c-0430-ffc457bff834";  // 0000:03:00
constexpr const char* kB = "GPU-00000000-0000-0000-0000-00000000000b";  // 0000:3b:00
constexpr int64_t kDay = 24LL * 3600 * 1000;
constexpr int64_t kT0 = 1'700'000'000'000;  // ms

std::string Boot(char c) { return std::string(32, c); }

gpu_inventory::GpuInfo Gpu(const char* uuid, const char* bus_id) {
  gpu_inventory::GpuInfo g;
  g.uuid = uuid;
  g.pci_bus_id = bus_id;
  g.pci = *gpu_inventory::PciAddress::Parse(bus_id);
  return g;
}

std::string XidLine(const char* pci, uint32_t xid) {
  return "NVRM: Xid (PCI:" + std::string(pci) + "): " + std::to_string(xid) + ", pid=1, name=x, detail";
}

// A judge, as the module wires it, that can "crash" (be dropped) and come back from a checkpoint.
class Rules : public ::testing::Test {
 protected:
  Rules() : log_("judge", std::make_shared<spdlog::sinks::null_sink_mt>()) {}

  void Make(SiteOverrides overrides = {}, const HealthCheckpoint* from = nullptr) {
    overrides_ = std::move(overrides);
    judge_ = std::make_unique<XidJudge>(
        XidCatalog::Builtin(), overrides_, XidJudge::Settings{"gpu-node-supervisor", "SysLogsXIDError", "node1"}, log_,
        XidJudge::Outputs{[this](const DeviceHealth& h) {
                            verdicts_.push_back(h);
                            // What the module's checkpoint would hold at this verdict (the
                            // snapshot is taken before any effect leaves the process).
                            at_effect_ = Checkpoint();
                          },
                          [this](HealthEvent e, XidJudge::KubeEvent k) {
                            events_.push_back(std::move(e));
                            kinds_.emplace_back(k.reason);
                          },
                          [](std::string_view, uint32_t, uint64_t) {}, [](std::string_view, std::string_view) {},
                          [] {}, [] {}, [] {}, nullptr, [this](uint32_t) { ++beyond_; }});
    judge_->OnInventory({Gpu(kA, "00000000:03:00.0"), Gpu(kB, "00000000:3B:00.0")}, kT0);
    if (from != nullptr) {
      judge_->RestoreBootHistory(from->xid_boots);
      for (const auto& d : from->devices) {
        const auto held = from->held_by.find(d.RetainKey());
        judge_->Restore(d, held != from->held_by.end() ? &held->second : nullptr);
      }
      judge_->RestoreCounts(from->xid_counts);
    }
  }
  HealthCheckpoint Checkpoint() const {
    HealthCheckpoint c;
    c.boot_id = boot_;
    c.devices = judge_->Verdicts().All();
    for (const auto& d : c.devices) {
      if (const auto& held = judge_->Verdicts().HeldBy(d.RetainKey()); !held.empty()) c.held_by[d.RetainKey()] = held;
    }
    c.xid_counts = judge_->Counts().All();
    c.xid_boots = judge_->BootHistory().All();
    return c;
  }
  // Serialized and parsed back, as a restart reads the file.
  static HealthCheckpoint RoundTrip(const HealthCheckpoint& c) {
    std::string error;
    auto back = HealthCheckpoint::Parse(c.Serialize(), error);
    EXPECT_TRUE(back.has_value()) << error;
    return back.value_or(HealthCheckpoint{});
  }
  void NewBoot(char c, int64_t now) {
    boot_ = Boot(c);
    judge_->OnNewBoot(boot_, now);
  }
  void FirstBoot(char c) {
    boot_ = Boot(c);
    judge_->SetBoot(boot_);
  }
  // A kernel line logged at `at_ms`, read at `now_ms`.
  void Line(const char* pci, uint32_t xid, int64_t at_ms, int64_t now_ms) {
    judge_->OnKernelLine(XidLine(pci, xid), static_cast<uint64_t>(at_ms) * 1000, false, now_ms);
  }
  std::string Action(const char* uuid) {
    const DeviceHealth* h = judge_->Verdicts().Find(uuid);
    return h == nullptr || h->healthy ? "healthy" : h->recommended_action;
  }

  spdlog::logger log_;
  SiteOverrides overrides_;
  std::unique_ptr<XidJudge> judge_;
  std::string boot_;
  std::vector<DeviceHealth> verdicts_;
  std::vector<HealthEvent> events_;
  std::vector<std::string> kinds_;
  std::optional<HealthCheckpoint> at_effect_;
  int beyond_ = 0;
};

// --- escalation across boots --------------------------------------------------------------

TEST_F(Rules, ResetClassXidInMoreBootsThanTheThresholdAsksForHardwareInspection) {
  Make();
  FirstBoot('a');
  Line("0000:03:00", 79, kT0, kT0);  // RESTART_BM, boot 1
  EXPECT_EQ(Action(kA), "RESTART_BM");
  NewBoot('b', kT0 + kDay);
  Line("0000:03:00", 79, kT0 + kDay, kT0 + kDay);  // boot 2: not yet (boots: 2)
  EXPECT_EQ(Action(kA), "RESTART_BM");
  NewBoot('c', kT0 + 2 * kDay);
  Line("0000:03:00", 79, kT0 + 2 * kDay, kT0 + 2 * kDay);  // boot 3: more than 2
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
  ASSERT_FALSE(events_.empty());
  const HealthEvent& e = events_.back();
  EXPECT_EQ(e.recommended_action_name, "CONTACT_SUPPORT");
  EXPECT_EQ(e.recommended_action, static_cast<int>(RecommendedAction::kContactSupport));
  EXPECT_NE(e.message.find("XID 79 in 3 boots within 7d: hardware inspection instead of RESTART_BM"), std::string::npos)
      << e.message;
  EXPECT_NE(judge_->Verdicts().Find(kA)->reason.find("3 boots within 7d"), std::string::npos);
  // Another GPU and another XID have histories of their own.
  Line("0000:3b:00", 79, kT0 + 2 * kDay, kT0 + 2 * kDay);
  EXPECT_EQ(Action(kB), "RESTART_BM");
  Line("0000:03:00", 48, kT0 + 2 * kDay, kT0 + 2 * kDay);  // COMPONENT_RESET ranks lower: verdict stays
  EXPECT_EQ(events_.back().recommended_action_name, "CONTACT_SUPPORT");
}

TEST_F(Rules, OccurrencesInOneBootAndResetsDoNotEscalate) {
  Make();
  FirstBoot('a');
  for (int i = 0; i < 10; ++i) {
    Line("0000:03:00", 48, kT0 + i * 1000, kT0 + i * 1000);
    judge_->OnKernelLine(std::string("GPU reset occurred: ") + kA, 1, true, kT0 + i * 1000 + 1);
  }
  Line("0000:03:00", 48, kT0 + 20'000, kT0 + 20'000);
  EXPECT_EQ(Action(kA), "COMPONENT_RESET");  // one boot, however many resets
  EXPECT_EQ(judge_->BootHistory().BootsWithin(kA, 48, kT0 + 20'000, std::chrono::hours(1)), 1u);
}

TEST_F(Rules, BootsOutsideTheWindowDoNotCount) {
  Make();
  FirstBoot('a');
  Line("0000:03:00", 79, kT0, kT0);
  NewBoot('b', kT0 + 3 * kDay);
  Line("0000:03:00", 79, kT0 + 3 * kDay, kT0 + 3 * kDay);
  NewBoot('c', kT0 + 8 * kDay);  // boot a's occurrence is 8 days old: outside 7d
  Line("0000:03:00", 79, kT0 + 8 * kDay, kT0 + 8 * kDay);
  EXPECT_EQ(Action(kA), "RESTART_BM");
  NewBoot('d', kT0 + 9 * kDay);  // b, c, d within 7d: 3 boots
  Line("0000:03:00", 79, kT0 + 9 * kDay, kT0 + 9 * kDay);
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
}

TEST_F(Rules, TheBootHistorySurvivesARestartAndAKillAtTheEffect) {
  Make();
  FirstBoot('a');
  Line("0000:03:00", 46, kT0, kT0);  // COMPONENT_RESET
  // kill -9 right as the verdict left: the checkpoint taken for it already holds the boot.
  ASSERT_TRUE(at_effect_.has_value());
  const HealthCheckpoint crashed = RoundTrip(*at_effect_);
  ASSERT_EQ(crashed.xid_boots.size(), 1u);
  EXPECT_EQ(crashed.xid_boots[0].boots.at(0).boot_id, Boot('a'));

  // Boot b, a new process from that file (the verdicts are boot a's, the history is kept).
  Make({}, &crashed);
  NewBoot('b', kT0 + kDay);
  Line("0000:03:00", 46, kT0 + kDay, kT0 + kDay);
  EXPECT_EQ(Action(kA), "COMPONENT_RESET");
  // A clean restart in boot b, then boot c.
  const HealthCheckpoint saved = RoundTrip(Checkpoint());
  Make({}, &saved);
  NewBoot('c', kT0 + 2 * kDay);
  Line("0000:03:00", 46, kT0 + 2 * kDay, kT0 + 2 * kDay);
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");

  // Without the history (a fresh start in boot c) the same line would not have escalated.
  Make();
  NewBoot('c', kT0 + 2 * kDay);
  Line("0000:03:00", 46, kT0 + 2 * kDay, kT0 + 2 * kDay);
  EXPECT_EQ(Action(kA), "COMPONENT_RESET");
}

TEST_F(Rules, EscalationIsPerXidAndSiteOverridable) {
  SiteOverrides site = LoadSiteOverridesString(
      "xids:\n"
      "  - {xid: 79, escalation: {boots: 1, window: 2d}}\n"
      "  - {xid: 46, escalation: false}\n",
      "site.yaml");
  Make(site);
  FirstBoot('a');
  Line("0000:03:00", 79, kT0, kT0);
  Line("0000:3b:00", 46, kT0, kT0);
  NewBoot('b', kT0 + kDay);
  Line("0000:03:00", 79, kT0 + kDay, kT0 + kDay);  // 2 boots > 1
  Line("0000:3b:00", 46, kT0 + kDay, kT0 + kDay);
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
  EXPECT_NE(events_.at(events_.size() - 2).message.find("XID 79 in 2 boots within 2d"), std::string::npos);
  NewBoot('c', kT0 + 2 * kDay);
  Line("0000:3b:00", 46, kT0 + 2 * kDay, kT0 + 2 * kDay);
  EXPECT_EQ(Action(kB), "COMPONENT_RESET");  // never escalates
}

TEST(XidBootHistory, IsBounded) {
  XidBootHistory h;
  for (int boot = 0; boot < 40; ++boot) {
    EXPECT_LE(h.Record(kA, 79, Boot(static_cast<char>('a' + boot % 26)) + std::to_string(boot), kT0 + boot,
                       std::chrono::hours(1)),
              XidBootHistory::kMaxBoots);
  }
  EXPECT_EQ(h.All().at(0).boots.size(), XidBootHistory::kMaxBoots);
  for (uint32_t gpu = 0; gpu < 2 * XidBootHistory::kMaxKeys; ++gpu) {
    h.Record("GPU-" + std::to_string(gpu), 79, Boot('a'), kT0 + 1000 + gpu, std::chrono::hours(1));
  }
  EXPECT_EQ(h.size(), XidBootHistory::kMaxKeys);
  EXPECT_EQ(h.Record(kA, 79, "", kT0, std::chrono::hours(1)), 0u);  // no boot: nothing recorded
}

TEST(XidBootHistory, TheCheckpointKeysAreOptionalAndValidated) {
  const std::string head =
      "{\"version\":2,\"bootId\":\"\",\"journal\":{\"bootId\":\"\",\"cursor\":\"\",\"monotonicUsec\":0,"
      "\"realtimeUsec\":0},\"xidCounts\":[],";
  const std::string device =
      "{\"uuid\":\"GPU-1\",\"healthy\":false,\"reason\":\"r\",\"xid\":162,\"recommendedAction\":"
      "\"CONTACT_SUPPORT\",\"sinceUnixMs\":1,\"pci\":\"\"";
  std::string error;
  // Files written before these keys read as before: no holders (the verdict's XID), no history.
  const auto old = HealthCheckpoint::Parse(head + "\"devices\":[" + device + "}]}", error);
  ASSERT_TRUE(old) << error;
  EXPECT_TRUE(old->held_by.empty());
  EXPECT_TRUE(old->xid_boots.empty());
  VerdictBook book;
  ASSERT_TRUE(book.Restore(old->devices.at(0), nullptr));
  EXPECT_EQ(book.HeldBy("GPU-1"), std::vector<uint32_t>{162});
  const auto good = HealthCheckpoint::Parse(head + "\"devices\":[" + device + ",\"heldBy\":[48,162]}],"
                                            "\"xidBoots\":[{\"gpu\":\"GPU-1\",\"xid\":79,\"boots\":[{\"bootId\":"
                                            "\"ab\",\"lastUnixMs\":5}]}]}", error);
  ASSERT_TRUE(good) << error;
  EXPECT_EQ(good->held_by.at("GPU-1"), (std::vector<uint32_t>{48, 162}));
  ASSERT_EQ(good->xid_boots.size(), 1u);
  EXPECT_EQ(good->xid_boots[0].boots.at(0), (XidBootHistory::Boot{"ab", 5}));
  for (const std::string& bad : {
           head + "\"devices\":[" + device + ",\"heldBy\":[\"x\"]}]}",
           head + "\"devices\":[" + device + ",\"heldBy\":7}]}",
           head + "\"devices\":[],\"xidBoots\":{}}",
           head + "\"devices\":[],\"xidBoots\":[{\"gpu\":\"g\",\"xid\":79}]}",
           head + "\"devices\":[],\"xidBoots\":[{\"gpu\":\"g\",\"xid\":79,\"boots\":[{\"bootId\":\"\","
                  "\"lastUnixMs\":1}]}]}",
       }) {
    EXPECT_FALSE(HealthCheckpoint::Parse(bad, error)) << bad;
  }
}

// --- cancellation: clears -------------------------------------------------------------------

TEST_F(Rules, Xid163ClearsThe162VerdictOnTheSameGpu) {
  Make();
  FirstBoot('a');
  Line("0000:03:00", 162, kT0, kT0);
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
  Line("0000:03:00", 163, kT0 + 1000, kT0 + 1000);
  EXPECT_EQ(Action(kA), "healthy");
  ASSERT_FALSE(verdicts_.empty());
  EXPECT_TRUE(verdicts_.back().healthy);
  EXPECT_EQ(verdicts_.back().reason, "XID 163 (XID_163) clears XID 162");
  const HealthEvent& e = events_.back();
  EXPECT_TRUE(e.is_healthy);
  EXPECT_EQ(e.error_code, std::vector<std::string>{"163"});
  EXPECT_EQ(e.entities_impacted.back().value, kA);
  EXPECT_EQ(kinds_.back(), "GpuXidCleared");
}

TEST_F(Rules, Xid163DoesNotClearAnotherGpuOrAnotherXidOrAGpuStillHeld) {
  Make();
  FirstBoot('a');
  Line("0000:03:00", 162, kT0, kT0);
  Line("0000:3b:00", 163, kT0 + 1, kT0 + 1);  // another GPU
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
  Line("0000:3b:00", 48, kT0 + 2, kT0 + 2);
  Line("0000:3b:00", 163, kT0 + 3, kT0 + 3);  // another XID
  EXPECT_EQ(Action(kB), "COMPONENT_RESET");
  // 162 and 48 both hold A: 163 releases 162 only.
  Line("0000:03:00", 48, kT0 + 4, kT0 + 4);
  Line("0000:03:00", 163, kT0 + 5, kT0 + 5);
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
  EXPECT_EQ(judge_->Verdicts().HeldBy(kA), std::vector<uint32_t>{48});
}

TEST_F(Rules, Xid163ClearsA162VerdictRestoredFromTheCheckpoint) {
  Make();
  FirstBoot('a');
  Line("0000:03:00", 162, kT0, kT0);
  const HealthCheckpoint saved = RoundTrip(Checkpoint());
  EXPECT_EQ(saved.held_by.at(kA), std::vector<uint32_t>{162});
  Make({}, &saved);  // restart, same boot
  FirstBoot('a');
  EXPECT_EQ(Action(kA), "CONTACT_SUPPORT");
  Line("0000:03:00", 163, kT0 + 1000, kT0 + 1000);
  EXPECT_EQ(Action(kA), "healthy");
}

TEST_F(Rules, ClearsDropTheClearedXidsThresholdCounts) {
  SiteOverrides site = LoadSiteOverridesString(
      "xids:\n"
      "  - {xid: 13, threshold: {count: 2, window: 1h}}\n"
      "  - {xid: 163, clears: [162, 13]}\n",
      "site.yaml");
  Make(site);
  FirstBoot('a');
  Line("0000:03:00", 13, kT0, kT0);
  Line("0000:03:00", 163, kT0 + 1, kT0 + 1);  // the count of 13 starts again
  Line("0000:03:00", 13, kT0 + 2, kT0 + 2);
  EXPECT_EQ(Action(kA), "healthy");
  Line("0000:03:00", 13, kT0 + 3, kT0 + 3);
  EXPECT_EQ(Action(kA), "COMPONENT_RESET");  // two within the hour: fatal, with a reset
  EXPECT_TRUE(judge_->Verdicts().IsUnhealthy(kA));
}

// --- lookback -------------------------------------------------------------------------------

TEST_F(Rules, OccurrencesOlderThanTheLookbackAreCountedNotActedOn) {
  SiteOverrides site = LoadSiteOverridesString("defaults: {lookback: 24h}\nxids:\n  - {xid: 48, lookback: 1h}\n",
                                               "site.yaml");
  Make(site);
  FirstBoot('a');
  const int64_t now = kT0 + 2 * kDay;
  Line("0000:03:00", 79, now - kDay - 1000, now);  // 24h and a second ago: history only
  Line("0000:03:00", 48, now - 2 * 3600 * 1000, now);  // 2h ago, 48's lookback is 1h
  EXPECT_EQ(Action(kA), "healthy");
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(beyond_, 2);
  EXPECT_EQ(judge_->Counts().Get(kA, 79), 1u);
  EXPECT_EQ(judge_->Counts().Get(kA, 48), 1u);
  EXPECT_EQ(judge_->BootHistory().BootsWithin(kA, 79, now, std::chrono::hours(48)), 1u);  // kept for escalation
  Line("0000:03:00", 79, now - kDay + 1000, now);  // within 24h: acted on
  EXPECT_EQ(Action(kA), "RESTART_BM");
}

TEST_F(Rules, WithoutALookbackEveryOccurrenceReadIsActedOn) {
  Make();  // the built-in catalog sets none
  FirstBoot('a');
  Line("0000:03:00", 79, kT0, kT0 + 6 * kDay);
  EXPECT_EQ(Action(kA), "RESTART_BM");
  EXPECT_EQ(beyond_, 0);
}

// --- the site's per-XID keys ----------------------------------------------------------------

TEST(SiteXids, LayOverTheCatalogsEntries) {
  const SiteOverrides site = LoadSiteOverridesString(
      "defaults: {escalation: {boots: 3, window: 5d}, lookback: 12h}\n"
      "xids:\n"
      "  - {xid: 31, fatal: true}\n"                      // RESTART_APP → a reset
      "  - {xid: 79, action: RESTART_VM}\n"
      "  - {xid: 48, action: NONE}\n"                     // no longer fatal
      "  - {xid: 1000, mnemonic: FUTURE, fatal: true, action: RESTART_BM, clears: [999]}\n"
      "  - {xid: 13, threshold: {count: 3, window: 10m}, lookback: 1h}\n",
      "site.yaml");
  const XidPolicy policy(XidCatalog::Builtin(), site);
  const XidCatalog& c = policy.catalog();
  EXPECT_TRUE(c.Find(31)->fatal);
  EXPECT_EQ(c.Find(31)->action, RecommendedAction::kComponentReset);
  EXPECT_EQ(c.Find(79)->action, RecommendedAction::kRestartVm);
  EXPECT_TRUE(c.Find(79)->fatal);
  EXPECT_FALSE(c.Find(48)->fatal);
  EXPECT_EQ(c.Find(1000)->mnemonic, "FUTURE");
  EXPECT_EQ(c.Find(1000)->clears, std::vector<uint32_t>{999});
  EXPECT_EQ(c.Find(13)->threshold->count, 3u);
  EXPECT_EQ(c.LookbackFor(13), std::chrono::hours(1));
  EXPECT_EQ(c.LookbackFor(79), std::chrono::hours(12));
  EXPECT_EQ(c.EscalationFor(79), (XidEscalation{true, 3, std::chrono::hours(5 * 24)}));
  // The built-in catalog itself: 2 boots in 7 days, no lookback, 163 clears 162.
  EXPECT_EQ(XidCatalog::Builtin().EscalationFor(79), (XidEscalation{true, 2, std::chrono::hours(7 * 24)}));
  EXPECT_EQ(XidCatalog::Builtin().LookbackFor(79), std::nullopt);
  EXPECT_EQ(XidCatalog::Builtin().Find(163)->clears, std::vector<uint32_t>{162});
  EXPECT_TRUE(XidCatalog::Builtin().Find(162)->fatal);
  EXPECT_FALSE(XidCatalog::Builtin().Find(163)->fatal);
}

TEST(SiteXids, ACatalogFileCarriesThePolicyKeysAndDefaults) {
  const XidCatalog site = XidCatalog::LoadString(
      "version: 1\n"
      "defaults: {lookback: 2h}\n"
      "xids:\n"
      "  - {xid: 79, mnemonic: M, description: d, fatal: true, action: RESTART_BM,\n"
      "     escalation: {boots: 4, window: 3d}, clears: [45]}\n",
      "site-catalog.yaml");
  const XidCatalog laid = XidCatalog::Builtin().LaidOver(site);
  EXPECT_EQ(laid.EscalationFor(79), (XidEscalation{true, 4, std::chrono::hours(72)}));
  EXPECT_EQ(laid.EscalationFor(46), (XidEscalation{true, 2, std::chrono::hours(7 * 24)}));  // built-in default
  EXPECT_EQ(laid.LookbackFor(46), std::chrono::hours(2));
  EXPECT_EQ(laid.Find(79)->clears, std::vector<uint32_t>{45});
}

std::string Error(const std::string& yaml) {
  try {
    (void)LoadSiteOverridesString(yaml, "site.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string CatalogError(const std::string& yaml) {
  try {
    (void)XidCatalog::LoadString(yaml, "cat.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SiteXids, EveryBadKeyIsReportedWhereItIs) {
  EXPECT_EQ(Error("xids:\n  - {xid: 79, escalation: {boots: 0, window: 7d}}\n"),
            "site.yaml:2:35: xids[0].escalation.boots: boots 0 is out of range (1-15)");
  EXPECT_EQ(Error("xids:\n  - {xid: 79, escalation: {boots: 2}}\n"),
            "site.yaml:2:27: xids[0].escalation.window: missing required key");
  EXPECT_EQ(Error("xids:\n  - {xid: 79, escalation: {boots: 2, window: 8d}}\n"),
            "site.yaml:2:46: xids[0].escalation.window: expected a duration like 30s, 10m, 1h30m or 7d (more than 0, "
            "at most 7 days), got '8d'");
  EXPECT_EQ(Error("xids:\n  - {xid: 79, escalation: yes}\n"),
            "site.yaml:2:27: xids[0].escalation: expected {boots: N, window: D} or false, got 'yes'");
  EXPECT_EQ(Error("xids:\n  - {xid: 79, escalation: true}\n"),
            "site.yaml:2:27: xids[0].escalation: expected {boots: N, window: D} or false, got 'true'");
  EXPECT_EQ(Error("xids:\n  - {xid: 163, clears: [163]}\n"),
            "site.yaml:2:25: xids[0].clears[0]: an XID cannot clear itself");
  EXPECT_EQ(Error("xids:\n  - {xid: 163, clears: [162, 162]}\n"),
            "site.yaml:2:30: xids[0].clears[1]: XID 162 is listed twice");
  EXPECT_EQ(Error("xids:\n  - {xid: 163, clears: 162}\n"),
            "site.yaml:2:24: xids[0].clears: expected a sequence, got '162'");
  EXPECT_EQ(Error("xids:\n  - {xid: 163, lookback: 0s}\n"),
            "site.yaml:2:26: xids[0].lookback: expected a duration like 30s, 10m, 1h30m or 7d (more than 0, at most 7 "
            "days), got '0s'");
  EXPECT_EQ(Error("xids:\n  - {xid: 48, fatal: true, action: NONE}\n"),
            "site.yaml:2:36: xids[0].action: a fatal XID needs an action that acts on the device, not NONE");
  EXPECT_EQ(Error("xids:\n  - {xid: 48}\n"), "site.yaml:2:5: xids[0]: sets nothing (give at least one key besides xid)");
  EXPECT_EQ(Error("xids:\n  - {xid: 48, severity: high}\n"),
            "site.yaml:2:15: xids[0].severity: unknown key (allowed: xid, mnemonic, description, fatal, action, "
            "nvidia_bucket, threshold, escalation, clears, lookback)");
  EXPECT_EQ(Error("critical: [48]\nxids:\n  - {xid: 48, lookback: 1h}\n"),
            "site.yaml:3:11: xids[0].xid: XID 48 is also listed in critical (line 1); an XID may appear once, in one "
            "of ignore, critical, thresholds and xids");
  EXPECT_EQ(Error("defaults: {lookback: forever}\n"),
            "site.yaml:1:22: defaults.lookback: expected a duration like 30s, 10m, 1h30m or 7d (more than 0, at most 7 "
            "days), got 'forever'");
  EXPECT_EQ(Error("defaults: {boots: 2}\n"),
            "site.yaml:1:12: defaults.boots: unknown key (allowed: escalation, lookback)");
  EXPECT_EQ(CatalogError("version: 1\ndefaults: {escalation: {boots: 99, window: 1d}}\nxids:\n"
                         "  - {xid: 1, mnemonic: M, description: d, fatal: false, action: NONE}\n"),
            "cat.yaml:2:32: defaults.escalation.boots: boots 99 is out of range (1-15)");
  EXPECT_EQ(CatalogError("version: 1\nxids:\n"
                         "  - {xid: 1, mnemonic: M, description: d, fatal: false, action: NONE, threshold: {count: 0, "
                         "window: 1m}}\n"),
            "cat.yaml:3:90: xids[0].threshold.count: count 0 is out of range (1-100)");
}

}  // namespace
}  // namespace gns::gpu_health::policy_rules_test
