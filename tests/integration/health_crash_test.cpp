// kill -9 of the real binary at random points while XID lines arrive in a real journal: after
// the last restart every line has been counted exactly once (gpu-health restores its counts
// and its position in the journal from one checkpoint and reads on from there), the verdicts
// are right, and a line that was in the journal before any start is not lost.
#include "journal_writer.h"
#include "support/eventually.hpp"
#include "support/http_client.hpp"
#include "support/prometheus.hpp"
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <thread>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class HealthCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-health-crash-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "journal");
    fs::create_directories(dir_ / "host/proc/sys/kernel/random");
    // The host's boot ID as the journal's: the checkpoint's verdicts belong to this boot.
    writer_ = std::make_unique<sim::JournalWriter>((dir_ / "journal").string());
    std::ofstream(dir_ / "host/proc/sys/kernel/random/boot_id") << writer_->BootId() << "\n";
    config_ = (dir_ / "site.yaml").string();
    std::ofstream(config_) << "version: v1\nnodeName: n1\npaths:\n  kubeletDir: " << (dir_ / "kubelet").string()
                           << "\n  cdiDir: " << (dir_ / "cdi").string() << "\n  stateDir: " << (dir_ / "state").string()
                           << "\n  hostRoot: " << (dir_ / "host").string()
                           << "\nmodules:\n  metrics:\n    enabled: true\n    listen: 127.0.0.1:0\n"
                              "  journald:\n    enabled: true\n    directory: "
                           << (dir_ / "journal").string()
                           << "\n    cursorFlushInterval: 50ms\n"
                              "  gpu-health:\n    enabled: true\n    adminSocket: false\n"
                              "    checkpointInterval: 50ms\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Append(std::mt19937& rng, int n) {
    static const char* kPci[] = {"0000:03:00", "0000:3b:00", "0000:86:00", "0000:cb:00"};
    static const int kXid[] = {13, 31, 48, 79};
    std::vector<sim::JournalEntry> entries;
    for (int i = 0; i < n; ++i) {
      const char* pci = kPci[rng() % 4];
      const int xid = kXid[rng() % 4];
      entries.push_back(sim::JournalWriter::Kernel(sim::XidMessage(pci, xid)));
      ++expected_["gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(pci) + "\",xid=\"" +
                  std::to_string(xid) + "\"}"];
      if (rng() % 3 == 0) entries.push_back(sim::JournalWriter::Kernel("unrelated line " + std::to_string(i)));
    }
    writer_->Append(entries);
  }

  fs::path dir_;
  std::string config_;
  std::unique_ptr<sim::JournalWriter> writer_;
  std::map<std::string, int> expected_;
};

TEST_F(HealthCrashTest, KillNineAtRandomPointsCountsEveryXidLineOnce) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  Append(rng, 5);  // in the journal before the first start
  for (int round = 0; round < 12; ++round) {
    test::Subprocess proc({Binary(), "run", "--config", config_});
    // Killed at a random point: before it has read anything, while it reads, while it writes.
    if (rng() % 2 == 0) {
      ASSERT_TRUE(proc.WaitForLine("serving /metrics")) << proc.Output();
    }
    const int n = 1 + static_cast<int>(rng() % 15);
    std::mt19937 batch_rng(rng());
    std::thread appender([&] { Append(batch_rng, n); });
    std::this_thread::sleep_for(milliseconds(rng() % 200));
    appender.join();
    std::this_thread::sleep_for(milliseconds(rng() % 100));
    proc.Signal(SIGKILL);
    ASSERT_EQ(proc.Wait(), 128 + SIGKILL);
  }

  test::Subprocess proc({Binary(), "run", "--config", config_});
  const auto line = proc.WaitForLine("serving /metrics");
  ASSERT_TRUE(line) << proc.Output();
  const auto port = PortIn(*line);
  ASSERT_NE(port, 0u);
  std::map<std::string, double> seen;
  auto all_counted = [&] {
    const auto metrics = test::HttpRequest("127.0.0.1", port, "GET", "/metrics");
    if (metrics.status != 200) return false;
    const auto scrape = test::ParsePrometheus(metrics.body);
    seen.clear();
    for (const auto& [series, value] : scrape.samples) {
      if (series.rfind("gpu_node_supervisor_xid_errors_total{", 0) == 0) seen[series] = value;
    }
    for (const auto& [series, n] : expected_) {
      if (seen[series] != n) return false;
    }
    return true;
  };
  test::Eventually(all_counted, std::chrono::seconds(30));
  // Settled: nothing more arrives later either (a replay would show here).
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(all_counted()) << proc.Output();
  for (const auto& [series, n] : expected_) EXPECT_EQ(seen[series], n) << series;
  for (const auto& [series, value] : seen) EXPECT_TRUE(expected_.count(series)) << series << " = " << value;
  proc.Signal(SIGTERM);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
}

}  // namespace
}  // namespace gns
