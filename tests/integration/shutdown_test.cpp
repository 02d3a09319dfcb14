// The real binary's shutdown: SIGTERM while gpu-inventory's NVML event waiter is blocked in
// nvmlEventSetWait_v2. Its own test binary (many process starts; its own ctest time budget).
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;

class ShutdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-shutdown-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string SiteYaml(const std::string& modules) {
    return "version: v1\nnodeName: n1\npaths:\n  kubeletDir: " + dir_.string() + "/kubelet\n  cdiDir: " +
           dir_.string() + "/cdi\n  stateDir: " + dir_.string() + "/state\n  hostRoot: /\nmodules:\n" + modules;
  }
  std::string Write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  fs::path dir_;
};

// SIGTERM while gpu-inventory's NVML waiter blocks in nvmlEventSetWait_v2 (default 5 s wait):
// every one of 50 start/stop cycles exits 0, with nothing leaked (ASan/LSan run at exit in the
// sanitizer build and would fail the exit code). How fast is bench/macro/startup_bench's figure.
TEST_F(ShutdownTest, FiftyStartStopCyclesWithTheNvmlWaiterBlockedAllExitZero) {
  const std::string fake = std::string(std::getenv("GNS_BINARY_DIR")) + "/tools/sim/fake_nvml/libnvidia-ml.so.1";
  const auto config = Write("site.yaml", SiteYaml("  metrics:\n    enabled: true\n    listen: 127.0.0.1:0\n"
                                                  "  gpu-inventory:\n    enabled: true\n    nvmlLibrary: " +
                                                  fake + "\n"));
  const std::map<std::string, std::string> env{{"FAKE_NVML_CONFIG", Source("tools/sim/fake_nvml/gpus-8.json")}};
  // 50 unless GNS_SHUTDOWN_CYCLES says otherwise (a quick local run).
  const char* cycles_env = std::getenv("GNS_SHUTDOWN_CYCLES");
  const int cycles = cycles_env != nullptr ? std::atoi(cycles_env) : 50;
  // Generous hang guards, not timing assertions: an ASan binary on a loaded 2-core machine can
  // take tens of seconds to start.
  constexpr auto kGuard = std::chrono::seconds(120);
  for (int cycle = 1; cycle <= cycles; ++cycle) {
    test::Subprocess proc({Binary(), "run", "--config", config}, env);
    // "NVML up" is logged once the event set answered its first wait: the waiter then blocks.
    ASSERT_TRUE(proc.WaitForLine("NVML up", kGuard)) << "cycle " << cycle << ": " << proc.Output();
    proc.Signal(SIGTERM);
    const auto code = proc.Wait(kGuard);
    ASSERT_TRUE(code) << "cycle " << cycle << ": no exit\n" << proc.Output();
    ASSERT_EQ(*code, 0) << "cycle " << cycle << ": " << proc.Output();
    ASSERT_NE(proc.Output().find("all modules stopped"), std::string::npos) << proc.Output();
  }
}

}  // namespace
}  // namespace gns
