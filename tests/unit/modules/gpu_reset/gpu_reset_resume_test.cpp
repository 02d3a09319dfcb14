// gpu-reset's record read back at start (issue #24 §6): a gpu-reset.json of N jobs is resumed in
// O(N) memory (once every queued state message copied every job), a record that is not a
// regular file is moved aside unread, and the record is read on the pool: the loop runs on while
// it is read, the module is not ready and takes no request until it is back, and a stop during
// the read is clean.
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/api/maintenance.hpp"
#include "modules/gpu_reset/gpu_reset_module.hpp"
#include "modules/gpu_reset/messages.hpp"
#include "modules/gpu_reset/reset_book.hpp"
#include "support/held_pool.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <random>

namespace gns::gpu_reset {
namespace {

namespace fs = std::filesystem;

class FakeMaintenance : public gpu_inventory::GpuMaintenance {
 public:
  void Inspect(const std::string&, std::function<void(gpu_inventory::GpuMaintenanceRead)> done) override {
    done(gpu_inventory::GpuMaintenanceRead{});
  }
  void SetPersistence(const std::string&, bool, std::function<void(std::string)> done) override { done(""); }
};

class GpuResetResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-gpu-reset-resume-" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
    h_.site.paths.state_dir = dir_.string();
    h_.site.node_name = "n1";
    h_.services.Provide<gpu_inventory::GpuMaintenance>(std::make_shared<FakeMaintenance>());
    config_.watch_objects = false;
    config_.admin_socket = false;
  }
  void TearDown() override {
    OpenPool();
    if (module_) {
      bool stopped = false;
      module_->Stop([&] { stopped = true; });
      EXPECT_TRUE(h_.RunUntil([&] { return stopped; }));
      module_.reset();
    }
    context_.reset();
    // A save the module started may still be writing into the directory on the pool.
    h_.pool.Join();
    h_.Drain();
    fs::remove_all(dir_);
  }
  std::string BookPath() const { return (dir_ / "gpu-reset.json").string(); }
  void Start() {
    context_ = std::make_unique<ModuleContext>(h_.Parts(), "gpu-reset",
                                               [this](std::string why) { failures_.push_back(why); },
                                               [this](ModuleHealth health, std::string detail) {
                                                 health_ = health;
                                                 health_detail_ = std::move(detail);
                                               });
    module_ = std::make_unique<GpuResetModule>(*context_, config_);
    module_->Start();
  }
  // Holds both of the harness pool's threads (a slow disk): nothing on the pool runs until OpenPool.
  void BlockPool() { held_pool_.emplace(h_.pool); }
  void OpenPool() {
    if (held_pool_) held_pool_->Release();
  }
  void WriteBook(const ResetBook& book) { std::ofstream(BookPath()) << nlohmann::json(book).dump(); }
  static ResetJob FinishedAutoJob(const std::string& uuid, int64_t since) {
    ResetJob job;
    job.id = "auto/" + uuid + "/" + std::to_string(since);
    job.source = "auto";
    job.phase = "Failed";
    job.reason = "HealthNotRunning";
    job.created_unix_ms = job.started_unix_ms = job.completed_unix_ms = 1767225600000;
    job.gpus.push_back(NewGpuReset(uuid));
    job.gpus.back().outcome = "refused";
    job.gpus.back().step = Step::kDone;
    return job;
  }
  uint64_t StatePublished() const {
    for (const auto& topic : h_.bus.Topics()) {
      if (topic.name == GpuResetState::kTopic) return topic.counters.published;
    }
    return 0;
  }

  test::LoopHarness h_;
  fs::path dir_;
  GpuResetModule::Config config_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<GpuResetModule> module_;
  std::vector<std::string> failures_;
  ModuleHealth health_ = ModuleHealth::kOk;
  std::string health_detail_;
  std::optional<test::HeldPool> held_pool_;
};

TEST_F(GpuResetResumeTest, ABookOfManyJobsIsResumedWithoutACopyOfEveryJobPerChange) {
  constexpr int kJobs = 300;
  ResetBook book;
  for (int i = 0; i < kJobs; ++i) {
    ResetJob job;
    job.id = "cli/" + std::to_string(i + 1);
    job.source = "cli";
    job.created_unix_ms = 1767225600000 + i;
    job.gpus.push_back(NewGpuReset("GPU-" + std::to_string(i)));
    book.jobs.push_back(std::move(job));
  }
  book.next_cli = kJobs + 1;
  std::ofstream(BookPath()) << nlohmann::json(book).dump();
  // gpu-health is not running here: every job is refused at its first step, one after another,
  // all within one turn of the loop.
  Start();
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto* state = h_.bus.Latest<GpuResetState>();
    if (state == nullptr || !state->running.empty()) return false;
    for (const auto& job : state->jobs) {
      if (job["phase"] != "Succeeded" && job["phase"] != "Failed") return false;
    }
    return true;
  }));
  EXPECT_TRUE(failures_.empty());
  // Each job changes the state several times (step begun, ended, job finished). A message per
  // change, each with every job, was O(N²): 1200+ messages of up to 300 jobs here.
  EXPECT_LT(StatePublished(), static_cast<uint64_t>(kJobs / 10)) << "messages published";
}

TEST_F(GpuResetResumeTest, ARecordThatIsAFifoIsMovedAsideUnreadAndTheStartIsClean) {
  ASSERT_EQ(::mkfifo(BookPath().c_str(), 0600), 0);
  Start();  // once: waited for a writer for ever, the whole loop with it
  // Read on the pool: the state is published once the record is dealt with.
  ASSERT_TRUE(h_.RunUntil([&] { return h_.bus.Latest<GpuResetState>() != nullptr; }));
  EXPECT_TRUE(failures_.empty());
  std::size_t aside = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().starts_with("gpu-reset.json.corrupt-")) {
      ++aside;
      EXPECT_TRUE(fs::is_fifo(fs::symlink_status(e.path())));
    }
  }
  EXPECT_EQ(aside, 1u);
  EXPECT_TRUE(h_.bus.Latest<GpuResetState>()->jobs.empty());
}

TEST_F(GpuResetResumeTest, TheRecordIsReadOffTheLoopAndTheModuleIsNotReadyUntilItIsBack) {
  ResetBook book;
  book.jobs.push_back(FinishedAutoJob("GPU-1", 1000));
  WriteBook(book);
  BlockPool();  // the read takes as long as the test wants: a slow disk, an NFS state dir
  Start();
  // The loop turns on (once: ReadStateFile in Start, the loop stood still until the file was read).
  ASSERT_TRUE(h_.RunUntil([&] { return health_ == ModuleHealth::kUnhealthy; }, std::chrono::seconds(3)))
      << "the module never said it is not ready while the record is read";
  EXPECT_NE(health_detail_.find("gpu-reset.json"), std::string::npos) << health_detail_;
  h_.Drain();
  EXPECT_EQ(h_.bus.Latest<GpuResetState>(), nullptr) << "state published before the record was restored";
  OpenPool();
  ASSERT_TRUE(h_.RunUntil([&] { return h_.bus.Latest<GpuResetState>() != nullptr && health_ == ModuleHealth::kOk; }));
  ASSERT_EQ(h_.bus.Latest<GpuResetState>()->jobs.size(), 1u);
  EXPECT_EQ(h_.bus.Latest<GpuResetState>()->jobs.front()["id"], "auto/GPU-1/1000");
  EXPECT_TRUE(failures_.empty());
}

TEST_F(GpuResetResumeTest, ARequestThatComesWhileTheRecordIsReadWaitsForItAndIsNotDoubled) {
  config_.auto_reset = true;
  ResetBook book;
  book.jobs.push_back(FinishedAutoJob("GPU-1", 1000));  // this verdict was acted on before the restart
  WriteBook(book);
  BlockPool();
  Start();
  // The same verdict (retained, so delivered again at once) and a new one for another GPU.
  gpu_health::DeviceHealth again;
  again.uuid = "GPU-1";
  again.healthy = false;
  again.recommended_action = "COMPONENT_RESET";
  again.since_unix_ms = 1000;
  h_.bus.Publish(again);
  gpu_health::DeviceHealth fresh = again;
  fresh.uuid = "GPU-2";
  fresh.since_unix_ms = 2000;
  h_.bus.Publish(fresh);
  h_.Drain();
  EXPECT_EQ(h_.bus.Latest<GpuResetState>(), nullptr);
  OpenPool();
  // gpu-health is not running here: the new job is refused at its hold, nothing touched.
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto* state = h_.bus.Latest<GpuResetState>();
    if (state == nullptr || !state->running.empty() || state->jobs.size() < 2) return false;
    for (const auto& job : state->jobs) {
      if (job["phase"] != "Succeeded" && job["phase"] != "Failed") return false;
    }
    return true;
  }));
  h_.Drain();
  const auto& jobs = h_.bus.Latest<GpuResetState>()->jobs;
  ASSERT_EQ(jobs.size(), 2u) << jobs.dump();
  EXPECT_EQ(jobs[0]["id"], "auto/GPU-1/1000");  // restored, not replaced, not run again
  EXPECT_EQ(jobs[0]["reason"], "HealthNotRunning");
  EXPECT_EQ(jobs[1]["id"], "auto/GPU-2/2000");  // taken after the restore
  EXPECT_EQ(jobs[1]["reason"], "HealthNotRunning");
  EXPECT_TRUE(failures_.empty());
}

TEST_F(GpuResetResumeTest, AStopWhileTheRecordIsReadIsClean) {
  ResetBook book;
  ResetJob open = FinishedAutoJob("GPU-1", 1000);
  open.phase = "Pending";
  open.gpus.back().outcome.clear();
  open.gpus.back().step = Step::kQueued;
  book.jobs.push_back(open);
  WriteBook(book);
  BlockPool();
  Start();
  h_.Drain();
  bool stopped = false;
  module_->Stop([&] { stopped = true; });
  EXPECT_TRUE(stopped) << "nothing runs yet: the stop is at once";
  module_.reset();
  OpenPool();  // the read comes back to a module that is gone
  h_.Drain();
  h_.RunUntil([&] { return false; }, std::chrono::milliseconds(200));  // whatever was posted has run
  EXPECT_TRUE(failures_.empty());
  EXPECT_EQ(h_.bus.Latest<GpuResetState>(), nullptr);
  // The record is as it was: the job resumes at the next start.
  std::ifstream in(BookPath());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(ParseResetBook(text).jobs.front().phase, "Pending");
}

}  // namespace
}  // namespace gns::gpu_reset
