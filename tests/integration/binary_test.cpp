// The real binary: command line, config errors with positions and exit code 2, serving the
// endpoints, sd_notify, and a graceful SIGTERM.
#include "support/api_sim.hpp"
#include "support/http_client.hpp"
#include "support/prometheus.hpp"
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;

class BinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-binary-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::string SiteYaml(const std::string& modules) {
    return "version: v1\nnodeName: n1\npaths:\n  kubeletDir: " + dir_.string() + "/kubelet\n  cdiDir: " + dir_.string() +
           "/cdi\n  stateDir: " + dir_.string() + "/state\n  hostRoot: /\nmodules:\n" + modules;
  }

  fs::path dir_;
};

TEST_F(BinaryTest, ValidateConfigAcceptsBothShippedConfigs) {
  auto [code, out] = test::RunToCompletion({Binary(), "validate-config", "--config", Source("config/example.yaml")},
                                           {{"NODE_NAME", "gpu-node-1"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("config ok: node gpu-node-1, modules enabled: metrics kube gpu-inventory journald gpu-health device-plugin pod-resources"), std::string::npos) << out;
  std::tie(code, out) = test::RunToCompletion({Binary(), "validate-config", "--config", Source("config/local.yaml")},
                                              {{"GNS_SANDBOX", dir_.string()}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("forcing ComputeDomainCliques=false"), std::string::npos) << out;
}

TEST_F(BinaryTest, ValidateConfigOfTheExampleNeedsNothingButTheNodeName) {
  // Nothing installed on the machine, no environment but NODE_NAME: the XID catalog is built
  // in, and the files of disabled modules are not opened.
  const auto [code, out] = test::RunToCompletion(
      {"/usr/bin/env", "-i", "NODE_NAME=gpu-node-1", Binary(), "validate-config", "--config", Source("config/example.yaml")});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("config ok: node gpu-node-1"), std::string::npos) << out;
}

TEST_F(BinaryTest, ConfigErrorsExitTwoWithFileLineColumnAndKeyPath) {
  const auto bad = Write("bad.yaml", SiteYaml("  metrics:\n    enabled: true\n    bogus: 1\n"));
  for (const char* cmd : {"validate-config", "run"}) {
    const auto [code, out] = test::RunToCompletion({Binary(), cmd, "--config", bad});
    EXPECT_EQ(code, 2) << cmd << ": " << out;
    EXPECT_NE(out.find("error: " + bad + ":11:5: modules.metrics.bogus: unknown key"), std::string::npos) << out;
  }
  const auto wrong_type = Write("type.yaml", SiteYaml("  metrics:\n    enabled: true\n    maxConnections: many\n"));
  const auto [code, out] = test::RunToCompletion({Binary(), "validate-config", "--config", wrong_type});
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find(wrong_type + ":11:21: modules.metrics.maxConnections: expected an integer, got \"many\""),
            std::string::npos)
      << out;
}

TEST_F(BinaryTest, BadCommandLineExitsTwo) {
  const auto ok = Write("ok.yaml", SiteYaml("  metrics:\n    enabled: true\n"));
  EXPECT_EQ(test::RunToCompletion({Binary(), "run", "--config", ok, "--frobnicate"}).first, 2);
  EXPECT_EQ(test::RunToCompletion({Binary(), "run", "--config", ok, "--log-format", "xml"}).first, 2);
  const auto [code, out] = test::RunToCompletion({Binary(), "run", "--config", ok, "--feature-gates", "Nope=true"});
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--feature-gates: unknown feature gate \"Nope\""), std::string::npos) << out;
  const auto version = test::RunToCompletion({Binary(), "version"});
  EXPECT_EQ(version.first, 0);
  EXPECT_EQ(version.second.rfind("gpu-node-supervisor ", 0), 0u);
}

// Issue #24: inputs that crashed (alias loops: unbounded recursion), grew without bound (a
// billion laughs, /dev/zero) or hung (a FIFO) are config errors: exit 2 with a message.
TEST_F(BinaryTest, HostileConfigFilesExitTwoWithAMessage) {
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c) {
    laughs += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) laughs += std::string(i ? ", " : "") + "*" + static_cast<char>(c - 1);
    laughs += "]\n";
  }
  const auto fifo = (dir_ / "site.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {Write("alias.yaml", "a: &a [*a]\n"), "alias *a refers to the node it is part of"},
      {Write("merge.yaml", "a: &a\n  b: 1\n  <<: *a\n"), "alias *a refers to the node it is part of"},
      {Write("laughs.yaml", laughs), "YAML nodes (aliases counted as what they copy): refused"},
      {Write("quote.yaml", SiteYaml("  metrics:\n    enabled: \"true\n")), "invalid YAML"},
      {"/dev/zero", "/dev/zero: cannot read config file: a character device, not a regular file"},
      {fifo, fifo + ": cannot read config file: a FIFO, not a regular file"},
  };
  for (const auto& [file, message] : cases) {
    for (const char* cmd : {"validate-config", "run"}) {
      const auto [code, out] = test::RunToCompletion({Binary(), cmd, "--config", file});
      EXPECT_EQ(code, 2) << cmd << " " << file << ": " << out;
      EXPECT_NE(out.find(message), std::string::npos) << cmd << " " << file << ": " << out;
    }
  }
}

TEST_F(BinaryTest, UnknownSubcommandIsNamed) {
  const auto [code, out] = test::RunToCompletion({Binary(), "valdate-config", "--config", "x.yaml"});
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("error: unknown subcommand \"valdate-config\" (known: run, validate-config, version,"),
            std::string::npos)
      << out;
}

// A unix datagram socket standing in for systemd's NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~NotifySocket() { ::close(fd_); }
  std::string Receive() {
    char buf[512];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST_F(BinaryTest, ServesEndpointsNotifiesSystemdAndStopsGracefullyOnSigterm) {
  const auto config = Write("site.yaml", SiteYaml("  metrics:\n    enabled: true\n    listen: 127.0.0.1:0\n"));
  NotifySocket notify((dir_ / "notify.sock").string());
  test::Subprocess proc({Binary(), "run", "--config", config, "--log-format", "json"},
                        {{"NOTIFY_SOCKET", (dir_ / "notify.sock").string()}});
  EXPECT_EQ(notify.Receive(), "READY=1");
  const auto line = proc.WaitForLine("serving /metrics");
  ASSERT_TRUE(line) << proc.Output();
  const auto json = nlohmann::json::parse(*line);  // JSON log lines are JSON
  EXPECT_EQ(json.at("logger"), "metrics");
  const auto port = PortIn(json.at("msg"));
  ASSERT_NE(port, 0) << *line;

  const auto metrics = test::HttpRequest("127.0.0.1", port, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200) << metrics.error;
  const auto scrape = test::ParsePrometheus(metrics.body);
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_module_up{module=\"metrics\"}"), 1);
  EXPECT_GT(scrape.Value("gpu_node_supervisor_process_resident_memory_bytes"), 0);
  EXPECT_GE(scrape.Value("gpu_node_supervisor_bus_published_total{topic=\"supervisor.module-states\"}"), 2);
  EXPECT_EQ(test::HttpRequest("127.0.0.1", port, "GET", "/readyz").status, 200);
  EXPECT_EQ(test::HttpRequest("127.0.0.1", port, "GET", "/healthz").status, 200);
  const auto state = nlohmann::json::parse(test::HttpRequest("127.0.0.1", port, "GET", "/debug/state").body);
  EXPECT_EQ(state.at("supervisor.module-states").at("metrics").at("state"), "running");

  proc.Signal(SIGTERM);
  EXPECT_EQ(notify.Receive(), "STOPPING=1");
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
  const auto out = proc.Output();
  const auto stopping = out.find("stopping module metrics");
  const auto stopped = out.find("all modules stopped");
  EXPECT_NE(stopping, std::string::npos) << out;
  EXPECT_NE(stopped, std::string::npos) << out;
  EXPECT_LT(stopping, stopped);
}

TEST_F(BinaryTest, ModuleThatCannotStartIsRetriedWhileTheProcessStaysUp) {
  // Hold a port so the metrics module's bind fails; the supervisor keeps retrying it.
  const auto blocker = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(blocker, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(blocker, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(blocker, reinterpret_cast<sockaddr*>(&addr), &len);
  const auto port = ntohs(addr.sin_port);
  const auto config = Write("site.yaml", SiteYaml("  metrics:\n    enabled: true\n    listen: 127.0.0.1:" +
                                                  std::to_string(port) + "\n") +
                                         "runtime:\n  restartBackoff: {initial: 10ms, max: 50ms}\n");
  test::Subprocess proc(std::vector<std::string>{Binary(), "run", "--config", config});
  ASSERT_TRUE(proc.WaitForLine("start failed")) << proc.Output();
  ASSERT_TRUE(proc.WaitForLine("restarts in")) << proc.Output();
  ::close(blocker);  // the port frees up: the next attempt succeeds
  ASSERT_TRUE(proc.WaitForLine("serving /metrics")) << proc.Output();
  proc.Signal(SIGINT);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
}

TEST_F(BinaryTest, InterruptedWritesInTheStateDirAreRemovedAtStart) {
  // What a kill -9 in the middle of atomic writes leaves in stateDir (ours alone).
  fs::create_directories(dir_ / "state" / "dra-compute-domain");
  const auto leftover = dir_ / "state" / "dra-compute-domain" / "checkpoint.json.tmp.99999.42";
  const auto cursor_leftover = dir_ / "state" / "journal-cursor.tmp.12345.7";
  const auto kept = dir_ / "state" / "dra-compute-domain" / "checkpoint.json";
  const auto other = dir_ / "state" / "notes.tmp";
  for (const auto& p : {leftover, cursor_leftover, kept, other}) std::ofstream(p) << "x";
  const auto config = Write("site.yaml", SiteYaml("  metrics:\n    enabled: true\n    listen: 127.0.0.1:0\n"));
  test::Subprocess proc({Binary(), "run", "--config", config});
  ASSERT_TRUE(proc.WaitForLine("supervisor ready")) << proc.Output();
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_FALSE(fs::exists(cursor_leftover));
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_NE(proc.Output().find("removed " + leftover.string() + ", left by an interrupted write"), std::string::npos)
      << proc.Output();
  proc.Signal(SIGTERM);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
}

// `inventory`: one NVML read through the same dlopen and calls as gpu-inventory, as JSON.
TEST_F(BinaryTest, InventoryPrintsWhatNvmlReportsAndFailsClearlyWithoutIt) {
  const std::string fake = std::string(std::getenv("GNS_BINARY_DIR")) + "/tools/sim/fake_nvml/libnvidia-ml.so.1";
  const std::string gpus = Source("tools/sim/fake_nvml/gpus-8.json");
  auto [code, out] = test::RunToCompletion({Binary(), "inventory", "--nvml-library", fake},
                                           {{"FAKE_NVML_CONFIG", gpus}});
  ASSERT_EQ(code, 0) << out;
  const auto described = nlohmann::json::parse(std::ifstream(gpus));
  const auto printed = nlohmann::json::parse(out.substr(out.find('{')));
  const auto& inventory = printed.at("inventory");
  EXPECT_EQ(inventory.at("available"), true);
  EXPECT_EQ(inventory.at("driverVersion"), described.at("driverVersion"));
  ASSERT_EQ(inventory.at("gpus").size(), described.at("gpus").size());
  for (std::size_t i = 0; i < described.at("gpus").size(); ++i) {
    EXPECT_EQ(inventory.at("gpus")[i].at("uuid"), described.at("gpus")[i].at("uuid"));
  }
  const auto& fabric = described.at("gpus")[0].at("fabric");
  EXPECT_EQ(printed.at("clique").at("cliqueId"),
            fabric.at("clusterUuid").get<std::string>() + "." + std::to_string(fabric.at("cliqueId").get<int>()));

  std::tie(code, out) = test::RunToCompletion({Binary(), "inventory", "--nvml-library", (dir_ / "no-nvml.so.1").string()});
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("error: NVML"), std::string::npos) << out;
  EXPECT_NE(out.find("no-nvml.so.1"), std::string::npos) << out;
}

// `scan`: every polled health check once, NVML read as gpu-inventory reads it and judged as
// gpu-health judges it; exit 1 when a GPU is unhealthy, 2 without NVML.
TEST_F(BinaryTest, ScanJudgesEveryGpuOnceAndExitsOneWhenAGpuIsUnhealthy) {
  const std::string fake = std::string(std::getenv("GNS_BINARY_DIR")) + "/tools/sim/fake_nvml/libnvidia-ml.so.1";
  const std::string gpus = Source("tools/sim/fake_nvml/gpus-8.json");
  const std::string no_sys = (dir_ / "host").string();  // no /sys: the PCI bus is not counted
  auto [code, out] = test::RunToCompletion(
      {Binary(), "scan", "--nvml-library", fake, "--host-root", no_sys, "--output", "json"}, {{"FAKE_NVML_CONFIG", gpus}});
  ASSERT_EQ(code, 0) << out;
  auto printed = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(printed.at("ok"), true);
  EXPECT_EQ(printed.at("healthy"), true);
  ASSERT_EQ(printed.at("gpus").size(), 8u);
  auto finding = [](const nlohmann::json& gpu, const std::string& check) {
    for (const auto& f : gpu.at("findings")) {
      if (f.at("check") == check) return f;
    }
    return nlohmann::json();
  };
  for (const auto& gpu : printed.at("gpus")) {
    EXPECT_EQ(gpu.at("healthy"), true) << gpu.dump();
    EXPECT_EQ(finding(gpu, "RowRemapPending").value("holds", true), false) << gpu.dump();
    EXPECT_EQ(finding(gpu, "PcieLinkDegraded").value("holds", true), false) << gpu.dump();
  }

  // GPU 2's link trained at x8 of x16, GPU 5's NVLink 0 down.
  auto described = nlohmann::json::parse(std::ifstream(gpus));
  described["gpus"][2]["health"] = {{"pcieWidth", 8}};
  described["gpus"][5]["health"] = {{"nvlinkDown", {0}}};
  const auto faulty = Write("gpus-faulty.json", described.dump());
  std::tie(code, out) = test::RunToCompletion(
      {Binary(), "scan", "--nvml-library", fake, "--host-root", no_sys, "--output", "json"}, {{"FAKE_NVML_CONFIG", faulty}});
  ASSERT_EQ(code, 1) << out;
  printed = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(printed.at("healthy"), false);
  const auto pcie = finding(printed.at("gpus")[2], "PcieLinkDegraded");
  EXPECT_EQ(pcie.value("holds", false), true) << printed.dump();
  EXPECT_EQ(pcie.value("recommendedAction", ""), "RESTART_BM") << pcie.dump();
  const auto link = finding(printed.at("gpus")[5], "NvLinkDown");
  EXPECT_EQ(link.value("holds", false), true) << printed.dump();
  EXPECT_EQ(printed.at("gpus")[5].at("healthy"), false);
  EXPECT_EQ(printed.at("gpus")[0].at("healthy"), true);

  std::tie(code, out) = test::RunToCompletion({Binary(), "scan", "--nvml-library", fake, "--host-root", no_sys},
                                              {{"FAKE_NVML_CONFIG", faulty}});
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("PcieLinkDegraded"), std::string::npos) << out;
  // The table's columns stay apart with real-length UUIDs and PCI addresses: a check's name
  // follows its GPU's PCI address after at least two spaces, never glued to it.
  const auto pci = printed.at("gpus")[0].value("pci", std::string());
  ASSERT_FALSE(pci.empty()) << printed.dump();
  EXPECT_NE(out.find(pci + "  GpuLost"), std::string::npos) << out;
  EXPECT_NE(out.find("FAIL"), std::string::npos) << out;
  EXPECT_NE(out.find("UNHEALTHY"), std::string::npos) << out;

  std::tie(code, out) = test::RunToCompletion({Binary(), "scan", "--nvml-library", (dir_ / "no-nvml.so.1").string()});
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("error: NVML"), std::string::npos) << out;
}

// kUses in the real binary: the controller waits (and says so) while kube cannot start, then
// starts once kube runs; the process serves throughout.
TEST_F(BinaryTest, ControllerWaitsForTheKubeModuleAndStartsAfterIt) {
  const auto kubeconfig = dir_ / "api" / "kubeconfig";  // written by the simulator, later
  const auto config = Write(
      "site.yaml",
      SiteYaml("  metrics:\n    enabled: true\n    listen: 127.0.0.1:0\n"
               "  kube:\n    enabled: true\n    kubeconfig: " + kubeconfig.string() + "\n"
               "  compute-domain-controller:\n    enabled: true\n"
               "    leaderElection: {namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}\n") +
          "runtime:\n  restartBackoff: {initial: 50ms, max: 200ms}\n");
  test::Subprocess proc(std::vector<std::string>{Binary(), "run", "--config", config});
  const auto line = proc.WaitForLine("serving /metrics");
  ASSERT_TRUE(line) << proc.Output();
  const auto port = PortIn(*line);
  ASSERT_NE(port, 0) << *line;
  ASSERT_TRUE(proc.WaitForLine("start failed: kubeconfig")) << proc.Output();

  const auto states = [&] {
    const auto r = test::HttpRequest("127.0.0.1", port, "GET", "/debug/state");
    return r.status == 200 ? nlohmann::json::parse(r.body).at("supervisor.module-states") : nlohmann::json();
  };
  const auto controller = states().at("compute-domain-controller");
  EXPECT_EQ(controller.at("state"), "waiting") << controller.dump();
  EXPECT_EQ(controller.at("detail"), "waiting for kube") << controller.dump();
  const auto readyz = test::HttpRequest("127.0.0.1", port, "GET", "/readyz");
  EXPECT_EQ(readyz.status, 503);
  EXPECT_NE(readyz.body.find("compute-domain-controller"), std::string::npos) << readyz.body;
  EXPECT_EQ(proc.Output().find("candidate for lease"), std::string::npos) << "the controller started without kube";

  // The API server (and its kubeconfig) appears: kube starts at its next attempt, then the controller.
  gns::test::ApiSim server(dir_ / "api");
  ASSERT_TRUE(proc.WaitForLine("candidate for lease")) << proc.Output();
  ASSERT_TRUE(proc.WaitForLine("started leading")) << proc.Output();
  EXPECT_EQ(states().at("compute-domain-controller").at("state"), "running");
  EXPECT_EQ(test::HttpRequest("127.0.0.1", port, "GET", "/readyz").status, 200);
  proc.Signal(SIGTERM);
  EXPECT_EQ(proc.Wait(), 0) << proc.Output();
  server.Stop();
}

}  // namespace
}  // namespace gns
