// nvsentinel-export through the real binary: XID lines in a real journal become HealthEvents at
// the platform-connector simulator (gns-sim-nvsentinel, a separate process that records every
// event it takes); the connector stopped and started again gets every event in order; kill -9
// of the supervisor in the middle of deliveries ends with every event delivered, counted by id
// at the simulator: none missing, and after dedupe by id none doubled (a resend carries the id
// of the first send).
#include "journal_writer.h"
#include "support/eventually.hpp"
#include "support/http_client.hpp"
#include "support/prometheus.hpp"
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class NvsentinelExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-nvs-export-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "journal");
    fs::create_directories(dir_ / "host/proc/sys/kernel/random");
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
                              "    checkpointInterval: 50ms\n"
                              "    overrides: {dedup_window: 1ms}\n"
                              "  nvsentinel-export:\n    enabled: true\n    socket: unix://"
                           << Socket() << "\n    retry: {initial: 20ms, max: 200ms}\n    callDeadline: 5s\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Socket() const { return (dir_ / "nvsentinel.sock").string(); }
  std::string Record() const { return (dir_ / "received.jsonl").string(); }

  std::unique_ptr<test::Subprocess> StartSim(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{Built("tools/sim/nvsentinel/gns-sim-nvsentinel"), "--socket", Socket(), "--record",
                                  Record()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto sim = std::make_unique<test::Subprocess>(argv);
    EXPECT_TRUE(sim->WaitForLine("serving")) << sim->Output();
    return sim;
  }

  // XID 48 lines, each with its number in the detail (the event's message carries it).
  void Append(int n) {
    static const char* kPci[] = {"0000:03:00", "0000:3b:00", "0000:86:00", "0000:cb:00"};
    std::vector<sim::JournalEntry> entries;
    for (int i = 0; i < n; ++i) {
      ++lines_;
      entries.push_back(sim::JournalWriter::Kernel(sim::XidMessage(kPci[lines_ % 4], 48, "line " + std::to_string(lines_) + " end")));
    }
    writer_->Append(entries);
  }

  // The XID events the simulator recorded, in the order it took them: (line number, id).
  std::vector<std::pair<int, std::string>> Received() const {
    std::vector<std::pair<int, std::string>> out;
    std::ifstream in(Record());
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("event")) continue;  // a line cut by a stop
      const std::string message = j["event"].value("message", "");
      const auto at = message.find("line ");
      if (at == std::string::npos) continue;
      out.emplace_back(std::stoi(message.substr(at + 5)), j["event"].value("id", ""));
    }
    return out;
  }

  // The lines no event names yet, for a failure message.
  std::string MissingLines() const {
    std::set<int> got;
    for (const auto& [line, id] : Received()) got.insert(line);
    std::string out;
    for (int line = 1; line <= lines_; ++line) {
      if (!got.contains(line)) out += " " + std::to_string(line);
    }
    return out.empty() ? "none missing" : "missing lines:" + out;
  }

  static unsigned TestSeed() {
    const char* env = std::getenv("GNS_NVS_EXPORT_SEED");
    return env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
  }

  bool BootEventReceived() const {
    std::ifstream in(Record());
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("\"message\":\"new boot ") != std::string::npos) return true;
    }
    return false;
  }

  double Metric(unsigned short port, const std::string& name) {
    const auto metrics = test::HttpRequest("127.0.0.1", port, "GET", "/metrics");
    if (metrics.status != 200) return -1;
    for (const auto& [series, value] : test::ParsePrometheus(metrics.body).samples) {
      if (series == name) return value;
    }
    return -1;
  }

  fs::path dir_;
  std::string config_;
  std::unique_ptr<sim::JournalWriter> writer_;
  int lines_ = 0;
};

TEST_F(NvsentinelExportTest, XidLinesReachTheConnectorInOrderAcrossItsRestart) {
  auto sim = StartSim();
  test::Subprocess proc({Binary(), "run", "--config", config_});
  const auto serving = proc.WaitForLine("serving /metrics");
  ASSERT_TRUE(serving) << proc.Output();
  const auto port = PortIn(*serving);
  Append(3);
  ASSERT_TRUE(test::Eventually([&] { return Received().size() >= 3; }, std::chrono::seconds(30))) << proc.Output();
  {
    // The first XID line's event (gpu-health's "new boot" recovery may come before it).
    std::ifstream in(Record());
    std::string first;
    while (std::getline(in, first) && first.find("line 1 end") == std::string::npos) {
    }
    const nlohmann::json e = nlohmann::json::parse(first).at("event");
    EXPECT_EQ(e["checkName"], "SysLogsXIDError") << first;
    EXPECT_EQ(e["errorCode"], nlohmann::json::array({"48"})) << first;
    EXPECT_EQ(e["nodeName"], "n1") << first;
    EXPECT_EQ(e["processingStrategy"], "EXECUTE_REMEDIATION") << first;
    EXPECT_FALSE(e.value("isHealthy", false)) << first;  // false: proto3 JSON leaves it out
    EXPECT_EQ(e["entitiesImpacted"][0]["entityType"], "PCI") << first;
    EXPECT_EQ(e["id"].get<std::string>().size(), 36u) << first;
  }
  // The connector goes away: events queue on disk, calls fail.
  sim->Signal(SIGTERM);
  ASSERT_EQ(sim->Wait(), 0);
  Append(3);
  ASSERT_TRUE(test::Eventually([&] {
    return Metric(port, "gpu_node_supervisor_nvsentinel_export_queued") == 3 &&
           Metric(port, "gpu_node_supervisor_nvsentinel_export_failed_calls_total") >= 1;
  }, std::chrono::seconds(30))) << proc.Output();
  sim = StartSim();
  ASSERT_TRUE(test::Eventually([&] { return Received().size() >= 6; }, std::chrono::seconds(30))) << proc.Output();
  std::this_thread::sleep_for(milliseconds(500));  // settled: nothing more comes, nothing twice
  const auto received = Received();
  ASSERT_EQ(received.size(), 6u);
  std::set<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(received[static_cast<std::size_t>(i)].first, i + 1);
    ids.insert(received[static_cast<std::size_t>(i)].second);
  }
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(Metric(port, "gpu_node_supervisor_nvsentinel_export_queued"), 0);
  proc.Signal(SIGTERM);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
}

TEST_F(NvsentinelExportTest, KillNineMidDeliveryDeliversEveryEventOnceById) {
  const unsigned seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: GNS_NVS_EXPORT_SEED=" + std::to_string(seed) + ")");
  std::mt19937 rng(seed);
  // A slow connector (each call takes 300 ms), refusing while the events queue up.
  auto sim = StartSim({"--delay-ms", "300", "--failing"});
  for (int round = 0; round < 6; ++round) {
    test::Subprocess proc({Binary(), "run", "--config", config_});
    const auto serving = proc.WaitForLine("serving /metrics");
    ASSERT_TRUE(serving) << proc.Output();
    const auto port = PortIn(*serving);
    const int appended = 1 + static_cast<int>(rng() % 4);
    Append(appended);
    // Every event of this round on disk (the kill lands in delivery, not in the intake: see the
    // README): as many taken as lines appended (gpu-health's "new boot" recovery may be one of
    // them in the first rounds, so the count must also hold still for a while).
    double taken = -1;
    int still = 0;
    ASSERT_TRUE(test::Eventually([&] {
      const double now = Metric(port, "gpu_node_supervisor_nvsentinel_export_queued_total");
      still = now == taken ? still + 1 : 0;
      taken = now;
      return now >= appended && still >= 3;
    }, std::chrono::seconds(30))) << "round " << round << ": taken " << taken << " of " << appended << "\n"
                                   << proc.Output();
    sim->Signal(SIGUSR2);  // take calls: the next retry is a call that takes 300 ms
    std::this_thread::sleep_for(milliseconds(rng() % 700));
    proc.Signal(SIGKILL);
    ASSERT_EQ(proc.Wait(), 128 + SIGKILL);
    sim->Signal(SIGUSR1);
  }
  sim->Signal(SIGUSR2);
  test::Subprocess proc({Binary(), "run", "--config", config_});
  ASSERT_TRUE(proc.WaitForLine("serving /metrics")) << proc.Output();
  auto all_lines = [&] {
    std::set<int> lines;
    for (const auto& [line, id] : Received()) lines.insert(line);
    return static_cast<int>(lines.size()) == lines_;
  };
  ASSERT_TRUE(test::Eventually(all_lines, std::chrono::seconds(60))) << MissingLines() << " of " << lines_ << "\n"
                                                                      << proc.Output();
  std::this_thread::sleep_for(milliseconds(800));
  // Per line: exactly one id (a resend is the same event); per id: one line.
  std::map<int, std::set<std::string>> ids_of_line;
  std::map<std::string, std::set<int>> lines_of_id;
  std::size_t resent = 0;
  std::set<std::string> seen;
  for (const auto& [line, id] : Received()) {
    ids_of_line[line].insert(id);
    lines_of_id[id].insert(line);
    if (!seen.insert(id).second) ++resent;
  }
  EXPECT_EQ(static_cast<int>(ids_of_line.size()), lines_);
  for (int line = 1; line <= lines_; ++line) EXPECT_EQ(ids_of_line[line].size(), 1u) << "line " << line;
  for (const auto& [id, lines] : lines_of_id) EXPECT_EQ(lines.size(), 1u) << id;
  std::cout << lines_ << " events, " << resent << " resent with their id after a kill -9\n";
  proc.Signal(SIGTERM);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
  sim->Signal(SIGTERM);
  EXPECT_EQ(sim->Wait(), 0);
}

// kill -9 anywhere in the intake: before gpu-health's checkpoint (the lines are read again),
// between its checkpoint and its outbox reaching the bus, between the bus and our queue file
// (gpu-health's event log gives the event back at the next start), or in delivery. Every line
// arrives, each under one id.
TEST_F(NvsentinelExportTest, KillNineAnywhereInTheIntakeLosesNoEvent) {
  const unsigned seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: GNS_NVS_EXPORT_SEED=" + std::to_string(seed) + ")");
  std::mt19937 rng(seed);
  auto sim = StartSim();
  double replayed = 0;
  for (int round = 0; round < 8; ++round) {
    test::Subprocess proc({Binary(), "run", "--config", config_});
    const auto serving = proc.WaitForLine("serving /metrics");
    ASSERT_TRUE(serving) << proc.Output();
    const auto port = PortIn(*serving);
    // The previous round's replays, counted once this instance has read its queue and the log.
    std::this_thread::sleep_for(milliseconds(200));
    replayed += std::max(0.0, Metric(port, "gpu_node_supervisor_nvsentinel_export_replayed_total"));
    Append(1 + static_cast<int>(rng() % 3));
    std::this_thread::sleep_for(milliseconds(rng() % 120));
    proc.Signal(SIGKILL);
    ASSERT_EQ(proc.Wait(), 128 + SIGKILL);
  }
  test::Subprocess proc({Binary(), "run", "--config", config_});
  const auto serving = proc.WaitForLine("serving /metrics");
  ASSERT_TRUE(serving) << proc.Output();
  auto all_lines = [&] {
    std::set<int> lines;
    for (const auto& [line, id] : Received()) lines.insert(line);
    return static_cast<int>(lines.size()) == lines_;
  };
  ASSERT_TRUE(test::Eventually(all_lines, std::chrono::seconds(60))) << MissingLines() << " of " << lines_ << "\n"
                                                                      << proc.Output();
  std::this_thread::sleep_for(milliseconds(800));
  replayed += std::max(0.0, Metric(PortIn(*serving), "gpu_node_supervisor_nvsentinel_export_replayed_total"));
  std::map<int, std::set<std::string>> ids_of_line;
  for (const auto& [line, id] : Received()) ids_of_line[line].insert(id);
  EXPECT_EQ(static_cast<int>(ids_of_line.size()), lines_);
  for (int line = 1; line <= lines_; ++line) EXPECT_EQ(ids_of_line[line].size(), 1u) << "line " << line;
  std::cout << lines_ << " lines, " << replayed << " events given back by gpu-health's event log\n";
  proc.Signal(SIGTERM);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
  sim->Signal(SIGTERM);
  EXPECT_EQ(sim->Wait(), 0);
}

}  // namespace
}  // namespace gns
