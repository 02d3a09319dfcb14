// The journald module against real journal files written by systemd-journal-remote: live
// append while tailing, the health stream read only at its consumer's request and from its
// consumer's position (restart without loss or duplication, the position rotated away, a new
// boot), the units stream's own cursor file (restart, corrupt file), enormous and binary
// fields. The fixture plays the health stream's consumer the way gpu-health does: it asks
// each journald instance for the stream after the last line it handled.
#include "journal_writer.h"
#include "modules/journald/journald_module.hpp"
#include "modules/journald/messages.hpp"
#include "support/loop_harness.hpp"
#include "support/held_pool.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

namespace gns::journald {
namespace {

namespace fs = std::filesystem;
using sim::JournalWriter;

class JournaldModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("gns-journald-" + std::to_string(rd()));
    fs::create_directories(dir_ / "journal");
    fs::create_directories(dir_ / "state");
    h_.site.paths.state_dir = (dir_ / "state").string();
    config_.directory = (dir_ / "journal").string();
    config_.units = {"nvidia-imex.service"};
    config_.cursor_flush_interval = std::chrono::milliseconds(20);
    kernel_sub_ = h_.bus.Subscribe<KernelLine>([this](const KernelLine& l) {
      if (l.generation != generation_) return;  // an earlier request's line
      position_ = {l.boot_id, l.cursor, l.monotonic_usec, l.realtime_usec};
      kernel_.push_back(l);
    });
    unit_sub_ = h_.bus.Subscribe<UnitLine>([this](const UnitLine& l) {
      if (l.acknowledgement) {
        if (l.generation != generation_) return;
        position_ = {l.boot_id, l.cursor, l.monotonic_usec, l.realtime_usec};
      }
      units_.push_back(l);
    });
    state_sub_ = h_.bus.Subscribe<JournalState>([this](const JournalState& s) {
      if (consume_ && s.reader != asked_reader_) Ask(s.reader);
    });
  }

  // The consumer asks this reader for the health stream after the last line it handled.
  void Ask(const std::string& reader) {
    asked_reader_ = reader;
    HealthStreamRequest request;
    request.consumer = "test";
    request.reader = reader;
    request.active = true;
    request.generation = generation_ = ++generations_;
    request.after = position_;
    h_.bus.Publish(request);
  }

  void TearDown() override {
    StopModule();
    kernel_sub_.Reset();
    unit_sub_.Reset();
    state_sub_.Reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void StartModule() {
    context_ = std::make_unique<ModuleContext>(
        h_.Parts(), "journald", [this](std::string why) { failures_.push_back(why); },
        [this](ModuleHealth health, std::string detail) {
          health_ = health;
          health_detail_ = std::move(detail);
        });
    module_ = std::make_unique<JournaldModule>(*context_, config_);
    module_->Start();
  }

  void StopModule() {
    if (!module_) return;
    bool stopped = false;
    module_->Stop([&] { stopped = true; });
    EXPECT_TRUE(h_.RunUntil([&] { return stopped; }));
    module_.reset();
    context_.reset();
  }

  bool Live() {
    const auto* s = h_.bus.Latest<JournalState>();
    return s != nullptr && s->health.live && (s->units.live || !s->units.open);
  }
  const StreamState& Health() { return h_.bus.Latest<JournalState>()->health; }

  std::vector<std::string> KernelMessages() const {
    std::vector<std::string> out;
    for (const auto& l : kernel_) out.push_back(l.message);
    return out;
  }

  static std::vector<sim::JournalEntry> Kernel(const std::string& prefix, int n) {
    std::vector<sim::JournalEntry> out;
    for (int i = 0; i < n; ++i) out.push_back(JournalWriter::Kernel(prefix + std::to_string(i)));
    return out;
  }

  double Metric(const std::string& text) {
    const auto rendered = h_.metrics.Render();
    const auto at = rendered.find("\n" + text + " ");
    if (at == std::string::npos) return 0;
    return std::stod(rendered.substr(at + text.size() + 2));
  }

  test::LoopHarness h_;
  fs::path dir_;
  JournaldModule::Config config_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<JournaldModule> module_;
  std::vector<std::string> failures_;
  ModuleHealth health_ = ModuleHealth::kOk;
  std::string health_detail_;
  std::vector<KernelLine> kernel_;
  std::vector<UnitLine> units_;
  bool consume_ = true;  // the fixture asks for the health stream
  JournalPosition position_;  // the consumer's: the last health line it handled
  std::string asked_reader_;
  uint64_t generation_ = 0;
  uint64_t generations_ = 0;
  Subscription kernel_sub_;
  Subscription unit_sub_;
  Subscription state_sub_;
};

TEST_F(JournaldModuleTest, PublishesWhatIsThereThenFollowsLiveAppends) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append(Kernel("boot line ", 2));
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 2 && Live(); }));
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"boot line 0", "boot line 1"}));
  EXPECT_EQ(kernel_[0].boot_id, writer.BootId());
  EXPECT_EQ(kernel_[0].priority, 3);
  EXPECT_GT(kernel_[1].realtime_usec, kernel_[0].realtime_usec);
  EXPECT_GT(kernel_[1].monotonic_usec, kernel_[0].monotonic_usec);
  EXPECT_FALSE(kernel_[0].cursor.empty());
  EXPECT_EQ(Health().start_mode, "boot-head");
  EXPECT_EQ(Health().consumer, "test");

  // Appended while the module waits on the journal's fd: each arrives without polling.
  writer.Append({JournalWriter::Kernel(sim::XidMessage("0000:3b:00", 79)),
                 JournalWriter::Syslog("gpu-reset", sim::ResetAckMessage("GPU-1")),
                 JournalWriter::Unit("nvidia-imex.service", "IMEX daemon started"),
                 JournalWriter::Unit("sshd.service", "not ours"),
                 JournalWriter::Syslog("cron", "not ours either")});
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 3 && units_.size() == 2; }));
  EXPECT_EQ(kernel_[2].message, sim::XidMessage("0000:3b:00", 79));
  // Two streams, so no order between an acknowledgement and a unit line.
  const auto ack = std::find_if(units_.begin(), units_.end(), [](const UnitLine& l) { return l.acknowledgement; });
  const auto unit = std::find_if(units_.begin(), units_.end(), [](const UnitLine& l) { return !l.acknowledgement; });
  ASSERT_TRUE(ack != units_.end() && unit != units_.end());
  EXPECT_EQ(ack->identifier, "gpu-reset");
  EXPECT_EQ(ack->message, "GPU reset occurred: GPU-1");
  EXPECT_EQ(ack->generation, generation_);
  EXPECT_EQ(unit->unit, "nvidia-imex.service");
  EXPECT_EQ(unit->generation, 0u);
  // A few more appends, one at a time.
  for (int i = 0; i < 5; ++i) {
    writer.Append(JournalWriter::Kernel("live " + std::to_string(i)));
    ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == static_cast<std::size_t>(4 + i); })) << i;
  }
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  EXPECT_EQ(units_.size(), 2u);  // sshd and cron never matched
  EXPECT_TRUE(failures_.empty());
}

TEST_F(JournaldModuleTest, RestartResumesAfterTheConsumersPositionWithoutLossOrDuplication) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append(Kernel("first ", 5));
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 5 && Live(); }));
  StopModule();
  EXPECT_EQ(position_.cursor, kernel_.back().cursor);

  writer.Append(Kernel("while down ", 3));
  kernel_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() >= 3 && Live(); }));
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"while down 0", "while down 1", "while down 2"}));
  EXPECT_EQ(Health().start_mode, "cursor");
  // And it keeps tailing after the resume; a restart with nothing new publishes nothing.
  writer.Append(JournalWriter::Kernel("after resume"));
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 4; }));
  StopModule();
  kernel_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return Live(); }));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  EXPECT_TRUE(kernel_.empty());
}

TEST_F(JournaldModuleTest, CursorRotatedAwayCountsAGapAndResumesAfterItsTimeInTheBoot) {
  JournalWriter writer((dir_ / "journal").string(), "old.journal");
  writer.Append(Kernel("old ", 3));
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 3 && Live(); }));
  StopModule();
  // Vacuumed: the file holding the cursor is gone; the same boot goes on in a new file.
  fs::remove(dir_ / "journal" / "old.journal");
  writer.SetFile("new.journal");
  writer.Append(Kernel("new ", 2));
  kernel_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() >= 2 && Live(); }));
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"new 0", "new 1"}));
  EXPECT_EQ(Health().start_mode, "gap");
  EXPECT_EQ(Health().gaps, 1u);
  EXPECT_EQ(Metric("gpu_node_supervisor_journald_cursor_gaps_total"), 1);
}

TEST_F(JournaldModuleTest, RotationWhileTailingLosesNothing) {
  JournalWriter writer((dir_ / "journal").string(), "a.journal");
  writer.Append(Kernel("a ", 2));
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 2 && Live(); }));
  fs::remove(dir_ / "journal" / "a.journal");
  writer.SetFile("b.journal");
  writer.Append(Kernel("b ", 2));
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 4; }));
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"a 0", "a 1", "b 0", "b 1"}));
}

TEST_F(JournaldModuleTest, NewBootIsReadFromItsHead) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append(Kernel("boot A ", 3));
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 3 && Live(); }));
  const std::string boot_a = writer.BootId();
  StopModule();
  writer.SetBootId(JournalWriter::NewBootId());
  writer.Append(Kernel("boot B ", 2));
  kernel_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() >= 2 && Live(); }));
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"boot B 0", "boot B 1"}));
  EXPECT_EQ(kernel_[0].boot_id, writer.BootId());
  EXPECT_NE(kernel_[0].boot_id, boot_a);
  EXPECT_EQ(Health().start_mode, "new-boot");
  EXPECT_EQ(h_.bus.Latest<JournalState>()->boot_id, writer.BootId());
}

TEST_F(JournaldModuleTest, NewBootWhileTailingIsFollowed) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append(Kernel("A ", 1));
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 1 && Live(); }));
  writer.SetBootId(JournalWriter::NewBootId());
  writer.Append(Kernel("B ", 1));
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 2; }));
  EXPECT_EQ(kernel_[1].boot_id, writer.BootId());
  EXPECT_EQ(h_.bus.Latest<JournalState>()->boot_id, writer.BootId());
}

TEST_F(JournaldModuleTest, CorruptCursorFileIsCountedAndTheBootReadFromItsHead) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "line 0"), JournalWriter::Unit("nvidia-imex.service", "line 1")});
  for (const std::string& garbage : {std::string("{not json"), std::string("\0\xff\xfe garbage", 12),
                                    std::string(R"({"version":1,"bootId":"xyz","cursor":"s=1"})")}) {
    fs::create_directories(dir_ / "state" / "journald");
    std::ofstream(dir_ / "state" / "journald" / "cursor.json", std::ios::binary | std::ios::trunc) << garbage;
    units_.clear();
    StartModule();
    ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 2 && Live(); }));
    EXPECT_EQ(h_.bus.Latest<JournalState>()->units.start_mode, "boot-head");
    StopModule();
  }
  EXPECT_EQ(Metric("gpu_node_supervisor_journald_bad_input_total{kind=\"corrupt_cursor_file\"}"), 3);
  // The stop wrote a good one again.
  std::ifstream in(dir_ / "state" / "journald" / "cursor.json");
  const std::string saved((std::istreambuf_iterator<char>(in)), {});
  std::string error;
  EXPECT_TRUE(ParseSavedPosition(saved, error)) << error;
}

// Issue #24 §6 and §8: cursor.json replaced by a FIFO (once: Start waited for a writer for ever)
// or a link to /dev/zero (once: read until memory ran out) is refused unread and moved aside;
// journald/ is 0700 whatever the umask (once: 0777 under umask 000).
TEST_F(JournaldModuleTest, ACursorFileThatIsNotARegularFileIsMovedAsideAndTheDirectoryIsPrivate) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "line 0")});
  const fs::path journald = dir_ / "state" / "journald";
  const fs::path cursor = journald / "cursor.json";
  const mode_t saved_umask = ::umask(0);
  StartModule();  // creates journald/
  ::umask(saved_umask);
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && Live(); }));
  StopModule();
  EXPECT_EQ(fs::status(journald).permissions(), fs::perms::owner_all);
  auto moved_aside = [&] {
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(journald)) n += e.path().filename().string().starts_with("cursor.json.corrupt-");
    return n;
  };
  fs::remove(cursor);
  ASSERT_EQ(::mkfifo(cursor.c_str(), 0600), 0);
  units_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && Live(); }));
  EXPECT_EQ(h_.bus.Latest<JournalState>()->units.start_mode, "boot-head");
  StopModule();
  EXPECT_EQ(moved_aside(), 1u);
  fs::remove(cursor);
  fs::create_symlink("/dev/zero", cursor);
  units_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && Live(); }));
  StopModule();
  EXPECT_EQ(moved_aside(), 2u);
  EXPECT_EQ(Metric("gpu_node_supervisor_journald_bad_input_total{kind=\"corrupt_cursor_file\"}"), 2);
  // The stop wrote a good, regular one again.
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(cursor)));
  EXPECT_TRUE(failures_.empty());
}

TEST_F(JournaldModuleTest, EnormousAndBinaryMessagesAreBoundedNeverACrash) {
  config_.max_message_bytes = 1024;
  JournalWriter writer((dir_ / "journal").string());
  std::string binary = "NVRM: Xid (PCI:0000:3b";
  binary += std::string("\0\n\xff\x01", 4);
  binary += "): 79, trunc";
  writer.Append({JournalWriter::Kernel(std::string(200000, 'x')), JournalWriter::Kernel(binary),
                 sim::JournalEntry{{{"_TRANSPORT", "kernel"}, {"PRIORITY", "garbage"}}},  // no MESSAGE
                 JournalWriter::Kernel("after")});
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 3 && Live(); }));
  EXPECT_EQ(kernel_[0].message.size(), 1024u);
  EXPECT_TRUE(kernel_[0].truncated);
  EXPECT_EQ(kernel_[1].message, binary);
  EXPECT_EQ(kernel_[2].message, "after");
  EXPECT_EQ(kernel_[2].priority, 3);
  EXPECT_EQ(Metric("gpu_node_supervisor_journald_truncated_total"), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_journald_bad_input_total{kind=\"entry_without_message\"}"), 1);
}

TEST_F(JournaldModuleTest, WakeupsAreCountedByCauseAndShownInTheState) {
  JournalWriter writer((dir_ / "journal").string());
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return Live(); }));
  writer.Append(JournalWriter::Kernel("wake me"));
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 1; }));
  const double fd = Metric(R"(gpu_node_supervisor_journald_wakeups_total{cause="fd"})");
  const double timeout = Metric(R"(gpu_node_supervisor_journald_wakeups_total{cause="timeout"})");
  EXPECT_GE(fd + timeout, 1);  // the entry came through a wake, whichever the cause
  // The state published after that round shows the same counts (/debug/state).
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto& s = h_.bus.Latest<JournalState>()->health;
    return s.fd_wakeups + s.timeout_wakeups >= 1 && s.entries == 1;
  }));
  const auto* state = &h_.bus.Latest<JournalState>()->health;
  EXPECT_TRUE(state->live);
  // sd-journal gives no timeout here unless the test directory is on a file system without
  // inotify; without one no timer is armed, so no wake can be a timeout's.
  if (!state->timeout_wait) {
    EXPECT_EQ(state->timeout_wakeups, 0u);
  }
  const nlohmann::json shown = *h_.bus.Latest<JournalState>();
  EXPECT_EQ(shown["health"]["fdWakeups"], state->fd_wakeups);
  EXPECT_EQ(shown["health"]["timeoutWakeups"], state->timeout_wakeups);
  EXPECT_EQ(shown["health"]["timeoutWait"], state->timeout_wait);
  EXPECT_TRUE(failures_.empty());
}

TEST_F(JournaldModuleTest, TheUnitsStreamResumesAfterItsOwnCursorFile) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u0"), JournalWriter::Kernel("k0")});
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && kernel_.size() == 1 && Live(); }));
  StopModule();
  std::string error;
  std::ifstream in(dir_ / "state" / "journald" / "cursor.json");
  const std::string saved((std::istreambuf_iterator<char>(in)), {});
  const auto position = ParseSavedPosition(saved, error);
  ASSERT_TRUE(position) << error;
  EXPECT_EQ(position->cursor, units_.back().cursor);
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u1"), JournalWriter::Kernel("k1")});
  units_.clear();
  kernel_.clear();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() >= 1 && kernel_.size() >= 1 && Live(); }));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  ASSERT_EQ(units_.size(), 1u);
  EXPECT_EQ(units_[0].message, "u1");
  EXPECT_EQ(units_[0].generation, 0u);
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"k1"}));
  EXPECT_EQ(h_.bus.Latest<JournalState>()->units.start_mode, "cursor");
}

// Issue #24 §6: cursor.json is read on the pool, not on the loop (a slow disk once stalled every
// module and /healthz). While it loads the health stream flows, the module says it is loading
// (not ready), and the units stream reads nothing until it knows where to resume: nothing of
// it is published twice or skipped.
TEST_F(JournaldModuleTest, TheCursorIsReadOffTheLoopAndTheUnitsStreamWaitsForIt) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u0"), JournalWriter::Kernel("k0")});
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && kernel_.size() == 1 && Live(); }));
  StopModule();
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u1"), JournalWriter::Kernel("k1")});
  units_.clear();
  kernel_.clear();

  gns::test::HeldPool held(h_.pool);  // the read cannot finish
  StartModule();
  // The loop serves: the health stream reaches its consumer meanwhile.
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 1; }));
  EXPECT_EQ(KernelMessages(), (std::vector<std::string>{"k1"}));
  EXPECT_TRUE(module_->Loading());
  EXPECT_TRUE(units_.empty()) << "the units stream read before its cursor was known";
  EXPECT_EQ(health_, ModuleHealth::kUnhealthy);
  EXPECT_NE(health_detail_.find("loading " + module_->CursorPath()), std::string::npos) << health_detail_;

  held.Release();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && Live(); }));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  ASSERT_EQ(units_.size(), 1u);
  EXPECT_EQ(units_[0].message, "u1");
  EXPECT_EQ(h_.bus.Latest<JournalState>()->units.start_mode, "cursor");
  EXPECT_EQ(health_, ModuleHealth::kOk) << health_detail_;
  EXPECT_TRUE(failures_.empty());
}

// A stop while cursor.json loads: the late read touches nothing of the gone instance (ASan
// would say), and the cursor file is left as it was for the next start.
TEST_F(JournaldModuleTest, AStopWhileTheCursorLoadsKeepsItForTheNextStart) {
  JournalWriter writer((dir_ / "journal").string());
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u0")});
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && Live(); }));
  StopModule();
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u1")});
  units_.clear();
  {
    gns::test::HeldPool held(h_.pool);
    StartModule();
    h_.Drain();
    StopModule();
  }
  ASSERT_TRUE(gns::test::FlushPool(h_));  // the late read has come back to no one
  EXPECT_TRUE(units_.empty());
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && Live(); }));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  ASSERT_EQ(units_.size(), 1u);
  EXPECT_EQ(units_[0].message, "u1");
}

TEST_F(JournaldModuleTest, AStateDirThatCannotBeWrittenCostsTheCursorNeverTheStreams) {
  // Where nothing can be created (as a read-only state dir, even for root): a file stands where
  // the state directory should be, so mkdir and every write below it fail (ENOTDIR).
  std::ofstream(dir_ / "not-a-dir") << "x";
  h_.site.paths.state_dir = (dir_ / "not-a-dir").string();
  JournalWriter writer((dir_ / "journal").string());
  writer.Append({JournalWriter::Unit("nvidia-imex.service", "u0"), JournalWriter::Kernel("XID line")});
  ASSERT_NO_THROW(StartModule());
  // Both streams flow: the kernel line reaches its consumer (gpu-health) as ever.
  ASSERT_TRUE(h_.RunUntil([&] { return units_.size() == 1 && kernel_.size() == 1 && Live(); }));
  EXPECT_EQ(kernel_[0].message, "XID line");
  // The units stream's position is not persisted: counted, and the module says so.
  ASSERT_TRUE(h_.RunUntil([&] { return Metric("gpu_node_supervisor_journald_cursor_write_failures_total") >= 1; }));
  ASSERT_TRUE(h_.RunUntil([&] { return health_ == ModuleHealth::kDegraded; }));
  EXPECT_NE(health_detail_.find("not persisted"), std::string::npos) << health_detail_;
  EXPECT_TRUE(failures_.empty()) << (failures_.empty() ? std::string() : failures_.front());
  writer.Append({JournalWriter::Kernel("XID line 2")});
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 2; }));
  StopModule();  // stops although the last flush fails too
}

TEST_F(JournaldModuleTest, TheHealthStreamWaitsForItsConsumerAndFollowsItsRequests) {
  consume_ = false;
  JournalWriter writer((dir_ / "journal").string());
  writer.Append(Kernel("before start ", 3));
  StartModule();
  // Nobody asked: nothing of the health stream is read, so nothing is lost to a late consumer.
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  EXPECT_TRUE(kernel_.empty());
  EXPECT_FALSE(Health().open);
  const std::string reader = h_.bus.Latest<JournalState>()->reader;
  ASSERT_EQ(reader.size(), 16u);

  // A request for another journald instance (an earlier one) is not ours.
  HealthStreamRequest stale;
  stale.consumer = "test";
  stale.reader = "0123456789abcdef";
  stale.active = true;
  stale.generation = 99;
  h_.bus.Publish(stale);
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  EXPECT_TRUE(kernel_.empty());

  // The consumer arrives: everything already in the journal comes, once.
  Ask(reader);
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 3 && Live(); }));
  EXPECT_EQ(kernel_[0].generation, generation_);
  EXPECT_EQ(Metric("gpu_node_supervisor_journald_health_requests_total"), 1);

  // The consumer stops (as gpu-health does when it restarts): reading pauses...
  const JournalPosition handled = position_;
  HealthStreamRequest gone;
  gone.consumer = "test";
  gone.reader = reader;
  gone.active = false;
  h_.bus.Publish(gone);
  ASSERT_TRUE(h_.RunUntil([&] { return !Health().open; }));
  writer.Append(Kernel("while the consumer is away ", 2));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  EXPECT_EQ(kernel_.size(), 3u);
  // ...and its next request, from the position it kept, brings exactly what it missed.
  position_ = handled;
  kernel_.clear();
  Ask(reader);
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 2 && Live(); }));
  EXPECT_EQ(KernelMessages(),
            (std::vector<std::string>{"while the consumer is away 0", "while the consumer is away 1"}));

  // A request from further back replays from there (a consumer that lost what it handled).
  position_ = JournalPosition{};
  kernel_.clear();
  Ask(reader);
  ASSERT_TRUE(h_.RunUntil([&] { return kernel_.size() == 5 && Live(); }));
  EXPECT_EQ(kernel_.front().message, "before start 0");
  EXPECT_TRUE(failures_.empty());
}

TEST_F(JournaldModuleTest, ConfigDefaultsAndBadValues) {
  ConfigValue empty;
  ConfigMap section(empty, "modules.journald");
  const auto config = JournaldModule::ParseConfig(section, h_.site);
  section.Finish();
  EXPECT_TRUE(config.directory.empty());
  EXPECT_TRUE(config.kernel);
  EXPECT_EQ(config.ack_identifier, "gpu-reset");
  EXPECT_EQ(config.max_message_bytes, 16384u);

  const auto bad = ParseYaml("kernel: false\nackIdentifier: \"\"\n", "site.yaml");
  ConfigMap bad_section(bad, "modules.journald");
  EXPECT_THROW(JournaldModule::ParseConfig(bad_section, h_.site), ConfigError);
  const auto small = ParseYaml("maxMessageBytes: 3\n", "site.yaml");
  ConfigMap small_section(small, "modules.journald");
  EXPECT_THROW(JournaldModule::ParseConfig(small_section, h_.site), ConfigError);
}

}  // namespace
}  // namespace gns::journald
