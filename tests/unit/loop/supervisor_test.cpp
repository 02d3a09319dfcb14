// Supervision: restart with backoff, isolation of the other modules, stop order, deadlines,
// health and readiness reporting.
#include "loop/supervisor.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <boost/asio/steady_timer.hpp>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gns {
namespace {

using std::chrono::milliseconds;

// What a scripted test module does, shared between its successive instances.
struct Script {
  std::vector<std::string>* journal = nullptr;
  int fail_starts = 0;     // throw from Start() this many times
  bool hang_on_stop = false;
  int starts = 0;
  int stops = 0;
  ModuleContext* live = nullptr;  // the context of the running instance
};

class ScriptedModule final : public Module {
 public:
  ScriptedModule(ModuleContext& context, Script& script) : context_(context), script_(script) {}
  ~ScriptedModule() override {
    if (script_.live == &context_) script_.live = nullptr;
  }
  void Start() override {
    ++script_.starts;
    script_.journal->push_back("start " + context_.Name());
    if (script_.fail_starts > 0) {
      --script_.fail_starts;
      throw std::runtime_error("scripted start failure");
    }
    script_.live = &context_;
  }
  void Stop(std::function<void()> done) override {
    ++script_.stops;
    script_.journal->push_back("stop " + context_.Name());
    if (script_.hang_on_stop) return;  // never calls done
    done();
  }

 private:
  ModuleContext& context_;
  Script& script_;
};

class SupervisorTest : public ::testing::Test {
 protected:
  ModuleSpec Spec(const std::string& name, Script& script) {
    script.journal = &journal_;
    return ModuleSpec{name, [&script](ModuleContext& c) { return std::make_unique<ScriptedModule>(c, script); }};
  }
  ModuleSpec SpecUsing(const std::string& name, Script& script, std::vector<std::string> uses) {
    auto spec = Spec(name, script);
    spec.uses = std::move(uses);
    return spec;
  }
  ModuleSpec SpecFollowing(const std::string& name, Script& script, std::vector<std::string> follows) {
    auto spec = Spec(name, script);
    spec.follows = std::move(follows);
    return spec;
  }
  bool SawState(const std::string& name, ModuleState state, const std::string& detail) {
    h_.Drain();
    for (const auto& states : history_)
      for (const auto& m : states.modules)
        if (m.name == name && m.state == state && m.detail == detail) return true;
    return false;
  }
  std::vector<std::string> JournalSince(std::size_t from) {
    return std::vector<std::string>(journal_.begin() + static_cast<std::ptrdiff_t>(from), journal_.end());
  }

  std::unique_ptr<Supervisor> Make(std::vector<ModuleSpec> specs, milliseconds stop_timeout = milliseconds(2000)) {
    SupervisorSettings settings;
    settings.stop_timeout = stop_timeout;
    settings.restart_backoff = {milliseconds(2), milliseconds(8), 2.0, 0.0};
    auto sup = std::make_unique<Supervisor>(h_.Parts(), settings, std::move(specs), [] { return 1.0; });
    states_sub_ = h_.bus.Subscribe<ModuleStates>([this](const ModuleStates& s) { history_.push_back(s); });
    return sup;
  }

  const ModuleStatus& StatusOf(Supervisor& sup, const std::string& name) {
    static thread_local ModuleStates snapshot;
    snapshot = sup.Snapshot();
    for (const auto& m : snapshot.modules)
      if (m.name == name) return m;
    throw std::runtime_error("no module " + name);
  }

  test::LoopHarness h_;
  std::vector<std::string> journal_;
  std::vector<ModuleStates> history_;
  Subscription states_sub_;
};

TEST_F(SupervisorTest, ModuleThatFailsToStartIsRestartedWithBackoffWhileOthersKeepRunning) {
  Script steady, flaky;
  flaky.fail_starts = 3;
  auto sup = Make({Spec("steady", steady), Spec("flaky", flaky)});
  sup->StartAll();
  ASSERT_TRUE(h_.RunUntil([&] { return StatusOf(*sup, "flaky").state == ModuleState::kRunning; }));
  EXPECT_EQ(flaky.starts, 4);
  EXPECT_EQ(StatusOf(*sup, "flaky").restarts, 3);
  EXPECT_EQ(steady.starts, 1);
  EXPECT_EQ(steady.stops, 0);
  EXPECT_EQ(StatusOf(*sup, "steady").state, ModuleState::kRunning);
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_module_restarts_total", "", {{"module", "flaky"}}).Value(), 3);
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_module_up", "", {{"module", "flaky"}}).Value(), 1);
}

TEST_F(SupervisorTest, ModuleThatReportsFailureLaterIsStoppedAndRestartedAsANewInstance) {
  Script steady, worker;
  auto sup = Make({Spec("steady", steady), Spec("worker", worker)});
  sup->StartAll();
  h_.Drain();
  ASSERT_NE(worker.live, nullptr);
  ModuleContext* first = worker.live;
  first->ReportFailure("lost its socket");
  ASSERT_TRUE(h_.RunUntil([&] { return worker.starts == 2 && worker.live != nullptr; }));
  EXPECT_EQ(worker.stops, 1);
  EXPECT_EQ(StatusOf(*sup, "worker").state, ModuleState::kRunning);
  EXPECT_EQ(StatusOf(*sup, "worker").restarts, 1);
  EXPECT_EQ(steady.starts, 1);
  EXPECT_EQ(steady.stops, 0);

  // The failure was visible on the bus (retained module states) while it happened.
  h_.Drain();
  bool saw_backoff = false;
  for (const auto& states : history_)
    for (const auto& m : states.modules)
      if (m.name == "worker" && m.state == ModuleState::kBackoff && m.detail == "lost its socket") saw_backoff = true;
  EXPECT_TRUE(saw_backoff);
}

TEST_F(SupervisorTest, StaleFailureReportFromAReplacedInstanceIsIgnored) {
  Script worker;
  auto sup = Make({Spec("worker", worker)});
  sup->StartAll();
  h_.Drain();
  worker.live->ReportFailure("first");
  worker.live->ReportFailure("again, same instance");
  ASSERT_TRUE(h_.RunUntil([&] { return worker.starts == 2 && StatusOf(*sup, "worker").state == ModuleState::kRunning; }));
  h_.RunUntil([] { return false; }, milliseconds(50));
  EXPECT_EQ(worker.starts, 2);
  EXPECT_EQ(StatusOf(*sup, "worker").restarts, 1);
}

TEST_F(SupervisorTest, StopAllStopsInReverseStartOrder) {
  Script a, b, c;
  auto sup = Make({Spec("a", a), Spec("b", b), Spec("c", c)});
  sup->StartAll();
  h_.Drain();
  std::optional<bool> graceful;
  sup->StopAll([&](bool g) { graceful = g; });
  ASSERT_TRUE(h_.RunUntil([&] { return graceful.has_value(); }));
  EXPECT_TRUE(*graceful);
  EXPECT_EQ(journal_, (std::vector<std::string>{"start a", "start b", "start c", "stop c", "stop b", "stop a"}));
  for (const auto& m : sup->Snapshot().modules) EXPECT_EQ(m.state, ModuleState::kStopped);
}

TEST_F(SupervisorTest, MissedStopDeadlineReportsAHardStop) {
  Script a, stuck;
  stuck.hang_on_stop = true;
  auto sup = Make({Spec("a", a), Spec("stuck", stuck)}, milliseconds(30));
  sup->StartAll();
  h_.Drain();
  std::optional<bool> graceful;
  sup->StopAll([&](bool g) { graceful = g; });
  ASSERT_TRUE(h_.RunUntil([&] { return graceful.has_value(); }));
  EXPECT_FALSE(*graceful);
  EXPECT_EQ(a.stops, 0);  // stopping went no further than the stuck module
}

TEST_F(SupervisorTest, ModuleInBackoffDuringShutdownIsNotRestarted) {
  Script flaky;
  flaky.fail_starts = 100;
  SupervisorSettings settings;
  settings.restart_backoff = {milliseconds(10000), milliseconds(10000), 2.0, 0.0};
  Supervisor sup(h_.Parts(), settings, {Spec("flaky", flaky)}, [] { return 1.0; });
  sup.StartAll();
  ASSERT_TRUE(h_.RunUntil([&] { return sup.Snapshot().modules[0].state == ModuleState::kBackoff; }));
  std::optional<bool> graceful;
  sup.StopAll([&](bool g) { graceful = g; });
  ASSERT_TRUE(h_.RunUntil([&] { return graceful.has_value(); }));
  EXPECT_TRUE(*graceful);
  EXPECT_EQ(flaky.starts, 1);
}

TEST_F(SupervisorTest, UnhealthyModuleIsNotReady) {
  Script a;
  auto sup = Make({Spec("a", a)});
  sup->StartAll();
  h_.Drain();
  a.live->SetHealth(ModuleHealth::kUnhealthy, "NVML not loaded");
  h_.Drain();
  const auto* states = h_.bus.Latest<ModuleStates>();
  ASSERT_NE(states, nullptr);
  const auto not_ready = states->NotReady();
  ASSERT_EQ(not_ready.size(), 1u);
  EXPECT_EQ(not_ready[0]->name, "a");
  EXPECT_EQ(not_ready[0]->detail, "NVML not loaded");
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_module_up", "", {{"module", "a"}}).Value(), 0);
  a.live->SetHealth(ModuleHealth::kDegraded, "slow");
  h_.Drain();
  EXPECT_TRUE(h_.bus.Latest<ModuleStates>()->NotReady().empty());
}

TEST_F(SupervisorTest, UserIsStoppedBeforeItsProviderRestartsAndStartedAgainAfterIt) {
  Script kube, other, controller;
  auto sup = Make({Spec("kube", kube), Spec("other", other), SpecUsing("controller", controller, {"kube"})});
  sup->StartAll();
  h_.Drain();
  ASSERT_EQ(journal_, (std::vector<std::string>{"start kube", "start other", "start controller"}));
  ModuleContext* first_controller = controller.live;
  const std::size_t mark = journal_.size();
  kube.live->ReportFailure("token file unreadable");
  ASSERT_TRUE(h_.RunUntil([&] {
    return controller.starts == 2 && StatusOf(*sup, "controller").state == ModuleState::kRunning;
  }));
  // The user goes down first (it may still call the provider while it stops), comes back last.
  EXPECT_EQ(JournalSince(mark),
            (std::vector<std::string>{"stop controller", "stop kube", "start kube", "start controller"}));
  EXPECT_NE(controller.live, first_controller);  // a new instance, which finds the new services
  EXPECT_EQ(other.stops, 0);
  EXPECT_TRUE(SawState("controller", ModuleState::kWaiting, "waiting for kube (restarting)"));
  EXPECT_EQ(StatusOf(*sup, "controller").restarts, 1);
  EXPECT_EQ(StatusOf(*sup, "kube").restarts, 1);
}

TEST_F(SupervisorTest, AFollowerRunsWithoutTheModuleItFollowsAndPicksItUpWhenItRuns) {
  Script kube, health;
  kube.fail_starts = 2;
  auto sup = Make({Spec("kube", kube), SpecFollowing("health", health, {"kube"})});
  sup->StartAll();
  h_.Drain();
  // kube failed its start: health does not wait for it.
  EXPECT_EQ(health.starts, 1);
  EXPECT_EQ(StatusOf(*sup, "health").state, ModuleState::kRunning);
  const std::size_t mark = journal_.size();
  ASSERT_TRUE(h_.RunUntil([&] { return StatusOf(*sup, "kube").state == ModuleState::kRunning && health.starts == 2; }));
  // kube's failed starts leave health alone (it holds nothing of kube); once kube runs, health
  // starts again so that it finds kube's services.
  EXPECT_EQ(JournalSince(mark),
            (std::vector<std::string>{"start kube", "stop kube", "start kube", "stop health", "start health"}));
  EXPECT_EQ(StatusOf(*sup, "health").state, ModuleState::kRunning);
  EXPECT_EQ(StatusOf(*sup, "health").restarts, 1);
}

TEST_F(SupervisorTest, AFollowerGoesDownBeforeItsModuleFailsAndComesBackAtOnceWithoutIt) {
  Script kube, health;
  auto sup = Make({Spec("kube", kube), SpecFollowing("health", health, {"kube"})});
  sup->StartAll();
  h_.Drain();
  ASSERT_EQ(journal_, (std::vector<std::string>{"start kube", "start health"}));
  const std::size_t mark = journal_.size();
  kube.live->ReportFailure("API server gone");
  ASSERT_TRUE(h_.RunUntil([&] { return health.starts == 3 && StatusOf(*sup, "kube").state == ModuleState::kRunning; }));
  // Down before kube (it may hold kube's client), back while kube waits out its backoff, and
  // again once kube runs.
  EXPECT_EQ(JournalSince(mark), (std::vector<std::string>{"stop health", "stop kube", "start health", "start kube",
                                                          "stop health", "start health"}));
  h_.Drain();
  EXPECT_EQ(StatusOf(*sup, "health").state, ModuleState::kRunning);
}

TEST_F(SupervisorTest, AFollowerStartedWithItsModuleRunningIsNotRestarted) {
  Script kube, health;
  auto sup = Make({Spec("kube", kube), SpecFollowing("health", health, {"kube"})});
  sup->StartAll();
  h_.RunUntil([] { return false; }, milliseconds(30));
  EXPECT_EQ(health.starts, 1);
  EXPECT_EQ(StatusOf(*sup, "health").restarts, 0);
  bool done = false;
  sup->StopAll([&](bool) { done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return done; }));
  EXPECT_EQ(journal_.back(), "stop kube");
}

TEST_F(SupervisorTest, UserWaitsWhileItsProviderFailsToStart) {
  Script kube, controller;
  kube.fail_starts = 3;
  auto sup = Make({Spec("kube", kube), SpecUsing("controller", controller, {"kube"})});
  sup->StartAll();
  h_.Drain();
  EXPECT_EQ(controller.starts, 0);
  EXPECT_EQ(StatusOf(*sup, "controller").state, ModuleState::kWaiting);
  EXPECT_EQ(StatusOf(*sup, "controller").detail, "waiting for kube");
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_module_up", "", {{"module", "controller"}}).Value(), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return StatusOf(*sup, "controller").state == ModuleState::kRunning; }));
  EXPECT_EQ(kube.starts, 4);
  EXPECT_EQ(controller.starts, 1);
  EXPECT_EQ(journal_.back(), "start controller");
  EXPECT_EQ(StatusOf(*sup, "controller").restarts, 0);
}

TEST_F(SupervisorTest, RestartsCascadeDownAChainOfUsers) {
  Script a, b, c;
  auto sup = Make({Spec("a", a), SpecUsing("b", b, {"a"}), SpecUsing("c", c, {"b"})});
  sup->StartAll();
  h_.Drain();
  const std::size_t mark = journal_.size();
  a.live->ReportFailure("boom");
  ASSERT_TRUE(h_.RunUntil([&] { return c.starts == 2 && StatusOf(*sup, "c").state == ModuleState::kRunning; }));
  EXPECT_EQ(JournalSince(mark),
            (std::vector<std::string>{"stop c", "stop b", "stop a", "start a", "start b", "start c"}));
}

TEST_F(SupervisorTest, AUserFailingAloneLeavesItsProviderRunning) {
  Script kube, controller;
  auto sup = Make({Spec("kube", kube), SpecUsing("controller", controller, {"kube"})});
  sup->StartAll();
  h_.Drain();
  controller.live->ReportFailure("lost the lease");
  ASSERT_TRUE(h_.RunUntil([&] { return controller.starts == 2 && controller.live != nullptr; }));
  EXPECT_EQ(kube.starts, 1);
  EXPECT_EQ(kube.stops, 0);
}

TEST_F(SupervisorTest, UserInBackoffWhenItsProviderFailsWaitsForTheProvider) {
  Script kube, controller;
  auto sup = Make({Spec("kube", kube), SpecUsing("controller", controller, {"kube"})});
  sup->StartAll();
  h_.Drain();
  controller.fail_starts = 1000;  // its next starts fail: it sits in backoff
  controller.live->ReportFailure("first");
  ASSERT_TRUE(h_.RunUntil([&] { return controller.starts >= 2; }));
  controller.fail_starts = 0;
  kube.live->ReportFailure("provider too");
  ASSERT_TRUE(h_.RunUntil([&] {
    return kube.starts == 2 && StatusOf(*sup, "controller").state == ModuleState::kRunning;
  }));
  EXPECT_EQ(journal_.back(), "start controller");
}

TEST_F(SupervisorTest, UsesOfModulesNotEnabledAreIgnored) {
  Script controller;
  auto sup = Make({SpecUsing("controller", controller, {"kube"})});
  sup->StartAll();
  h_.Drain();
  EXPECT_EQ(StatusOf(*sup, "controller").state, ModuleState::kRunning);
}

TEST_F(SupervisorTest, AProviderMustStartBeforeItsUsers) {
  Script kube, controller;
  EXPECT_THROW(Make({SpecUsing("controller", controller, {"kube"}), Spec("kube", kube)}), std::logic_error);
}

TEST_F(SupervisorTest, WaitingUserIsStoppedCleanlyAtShutdown) {
  Script kube, controller;
  kube.fail_starts = 1000;
  auto sup = Make({Spec("kube", kube), SpecUsing("controller", controller, {"kube"})});
  sup->StartAll();
  h_.Drain();
  std::optional<bool> graceful;
  sup->StopAll([&](bool g) { graceful = g; });
  ASSERT_TRUE(h_.RunUntil([&] { return graceful.has_value(); }));
  EXPECT_TRUE(*graceful);
  EXPECT_EQ(controller.starts, 0);
  for (const auto& m : sup->Snapshot().modules) EXPECT_EQ(m.state, ModuleState::kStopped);
}

}  // namespace
}  // namespace gns
