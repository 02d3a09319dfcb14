// The XID judge with kernel lines as drivers print them (collected from public bug reports and
// the driver's own format strings): which GPU each one lands on, that each occurrence counts
// once, that banners and continuation lines never count, XID 154's recovery actions, and one
// verdict for NVML's and the kernel's report of the same occurrence.
#include "modules/gpu_health/recovery_action.hpp"
#include "modules/gpu_health/xid_judge.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_health {
namespace {

constexpr const char* kA = "GPU-455d8f70-2051-db6c-0430-ffc457bff834";  // 0000:03:00
constexpr const char* kB = "GPU-00000000-0000-0000-0000-00000000000b";  // 0000:3b:00
constexpr const char* kC = "GPU-00000000-0000-0000-0000-00000000000c";  // 0008:01:00
constexpr const char* kD = "GPU-00000000-0000-0000-0000-00000000000d";  // 0000:cb:00
constexpr int64_t kNow = 1'700'000'000'000;

gpu_inventory::GpuInfo Gpu(const char* uuid, const char* bus_id) {
  gpu_inventory::GpuInfo g;
  g.uuid = uuid;
  g.pci_bus_id = bus_id;
  g.pci = *gpu_inventory::PciAddress::Parse(bus_id);
  return g;
}

class XidJudgeTest : public ::testing::Test {
 protected:
  XidJudgeTest() : log_("judge", std::make_shared<spdlog::sinks::null_sink_mt>()) {}

  void Make(SiteOverrides overrides = {}) {
    overrides_ = std::move(overrides);
    judge_ = std::make_unique<XidJudge>(
        XidCatalog::Builtin(), overrides_, XidJudge::Settings{"gpu-node-supervisor", "SysLogsXIDError", "node1"}, log_,
        XidJudge::Outputs{[this](const DeviceHealth& h) { verdicts_.push_back(h); },
                          [this](HealthEvent e, XidJudge::KubeEvent) { events_.push_back(std::move(e)); },
                          [this](std::string_view, uint32_t, uint64_t) { ++counted_; },
                          [this](std::string_view kind, std::string_view) { bad_.emplace_back(kind); },
                          [this] { ++duplicates_; }, [] {}, [] {}, nullptr, nullptr});
    judge_->OnInventory({Gpu(kA, "00000000:03:00.0"), Gpu(kB, "00000000:3B:00.0"), Gpu(kC, "00000008:01:00.0"),
                         Gpu(kD, "00000000:CB:00.0")},
                        kNow);
  }
  void Line(const std::string& message, uint64_t at_usec = 1'700'000'000'000'000) {
    judge_->OnKernelLine(message, at_usec, false, kNow);
  }
  const DeviceHealth* Verdict(const char* uuid) { return judge_->Verdicts().Find(uuid); }
  bool Unhealthy(const char* uuid) { return judge_->Verdicts().IsUnhealthy(uuid); }

  spdlog::logger log_;
  SiteOverrides overrides_;
  std::unique_ptr<XidJudge> judge_;
  std::vector<DeviceHealth> verdicts_;
  std::vector<HealthEvent> events_;
  std::vector<std::string> bad_;
  int counted_ = 0;
  int duplicates_ = 0;
};

struct Shape {
  const char* name;
  const char* line;
  const char* gpu;  // the GPU it lands on; nullptr: none
  uint32_t xid;     // counted XID; 0: not an XID occurrence
  bool fatal;
};

class RealWorldShapes : public XidJudgeTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(RealWorldShapes, LandOnTheRightGpuAndCountOnce) {
  Make();
  const Shape& s = GetParam();
  Line(s.line);
  EXPECT_EQ(counted_, s.xid == 0 ? 0 : 1) << s.line;
  if (s.gpu == nullptr) {
    EXPECT_TRUE(verdicts_.empty()) << s.line;
    return;
  }
  if (s.fatal) {
    ASSERT_TRUE(Unhealthy(s.gpu)) << s.line;
    EXPECT_EQ(Verdict(s.gpu)->xid, s.xid);
  } else {
    EXPECT_FALSE(Unhealthy(s.gpu)) << s.line;
  }
  ASSERT_FALSE(events_.empty()) << s.line;
  EXPECT_EQ(events_.back().error_code, std::vector<std::string>{std::to_string(s.xid)});
  EXPECT_EQ(events_.back().entities_impacted.back().value, s.gpu);
}

INSTANTIATE_TEST_SUITE_P(
    Lines, RealWorldShapes,
    ::testing::Values(
        Shape{"plain", "NVRM: Xid (PCI:0000:03:00): 48, pid=91237, name=nv-hostengine, Ch 00000076", kA, 48, true},
        Shape{"unknown_pid", "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
              kB, 79, true},
        Shape{"mig_instance",
              "NVRM: Xid (PCI:0000:cb:00 GPU-I:05): 31, pid=12345, name=python, Ch 00000008, intr 00000000. MMU Fault",
              kD, 31, false},
        Shape{"mig_compute_instance", "NVRM: Xid (PCI:0000:cb:00 GPU-I:01 GPU-CI:02): 13, pid=4242, name=train.py, "
              "Graphics SM Warp Exception", kD, 13, false},
        Shape{"function_suffix", "NVRM: Xid (PCI:0000:3b:00.0): 94, pid=77, name=python3, Contained ECC error", kB, 94,
              false},
        Shape{"other_domain", "NVRM: Xid (PCI:0008:01:00): 119, pid=1, name=nvidia-smi, Timeout after 6s of waiting for "
              "RPC response from GPU0 GSP!", kC, 119, true},
        Shape{"name_with_spaces", "NVRM: Xid (PCI:0000:03:00): 13, pid=2280636, name=pt_main_thread worker 3, Graphics "
              "Exception: ESR 0x50e730=0x4000000", kA, 13, false},
        Shape{"dmesg_timestamp", "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 63, pid='<unknown>', "
              "name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate.", kD, 63, false},
        Shape{"old_format", "NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.", kA, 79, true},
        Shape{"gsp_banner", "NVRM: _kgspLogXid119: ********************************* GSP Timeout "
              "**********************************", nullptr, 0, false},
        Shape{"gsp_banner_note", "NVRM: _kgspLogXid119: Note: Please also check logs above.", nullptr, 0, false},
        Shape{"rpc_history", "NVRM: GPU0 _kgspLogRpcDebugInfo: Xid 119 follows", nullptr, 0, false},
        Shape{"fallen_off_continuation", "NVRM: fallen off the bus and is not responding to commands.", nullptr, 0,
              false},
        Shape{"unrelated", "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 17", nullptr, 0, false}),
    [](const ::testing::TestParamInfo<Shape>& info) { return std::string(info.param.name); });

TEST_F(XidJudgeTest, RecoveryActionChangesDecideWhatXid154Does) {
  Make();
  // 0x4 Drain and Reset: the GPU needs a reset.
  Line("NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)");
  ASSERT_TRUE(Unhealthy(kA));
  EXPECT_EQ(Verdict(kA)->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(Verdict(kA)->xid, 154u);
  EXPECT_NE(Verdict(kA)->reason.find("Drain and Reset"), std::string::npos) << Verdict(kA)->reason;
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_TRUE(events_[0].is_fatal);
  EXPECT_EQ(events_[0].recommended_action_name, "COMPONENT_RESET");

  // 0x1 GPU Reset Required (and its older wording, PF FLR).
  Line("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)");
  EXPECT_EQ(Verdict(kB)->recommended_action, "COMPONENT_RESET");
  Line("NVRM: Xid (PCI:0000:cb:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)");
  EXPECT_EQ(Verdict(kD)->recommended_action, "COMPONENT_RESET");

  // 0x2 Node Reboot Required: the whole node; an escalation of the same GPU is news.
  Line("NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x2 (Node Reboot "
       "Required)",
       1'700'000'000'100'000);
  EXPECT_EQ(Verdict(kA)->recommended_action, "RESTART_BM");
  EXPECT_EQ(events_.back().recommended_action_name, "RESTART_BM");

  // 0x0 None: reported, nothing changes.
  const std::size_t before = verdicts_.size();
  Line("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)");
  EXPECT_EQ(verdicts_.size(), before);
  EXPECT_FALSE(Unhealthy(kC));
  EXPECT_FALSE(events_.back().is_fatal);
  EXPECT_EQ(events_.back().recommended_action_name, "NONE");
}

TEST_F(XidJudgeTest, AnUnknownRecoveryActionIsFatalAndSaidSo) {
  Make();
  Line("NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x0 (None) to 0x9 (Something New)");
  ASSERT_TRUE(Unhealthy(kA));
  EXPECT_EQ(Verdict(kA)->recommended_action, "CONTACT_SUPPORT");
  EXPECT_NE(std::find(bad_.begin(), bad_.end(), "unknown_recovery_action"), bad_.end());
  // A 154 that does not say what it changed to follows the catalog (informational).
  Line("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed");
  EXPECT_FALSE(Unhealthy(kB));
  EXPECT_NE(std::find(bad_.begin(), bad_.end(), "xid154_without_action"), bad_.end());
}

TEST_F(XidJudgeTest, ASiteOverrideStillDecidesXid154) {
  Make(LoadSiteOverridesString("ignore: [154]\n", "site.yaml"));
  Line("NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)");
  EXPECT_FALSE(Unhealthy(kA));
  EXPECT_TRUE(events_.empty());
  Make(LoadSiteOverridesString("critical: [{xid: 154, action: RESTART_VM}]\n", "site.yaml"));
  Line("NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)");
  ASSERT_TRUE(Unhealthy(kA));
  EXPECT_EQ(Verdict(kA)->recommended_action, "RESTART_VM");
}

TEST_F(XidJudgeTest, NvmlAndKernelReportsAreJudgedOnceAndAlike) {
  Make(LoadSiteOverridesString("ignore: [94]\n", "site.yaml"));
  // An ignored XID is ignored whoever reports it: the GPU stays Healthy.
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kA, 94, 0xFFFFFFFF, 0xFFFFFFFF, kNow}, kNow);
  EXPECT_FALSE(Unhealthy(kA));
  EXPECT_TRUE(events_.empty());
  // One occurrence, two reports: one count, one verdict.
  Line("NVRM: Xid (PCI:0000:03:00): 48, pid=1, name=x, DBE", static_cast<uint64_t>(kNow) * 1000);
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kA, 48, 0xFFFFFFFF, 0xFFFFFFFF, kNow + 200}, kNow);
  EXPECT_EQ(judge_->Counts().Get(kA, 48), 1u);
  EXPECT_EQ(duplicates_, 1);
  EXPECT_EQ(verdicts_.size(), 1u);
  // NVML's 154 carries no action: the kernel line decides, NVML's report is not counted.
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kB, 154, 0xFFFFFFFF, 0xFFFFFFFF, kNow}, kNow);
  EXPECT_EQ(judge_->Counts().Get(kB, 154), 0u);
  EXPECT_FALSE(Unhealthy(kB));
}

TEST_F(XidJudgeTest, ResetAckSetHealthyAndNewBootHeal) {
  Make();
  Line("NVRM: Xid (PCI:0000:03:00): 79, pid=1, name=x, GPU has fallen off the bus.");
  Line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE");
  ASSERT_TRUE(Unhealthy(kA) && Unhealthy(kB));
  judge_->OnKernelLine("GPU reset occurred: " + std::string(kA), 1, true, kNow);
  EXPECT_FALSE(Unhealthy(kA));
  EXPECT_EQ(Verdict(kA)->reason, "GPU reset occurred");
  // The acknowledgement identifier is trusted for acknowledgements only.
  judge_->OnKernelLine("NVRM: Xid (PCI:0000:03:00): 79, pid=1, name=x, forged", 2, true, kNow);
  EXPECT_FALSE(Unhealthy(kA));
  EXPECT_EQ(judge_->SetHealthy("bogus", "test", kNow).rfind("error", 0), 0u);
  EXPECT_EQ(judge_->SetHealthy(kB, "test", kNow), "ok: 1 device(s) set healthy");
  Line("NVRM: Xid (PCI:0008:01:00): 48, pid=1, name=x, DBE");
  judge_->OnNewBoot(std::string(32, 'b'), kNow);
  EXPECT_TRUE(judge_->Verdicts().UnhealthyUuids().empty());
}

TEST_F(XidJudgeTest, ResetStartedHoldsAndAFailedResetLeavesRestartBm) {
  Make();
  // A Healthy GPU under a reset: Unhealthy for maintenance, no remediation, no HealthEvent.
  judge_->OnKernelLine("GPU reset started: " + std::string(kA), 1, true, kNow);
  ASSERT_TRUE(Unhealthy(kA));
  EXPECT_EQ(Verdict(kA)->reason, kResetInProgress);
  EXPECT_EQ(Verdict(kA)->recommended_action, "NONE");
  EXPECT_TRUE(events_.empty());
  // An Unhealthy one keeps the reason it is being reset for.
  Line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE");
  const std::size_t before = events_.size();
  judge_->OnKernelLine("GPU reset started: " + std::string(kB), 2, true, kNow);
  EXPECT_EQ(Verdict(kB)->xid, 48u);
  EXPECT_EQ(events_.size(), before);
  // The reset failed: only a reboot is left.
  judge_->OnKernelLine("GPU reset executed: " + std::string(kB) + ", success: false", 3, true, kNow);
  EXPECT_TRUE(Unhealthy(kB));
  EXPECT_EQ(Verdict(kB)->recommended_action, "RESTART_BM");
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_.back().recommended_action_name, "RESTART_BM");
  EXPECT_TRUE(events_.back().is_fatal);
  // Validated: Healthy through the normal path.
  judge_->OnKernelLine("GPU reset occurred: " + std::string(kA), 4, true, kNow);
  EXPECT_FALSE(Unhealthy(kA));
}

TEST_F(XidJudgeTest, AMilderXidNeverDowngradesTheRecommendedActionUntilTheGpuIsRecovered) {
  Make();
  // XID 79 (fallen off the bus): only a reboot helps.
  Line("NVRM: Xid (PCI:0000:03:00): 79, pid=1, name=x, GPU has fallen off the bus.", 1'700'000'000'000'000);
  ASSERT_TRUE(Unhealthy(kA));
  ASSERT_EQ(Verdict(kA)->recommended_action, "RESTART_BM");
  const std::size_t verdicts_before = verdicts_.size();
  // XID 48 (COMPONENT_RESET) on the same GPU: the verdict stays what 79 made it (autoReset and
  // the device plugin follow it), and the event tells NVSentinel the same.
  Line("NVRM: Xid (PCI:0000:03:00): 48, pid=1, name=x, DBE", 1'700'000'001'000'000);
  EXPECT_EQ(Verdict(kA)->recommended_action, "RESTART_BM");
  EXPECT_EQ(Verdict(kA)->xid, 79u);
  EXPECT_EQ(verdicts_.size(), verdicts_before) << "a milder XID changes no verdict";
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_.back().error_code, std::vector<std::string>{"48"});
  EXPECT_EQ(events_.back().recommended_action_name, "RESTART_BM");
  EXPECT_EQ(events_.back().recommended_action, static_cast<int>(RecommendedAction::kRestartBm));
  // NVML's report of another milder XID: the same.
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kA, 95, 0xFFFFFFFF, 0xFFFFFFFF, kNow + 5000}, kNow);
  EXPECT_EQ(Verdict(kA)->recommended_action, "RESTART_BM");
  // The driver's own recovery action moving down (0x2 → 0x4) does not downgrade it either.
  Line("NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x4 (Drain "
       "and Reset)",
       1'700'000'002'000'000);
  EXPECT_EQ(Verdict(kA)->recommended_action, "RESTART_BM");
  EXPECT_EQ(events_.back().recommended_action_name, "RESTART_BM");
  // Escalation still goes through (48, then 79, on another GPU).
  Line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE", 1'700'000'003'000'000);
  ASSERT_EQ(Verdict(kB)->recommended_action, "COMPONENT_RESET");
  Line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.", 1'700'000'004'000'000);
  EXPECT_EQ(Verdict(kB)->recommended_action, "RESTART_BM");
  EXPECT_EQ(Verdict(kB)->xid, 79u);

  // Recovery resets it: a validated reset, set-healthy, a new boot; then the next XID decides.
  judge_->OnKernelLine("GPU reset occurred: " + std::string(kA), 1'700'000'005'000'000, true, kNow);
  ASSERT_FALSE(Unhealthy(kA));
  Line("NVRM: Xid (PCI:0000:03:00): 48, pid=1, name=x, DBE", 1'700'000'006'000'000);
  EXPECT_EQ(Verdict(kA)->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(events_.back().recommended_action_name, "COMPONENT_RESET");
  EXPECT_EQ(judge_->SetHealthy(kB, "test", kNow), "ok: 1 device(s) set healthy");
  Line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE", 1'700'000'007'000'000);
  EXPECT_EQ(Verdict(kB)->recommended_action, "COMPONENT_RESET");
  Line("NVRM: Xid (PCI:0000:03:00): 79, pid=1, name=x, GPU has fallen off the bus.", 1'700'000'008'000'000);
  ASSERT_EQ(Verdict(kA)->recommended_action, "RESTART_BM");
  judge_->OnNewBoot(std::string(32, 'c'), kNow);
  Line("NVRM: Xid (PCI:0000:03:00): 48, pid=1, name=x, DBE", 1'700'000'009'000'000);
  EXPECT_EQ(Verdict(kA)->recommended_action, "COMPONENT_RESET");
}

TEST_F(XidJudgeTest, AFailedResetOfAGpuThatNeedsMoreKeepsWhatItNeeds) {
  Make();
  Line("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x9 (Something New)");
  ASSERT_EQ(Verdict(kB)->recommended_action, "CONTACT_SUPPORT");
  judge_->OnKernelLine("GPU reset executed: " + std::string(kB) + ", success: false", 3, true, kNow);
  EXPECT_EQ(Verdict(kB)->recommended_action, "CONTACT_SUPPORT");
  EXPECT_EQ(events_.back().recommended_action_name, "CONTACT_SUPPORT");
}

TEST_F(XidJudgeTest, AnXidOnAnUnknownAddressKeepsItsMostSevereAction) {
  Make();
  // 0000:5e:00 is none of the inventory's GPUs: the verdict waits until the address is learned.
  Line("NVRM: Xid (PCI:0000:5e:00): 79, pid=1, name=x, GPU has fallen off the bus.", 1'700'000'000'000'000);
  Line("NVRM: Xid (PCI:0000:5e:00): 48, pid=1, name=x, DBE", 1'700'000'001'000'000);
  EXPECT_EQ(events_.back().recommended_action_name, "RESTART_BM");
  constexpr const char* kE = "GPU-00000000-0000-0000-0000-00000000000e";
  Line(std::string("NVRM: GPU at PCI:0000:5e:00: ") + kE);
  ASSERT_TRUE(Unhealthy(kE));
  EXPECT_EQ(Verdict(kE)->recommended_action, "RESTART_BM");
  EXPECT_EQ(Verdict(kE)->xid, 79u);
}

TEST(RecoveryAction, CodesNamesAndWordings) {
  const auto reset = ParseRecoveryActionChange("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)");
  ASSERT_TRUE(reset);
  EXPECT_EQ(reset->code, 4u);
  EXPECT_EQ(reset->name, "Drain and Reset");
  EXPECT_EQ(reset->action, RecommendedAction::kComponentReset);
  // The code decides, whatever the wording of this driver release.
  EXPECT_EQ(ParseRecoveryActionChange("changed from 0x0 (None) to 0x2 (OS Reboot)")->action, RecommendedAction::kRestartBm);
  EXPECT_EQ(ParseRecoveryActionChange("changed from 0x0 (None) to 0x1 (PF FLR)")->action,
            RecommendedAction::kComponentReset);
  EXPECT_EQ(ParseRecoveryActionChange("changed from 0x0 (None) to 0x3 (Drain P2P)")->action,
            RecommendedAction::kComponentReset);
  EXPECT_EQ(ParseRecoveryActionChange("changed from 0x2 (Node Reboot Required) to 0x0 (None).")->action,
            RecommendedAction::kNone);
  // Without a code, the name.
  const auto by_name = ParseRecoveryActionChange("changed to (Node Reboot Required)");
  ASSERT_TRUE(by_name);
  EXPECT_EQ(by_name->code, 2u);
  EXPECT_EQ(by_name->action, RecommendedAction::kRestartBm);
  const auto unknown = ParseRecoveryActionChange("changed from 0x0 (None) to 0x1f (Future)");
  ASSERT_TRUE(unknown);
  EXPECT_FALSE(unknown->known);
  EXPECT_EQ(unknown->action, RecommendedAction::kContactSupport);
  EXPECT_FALSE(ParseRecoveryActionChange("GPU recovery action changed"));
  EXPECT_FALSE(ParseRecoveryActionChange(""));
  EXPECT_EQ(DriverRecoveryActionName(4), "Drain and Reset");
  EXPECT_EQ(DriverRecoveryActionName(77), "");
  // Hostile text stays bounded and printable.
  const auto hostile = ParseRecoveryActionChange(" to 0x1 (" + std::string(500, '\x01') + ")");
  ASSERT_TRUE(hostile);
  EXPECT_LE(hostile->name.size(), 64u);
}

TEST(VerdictBook, ChangesAreReportedOnceAndRestoresYieldToThisRun) {
  VerdictBook book;
  ASSERT_NE(book.MarkUnhealthy(kA, "0000:03:00", "XID 48", 48, RecommendedAction::kComponentReset, 10), nullptr);
  EXPECT_EQ(book.MarkUnhealthy(kA, "0000:03:00", "XID 48", 48, RecommendedAction::kComponentReset, 20), nullptr);
  const DeviceHealth* worse = book.MarkUnhealthy(kA, "", "XID 79", 79, RecommendedAction::kRestartBm, 30);
  ASSERT_NE(worse, nullptr);
  EXPECT_EQ(worse->since_unix_ms, 10);  // Unhealthy since the first
  EXPECT_EQ(worse->pci, "0000:03:00");
  EXPECT_TRUE(book.MarkHealthy(kB, "x", 40).empty());
  DeviceHealth saved;
  saved.uuid = kA;
  saved.healthy = false;
  EXPECT_FALSE(book.Restore(saved));  // this run already decided
  saved.uuid = kB;
  EXPECT_TRUE(book.Restore(saved));
  EXPECT_EQ(book.UnhealthyCount(), 2u);
  EXPECT_EQ(book.MarkHealthy(kA, "GPU reset occurred", 50).size(), 1u);
  EXPECT_EQ(book.UnhealthyUuids(), std::vector<std::string>{kB});
}

TEST(VerdictBook, TheRecommendedActionOnlyEscalatesUntilHealthy) {
  VerdictBook book;
  ASSERT_NE(book.MarkUnhealthy(kA, "0000:03:00", "XID 79", 79, RecommendedAction::kRestartBm, 10), nullptr);
  EXPECT_EQ(book.MarkUnhealthy(kA, "", "XID 48", 48, RecommendedAction::kComponentReset, 20), nullptr);
  EXPECT_EQ(book.MarkUnhealthy(kA, "", "held", 0, RecommendedAction::kNone, 25), nullptr);
  EXPECT_EQ(book.Find(kA)->recommended_action, "RESTART_BM");
  EXPECT_EQ(book.Find(kA)->reason, "XID 79");
  // The same rank: the latest XID explains it.
  const DeviceHealth* same = book.MarkUnhealthy(kA, "", "XID 119", 119, RecommendedAction::kRestartBm, 30);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(same->xid, 119u);
  ASSERT_NE(book.MarkUnhealthy(kA, "", "XID 999", 999, RecommendedAction::kContactSupport, 40), nullptr);
  EXPECT_EQ(book.MarkUnhealthy(kA, "", "XID 79", 79, RecommendedAction::kRestartBm, 50), nullptr);
  // A restored verdict (the checkpoint) ranks the same way, by its action's name.
  DeviceHealth saved;
  saved.uuid = kB;
  saved.healthy = false;
  saved.xid = 79;
  saved.recommended_action = "RESTART_BM";
  ASSERT_TRUE(book.Restore(saved));
  EXPECT_EQ(book.MarkUnhealthy(kB, "", "XID 48", 48, RecommendedAction::kComponentReset, 60), nullptr);
  // Healthy again: the next verdict starts from nothing.
  ASSERT_EQ(book.MarkHealthy(kA, "GPU reset occurred", 70).size(), 1u);
  const DeviceHealth* after = book.MarkUnhealthy(kA, "", "XID 48", 48, RecommendedAction::kComponentReset, 80);
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->recommended_action, "COMPONENT_RESET");
}

TEST(VerdictBook, AGpuInstanceHasItsOwnVerdictAndHealsWithItsGpu) {
  VerdictBook book;
  const DeviceHealth* gi5 = book.MarkUnhealthy(kD, "0000:cb:00", "XID 48 on GPU instance 5", 48,
                                               RecommendedAction::kComponentReset, 10, 5);
  ASSERT_NE(gi5, nullptr);
  EXPECT_EQ(gi5->gpu_instance, 5u);
  EXPECT_EQ(gi5->RetainKey(), std::string(kD) + "/gi5");
  EXPECT_TRUE(book.IsUnhealthy(kD, 5));
  EXPECT_FALSE(book.IsUnhealthy(kD));     // the GPU itself is not judged
  EXPECT_FALSE(book.IsUnhealthy(kD, 6));  // nor its other GPU instances
  ASSERT_NE(book.MarkUnhealthy(kD, "", "XID 48 on GPU instance 6", 48, RecommendedAction::kComponentReset, 20, 6),
            nullptr);
  ASSERT_NE(book.MarkUnhealthy(kA, "", "XID 79", 79, RecommendedAction::kRestartBm, 20), nullptr);
  EXPECT_EQ(book.UnhealthyCount(), 3u);
  EXPECT_EQ(book.UnhealthyUuids(), (std::vector<std::string>{kD, kA}));  // each GPU once, in key order
  // A reset of the GPU heals its GPU instances; other GPUs keep their verdicts.
  const auto healed = book.MarkHealthy(kD, "GPU reset occurred", 30);
  ASSERT_EQ(healed.size(), 2u);
  EXPECT_EQ(healed[0].gpu_instance, 5u);
  EXPECT_EQ(healed[1].gpu_instance, 6u);
  EXPECT_TRUE(healed[0].healthy && healed[1].healthy);
  EXPECT_FALSE(book.IsUnhealthy(kD, 5));
  EXPECT_EQ(book.UnhealthyUuids(), std::vector<std::string>{kA});
  // Restored per key: a GPU instance's saved verdict does not yield to its GPU's.
  DeviceHealth saved;
  saved.uuid = kB;
  saved.healthy = false;
  saved.gpu_instance = 2;
  EXPECT_TRUE(book.Restore(saved));
  saved.gpu_instance = kWholeGpu;
  EXPECT_TRUE(book.Restore(saved));
  EXPECT_TRUE(book.IsUnhealthy(kB, 2) && book.IsUnhealthy(kB));
}

TEST_F(XidJudgeTest, AnXidThatNamesAGpuInstanceMarksThatGpuInstanceAlone) {
  Make();
  // The kernel names GPU instance 5: its verdict, not the GPU's.
  Line("NVRM: Xid (PCI:0000:cb:00 GPU-I:05): 48, pid=1, name=x, DBE", static_cast<uint64_t>(kNow) * 1000);
  EXPECT_FALSE(Unhealthy(kD));
  ASSERT_TRUE(judge_->Verdicts().IsUnhealthy(kD, 5));
  ASSERT_EQ(verdicts_.size(), 1u);
  EXPECT_EQ(verdicts_[0].uuid, kD);
  EXPECT_EQ(verdicts_[0].gpu_instance, 5u);
  EXPECT_EQ(verdicts_[0].xid, 48u);
  EXPECT_NE(verdicts_[0].reason.find("GPU instance 5"), std::string::npos) << verdicts_[0].reason;
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_NE(events_[0].message.find("on GPU instance 5"), std::string::npos) << events_[0].message;
  EXPECT_EQ(events_[0].entities_impacted.back().value, kD);  // the event names the GPU
  // NVML's report of the same occurrence (same GPU instance) is folded into it.
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kD, 48, 5, 0, kNow + 100}, kNow);
  EXPECT_EQ(duplicates_, 1);
  EXPECT_EQ(verdicts_.size(), 1u);
  // NVML names GPU instance 3 in a later occurrence: that GPU instance too.
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kD, 48, 3, 0, kNow + 60'000}, kNow);
  EXPECT_TRUE(judge_->Verdicts().IsUnhealthy(kD, 3));
  EXPECT_FALSE(Unhealthy(kD));
  // Without an instance the XID is the whole GPU's, beside the GPU instances' verdicts.
  Line("NVRM: Xid (PCI:0000:cb:00): 79, pid=1, name=x, GPU has fallen off the bus.");
  EXPECT_TRUE(Unhealthy(kD));
  EXPECT_EQ(Verdict(kD)->gpu_instance, kWholeGpu);
  // A reset heals the GPU and every GPU instance of it.
  verdicts_.clear();
  judge_->OnKernelLine("GPU reset occurred: " + std::string(kD), 1, true, kNow);
  EXPECT_TRUE(judge_->Verdicts().UnhealthyUuids().empty());
  ASSERT_EQ(verdicts_.size(), 3u);
  for (const auto& v : verdicts_) EXPECT_TRUE(v.healthy) << v.RetainKey();
}

TEST_F(XidJudgeTest, TwoGpuInstancesFailingAtOnceAreTwoOccurrences) {
  Make();
  const auto usec = static_cast<uint64_t>(kNow) * 1000;
  // Interleaved so that folding per GPU would take NVML's GPU-instance-3 report for the
  // kernel's GPU-instance-5 one and lose instance 3's.
  Line("NVRM: Xid (PCI:0000:cb:00 GPU-I:05): 48, pid=1, name=x, DBE", usec);
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kD, 48, 3, 0, kNow + 10}, kNow);
  judge_->OnNvmlXid(gpu_inventory::XidObservation{kD, 48, 5, 0, kNow + 20}, kNow);
  Line("NVRM: Xid (PCI:0000:cb:00 GPU-I:03): 48, pid=1, name=x, DBE", usec + 30'000);
  EXPECT_TRUE(judge_->Verdicts().IsUnhealthy(kD, 5));
  EXPECT_TRUE(judge_->Verdicts().IsUnhealthy(kD, 3));
  EXPECT_FALSE(Unhealthy(kD));
  EXPECT_EQ(judge_->Counts().Get(kD, 48), 2u);
  EXPECT_EQ(duplicates_, 2);
}

TEST_F(XidJudgeTest, AGpuInstanceVerdictIsHealedBySetHealthyAndANewBoot) {
  Make();
  Line("NVRM: Xid (PCI:0000:cb:00 GPU-I:01 GPU-CI:00): 48, pid=1, name=x, DBE");
  ASSERT_TRUE(judge_->Verdicts().IsUnhealthy(kD, 1));
  EXPECT_EQ(judge_->SetHealthy(kD, "test", kNow), "ok: 1 device(s) set healthy");
  EXPECT_FALSE(judge_->Verdicts().IsUnhealthy(kD, 1));
  Line("NVRM: Xid (PCI:0000:cb:00 GPU-I:02): 48, pid=1, name=x, DBE", 1'700'000'100'000'000);
  ASSERT_TRUE(judge_->Verdicts().IsUnhealthy(kD, 2));
  judge_->OnNewBoot(std::string(32, 'c'), kNow);
  EXPECT_FALSE(judge_->Verdicts().IsUnhealthy(kD, 2));
}

TEST_F(XidJudgeTest, AGpuInstanceXidOnAnUnknownAddressWaitsWithItsInstance) {
  Make();
  Line("NVRM: Xid (PCI:0000:99:00 GPU-I:04): 48, pid=1, name=x, DBE");
  EXPECT_TRUE(verdicts_.empty());
  constexpr const char* kE = "GPU-00000000-0000-0000-0000-00000000000e";
  judge_->OnKernelLine("NVRM: GPU at PCI:0000:99:00: " + std::string(kE), 2, false, kNow);
  ASSERT_EQ(verdicts_.size(), 1u);
  EXPECT_EQ(verdicts_[0].uuid, kE);
  EXPECT_EQ(verdicts_[0].gpu_instance, 4u);
  EXPECT_FALSE(judge_->Verdicts().IsUnhealthy(kE));
}

TEST_F(XidJudgeTest, AFatalSxidOnAPortWithoutAGpuOfOursIsReportedForTheSwitchOnly) {
  std::vector<std::pair<uint32_t, bool>> sxids;
  overrides_ = {};
  judge_ = std::make_unique<XidJudge>(
      XidCatalog::Builtin(), overrides_, XidJudge::Settings{"gpu-node-supervisor", "SysLogsXIDError", "node1"}, log_,
      XidJudge::Outputs{[this](const DeviceHealth& h) { verdicts_.push_back(h); },
                        [this](HealthEvent e, XidJudge::KubeEvent k) {
                          EXPECT_TRUE(k.record);
                          EXPECT_EQ(k.reason, "NvSwitchSxidFatal");
                          events_.push_back(std::move(e));
                        },
                        [this](std::string_view, uint32_t, uint64_t) { ++counted_; },
                        [this](std::string_view kind, std::string_view) { bad_.emplace_back(kind); }, [] {}, [] {},
                        [] {}, [&](uint32_t sxid, bool fatal, bool mapped) {
                          EXPECT_FALSE(mapped);
                          sxids.emplace_back(sxid, fatal);
                        }, nullptr});
  judge_->OnInventory({Gpu(kA, "00000000:03:00.0")}, kNow);  // no NVSwitch links: a PCIe-like GPU

  Line("[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt");
  Line("[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00");
  EXPECT_TRUE(events_.empty());
  Line("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 30 LTSSM Fault Up");

  EXPECT_EQ(sxids, (std::vector<std::pair<uint32_t, bool>>{{22013, false}, {20034, true}}));
  ASSERT_EQ(events_.size(), 1u);
  const HealthEvent& e = events_.front();
  EXPECT_EQ(e.check_name, "SysLogsSXIDError");
  EXPECT_EQ(e.component_class, "NVSWITCH");
  EXPECT_TRUE(e.is_fatal);
  EXPECT_FALSE(e.is_healthy);
  EXPECT_EQ(e.recommended_action_name, "CONTACT_SUPPORT");
  EXPECT_EQ(e.error_code, std::vector<std::string>{"20034"});
  EXPECT_EQ(e.entities_impacted, (std::vector<ImpactedEntity>{{"NVSWITCH", "0"}, {"PCI", "0000:c3:00.0"}, {"NVLINK", "30"}}));
  EXPECT_NE(e.message.find("LTSSM Fault Up"), std::string::npos) << e.message;
  // The switch is not a GPU: no verdict, no XID count.
  EXPECT_TRUE(verdicts_.empty());
  EXPECT_FALSE(Unhealthy(kA));
  EXPECT_EQ(counted_, 0);
  EXPECT_TRUE(bad_.empty());
}

// --- SXid → GPU (issue 26) -------------------------------------------------------------------

// Two GPUs behind one NVSwitch at 0000:c3:00.0: GPU A's links 0-3 end in ports 10-13, GPU B's in
// ports 14-17 (an HGX baseboard spreads each GPU's links over the switches the same way).
class SxidMappingTest : public XidJudgeTest {
 protected:
  void MakeMapped(const SxidCatalog* catalog = nullptr) {
    judge_ = std::make_unique<XidJudge>(
        XidCatalog::Builtin(), overrides_, XidJudge::Settings{"gpu-node-supervisor", "SysLogsXIDError", "node1"}, log_,
        XidJudge::Outputs{[this](const DeviceHealth& h) { verdicts_.push_back(h); },
                          [this](HealthEvent e, XidJudge::KubeEvent k) {
                            if (e.check_name != "SysLogsSXIDError") return;  // the reset's, below
                            EXPECT_EQ(k.reason, "NvSwitchSxidFatal");
                            events_.push_back(std::move(e));
                          },
                          [this](std::string_view, uint32_t, uint64_t) { ++counted_; },
                          [this](std::string_view kind, std::string_view) { bad_.emplace_back(kind); }, [] {}, [] {},
                          [] {},
                          [this](uint32_t sxid, bool fatal, bool mapped) { sxids_.push_back({sxid, fatal, mapped}); },
                          nullptr});
    if (catalog != nullptr) judge_->SetSxidCatalog(*catalog);
    auto a = Gpu(kA, "00000000:03:00.0");
    auto b = Gpu(kB, "00000000:3B:00.0");
    b.index = 1;
    const auto nvswitch = *PciAddress::Parse("0000:c3:00.0");
    for (uint32_t link = 0; link < 4; ++link) {
      a.nvswitch_links.push_back({link, nvswitch, 10 + link});
      b.nvswitch_links.push_back({link, nvswitch, 14 + link});
    }
    judge_->OnInventory({a, b}, kNow);
  }
  struct Seen {
    uint32_t sxid;
    bool fatal;
    bool mapped;
    bool operator==(const Seen&) const = default;
  };
  std::vector<Seen> sxids_;
};

TEST_F(SxidMappingTest, AFatalSxidOnAGpusPortMakesThatGpuUnhealthyAndNoOther) {
  MakeMapped();
  ASSERT_EQ(judge_->SwitchPorts().size(), 8u);
  Line("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 15 LTSSM Fault Up");
  // The report's companions change nothing.
  Line("[131453.741001] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Severity 1 Engine instance 15 Sub-engine instance 00");
  Line("[131453.741120] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}");

  ASSERT_TRUE(Unhealthy(kB));
  EXPECT_FALSE(Unhealthy(kA));
  const DeviceHealth* v = Verdict(kB);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->recommended_action, "COMPONENT_RESET");  // the built-in catalog's default
  EXPECT_EQ(v->xid, 0u) << "no XID holds it";
  EXPECT_NE(v->reason.find("SXid 20034 (LTSSM_FAULT_UP)"), std::string::npos) << v->reason;
  EXPECT_NE(v->reason.find("0000:c3:00.0 port 15"), std::string::npos) << v->reason;
  EXPECT_NE(v->reason.find("GPU 1 link 1"), std::string::npos) << v->reason;
  ASSERT_EQ(verdicts_.size(), 1u);
  EXPECT_EQ(verdicts_.front().uuid, kB);

  ASSERT_EQ(events_.size(), 1u);
  const HealthEvent& e = events_.front();
  EXPECT_EQ(e.check_name, "SysLogsSXIDError");
  EXPECT_EQ(e.recommended_action_name, "COMPONENT_RESET");
  EXPECT_EQ(e.entities_impacted, (std::vector<ImpactedEntity>{{"NVSWITCH", "0"},
                                                              {"PCI", "0000:c3:00.0"},
                                                              {"NVLINK", "15"},
                                                              {"GPU_UUID", kB}}));
  EXPECT_EQ(sxids_, (std::vector<Seen>{{20034, true, true}}));
  EXPECT_EQ(counted_, 0) << "an SXid is no XID occurrence";

  // Recovery is a fatal XID's: a validated reset heals it.
  judge_->OnKernelLine("GPU reset occurred: " + std::string(kB), 1'700'000'000'000'000, true, kNow);
  EXPECT_FALSE(Unhealthy(kB));
}

TEST_F(SxidMappingTest, AFatalSxidOfTheSwitchItselfOrAnUnwiredPortIsANodeLevelFinding) {
  MakeMapped();
  // Port 40 is wired to no GPU of ours (a trunk port, or another tray's GPU).
  Line("[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 40 sourcetrack timeout error (First)");
  // No link: an error of the switch itself (the driver's "Fatal, Unexpected PRI error" form).
  Line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 10001, Fatal, Unexpected PRI error");
  // Port 15 of another switch: the switch's address matters, not only the port.
  Line("nvidia-nvswitch1: SXid (PCI:0000:c4:00.0): 20034, Fatal, Link 15 LTSSM Fault Up");

  EXPECT_FALSE(Unhealthy(kA));
  EXPECT_FALSE(Unhealthy(kB));
  EXPECT_TRUE(verdicts_.empty());
  ASSERT_EQ(events_.size(), 3u);
  for (const HealthEvent& e : events_) {
    EXPECT_EQ(e.recommended_action_name, "CONTACT_SUPPORT") << e.message;  // the node action
    for (const auto& entity : e.entities_impacted) EXPECT_NE(entity.type, "GPU_UUID") << e.message;
  }
  EXPECT_NE(events_[0].message.find("no GPU of ours on that port"), std::string::npos) << events_[0].message;
  EXPECT_NE(events_[1].message.find("an error of the switch itself"), std::string::npos) << events_[1].message;
  EXPECT_EQ(events_[1].entities_impacted,
            (std::vector<ImpactedEntity>{{"NVSWITCH", "0"}, {"PCI", "0000:c3:00.0"}}));
  EXPECT_EQ(sxids_, (std::vector<Seen>{{24007, true, false}, {10001, true, false}, {20034, true, false}}));
}

TEST_F(SxidMappingTest, TheSiteCatalogDowngradesAFatalSxidAndUpgradesANonFatalOne) {
  const SxidCatalog site = SxidCatalog::Builtin().LaidOver(SxidCatalog::LoadString(R"(
version: 1
sxids:
  - {sxid: 20034, description: "link flaps on this cluster's cables; tracked elsewhere", fatal: false}
  - {sxid: 12028, description: "stalls our fabric", fatal: true, action: RESTART_VM}
)", "site-sxid.yaml"));
  MakeMapped(&site);
  Line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 15 LTSSM Fault Up");
  EXPECT_FALSE(Unhealthy(kB)) << "downgraded by the site catalog";
  EXPECT_TRUE(events_.empty());
  Line("nvidia-nvswitch3: SXid (PCI:0000:c3:00.0): 12028, Non-fatal, Link 11 egress non-posted PRIV error (First)");
  ASSERT_TRUE(Unhealthy(kA)) << "made fatal by the site catalog";
  EXPECT_EQ(Verdict(kA)->recommended_action, "RESTART_VM");
  EXPECT_NE(Verdict(kA)->reason.find("fatal by the SXid catalog"), std::string::npos) << Verdict(kA)->reason;
  EXPECT_FALSE(Unhealthy(kB));
  EXPECT_EQ(sxids_, (std::vector<Seen>{{20034, false, true}, {12028, true, true}}));
}

TEST_F(SxidMappingTest, APortStaysMappedWhenALaterInventoryNoLongerNamesIt) {
  MakeMapped();
  // The link behind port 15 went down: the next read no longer names its far end.
  auto b = Gpu(kB, "00000000:3B:00.0");
  b.index = 1;
  b.nvswitch_links.push_back({0, *PciAddress::Parse("0000:c3:00.0"), 14});
  judge_->OnInventory({Gpu(kA, "00000000:03:00.0"), b}, kNow);
  Line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 15 LTSSM Fault Up");
  EXPECT_TRUE(Unhealthy(kB));
  EXPECT_FALSE(Unhealthy(kA));
}

TEST_F(SxidMappingTest, NonFatalSxidsAreCountedOnly) {
  MakeMapped();
  Line("[   38.178720] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 22013, Non-fatal, Link 14 Minion Link DLREQ interrupt");
  Line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 19049, Correctable, Link 12 single-bit ECC error");
  EXPECT_TRUE(events_.empty());
  EXPECT_TRUE(verdicts_.empty());
  EXPECT_EQ(sxids_, (std::vector<Seen>{{22013, false, true}, {19049, false, true}}));
}

}  // namespace
}  // namespace gns::gpu_health
