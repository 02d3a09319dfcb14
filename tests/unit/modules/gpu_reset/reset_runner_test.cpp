// The eight steps of one GPU's reset, run by ResetRunner against a fake node (NodeMaintenance):
// the whole way through, each step's way on, and each way each step fails (refused before the
// command: nothing touched; failed after it: the journal says so), a resumed GPU, and a stop.
#include "modules/gpu_reset/reset_runner.hpp"

#include "modules/gpu_reset/intake.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>

namespace gns::gpu_reset {
namespace {

using std::chrono::milliseconds;
constexpr const char* kRunnerUuid = "GPU-11111111-2222-3333-4444-555555555555";

// A node that behaves: gpu-health holds the GPU Unhealthy at "GPU reset started" and turns it
// Healthy at "GPU reset occurred", gpu-inventory lets go and takes back when asked. Each test
// breaks the one thing it is about.
class FakeNode : public NodeMaintenance {
 public:
  bool health_running = true;
  bool health_follows = true;
  bool inventory_lets_go = true;
  bool inventory_takes_back = true;
  std::map<std::string, Verdict> verdicts;
  GpuView gpu{true, true, "", true, false, "00000000:3B:00.0", std::nullopt};
  PodView pods{true, true, "", {}};
  std::map<std::string, std::string> journal_errors;  // message prefix → error
  std::vector<std::string> journal;
  std::vector<std::string> releases;  // "release <uuid>" / "take back <uuid>"
  std::vector<std::string> evictions;
  std::deque<gpu_inventory::GpuMaintenanceRead> reads;  // then `read`, again and again
  gpu_inventory::GpuMaintenanceRead read;
  int inspects = 0;
  std::string persistence_error;
  std::vector<bool> persistence_sets;
  std::vector<std::string> persistence_restored;
  CommandResult command;
  std::vector<std::vector<std::string>> commands;
  int kills = 0;
  bool persisted = true;
  bool job_recorded = true;
  int saves = 0;
  int step_changes = 0;
  std::vector<std::string> progress;
  std::vector<std::string> ended;  // outcomes
  std::function<void(const std::string&)> on_journal;
  std::function<void(bool)> on_release;

  FakeNode() {
    command.started = command.exited = true;
    command.exit_code = 0;
    command.out = "GPU 00000000:3B:00.0 was successfully reset.\n";
    command.elapsed = milliseconds(1234);
    read.persistence = false;
    read.compute_processes = std::vector<gpu_inventory::GpuProcess>{};
  }

  bool HealthRunning() const override { return health_running; }
  std::optional<Verdict> VerdictOf(const std::string& uuid) const override {
    const auto it = verdicts.find(uuid);
    if (it == verdicts.end()) return std::nullopt;
    return it->second;
  }
  GpuView Gpu(const std::string&) const override { return gpu; }
  PodView Pods(const std::string&) const override { return pods; }
  std::string WriteJournal(const std::string& message, int, const std::string& uuid) override {
    for (const auto& [prefix, error] : journal_errors) {
      if (message.rfind(prefix, 0) == 0) return error;
    }
    journal.push_back(message);
    if (health_follows && message.rfind("GPU reset started", 0) == 0) verdicts[uuid] = {false, "GPU reset in progress"};
    if (health_follows && message.rfind("GPU reset occurred", 0) == 0) verdicts[uuid] = {true, "reset acknowledged"};
    if (on_journal) on_journal(message);
    return "";
  }
  void RequestRelease(const std::string& uuid, bool release, const std::string&) override {
    releases.push_back((release ? "release " : "take back ") + uuid);
    if (release && inventory_lets_go) gpu.released = true;
    if (!release && inventory_takes_back) gpu.released = false;
    if (on_release) on_release(release);
  }
  void Evict(const std::string& ns, const std::string& name) override { evictions.push_back(ns + "/" + name); }
  boost::asio::awaitable<gpu_inventory::GpuMaintenanceRead> Inspect(const std::string&) override {
    ++inspects;
    if (!reads.empty()) {
      auto next = reads.front();
      reads.pop_front();
      co_return next;
    }
    co_return read;
  }
  boost::asio::awaitable<std::string> SetPersistence(const std::string&, bool enabled) override {
    persistence_sets.push_back(enabled);
    co_return persistence_error;
  }
  void RestorePersistence(const std::string& uuid) override { persistence_restored.push_back(uuid); }
  boost::asio::awaitable<CommandResult> RunResetCommand(const std::vector<std::string>& argv) override {
    commands.push_back(argv);
    co_return command;
  }
  void KillResetCommand() override { ++kills; }
  void Save() override { ++saves; }
  boost::asio::awaitable<bool> Persisted() override { co_return persisted; }
  boost::asio::awaitable<bool> JobRecorded(const std::string&) override { co_return job_recorded; }
  std::string RecordPath() const override { return "/state/gpu-reset.json"; }
  std::string RecordProblem() const override { return persisted && job_recorded ? "" : "Read-only file system"; }
  void StepChanged(ResetJob&) override { ++step_changes; }
  void Progress(const ResetJob&, const std::string& line) override { progress.push_back(line); }
  void GpuEnded(const GpuReset& g) override { ended.push_back(g.outcome); }
  int64_t NowMs() const override {
    return std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

class ResetRunnerTest : public ::testing::Test {
 protected:
  ResetRunnerTest() {
    settings_.holders_timeout = milliseconds(300);
    settings_.holders_recheck = milliseconds(10);
    settings_.hold_timeout = milliseconds(200);
    settings_.release_timeout = milliseconds(200);
    settings_.settle = milliseconds(0);
    settings_.healthy_timeout = milliseconds(200);
    settings_.command = {"reset-tool", "--gpu", "{uuid}", "--bus={pci}"};
    settings_.ack_identifier = "gpu-node-supervisor";
    job_.id = "cli/1";
    job_.source = "cli";
    job_.gpus.push_back(NewGpuReset(kRunnerUuid));
  }

  ResetRunner& Runner() {
    if (!runner_) runner_ = std::make_unique<ResetRunner>(io_.get_executor(), node_, settings_, log_);
    return *runner_;
  }
  // Runs the GPU's steps to their end; false if they did not end within a generous limit.
  bool Run(std::function<void()> meanwhile = nullptr) {
    bool done = false;
    boost::asio::co_spawn(io_, Runner().RunGpu(job_, Gpu()), [&](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
      done = true;
    });
    if (meanwhile) boost::asio::post(io_, meanwhile);
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < limit) io_.run_one_for(milliseconds(50));
    return done;
  }
  GpuReset& Gpu() { return job_.gpus.front(); }
  std::vector<std::string> StepNames() {
    std::vector<std::string> names;
    for (const auto& s : Gpu().steps) names.push_back(s.name + ":" + s.result);
    return names;
  }
  void ExpectOutcome(const std::string& outcome, const std::string& reason) {
    EXPECT_EQ(Gpu().outcome, outcome);
    EXPECT_EQ(Gpu().reason, reason) << Gpu().message;
    EXPECT_EQ(Gpu().step, Step::kDone);
    ASSERT_EQ(node_.ended.size(), 1u);
    EXPECT_EQ(node_.ended.front(), outcome);
  }
  // Refused: the GPU was never reset, and nothing says it was.
  void ExpectRefused(const std::string& reason) {
    ExpectOutcome("refused", reason);
    EXPECT_TRUE(node_.commands.empty());
    for (const auto& line : node_.journal) EXPECT_EQ(line.find("success: false"), std::string::npos) << line;
  }
  // Failed after the command: the journal says so (gpu-health keeps it Unhealthy, RESTART_BM).
  void ExpectFailed(const std::string& reason) {
    ExpectOutcome("failed", reason);
    ASSERT_FALSE(node_.journal.empty());
    EXPECT_EQ(node_.journal.back(), std::string("GPU reset executed: ") + kRunnerUuid + ", success: false");
  }
  std::string StepMessage(std::string_view step) {
    for (const auto& s : Gpu().steps)
      if (s.name == step) return s.message;
    return "";
  }

  boost::asio::io_context io_;
  FakeNode node_;
  RunnerSettings settings_;
  spdlog::logger log_{"reset-runner-test"};
  ResetJob job_;
  std::unique_ptr<ResetRunner> runner_;
};

// ------------------------------------------------------------------------------ all the way

TEST_F(ResetRunnerTest, AGpuGoesThroughTheSevenStepsInOrderAndSucceeds) {
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(StepNames(), (std::vector<std::string>{"hold:ok", "holders:ok", "persistence:ok", "release:ok", "reset:ok",
                                                   "validate:ok", "restore:ok"}));
  EXPECT_EQ(node_.journal, (std::vector<std::string>{std::string("GPU reset started: ") + kRunnerUuid,
                                                     std::string("GPU reset occurred: ") + kRunnerUuid}));
  EXPECT_EQ(node_.releases, (std::vector<std::string>{std::string("release ") + kRunnerUuid, std::string("take back ") + kRunnerUuid}));
  ASSERT_EQ(node_.commands.size(), 1u);
  EXPECT_EQ(node_.commands.front(),
            (std::vector<std::string>{"reset-tool", "--gpu", kRunnerUuid, "--bus=00000000:3B:00.0"}));
  EXPECT_EQ(Gpu().command_ms, 1234);
  EXPECT_EQ(StepMessage("reset"), "GPU 00000000:3B:00.0 was successfully reset.");
  EXPECT_FALSE(Gpu().released);
  EXPECT_EQ(Gpu().persistence_was_on, false);
  EXPECT_TRUE(node_.persistence_sets.empty());
  EXPECT_GE(node_.saves, 8);  // before each step, and at the end
  EXPECT_EQ(Runner().Current(), nullptr);
}

// ----------------------------------------------------------------------------------- 1. hold

TEST_F(ResetRunnerTest, HoldIsRefusedWhenTheJobCannotBeRecorded) {
  node_.job_recorded = false;
  ASSERT_TRUE(Run());
  ExpectRefused("StateNotPersisted");
  EXPECT_NE(Gpu().message.find("Read-only file system"), std::string::npos) << Gpu().message;
  EXPECT_TRUE(node_.journal.empty());
}

TEST_F(ResetRunnerTest, HoldIsRefusedWithoutGpuHealth) {
  node_.health_running = false;
  ASSERT_TRUE(Run());
  ExpectRefused("HealthNotRunning");
  EXPECT_TRUE(node_.journal.empty());
}

TEST_F(ResetRunnerTest, HoldIsRefusedWhenTheJournalCannotBeWritten) {
  node_.journal_errors["GPU reset started"] = "connect /run/systemd/journal/socket: No such file or directory";
  ASSERT_TRUE(Run());
  ExpectRefused("JournalUnavailable");
  EXPECT_TRUE(node_.releases.empty());
}

TEST_F(ResetRunnerTest, HoldTimesOutWhenTheVerdictStaysHealthy) {
  node_.health_follows = false;
  node_.verdicts[kRunnerUuid] = {true, ""};
  ASSERT_TRUE(Run());
  ExpectRefused("HoldTimeout");
  EXPECT_NE(Gpu().message.find("gpu-node-supervisor"), std::string::npos) << Gpu().message;
  EXPECT_EQ(StepNames(), (std::vector<std::string>{"hold:failed"}));
}

TEST_F(ResetRunnerTest, HoldWaitsForTheVerdictToTurnUnhealthy) {
  node_.health_follows = false;
  settings_.hold_timeout = milliseconds(5000);
  node_.on_journal = [&](const std::string& message) {
    if (message.rfind("GPU reset started", 0) != 0) return;
    boost::asio::post(io_, [&] {  // a turn later, as gpu-health's verdict comes over the bus
      node_.verdicts[kRunnerUuid] = {false, "GPU reset in progress"};
      node_.health_follows = true;
      Runner().Wake();
    });
  };
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(StepMessage("hold"), "Unhealthy at the kubelet (GPU reset in progress)");
}

// -------------------------------------------------------------------------------- 2. holders

TEST_F(ResetRunnerTest, HoldersWaitForAProcessToGoAndThenGoOn) {
  auto held = node_.read;
  held.compute_processes = std::vector<gpu_inventory::GpuProcess>{{4242, 1 << 20}};
  node_.reads = {held, held};
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_GE(node_.inspects, 3);
  EXPECT_EQ(StepMessage("holders"), "nothing holds the GPU");
}

TEST_F(ResetRunnerTest, HoldersFailPolicyRefusesAGpuAPodHolds) {
  settings_.holders = HolderPolicy::kFail;
  node_.pods.holders = {{"ml", "trainer-0", "main"}};
  ASSERT_TRUE(Run());
  ExpectRefused("GpuInUse");
  EXPECT_EQ(Gpu().message, "held by pod ml/trainer-0 (container main) (holders: fail)");
  EXPECT_TRUE(node_.releases.empty());
}

TEST_F(ResetRunnerTest, HoldersEvictPolicyAsksEachPodToGoOnceAndGivesUpAtTheTimeout) {
  settings_.holders = HolderPolicy::kEvict;
  node_.pods.holders = {{"ml", "trainer-0", "main"}, {"ml", "trainer-1", "main"}};
  ASSERT_TRUE(Run());
  ExpectRefused("HoldersTimeout");
  EXPECT_EQ(node_.evictions, (std::vector<std::string>{"ml/trainer-0", "ml/trainer-1"}));
}

TEST_F(ResetRunnerTest, HoldersAskAgainForAnEvictionThatWasRefused) {
  settings_.holders = HolderPolicy::kEvict;
  node_.pods.holders = {{"ml", "trainer-0", "main"}};
  settings_.holders_timeout = milliseconds(5000);
  // The first eviction is refused (a PodDisruptionBudget); after the second the pod goes.
  bool refused = false;
  std::function<void()> poll = [&] {
    if (node_.evictions.size() == 1 && !refused) {
      refused = true;
      Runner().EvictionRefused("ml", "trainer-0");
    } else if (node_.evictions.size() == 2) {
      node_.pods.holders.clear();
      Runner().Wake();
      return;
    }
    boost::asio::post(io_, [&] { poll(); });
  };
  ASSERT_TRUE(Run([&] { poll(); }));
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(node_.evictions, (std::vector<std::string>{"ml/trainer-0", "ml/trainer-0"}));
}

// A GPU held only through a DRA claim (pod-resources' map: the pod under `via`, nothing under
// the GPU's own ID), as the module hands it to the runner.
pod_resources::GpuPodMap HeldThroughAClaim() {
  pod_resources::GpuPodMap map;
  map.listed = map.fresh = true;
  map.via[kRunnerUuid] = {{"ml", "trainer-0", "uid", "main", "gpu.nvidia.com", "ml/gpus", "node-1/gpu-3"}};
  return map;
}

TEST_F(ResetRunnerTest, AGpuHeldOnlyThroughADraClaimIsWaitedForAndTheClaimNamedInTheStatus) {
  auto map = HeldThroughAClaim();
  node_.pods = PodHoldersOf(kRunnerUuid, &map);
  settings_.holders_timeout = milliseconds(5000);
  std::function<void()> poll = [&] {
    if (StepMessage("holders").find("waiting: ") == 0) {
      map.via.clear();  // the pod ended
      node_.pods = PodHoldersOf(kRunnerUuid, &map);
      Runner().Wake();
      return;
    }
    boost::asio::post(io_, [&] { poll(); });
  };
  ASSERT_TRUE(Run([&] { poll(); }));
  ExpectOutcome("succeeded", "");
  const auto named = std::find_if(node_.progress.begin(), node_.progress.end(), [](const std::string& line) {
    return line.find("waiting: held by pod ml/trainer-0 (container main, claim ml/gpus (gpu.nvidia.com node-1/gpu-3))") !=
           std::string::npos;
  });
  EXPECT_NE(named, node_.progress.end());
  EXPECT_TRUE(node_.evictions.empty());  // holders: wait
}

TEST_F(ResetRunnerTest, AGpuHeldOnlyThroughADraClaimIsRefusedUnderFail) {
  auto map = HeldThroughAClaim();
  node_.pods = PodHoldersOf(kRunnerUuid, &map);
  settings_.holders = HolderPolicy::kFail;
  ASSERT_TRUE(Run());
  ExpectRefused("GpuInUse");
  EXPECT_EQ(Gpu().message,
            "held by pod ml/trainer-0 (container main, claim ml/gpus (gpu.nvidia.com node-1/gpu-3)) (holders: fail)");
  EXPECT_TRUE(node_.releases.empty());
}

TEST_F(ResetRunnerTest, AGpuHeldOnlyThroughADraClaimHasThePodWithTheClaimEvicted) {
  auto map = HeldThroughAClaim();
  node_.pods = PodHoldersOf(kRunnerUuid, &map);
  settings_.holders = HolderPolicy::kEvict;
  ASSERT_TRUE(Run());
  ExpectRefused("HoldersTimeout");
  EXPECT_EQ(node_.evictions, (std::vector<std::string>{"ml/trainer-0"}));
}

TEST_F(ResetRunnerTest, AClaimPreparedWithoutAListedPodIsWaitedForButNothingIsEvicted) {
  pod_resources::GpuPodMap map;
  map.listed = map.fresh = true;
  map.pending[kRunnerUuid] = {{"", "ml/gpus", "gpu-3", "prepared by dra-gpu; the kubelet lists no pod with it yet"}};
  node_.pods = PodHoldersOf(kRunnerUuid, &map);
  settings_.holders = HolderPolicy::kEvict;
  ASSERT_TRUE(Run());
  ExpectRefused("HoldersTimeout");
  EXPECT_TRUE(node_.evictions.empty());
  EXPECT_NE(Gpu().message.find("claim ml/gpus on gpu-3 (prepared by dra-gpu"), std::string::npos) << Gpu().message;
}

// A claim prepared on the GPU after the holders step passed (before dra-gpu saw it released):
// the reset is refused before the command, and the GPU given back.
TEST_F(ResetRunnerTest, AHolderThatCameAfterTheHoldersStepRefusesTheResetBeforeTheCommand) {
  node_.on_release = [&](bool release) {
    if (!release) return;
    pod_resources::GpuPodMap map;
    map.listed = map.fresh = true;
    map.pending[kRunnerUuid] = {{"", "ml/late", "gpu-3", "prepared by dra-gpu; the kubelet lists no pod with it yet"}};
    node_.pods = PodHoldersOf(kRunnerUuid, &map);
  };
  ASSERT_TRUE(Run());
  ExpectRefused("GpuInUse");
  EXPECT_NE(Gpu().message.find("claim ml/late on gpu-3"), std::string::npos) << Gpu().message;
  EXPECT_EQ(node_.releases, (std::vector<std::string>{std::string("release ") + kRunnerUuid,
                                                       std::string("take back ") + kRunnerUuid}));
}

TEST_F(ResetRunnerTest, HoldersDoNotTrustAPodListThatIsNotFresh) {
  node_.pods.fresh = false;
  node_.pods.error = "kubelet socket: connection refused";
  ASSERT_TRUE(Run());
  ExpectRefused("HoldersTimeout");
  EXPECT_NE(Gpu().message.find("not fresh (kubelet socket: connection refused)"), std::string::npos) << Gpu().message;
}

TEST_F(ResetRunnerTest, HoldersWithoutThePodModuleGoOnWhenNoProcessHoldsTheGpu) {
  node_.pods = {};
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(StepMessage("holders"), "no process holds the GPU; pods unknown (the pod-resources module is not running)");
}

TEST_F(ResetRunnerTest, HoldersAreRefusedWhenNvmlCannotBeRead) {
  node_.read.error = "NVML_ERROR_UNINITIALIZED";
  ASSERT_TRUE(Run());
  ExpectRefused("NvmlUnavailable");
  EXPECT_EQ(Gpu().message, "cannot read the processes on the GPU: NVML_ERROR_UNINITIALIZED");
}

// ---------------------------------------------------------------------------- 3. persistence

TEST_F(ResetRunnerTest, PersistenceThatWasOnIsRecordedTurnedOffAndTurnedOnAgainAfter) {
  node_.read.persistence = true;
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(Gpu().persistence_was_on, true);
  EXPECT_EQ(node_.persistence_sets, (std::vector<bool>{false, true}));
  EXPECT_EQ(StepMessage("persistence"), "persistence mode was on: turned off (restored after the reset)");
}

TEST_F(ResetRunnerTest, PersistenceIsLeftOnAndTheGpuRefusedWhenThatCannotBeRecorded) {
  node_.read.persistence = true;
  node_.persisted = false;
  ASSERT_TRUE(Run());
  ExpectRefused("StateNotPersisted");
  EXPECT_TRUE(node_.persistence_sets.empty());
}

TEST_F(ResetRunnerTest, PersistenceRefusedWhenItCannotBeTurnedOffAndGivenBack) {
  node_.read.persistence = true;
  node_.persistence_error = "NVML_ERROR_NO_PERMISSION";
  ASSERT_TRUE(Run());
  ExpectRefused("PersistenceModeFailed");
  EXPECT_EQ(node_.persistence_restored, (std::vector<std::string>{kRunnerUuid}));
  EXPECT_TRUE(node_.releases.empty());
}

TEST_F(ResetRunnerTest, PersistenceRefusedWhenNvmlCannotBeRead) {
  gpu_inventory::GpuMaintenanceRead broken;
  broken.error = "GPU is lost";
  node_.reads = {node_.read, broken};  // holders read it, persistence does not
  ASSERT_TRUE(Run());
  ExpectRefused("NvmlUnavailable");
  EXPECT_EQ(Gpu().message, "cannot read persistence mode: GPU is lost");
}

// -------------------------------------------------------------------------------- 4. release

TEST_F(ResetRunnerTest, ReleaseTimesOutWhenGpuInventoryKeepsTheGpuAndGivesItBack) {
  node_.inventory_lets_go = false;
  ASSERT_TRUE(Run());
  ExpectRefused("ReleaseTimeout");
  EXPECT_EQ(node_.releases, (std::vector<std::string>{std::string("release ") + kRunnerUuid, std::string("take back ") + kRunnerUuid}));
  EXPECT_FALSE(Gpu().released);
}

TEST_F(ResetRunnerTest, ReleaseGoesOnWhenNvmlIsNotInUseAtAll) {
  node_.inventory_lets_go = false;
  node_.gpu.available = false;
  node_.gpu.error = "NVML library not found";
  node_.on_release = [&](bool release) {
    if (!release) node_.gpu.available = true;
  };
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(StepMessage("release"), "NVML is not in use (NVML library not found)");
}

// ---------------------------------------------------------------------------------- 5. reset

TEST_F(ResetRunnerTest, AResetCommandThatFailsFailsTheGpuAndTheJournalSaysSo) {
  node_.command.exit_code = 3;
  node_.command.out = "";
  node_.command.err = "Resetting GPU failed.\nThe GPU is in use by another client.\n";
  ASSERT_TRUE(Run());
  ExpectFailed("ResetCommandFailed");
  EXPECT_EQ(Gpu().message, "reset-tool: exit 3: The GPU is in use by another client.");
  EXPECT_EQ(Gpu().command_output, node_.command.err);
  EXPECT_EQ(node_.releases.back(), std::string("take back ") + kRunnerUuid);
}

// ------------------------------------------------------------------------------- 6. validate

TEST_F(ResetRunnerTest, ValidateFailsWhenTheGpuDoesNotComeBack) {
  node_.inventory_takes_back = false;
  ASSERT_TRUE(Run());
  ExpectFailed("GpuMissing");
  EXPECT_NE(Gpu().message.find("does not show " + std::string(kRunnerUuid) + " again"), std::string::npos) << Gpu().message;
}

TEST_F(ResetRunnerTest, ValidateFailsWhenNvmlCannotReadTheGpu) {
  gpu_inventory::GpuMaintenanceRead broken;
  broken.error = "GPU is lost";
  node_.reads = {node_.read, node_.read, broken};  // holders, persistence, validate
  ASSERT_TRUE(Run());
  ExpectFailed("ValidationFailed");
}

TEST_F(ResetRunnerTest, ValidateFailsOnAPendingPageRetirement) {
  auto after = node_.read;
  after.retired_pages_pending = true;
  node_.reads = {node_.read, node_.read, after};
  ASSERT_TRUE(Run());
  ExpectFailed("PendingPageRetirement");
}

TEST_F(ResetRunnerTest, ValidateFailsOnAPendingRowRemap) {
  auto after = node_.read;
  after.remap_pending = true;
  node_.reads = {node_.read, node_.read, after};
  ASSERT_TRUE(Run());
  ExpectFailed("PendingRowRemap");
}

TEST_F(ResetRunnerTest, ValidateFailsOnAFailedRowRemap) {
  auto after = node_.read;
  after.remap_failure = true;
  node_.reads = {node_.read, node_.read, after};
  ASSERT_TRUE(Run());
  ExpectFailed("RowRemapFailure");
}

TEST_F(ResetRunnerTest, ValidateFailsOnAnXidSinceItBegan) {
  node_.on_release = [&](bool release) {
    if (!release) Runner().NoteXid(kRunnerUuid, "XID 79 (NVML)", std::nullopt);
  };
  ASSERT_TRUE(Run());
  ExpectFailed("XidAfterReset");
  EXPECT_EQ(Gpu().message, "XID 79 (NVML) after the reset, before it validated");
}

TEST_F(ResetRunnerTest, AnXidJudgedBeforeValidationBeganOrOnAnotherGpuIsNotHeldAgainstIt) {
  node_.on_release = [&](bool release) {
    if (release) return;
    Runner().NoteXid(kRunnerUuid, "XID 79 (kernel)", 1000);  // judged long ago, released late
    Runner().NoteXid("GPU-other", "XID 79 (NVML)", std::nullopt);
  };
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
}

TEST_F(ResetRunnerTest, ValidateFailsOnAnIncompleteFabricRegistration) {
  node_.gpu.fabric_state = 1;
  ASSERT_TRUE(Run());
  ExpectFailed("FabricIncomplete");
  EXPECT_EQ(Gpu().message, "fabric registration is not complete after the reset (state 1)");
}

TEST_F(ResetRunnerTest, ValidateSaysTheFabricIsComplete) {
  node_.gpu.fabric_state = 3;
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(StepMessage("validate"), "same UUID present, nothing pending, no XID, fabric complete");
}

// -------------------------------------------------------------------------------- 7. restore

TEST_F(ResetRunnerTest, RestoreFailsWhenTheAcknowledgementCannotBeWritten) {
  node_.journal_errors["GPU reset occurred"] = "journal socket gone";
  ASSERT_TRUE(Run());
  ExpectFailed("JournalUnavailable");
  EXPECT_EQ(Gpu().message, "the reset validated but the acknowledgement could not be written: journal socket gone");
}

TEST_F(ResetRunnerTest, RestoreFailsOnAnXidWithinTheSettleWindow) {
  settings_.settle = milliseconds(5000);
  node_.on_journal = [&](const std::string& message) {
    if (message.rfind("GPU reset occurred", 0) == 0) {
      boost::asio::post(io_, [&] { Runner().NoteXid(kRunnerUuid, "XID 48 (kernel)", node_.NowMs()); });
    }
  };
  ASSERT_TRUE(Run());
  ExpectFailed("XidAfterReset");
  EXPECT_EQ(Gpu().message, "XID 48 (kernel) within the settle window (5000 ms) after the GPU was back in service");
}

TEST_F(ResetRunnerTest, RestoreTurnsPersistenceOnAgainAndSaysWhenItCannot) {
  node_.read.persistence = true;
  node_.on_release = [&](bool release) {
    if (!release) node_.persistence_error = "NVML_ERROR_NO_PERMISSION";  // the turn-on fails
  };
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_EQ(node_.persistence_sets, (std::vector<bool>{false, true}));
  EXPECT_EQ(StepMessage("restore").rfind("persistence mode NOT restored (NVML_ERROR_NO_PERMISSION); ", 0), 0u)
      << StepMessage("restore");
}

TEST_F(ResetRunnerTest, RestoreWaitsForHealthyNoLongerThanItsTimeout) {
  node_.health_follows = false;
  node_.on_journal = [&](const std::string& message) {
    if (message.rfind("GPU reset started", 0) == 0) node_.verdicts[kRunnerUuid] = {false, "held"};  // never Healthy again
  };
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_NE(StepMessage("restore").find("the verdict was not Healthy yet when the wait ended"), std::string::npos);
}

// --------------------------------------------------------------------------- resume and stop

TEST_F(ResetRunnerTest, AGpuResumedAfterTheCommandValidatesAgainAndIsNotResetAgain) {
  Gpu().step = Step::kRestore;
  node_.verdicts[kRunnerUuid] = {false, "GPU reset in progress"};
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  EXPECT_TRUE(node_.commands.empty());
  EXPECT_EQ(StepNames(), (std::vector<std::string>{"validate:ok", "restore:ok"}));
  EXPECT_EQ(node_.journal, (std::vector<std::string>{std::string("GPU reset occurred: ") + kRunnerUuid}));
}

TEST_F(ResetRunnerTest, AGpuResumedBeforeTheCommandStartsAgainFromTheHold) {
  Gpu().step = Step::kRelease;
  ASSERT_TRUE(Run());
  ExpectOutcome("succeeded", "");
  ASSERT_FALSE(Gpu().steps.empty());
  EXPECT_EQ(Gpu().steps.front().name, "hold");
  EXPECT_EQ(node_.commands.size(), 1u);
}

TEST_F(ResetRunnerTest, AStopEndsTheWaitKillsTheCommandAndLeavesTheGpuAtItsStep) {
  node_.health_follows = false;
  settings_.hold_timeout = milliseconds(60000);
  ASSERT_TRUE(Run([&] { Runner().Stop(); }));
  EXPECT_EQ(Gpu().outcome, "");
  EXPECT_EQ(Gpu().step, Step::kHold);  // resumes from here at the next start
  EXPECT_TRUE(node_.ended.empty());
  EXPECT_EQ(node_.kills, 1);
  EXPECT_EQ(Runner().Current(), nullptr);
}

TEST(ResetRunnerLastLine, TakesTheLastNonEmptyLine) {
  EXPECT_EQ(LastLine("a\nb\n\n  \n"), "b");
  EXPECT_EQ(LastLine("only"), "only");
  EXPECT_EQ(LastLine("\n\n"), "");
}

}  // namespace
}  // namespace gns::gpu_reset
