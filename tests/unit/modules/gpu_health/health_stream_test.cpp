// journald and gpu-health together over real journal files: every kernel line is acted on
// exactly once by gpu-health whatever the start order, across a restart of gpu-health alone
// while lines arrive, and across a restart of journald alone. "Once" is read off what an
// operator sees: the XID counters, the HealthEvents on the bus and the verdicts.
#include "journal_writer.h"
#include "modules/gpu_health/gpu_health_module.hpp"
#include "modules/journald/journald_module.hpp"
#include "support/eventually.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"

#include <gtest/gtest.h>
#include <systemd/sd-journal.h>

#include <filesystem>
#include <atomic>
#include <future>
#include <map>
#include <optional>
#include <thread>
#include <string>
#include <vector>

namespace gns::gpu_health {
namespace {

namespace fs = std::filesystem;
using sim::JournalWriter;

constexpr const char* kStreamA = "GPU-455d8f70-2051-db6c-0430-ffc457bff834";  // 0000:03:00
constexpr const char* kStreamB = "GPU-00000000-0000-0000-0000-000000000002";  // 0000:3b:00

class HealthStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnshs-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    fs::create_directories(dir_ + "/journal");
    fs::create_directories(dir_ + "/state");
    h_.site.paths.state_dir = dir_ + "/state";
    h_.site.node_name = "node1";
    writer_ = std::make_unique<JournalWriter>(dir_ + "/journal");
    journal_config_.directory = dir_ + "/journal";
    journal_config_.cursor_flush_interval = std::chrono::milliseconds(20);
    health_config_.catalog = XidCatalog::Builtin();
    health_config_.checkpoint_interval = std::chrono::milliseconds(20);
    health_config_.admin_socket = false;
    gpu_inventory::GpuInventory inv;
    inv.available = true;
    for (const auto& [uuid, bus] : {std::pair{kStreamA, "00000000:03:00.0"}, std::pair{kStreamB, "00000000:3B:00.0"}}) {
      gpu_inventory::GpuInfo g;
      g.uuid = uuid;
      g.pci_bus_id = bus;
      g.pci = *gpu_inventory::PciAddress::Parse(bus);
      inv.gpus.push_back(g);
    }
    h_.bus.Publish(inv);
    event_sub_ = h_.bus.Subscribe<HealthEvent>([this](const HealthEvent& e) {
      ++events_[e.error_code.empty() ? "healthy" : e.entities_impacted.back().value + "/" + e.error_code[0]];
    });
  }
  void TearDown() override {
    health_.Stop();
    journald_.Stop();
    event_sub_.Reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void StartJournald() { journald_.Start(journal_config_); }
  void StartHealth() { health_.Start(health_config_); }

  double Count(const char* uuid, uint32_t xid) {
    const auto rendered = h_.metrics.Render();
    const std::string key =
        "\ngpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(uuid) + "\",xid=\"" + std::to_string(xid) + "\"} ";
    const auto at = rendered.find(key);
    return at == std::string::npos ? 0 : std::stod(rendered.substr(at + key.size()));
  }
  // Each XID line appended: a distinct occurrence, its own first event.
  void AppendXid(const char* pci, uint32_t xid) {
    writer_->Append(JournalWriter::Kernel(sim::XidMessage(pci, xid)));
    ++appended_[std::string(pci) + "/" + std::to_string(xid)];
  }
  bool Live() {
    const auto* s = h_.bus.Latest<journald::JournalState>();
    return s != nullptr && s->health.open && s->health.live;
  }
  // Every count and event as appended, and nothing more arriving for a while.
  void ExpectExactlyOnce() {
    const std::map<std::string, const char*> uuid_of = {{"0000:03:00", kStreamA}, {"0000:3b:00", kStreamB}};
    auto all_counted = [&] {
      for (const auto& [key, n] : appended_) {
        const auto slash = key.find('/');
        const uint32_t xid = static_cast<uint32_t>(std::stoul(key.substr(slash + 1)));
        if (Count(uuid_of.at(key.substr(0, slash)), xid) != n) return false;
      }
      return true;
    };
    ASSERT_TRUE(h_.RunUntil([&] { return all_counted() && Live(); })) << h_.metrics.Render();
    h_.RunUntil([] { return false; }, std::chrono::milliseconds(200));
    EXPECT_TRUE(all_counted()) << h_.metrics.Render();
    for (const auto& [key, n] : appended_) {
      const auto slash = key.find('/');
      const std::string event_key = std::string(uuid_of.at(key.substr(0, slash))) + key.substr(slash);
      // Non-fatal XIDs of one key within the dedup window are rate-limited: at most one event
      // per key per instance here; never more events than occurrences.
      EXPECT_GE(events_[event_key], 1) << event_key;
      EXPECT_LE(events_[event_key], n) << event_key;
    }
  }

  test::LoopHarness h_;
  std::string dir_;
  std::unique_ptr<JournalWriter> writer_;
  journald::JournaldModule::Config journal_config_;
  GpuHealthModule::Config health_config_;
  test::ModuleUnderTest<journald::JournaldModule> journald_{h_};
  test::ModuleUnderTest<GpuHealthModule> health_{h_};
  std::map<std::string, int> appended_;
  std::map<std::string, int> events_;
  Subscription event_sub_;
};

TEST_F(HealthStreamTest, LinesInTheJournalBeforeStartAreHandledOnceWhenJournaldStartsFirst) {
  // A GPU that failed before the pod came up.
  AppendXid("0000:03:00", 48);
  AppendXid("0000:3b:00", 13);
  writer_->Append(JournalWriter::Kernel("usb 1-1: new high-speed USB device"));
  StartJournald();
  // The manifest's order: journald runs (and used to read everything) before gpu-health.
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  StartHealth();
  ExpectExactlyOnce();
  ASSERT_TRUE(h_.bus.LatestByKey<DeviceHealth>().count(kStreamA));
  EXPECT_FALSE(h_.bus.LatestByKey<DeviceHealth>().at(kStreamA).healthy);
  EXPECT_EQ(events_[std::string(kStreamA) + "/48"], 1);
}

TEST_F(HealthStreamTest, LinesInTheJournalBeforeStartAreHandledOnceWhenGpuHealthStartsFirst) {
  AppendXid("0000:03:00", 48);
  AppendXid("0000:3b:00", 13);
  StartHealth();
  StartJournald();
  ExpectExactlyOnce();
  ASSERT_TRUE(h_.bus.LatestByKey<DeviceHealth>().count(kStreamA));
  EXPECT_FALSE(h_.bus.LatestByKey<DeviceHealth>().at(kStreamA).healthy);
  EXPECT_EQ(events_[std::string(kStreamA) + "/48"], 1);
}

TEST_F(HealthStreamTest, ARestartOfGpuHealthAloneWhileLinesArriveLosesAndRepeatsNothing) {
  StartJournald();
  StartHealth();
  AppendXid("0000:03:00", 13);
  AppendXid("0000:3b:00", 31);
  ExpectExactlyOnce();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    health_.Stop();
    // Arrive while gpu-health is down (a crash loop, an update of its config).
    AppendXid("0000:03:00", 13);
    AppendXid("0000:3b:00", 79);
    StartHealth();
    AppendXid("0000:3b:00", 31);  // and right after it is back
    ExpectExactlyOnce();
  }
  EXPECT_FALSE(h_.bus.LatestByKey<DeviceHealth>().at(kStreamB).healthy);
}

TEST_F(HealthStreamTest, ARestartOfJournaldAloneRepeatsNothing) {
  StartJournald();
  StartHealth();
  for (int i = 0; i < 5; ++i) AppendXid("0000:03:00", 13);
  ExpectExactlyOnce();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    journald_.Stop();
    AppendXid("0000:3b:00", 13);  // while journald is down
    StartJournald();
    AppendXid("0000:03:00", 13);
    ExpectExactlyOnce();
  }
  const auto* state = h_.bus.Latest<journald::JournalState>();
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->health.consumer, "gpu-health");
  EXPECT_EQ(state->health.start_mode, "cursor");  // after gpu-health's last handled line
}

TEST_F(HealthStreamTest, TheCheckpointHoldsThePositionWithTheCountsItProduced) {
  StartJournald();
  StartHealth();
  AppendXid("0000:03:00", 48);
  AppendXid("0000:03:00", 13);
  ExpectExactlyOnce();
  health_.Stop();  // a clean stop writes what was handled
  std::string text;
  std::string error;
  ASSERT_TRUE(ReadWholeFile(h_.site.paths.state_dir + "/gpu-health/devices.json", text, error)) << error;
  const auto saved = HealthCheckpoint::Parse(text, error);
  ASSERT_TRUE(saved) << error;
  EXPECT_FALSE(saved->journal.cursor.empty());
  EXPECT_EQ(saved->journal.boot_id, writer_->BootId());
  uint64_t counted = 0;
  for (const auto& c : saved->xid_counts) counted += c.count;
  EXPECT_EQ(counted, 2u);
  ASSERT_EQ(saved->devices.size(), 1u);
  EXPECT_EQ(saved->devices[0].uuid, kStreamA);
}

TEST_F(HealthStreamTest, TheCheckpointAVerdictTakesAtOnceHoldsTheLineThatCausedIt) {
  health_config_.checkpoint_interval = std::chrono::hours(1);  // no position-only write meanwhile
  StartJournald();
  StartHealth();
  // A first line that changes nothing: the boot is known and the writer idle when the next comes.
  writer_->Append(JournalWriter::Kernel("unrelated kernel line"));
  ASSERT_TRUE(h_.RunUntil([&] { return Live(); }));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(300));
  const std::string path = h_.site.paths.state_dir + "/gpu-health/devices.json";
  std::error_code ignored;
  fs::remove(path, ignored);
  // Both pool threads held: the checkpoint the verdict takes waits behind them, and the writer
  // starts no second write until the loop hears that the first one landed.
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  std::atomic<int> held{0};
  for (int i = 0; i < 2; ++i) h_.pool.Execute([gate, &held] { ++held; gate.wait(); });
  while (held.load() < 2) std::this_thread::yield();
  AppendXid("0000:03:00", 48);  // fatal: a verdict, persisted at once
  ASSERT_TRUE(h_.RunUntil([&] { return Count(kStreamA, 48) == 1; }));
  h_.Drain();
  open.set_value();
  // The loop stays still: what lands is that first checkpoint, as a kill -9 would leave it.
  std::optional<HealthCheckpoint> on_disk;
  gns::test::Eventually(
      [&] {
        std::string text, error;
        if (ReadWholeFile(path, text, error)) on_disk = HealthCheckpoint::Parse(text, error);
        return on_disk.has_value();
      },
      std::chrono::seconds(20), std::chrono::milliseconds(5));
  ASSERT_TRUE(on_disk);
  ASSERT_EQ(on_disk->devices.size(), 1u);
  uint64_t counted = 0;
  for (const auto& c : on_disk->xid_counts) counted += c.count;
  EXPECT_EQ(counted, 1u);
  // With the count, the position of the line that produced it (the journal's last entry), not
  // of the line before: a restart from this file reads on after the XID instead of again.
  sd_journal* j = nullptr;
  ASSERT_GE(sd_journal_open_directory(&j, (dir_ + "/journal").c_str(), 0), 0);
  char* cursor = nullptr;
  ASSERT_GE(sd_journal_seek_tail(j), 0);
  ASSERT_GT(sd_journal_previous(j), 0);
  ASSERT_GE(sd_journal_get_cursor(j, &cursor), 0);
  EXPECT_EQ(on_disk->journal.cursor, std::string(cursor));
  free(cursor);
  sd_journal_close(j);
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
}

}  // namespace
}  // namespace gns::gpu_health
