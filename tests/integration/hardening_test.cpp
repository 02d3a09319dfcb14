// The real binary against its process environment (issue #24 §7, §8): signals that used to end
// it without a word, a descriptor limit gRPC aborts under, and a umask of 000.
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace gns {
namespace {

namespace fs = std::filesystem;

// Generous hang guards, not timing assertions: an ASan binary on a loaded machine starts slowly.
constexpr auto kGuard = std::chrono::seconds(120);

class HardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-hardening-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_ = (dir_ / "site.yaml").string();
    std::ofstream(config_) << "version: v1\nnodeName: n1\npaths:\n  kubeletDir: " << dir_.string()
                           << "/kubelet\n  cdiDir: " << dir_.string() << "/cdi\n  stateDir: " << dir_.string()
                           << "/state\n  hostRoot: /\nmodules:\n  metrics:\n    enabled: true\n"
                              "    listen: 127.0.0.1:0\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The binary under `sh -c` so the shell can set the umask and limits first.
  std::vector<std::string> Under(const std::string& shell_prefix) const {
    return {"/bin/sh", "-c", shell_prefix + " exec \"$0\" \"$@\"", Binary(), "run", "--config", config_};
  }

  fs::path dir_;
  std::string config_;
};

// SIGPIPE, SIGHUP, SIGUSR1 and SIGUSR2 once ended the process with no log line; under umask 000
// the state directory was created 0777.
TEST_F(HardeningTest, StraySignalsAreLoggedAndIgnoredAndTheStateDirectoryIsPrivateUnderUmask000) {
  test::Subprocess proc(Under("umask 000;"));
  ASSERT_TRUE(proc.WaitForLine("supervisor ready", kGuard)) << proc.Output();
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  proc.Signal(SIGPIPE);  // ignored without a word: a log reader that went away is no event
  for (const char* name : {"SIGUSR1", "SIGUSR2", "SIGHUP"}) {
    const int sig = std::string(name) == "SIGUSR1" ? SIGUSR1 : std::string(name) == "SIGUSR2" ? SIGUSR2 : SIGHUP;
    proc.Signal(sig);
    ASSERT_TRUE(proc.WaitForLine(std::string(name) + " received: ignored", kGuard)) << proc.Output();
  }
  proc.Signal(SIGTERM);
  const auto code = proc.Wait(kGuard);
  ASSERT_TRUE(code) << proc.Output();
  EXPECT_EQ(*code, 0) << proc.Output();
}

// `ulimit -n 16` once aborted inside gRPC. A low soft limit is raised to the hard one; a hard
// limit below what the process needs is a clear message and exit 1, before anything starts.
TEST_F(HardeningTest, TooFewDescriptorsIsAMessageAndALowSoftLimitIsRaised) {
  const auto [code, output] = test::RunToCompletion(Under("ulimit -n 16 &&"));
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("the open-file limit is 16 (hard limit 16)"), std::string::npos) << output;
  EXPECT_EQ(output.find("supervisor ready"), std::string::npos) << output;

  test::Subprocess proc(Under("ulimit -Sn 16 && ulimit -Hn 4096 &&"));
  ASSERT_TRUE(proc.WaitForLine("supervisor ready", kGuard)) << proc.Output();
  proc.Signal(SIGTERM);
  const auto stopped = proc.Wait(kGuard);
  ASSERT_TRUE(stopped) << proc.Output();
  EXPECT_EQ(*stopped, 0) << proc.Output();
}

}  // namespace
}  // namespace gns
