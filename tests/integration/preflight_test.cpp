// `gpu-node-supervisor preflight` through the real binary: a host root of real files, the
// unit on a private dbus-daemon with the fake systemd, the fake NVML; text and JSON output and
// the exit codes (0 warnings only, 1 a failure, 2 a usage error).
#include "support/api_sim.hpp"
#include "support/private_bus.hpp"
#include "support/subprocess.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace gns {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

class PreflightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::PrivateBus::Available()) GTEST_SKIP() << "dbus-daemon or gns-fake-systemd missing";
    char tmpl[] = "/tmp/gnspre-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    root_ = dir_ / "host";
    for (const char* d : {"proc", "etc/nvidia-imex", "dev/nvidia-caps-imex-channels", "usr/bin"}) {
      fs::create_directories(root_ / d);
    }
    Write("proc/devices", "Character devices:\n195 nvidia\n509 nvidia-caps-imex-channels\n");
    Write("etc/nvidia-imex/config.cfg", "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\nIMEX_CMD_PORT=50005\n");
    Write("etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n");
    for (const char* bin : {"usr/bin/nvidia-smi", "usr/bin/nvidia-imex"}) {
      Write(bin, "#!/bin/sh\n");
      fs::permissions(root_ / bin, fs::perms::owner_all);
    }
    bus_ = std::make_unique<test::PrivateBus>(dir_.string());
    bus_->StartBus();
    bus_->StartSystemd({"nvidia-imex.service"});
  }
  void TearDown() override {
    bus_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void Write(const std::string& rel, const std::string& text) { std::ofstream(root_ / rel) << text; }

  std::pair<int, std::string> Run(std::vector<std::string> extra) {
    std::vector<std::string> argv{Env("GNS_SUPERVISOR_BIN"), "preflight", "--host-root", root_.string(),
                                  "--bus-address", bus_->Address(), "--self", "10.0.0.1",
                                  "--nvml-library", Env("GNS_BINARY_DIR") + "/tools/sim/fake_nvml/libnvidia-ml.so.1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::RunToCompletion(argv, {{"FAKE_NVML_CONFIG", Env("GNS_SOURCE_DIR") + "/tools/sim/fake_nvml/gpus-8.json"}});
  }

  std::map<std::string, nlohmann::json> Checks(const std::string& output) {
    std::map<std::string, nlohmann::json> out;
    const auto start = output.find('{');
    const auto doc = nlohmann::json::parse(output.substr(start));
    for (const auto& c : doc.at("checks")) out[c.at("name").get<std::string>()] = c;
    return out;
  }

  fs::path dir_;
  fs::path root_;
  std::unique_ptr<test::PrivateBus> bus_;
};

TEST_F(PreflightTest, WarningsOnlyPassAndJsonHasEveryCheck) {
  // No channel0 node (major registered): a warning (§13); nvidia-imex-ctl absent: skip.
  const auto [code, output] = Run({"--output", "json"});
  EXPECT_EQ(code, 0) << output;
  auto checks = Checks(output);
  EXPECT_EQ(checks.at("channel-major")["status"], "pass");
  EXPECT_EQ(checks.at("channel0")["status"], "warn");
  EXPECT_NE(checks.at("channel0")["fix"].get<std::string>().find("mknod"), std::string::npos);
  EXPECT_EQ(checks.at("nvidia-imex-ctl")["status"], "skip");
  EXPECT_EQ(checks.at("unit-active")["status"], "pass");
  EXPECT_EQ(checks.at("unit-enabled")["status"], "pass");
  EXPECT_EQ(checks.at("imex-config")["status"], "pass");
  EXPECT_EQ(checks.at("nodes-config")["status"], "pass") << checks.at("nodes-config");
  EXPECT_EQ(checks.at("nodes-config-loaded")["status"], "pass");
  EXPECT_EQ(checks.at("nvml-clique")["status"], "pass") << checks.at("nvml-clique");
  for (const auto& [name, c] : checks) {
    for (const char* key : {"name", "status", "message", "fix"}) EXPECT_TRUE(c.contains(key)) << name << " " << key;
  }
}

TEST_F(PreflightTest, FailuresExitOneWithTheFix) {
  EXPECT_EQ(bus_->ManagerCall("StopUnit", "nvidia-imex.service"), "");
  Write("etc/nvidia-imex/nodes_config.cfg", "# peers\n10.0.0.2\n");
  const auto [code, output] = Run({"--skip-nvml"});
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("FAIL  unit-active"), std::string::npos) << output;
  EXPECT_NE(output.find("systemctl enable --now nvidia-imex.service"), std::string::npos) << output;
  EXPECT_NE(output.find("comment line"), std::string::npos) << output;
  EXPECT_NE(output.find("this node (10.0.0.1) is not in the map"), std::string::npos) << output;
  EXPECT_NE(output.find("SKIP  nvml-clique"), std::string::npos) << output;
}

TEST_F(PreflightTest, DomainStateFromNvidiaImexCtl) {
  fs::copy_file(fs::path(Env("GNS_SOURCE_DIR")) / "tools/sim/systemd/host-nvidia-imex-ctl", root_ / "usr/bin/nvidia-imex-ctl");
  auto [code, output] = Run({"--skip-nvml", "--output", "json"});
  EXPECT_EQ(code, 0) << output;
  auto checks = Checks(output);
  EXPECT_EQ(checks.at("nvidia-imex-ctl")["status"], "pass");
  EXPECT_EQ(checks.at("imex-domain")["status"], "pass") << checks.at("imex-domain");
  EXPECT_EQ(checks.at("imex-domain")["message"], "nvidia-imex-ctl READY/UP");
  Write("usr/bin/nvidia-imex-ctl.state", "down\n");
  std::tie(code, output) = Run({"--skip-nvml", "--output", "json"});
  EXPECT_EQ(code, 1) << output;
  checks = Checks(output);
  EXPECT_EQ(checks.at("imex-domain")["status"], "fail");
  EXPECT_NE(checks.at("imex-domain")["message"].get<std::string>().find("DomainNotReady"), std::string::npos);
  EXPECT_NE(checks.at("imex-domain")["fix"].get<std::string>().find("nvidia-imex-ctl -N -c"), std::string::npos);
  // A command service that never answers: the deadline, not a hang of preflight.
  Write("usr/bin/nvidia-imex-ctl.state", "hang\n");
  std::tie(code, output) = Run({"--skip-nvml", "--output", "json", "--timeout", "1"});
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(Checks(output).at("imex-domain")["message"].get<std::string>().find("DomainCheckTimeout"), std::string::npos);
}

TEST_F(PreflightTest, TheMapAgainstTheCliqueNodesInTheApi) {
  // Without credentials: skipped, not failed.
  auto [code, output] = Run({"--skip-nvml", "--output", "json"});
  EXPECT_EQ(code, 0) << output;
  EXPECT_EQ(Checks(output).at("nodes-config-clique")["status"], "skip");

  gns::test::ApiSim server(dir_ / "api");
  auto node = [](const std::string& name, const std::string& clique, const std::string& ip) {
    nlohmann::json n = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}, {"labels", {{"nvidia.com/gpu.clique", clique}}}}}};
    n["status"]["addresses"] = nlohmann::json::array();
    if (!ip.empty()) n["status"]["addresses"].push_back({{"type", "InternalIP"}, {"address", ip}});
    return n;
  };
  server.Seed(node("node1", "c1", "10.0.0.1"));
  server.Seed(node("node2", "c1", "10.0.0.2"));
  server.Seed(node("node9", "c2", "10.0.0.9"));
  const std::vector<std::string> api{"--skip-nvml", "--output", "json", "--kubeconfig", (dir_ / "api/kubeconfig").string(),
                                     "--node", "node1"};
  std::tie(code, output) = Run(api);
  EXPECT_EQ(code, 0) << output;
  auto check = Checks(output).at("nodes-config-clique");
  EXPECT_EQ(check["status"], "pass") << check;
  EXPECT_NE(check["message"].get<std::string>().find("2 Node(s) of clique c1"), std::string::npos) << check;

  // A Node joins the clique; the map was not rewritten.
  server.Seed(node("node3", "c1", "10.0.0.3"));
  std::tie(code, output) = Run(api);
  EXPECT_EQ(code, 1) << output;
  check = Checks(output).at("nodes-config-clique");
  EXPECT_EQ(check["status"], "fail");
  EXPECT_NE(check["message"].get<std::string>().find("missing from the map: 10.0.0.3"), std::string::npos) << check;
  EXPECT_NE(check["fix"].get<std::string>().find("systemctl restart"), std::string::npos) << check;

  // A Node of this clique without an address: a warning once the map matches the rest.
  Write("etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n10.0.0.3\n");
  server.Seed(node("node4", "c1", ""));
  std::tie(code, output) = Run(api);
  check = Checks(output).at("nodes-config-clique");
  EXPECT_EQ(check["status"], "warn") << check;
  EXPECT_NE(check["message"].get<std::string>().find("node4"), std::string::npos) << check;

  // A Node we cannot find.
  std::vector<std::string> wrong = api;
  wrong.back() = "node-unknown";
  std::tie(code, output) = Run(wrong);
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(Checks(output).at("nodes-config-clique")["message"].get<std::string>().find("node-unknown"), std::string::npos);
  server.Stop();
}

TEST_F(PreflightTest, NoBusIsAFailureAndABadFlagIsAUsageError) {
  bus_->StopSystemd();
  bus_->StopBus();
  auto [code, output] = Run({"--skip-nvml", "--output", "json"});
  EXPECT_EQ(code, 1) << output;
  EXPECT_EQ(Checks(output).at("unit-active")["status"], "fail");
  std::tie(code, output) = Run({"--output", "yaml"});
  EXPECT_EQ(code, 2) << output;
}

// `scan` judges the host services as gpu-health does, over the same private bus: the fabric
// manager failed → exit 1 with FabricManagerNotRunning; a unit the node lacks (persistenced
// here) is judged clear; running again → exit 0.
TEST_F(PreflightTest, ScanJudgesTheHostServicesOverTheBus) {
  bus_->StopSystemd();
  bus_->StartSystemd({"nvidia-imex.service", "nvidia-fabricmanager.service"});
  auto scan = [&] {
    return test::RunToCompletion({Env("GNS_SUPERVISOR_BIN"), "scan", "--output", "json", "--host-root", root_.string(),
                                  "--bus-address", bus_->Address(), "--nvml-library",
                                  Env("GNS_BINARY_DIR") + "/tools/sim/fake_nvml/libnvidia-ml.so.1"},
                                 {{"FAKE_NVML_CONFIG", Env("GNS_SOURCE_DIR") + "/tools/sim/fake_nvml/gpus-8.json"}});
  };
  auto service = [](const std::string& output, const std::string& check) {
    const auto doc = nlohmann::json::parse(output.substr(output.find('{')));
    for (const auto& f : doc.at("services")) {
      if (f.at("check") == check) return f;
    }
    return nlohmann::json();
  };
  auto [code, output] = scan();
  EXPECT_EQ(code, 0) << output;
  EXPECT_EQ(service(output, "FabricManagerNotRunning").value("holds", true), false) << output;
  EXPECT_EQ(service(output, "PersistencedNotRunning").value("holds", true), false) << output;
  EXPECT_EQ(service(output, "PersistencedNotRunning").value("judged", true), true) << output;

  ASSERT_EQ(bus_->Crash("nvidia-fabricmanager.service", 1, false), "");
  std::tie(code, output) = scan();
  EXPECT_EQ(code, 1) << output;
  const auto failed = service(output, "FabricManagerNotRunning");
  EXPECT_EQ(failed.value("holds", false), true) << output;
  EXPECT_EQ(failed.value("recommendedAction", ""), "RESTART_BM") << output;
  EXPECT_NE(failed.value("message", "").find("nvidia-fabricmanager.service is failed"), std::string::npos) << output;

  ASSERT_EQ(bus_->ManagerCall("StartUnit", "nvidia-fabricmanager.service"), "");
  std::tie(code, output) = scan();
  EXPECT_EQ(code, 0) << output;
}

}  // namespace
}  // namespace gns
