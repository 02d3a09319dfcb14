// The nvsentinel-export module end to end against the simulated platform connector: events on
// the bus reach it once each, in order, across a connector that is down, a module restart, a
// full queue and a damaged queue file.
#include "modules/nvsentinel_export/nvsentinel_export_module.hpp"

#include "modules/nvsentinel_export/event_store.hpp"
#include "platform_connector_sim.h"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/temp_dir.hpp"

#include "nvsentinel/v1/api.pb.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

namespace gns::nvsentinel_export {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class NvsentinelExportModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_.site.node_name = "node-1";
    h_.site.paths.state_dir = (dir_ / "state").string();
    config_.socket = "unix://" + Socket().string();
    config_.retry.initial = milliseconds(10);
    config_.retry.max = milliseconds(50);
    config_.call_deadline = milliseconds(2000);
  }
  fs::path Socket() const { return dir_ / "nvsentinel.sock"; }
  void StartSim() { sim_ = std::make_unique<sim::PlatformConnectorSim>(Socket(), dir_ / "received.jsonl"); }

  void Xid(int n) {
    gpu_health::HealthEvent e;
    e.message = "Xid 48 number " + std::to_string(n);
    e.error_code = {"48"};
    e.recommended_action_name = "COMPONENT_RESET";
    e.entities_impacted = {{"GPU_UUID", "GPU-1"}};
    e.generated_seconds = 1700000000 + n;
    h_.bus.Publish(e);
  }
  // An XID event as gpu-health makes it, `age` before now.
  static gpu_health::HealthEvent XidEvent(int n, std::chrono::seconds age = std::chrono::seconds(0)) {
    gpu_health::HealthEvent e;
    e.message = "Xid 48 number " + std::to_string(n);
    e.error_code = {"48"};
    e.recommended_action_name = "COMPONENT_RESET";
    e.entities_impacted = {{"GPU_UUID", "GPU-1"}};
    e.generated_seconds =
        std::chrono::duration_cast<std::chrono::seconds>((std::chrono::system_clock::now() - age).time_since_epoch())
            .count();
    return e;
  }
  // gpu-health's event log as it republishes it after its events went out (or at its start).
  void Log(std::vector<gpu_health::HealthEvent> events) { h_.bus.Publish(gpu_health::HealthEventLog{std::move(events)}); }
  const NvsentinelExportState* State() { return h_.bus.Latest<NvsentinelExportState>(); }
  // One instance takes `event` from the topic (and the log that follows it), delivers it and
  // stops: the book then records its id as taken.
  void TakeAndStop(const gpu_health::HealthEvent& event) {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    h_.bus.Publish(event);
    Log({event});
    ASSERT_TRUE(h_.RunUntil([&] { return sim_->Events().size() >= 1 && State() && State()->queued == 0; },
                            std::chrono::seconds(15)));
  }
  std::vector<std::string> Messages() {
    std::vector<std::string> out;
    for (const auto& e : sim_->Events()) {
      const auto at = e.json.find("Xid 48 number ");
      out.push_back(at == std::string::npos ? e.check_name : e.json.substr(at, e.json.find('"', at) - at));
    }
    return out;
  }
  bool Received(std::size_t n) {
    return h_.RunUntil([&] { return sim_->Events().size() >= n; }, std::chrono::seconds(15));
  }

  test::TempDir dir_{"gns-nvs"};
  test::LoopHarness h_;
  NvsentinelExportModule::Config config_;
  std::unique_ptr<sim::PlatformConnectorSim> sim_;
};

TEST_F(NvsentinelExportModuleTest, XidEventReachesTheConnectorOnce) {
  StartSim();
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  Xid(1);
  ASSERT_TRUE(Received(1));
  const auto events = sim_->Events();
  EXPECT_NE(events[0].json.find("\"recommendedAction\":\"COMPONENT_RESET\""), std::string::npos) << events[0].json;
  EXPECT_NE(events[0].json.find("\"nodeName\":\"node-1\""), std::string::npos) << events[0].json;
  EXPECT_NE(events[0].json.find("\"processingStrategy\":\"EXECUTE_REMEDIATION\""), std::string::npos);
  EXPECT_EQ(events[0].id.size(), 36u);
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->queued == 0 && State()->delivered == 1; }));
  // Settled: nothing more is sent, and a restart of the module sends nothing again.
  m.Stop();
  m.Start(config_);
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(sim_->Events().size(), 1u);
  // The file of the delivered event is gone.
  EXPECT_TRUE(EventStore((dir_ / "state/nvsentinel-export/queue").string()).Load(1).events.empty());
}

TEST_F(NvsentinelExportModuleTest, EventsTakenBeforeTheQueueIsReadAreWrittenAtStop) {
  // The pool's threads are held, so the queue is not read yet when the module stops.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  for (int i = 0; i < 2; ++i) h_.pool.Execute([released] { released.wait(); });
  {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    Xid(1);
    h_.Drain();  // the bus hands the event over
    std::thread releaser([&] {
      std::this_thread::sleep_for(milliseconds(200));
      release.set_value();
    });
    m.Stop();  // waits for the read, then writes the event
    releaser.join();
  }
  EXPECT_EQ(EventStore((dir_ / "state/nvsentinel-export/queue").string()).Load(1).events.size(), 1u);
}

TEST_F(NvsentinelExportModuleTest, ConnectorDownThenUpDeliversInOrder) {
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  for (int i = 1; i <= 5; ++i) Xid(i);
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->queued == 5 && State()->failed_calls >= 2; }));
  StartSim();
  sim_->SetFailing(true);  // up but refusing (restarting): UNAVAILABLE
  ASSERT_TRUE(h_.RunUntil([&] { return sim_->FailedCalls() >= 2; }));
  sim_->SetFailing(false);
  ASSERT_TRUE(Received(5));
  EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 1", "Xid 48 number 2", "Xid 48 number 3",
                                                  "Xid 48 number 4", "Xid 48 number 5"}));
  ASSERT_TRUE(h_.RunUntil([&] { return State()->queued == 0; }));
}

TEST_F(NvsentinelExportModuleTest, QueuedEventsSurviveARestartAndAreSentOnce) {
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  for (int i = 1; i <= 3; ++i) Xid(i);
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->queued == 3; }));
  m.Stop();  // the connector never answered: all three stay on disk
  EXPECT_EQ(EventStore((dir_ / "state/nvsentinel-export/queue").string()).Load(1).events.size(), 3u);
  StartSim();
  m.Start(config_);
  Xid(4);
  ASSERT_TRUE(Received(4));
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 1", "Xid 48 number 2", "Xid 48 number 3",
                                                  "Xid 48 number 4"}));
  std::set<std::string> ids;
  for (const auto& e : sim_->Events()) ids.insert(e.id);
  EXPECT_EQ(ids.size(), 4u);
}

TEST_F(NvsentinelExportModuleTest, EventWhoseRemovalWasNotPersistedIsResentWithItsId) {
  // The crash point between a call that returned OK and the removal of its file: the file is
  // still there at the next start, and the event goes again with the same id.
  StartSim();
  {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    Xid(1);
    ASSERT_TRUE(Received(1));
  }
  const auto first = sim_->Events()[0];
  // Put its file back as a kill -9 before the removal would have left it.
  datamodels::HealthEvent event;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(first.json, &event).ok());
  StoredEvent stored{1, event.id(), event.SerializeAsString()};
  ASSERT_TRUE(EventStore((dir_ / "state/nvsentinel-export/queue").string()).Append({stored}));
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  ASSERT_TRUE(Received(2));
  EXPECT_EQ(sim_->Events()[1].id, first.id);  // the receiver dedupes on it
}

TEST_F(NvsentinelExportModuleTest, FullQueueDropsTheOldestAndCountsThem) {
  config_.max_queued = 3;
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  for (int i = 1; i <= 5; ++i) Xid(i);
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->queued == 3 && State()->dropped == 2; }));
  StartSim();
  ASSERT_TRUE(Received(3));
  h_.RunUntil([] { return false; }, milliseconds(200));
  EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 3", "Xid 48 number 4", "Xid 48 number 5"}));
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_nvsentinel_export_dropped_total", "").Value(), 2.0);
}

TEST_F(NvsentinelExportModuleTest, DamagedQueueFileIsMovedAsideAndTheRestDelivered) {
  const fs::path queue = dir_ / "state/nvsentinel-export/queue";
  datamodels::HealthEvent good;
  good.set_id("good-1");
  good.set_checkname("SysLogsXIDError");
  ASSERT_TRUE(EventStore(queue.string()).Append({StoredEvent{1, "good-1", good.SerializeAsString()}}));
  std::ofstream(queue / StoredEventFileName(2)) << "GNSQ1 bad 5 0000000000000000\nhello";
  StartSim();
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  ASSERT_TRUE(Received(1));
  EXPECT_EQ(sim_->Events()[0].id, "good-1");
  // Degraded at load, ok after the delivery.
  EXPECT_TRUE(h_.RunUntil([&] { return m.health == ModuleHealth::kOk; }));
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_nvsentinel_export_damaged_total", "").Value(), 1.0);
  bool moved = false;
  for (const auto& entry : fs::directory_iterator(queue)) {
    moved |= entry.path().filename().string().rfind(StoredEventFileName(2) + ".corrupt-", 0) == 0;
  }
  EXPECT_TRUE(moved);
  EXPECT_TRUE(m.failures.empty());
}

TEST_F(NvsentinelExportModuleTest, CheckConditionsAreExportedOnceAcrossRestarts) {
  StartSim();
  gpu_health::GpuHealthChecks checks;
  checks.status = "running";
  checks.passes = 1;
  checks.conditions.push_back({"GPU-1", "GpuNvlinkDown", "NVLink", "fatal", "RESTART_BM", "link 3 down", "", 1000});
  h_.bus.Publish(checks);
  {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    ASSERT_TRUE(Received(1));
    EXPECT_EQ(sim_->Events()[0].check_name, "GpuNvlinkDown");
    EXPECT_FALSE(sim_->Events()[0].is_healthy);
  }
  // The same condition at the next start: nothing new. Its clearing: one healthy event.
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(sim_->Events().size(), 1u);
  checks.conditions.clear();
  checks.passes = 2;
  h_.bus.Publish(checks);
  ASSERT_TRUE(Received(2));
  EXPECT_TRUE(sim_->Events()[1].is_healthy);
  h_.RunUntil([] { return false; }, milliseconds(200));
  EXPECT_EQ(sim_->Events().size(), 2u);
}

TEST_F(NvsentinelExportModuleTest, VerdictsThatChangedWhileAwayAreExportedOnceAtStart) {
  StartSim();
  gpu_health::DeviceHealth sick;
  sick.uuid = "GPU-1";
  sick.healthy = false;
  sick.xid = 79;
  sick.recommended_action = "RESTART_BM";
  sick.since_unix_ms = 5000;
  gpu_health::GpuHealthState state;
  state.devices = {sick};
  h_.bus.Publish(state);
  {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    ASSERT_TRUE(Received(1));  // a fresh book: the unhealthy GPU is news
    EXPECT_NE(sim_->Events()[0].json.find("verdict-at-start"), std::string::npos) << sim_->Events()[0].json;
    EXPECT_FALSE(sim_->Events()[0].is_healthy);
  }
  {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    h_.RunUntil([] { return false; }, milliseconds(300));
    EXPECT_EQ(sim_->Events().size(), 1u);  // the same verdict: nothing
  }
  // Recovered while the exporter was not running: one healthy event at the next start.
  gpu_health::DeviceHealth fine = sick;
  fine.healthy = true;
  fine.since_unix_ms = 9000;
  state.devices = {fine};
  h_.bus.Publish(state);
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  ASSERT_TRUE(Received(2));
  EXPECT_TRUE(sim_->Events()[1].is_healthy);
  h_.RunUntil([] { return false; }, milliseconds(200));
  EXPECT_EQ(sim_->Events().size(), 2u);
}

// The kill -9 window between gpu-health letting an event out and our queue file being fsynced:
// the event is in gpu-health's log (its checkpoint) at the next start, not among the ids we
// took, and is sent then, once.
TEST_F(NvsentinelExportModuleTest, AnEventTheLogHoldsThatWeNeverTookIsSentOnceAtStart) {
  StartSim();
  const auto first = XidEvent(1);
  const auto missed = XidEvent(2);
  ASSERT_NO_FATAL_FAILURE(TakeAndStop(first));
  // Made and logged by gpu-health, then the process died before we took it.
  Log({first, missed});
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  ASSERT_TRUE(Received(2));
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 1", "Xid 48 number 2"}));
  // Republished logs (after later events) bring nothing again, and neither does a restart.
  Log({first, missed});
  m.Stop();
  m.Start(config_);
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(sim_->Events().size(), 2u);
}

// A book written by a build that did not record taken ids: that build delivered what the log
// holds, so the first log is history, not news — nothing from it is sent; what comes after is.
TEST_F(NvsentinelExportModuleTest, TheFirstLogUnderABookWithoutTakenIdsIsHistory) {
  StartSim();
  fs::create_directories(dir_ / "state/nvsentinel-export");
  std::ofstream(dir_ / "state/nvsentinel-export/export-book.json") << R"({"version":1,"verdicts":{}})";
  const auto first = XidEvent(1);
  const auto second = XidEvent(2);
  Log({first, second});
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  h_.RunUntil([] { return false; }, milliseconds(500));
  EXPECT_TRUE(sim_->Events().empty());
  const auto third = XidEvent(3);
  h_.bus.Publish(third);
  Log({first, second, third});
  ASSERT_TRUE(Received(1));
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 3"}));
}

// A fresh node (no book yet) has taken nothing: the log's events inside replayWindow are sent
// once, older ones are not. This is the kill -9 that lands before our very first queue write:
// gpu-health's checkpoint holds the event, we hold nothing.
TEST_F(NvsentinelExportModuleTest, AFreshNodeSendsTheLogsEventsInsideTheReplayWindowOnce) {
  StartSim();
  config_.replay_window = std::chrono::minutes(15);
  Log({XidEvent(1, std::chrono::hours(2)), XidEvent(2, std::chrono::minutes(1)), XidEvent(3)});
  {
    test::ModuleUnderTest<NvsentinelExportModule> m(h_);
    m.Start(config_);
    ASSERT_TRUE(Received(2));
    h_.RunUntil([] { return false; }, milliseconds(300));
    EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 2", "Xid 48 number 3"}));
    ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->queued == 0; }));
  }
  // The book now records them: the next start sends nothing again.
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(sim_->Events().size(), 2u);
}

// An event we never took that is older than replayWindow was made while the exporter was off:
// acting on it now would act on history.
TEST_F(NvsentinelExportModuleTest, AnUntakenEventOlderThanTheReplayWindowIsNotSent) {
  StartSim();
  config_.replay_window = std::chrono::minutes(15);
  const auto first = XidEvent(1);
  ASSERT_NO_FATAL_FAILURE(TakeAndStop(first));
  Log({first, XidEvent(2, std::chrono::hours(2)), XidEvent(3, std::chrono::minutes(1))});
  test::ModuleUnderTest<NvsentinelExportModule> m(h_);
  m.Start(config_);
  ASSERT_TRUE(Received(2));
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(Messages(), (std::vector<std::string>{"Xid 48 number 1", "Xid 48 number 3"}));
}

}  // namespace
}  // namespace gns::nvsentinel_export
