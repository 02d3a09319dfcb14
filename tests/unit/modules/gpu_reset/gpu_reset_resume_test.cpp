// gpu-reset's record read back at start (issue #24 §6): a gpu-reset.json of N jobs is resumed in
// O(N) memory (once every queued state message copied every job), and a record that is not a
// regular file is moved aside unread.
#include "modules/gpu_inventory/maintenance.hpp"
#include "modules/gpu_reset/gpu_reset_module.hpp"
#include "modules/gpu_reset/messages.hpp"
#include "modules/gpu_reset/reset_book.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
    if (module_) {
      bool stopped = false;
      module_->Stop([&] { stopped = true; });
      EXPECT_TRUE(h_.RunUntil([&] { return stopped; }));
      module_.reset();
    }
    context_.reset();
    fs::remove_all(dir_);
  }
  std::string BookPath() const { return (dir_ / "gpu-reset.json").string(); }
  void Start() {
    context_ = std::make_unique<ModuleContext>(h_.Parts(), "gpu-reset",
                                               [this](std::string why) { failures_.push_back(why); },
                                               [](ModuleHealth, std::string) {});
    module_ = std::make_unique<GpuResetModule>(*context_, config_);
    module_->Start();
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
      if (!job.Finished()) return false;
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
  h_.Drain();
  EXPECT_TRUE(failures_.empty());
  std::size_t aside = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().starts_with("gpu-reset.json.corrupt-")) {
      ++aside;
      EXPECT_TRUE(fs::is_fifo(fs::symlink_status(e.path())));
    }
  }
  EXPECT_EQ(aside, 1u);
  ASSERT_TRUE(h_.RunUntil([&] { return h_.bus.Latest<GpuResetState>() != nullptr; }));
  EXPECT_TRUE(h_.bus.Latest<GpuResetState>()->jobs.empty());
}

}  // namespace
}  // namespace gns::gpu_reset
