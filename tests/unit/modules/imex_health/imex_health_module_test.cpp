// The imex-health module against the real D-Bus wire (a private dbus-daemon with the fake
// systemd of tools/sim/systemd), real files under a host root (inotify) and the API simulator
// (the ImexHealthy Node condition and Events).
#include "support/api_sim.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/imex_health/imex_health_module.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/private_bus.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <sys/sysmacros.h>

namespace gns::imex_health {
namespace {

namespace fs = std::filesystem;
constexpr const char* kUnit = "nvidia-imex.service";
constexpr const char* kModuleProcDevices = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n";

class ImexHealthModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::PrivateBus::Available()) GTEST_SKIP() << "dbus-daemon or gns-fake-systemd missing";
    char tmpl[] = "/tmp/gnsimex-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    root_ = dir_ / "host";
    fs::create_directories(root_ / "proc");
    fs::create_directories(root_ / "etc/nvidia-imex");
    fs::create_directories(root_ / "dev/nvidia-caps-imex-channels");
    Write("proc/devices", kModuleProcDevices);
    Write("etc/nvidia-imex/config.cfg",
          "DAEMONIZE=0\nIMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\nIMEX_CMD_PORT=50005\n");
    Write("etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n");
    // A character device needs mknod (root); a test running without it sees the warning path.
    ::mknod((root_ / "dev/nvidia-caps-imex-channels/channel0").c_str(), S_IFCHR | 0666, makedev(234, 0));
    bus_ = std::make_unique<test::PrivateBus>(dir_.string());
    bus_->StartBus();
    bus_->StartSystemd({kUnit});

    server_ = std::make_unique<gns::test::ApiSim>(dir_ / "api");
    server_->Seed(nlohmann::json{{"apiVersion", "v1"},
                                 {"kind", "Node"},
                                 {"metadata", {{"name", "node1"}}},
                                 {"status", {{"addresses", {{{"type", "InternalIP"}, {"address", "10.0.0.1"}}}}}}});
    kube::ClientConfig config = server_->ClientConfig();
    const auto log = gns::test::QuietLogger("imex-health-test");
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, log}, config);
    kube::EventRecorderConfig events;
    events.reporting_instance = "node1";
    events.qps = 1000;
    events.burst = 1000;
    recorder_ = std::make_shared<kube::EventRecorder>(client_, h_.clock, h_.metrics, log, events);
    informers_ = std::make_shared<kube::InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics, log);
    h_.services.Provide<kube::KubeClient>(client_);
    h_.services.Provide<kube::EventRecorder>(recorder_);
    h_.services.Provide<kube::InformerRegistry>(informers_);
    h_.site.node_name = "node1";
    h_.site.paths.host_root = root_.string();
    state_sub_ = h_.bus.Subscribe<ImexHealth>([this](const ImexHealth& h) { latest_ = h; });
  }

  void TearDown() override {
    if (!bus_) return;
    module_.Stop();
    state_sub_.Reset();
    h_.services.Withdraw<kube::KubeClient>();
    h_.services.Withdraw<kube::EventRecorder>();
    h_.services.Withdraw<kube::InformerRegistry>();
    informers_->StopAll();
    client_->Shutdown();
    h_.Drain();
    server_->Stop();
    bus_.reset();
    fs::remove_all(dir_);
  }

  // Whole files appear at once (written beside, renamed over), as an editor or imex-peers does:
  // a truncate-then-write would show the module an empty file in between, and a test that waits
  // for "invalid" could stop at that one.
  void Write(const std::string& rel, const std::string& text) {
    const auto tmp = root_ / (rel + ".new");
    std::ofstream(tmp) << text;
    fs::rename(tmp, root_ / rel);
  }

  ImexHealthModule::Config Config(const std::string& yaml = "") {
    const auto value = ParseYaml("busAddress: " + bus_->Address() + "\n" + yaml, "site.yaml");
    ConfigMap section(value, "modules.imex-health");
    auto config = ImexHealthModule::ParseConfig(section, h_.site);
    section.Finish();
    return config;
  }

  void Start(const std::string& yaml = "") { module_.Start(Config(yaml)); }

  bool Reason(const std::string& reason) {
    return h_.RunUntil([&] { return latest_ && latest_->reason == reason; });
  }

  nlohmann::json Condition() {
    const auto node = server_->Call("GET", "/api/v1/nodes/node1").Json();
    for (const auto& c : node.value("/status/conditions"_json_pointer, nlohmann::json::array())) {
      if (c.value("type", "") == "ImexHealthy") return c;
    }
    return nullptr;
  }

  bool ConditionIs(const std::string& status, const std::string& reason) {
    return h_.RunUntil([&] {
      const auto c = Condition();
      return !c.is_null() && c["status"] == status && c["reason"] == reason;
    });
  }

  std::vector<std::string> EventReasons() {
    std::vector<std::string> out;
    const auto list = server_->Call("GET", "/apis/events.k8s.io/v1/namespaces/default/events").Json();
    for (const auto& e : list.value("items", nlohmann::json::array())) out.push_back(e.value("reason", ""));
    return out;
  }

  bool HasEvent(const std::string& reason) {
    return h_.RunUntil([&] {
      const auto reasons = EventReasons();
      return std::find(reasons.begin(), reasons.end(), reason) != reasons.end();
    });
  }

  test::LoopHarness h_;
  fs::path dir_;
  fs::path root_;
  std::unique_ptr<test::PrivateBus> bus_;
  std::unique_ptr<gns::test::ApiSim> server_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::EventRecorder> recorder_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::optional<ImexHealth> latest_;
  test::ModuleUnderTest<ImexHealthModule> module_{h_};
  Subscription state_sub_;
};

TEST_F(ImexHealthModuleTest, UnitStopAndStartFollowTheConditionAndEvents) {
  Start();
  ASSERT_TRUE(ConditionIs("True", "ImexHealthy")) << (latest_ ? latest_->message : "no verdict");
  EXPECT_TRUE(latest_->ready);
  EXPECT_EQ(latest_->channel_major, 234u);
  EXPECT_EQ(latest_->peers, (std::vector<std::string>{"10.0.0.1", "10.0.0.2"}));
  EXPECT_EQ(bus_->ManagerCall("StopUnit", kUnit), "");
  ASSERT_TRUE(ConditionIs("False", "ServiceInactive"));
  EXPECT_FALSE(latest_->ready);
  EXPECT_NE(Condition()["message"].get<std::string>().find("inactive"), std::string::npos);
  EXPECT_TRUE(HasEvent("ServiceInactive"));
  EXPECT_EQ(bus_->ManagerCall("StartUnit", kUnit), "");
  ASSERT_TRUE(ConditionIs("True", "ImexHealthy"));
  EXPECT_TRUE(HasEvent("ImexHealthy"));
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_imex_unit_active", "", {{"unit", kUnit}}).Value(), 1);
}

TEST_F(ImexHealthModuleTest, FailedUnitAndRestartLoop) {
  Start("restartLoop: {count: 3, window: 15m}\n");
  ASSERT_TRUE(Reason("ImexHealthy"));
  EXPECT_EQ(bus_->Crash(kUnit, 1, false), "");
  // The Service properties (exit status) and the Unit's ActiveState come in separate signals.
  ASSERT_TRUE(h_.RunUntil([&] {
    return latest_->reason == "ServiceFailed" && latest_->message.find("ExecMainStatus 1") != std::string::npos;
  })) << latest_->message;
  EXPECT_EQ(bus_->ManagerCall("StartUnit", kUnit), "");
  ASSERT_TRUE(Reason("ImexHealthy"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bus_->Crash(kUnit, 2, true), "");
  ASSERT_TRUE(h_.RunUntil([&] { return latest_->n_restarts == 3; }));
  EXPECT_EQ(latest_->reason, "ImexHealthy");  // three is the limit, not past it
  EXPECT_EQ(bus_->Crash(kUnit, 2, true), "");
  ASSERT_TRUE(ConditionIs("False", "RestartLoop"));
  EXPECT_EQ(latest_->restarts_in_window, 4u);
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_imex_unit_restarts_total", "", {{"unit", kUnit}}).Value(), 4);
}

TEST_F(ImexHealthModuleTest, FilesFollowedWithInotify) {
  Start("resolvePeers: false\n");
  ASSERT_TRUE(Reason("ImexHealthy"));
  // The API shows it too (a False from the start-up may still be in flight otherwise, and the
  // check below would see that one).
  ASSERT_TRUE(ConditionIs("True", "ImexHealthy"));
  // A comment line in the node map: invalid, seen without any unit change.
  Write("etc/nvidia-imex/nodes_config.cfg", "# rack a\n10.0.0.1\n10.0.0.2\n");
  ASSERT_TRUE(ConditionIs("False", "NodesConfigInvalid"));
  ASSERT_TRUE(h_.RunUntil([&] { return latest_->message.find("comment line") != std::string::npos; }))
      << latest_->message;
  // Valid again, but written after the unit became active: IMEX runs the old map.
  Write("etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n10.0.0.3\n");
  ASSERT_TRUE(Reason("NodesConfigStale"));
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(Reason("ImexHealthy"));
  // This node missing from the map.
  Write("etc/nvidia-imex/nodes_config.cfg", "10.0.0.2\n");
  ASSERT_TRUE(Reason("NodesConfigInvalid"));
  EXPECT_NE(latest_->message.find("this node (10.0.0.1)"), std::string::npos) << latest_->message;
  Write("etc/nvidia-imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n");
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(Reason("ImexHealthy"));
  // A broken config key.
  Write("etc/nvidia-imex/config.cfg", "IMEX_CMD_PORT=banana\n");
  ASSERT_TRUE(Reason("ConfigInvalid"));
  Write("etc/nvidia-imex/config.cfg", "IMEX_CMD_PORT=50005\n");
  ASSERT_TRUE(Reason("ImexHealthy"));
  // channel0 removed while the major is registered: a warning (§13), not a failed condition.
  fs::remove(root_ / "dev/nvidia-caps-imex-channels/channel0");
  ASSERT_TRUE(h_.RunUntil([&] { return !latest_->warnings.empty(); }));
  EXPECT_TRUE(latest_->ready);
  EXPECT_TRUE(HasEvent("Channel0Missing"));
  // The major gone: procfs has no inotify, so it is read again when the unit restarts.
  Write("proc/devices", "Character devices:\n195 nvidia\n");
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(ConditionIs("False", "ChannelMajorMissing"));
}

TEST_F(ImexHealthModuleTest, BusAndSystemdGoAwayAndComeBack) {
  Start();
  ASSERT_TRUE(Reason("ImexHealthy"));
  bus_->StopSystemd();
  ASSERT_TRUE(ConditionIs("Unknown", "SystemdUnavailable"));
  bus_->StartSystemd({kUnit});
  ASSERT_TRUE(Reason("ImexHealthy"));
  bus_->StopSystemd();
  bus_->StopBus();
  ASSERT_TRUE(ConditionIs("Unknown", "BusUnavailable"));
  EXPECT_EQ(module_.health, ModuleHealth::kDegraded);
  bus_->StartBus();
  bus_->StartSystemd({kUnit});
  ASSERT_TRUE(ConditionIs("True", "ImexHealthy"));
  EXPECT_EQ(module_.health, ModuleHealth::kOk) << module_.health_detail;
}

TEST_F(ImexHealthModuleTest, UnitThatDoesNotExist) {
  Start("unit: nvidia-imex-typo.service\n");
  ASSERT_TRUE(ConditionIs("False", "UnitNotFound"));
  EXPECT_NE(latest_->message.find("not-found"), std::string::npos) << latest_->message;
}

TEST_F(ImexHealthModuleTest, UnitLogErrorRate) {
  Start("logErrors: {threshold: 3, window: 10m}\n");
  ASSERT_TRUE(Reason("ImexHealthy"));
  journald::UnitLine line;
  line.unit = kUnit;
  line.priority = 3;
  line.message = "IMEX: connection to 10.0.0.2 failed";
  h_.bus.Publish(line);
  h_.bus.Publish(line);
  journald::UnitLine info = line;
  info.priority = 6;
  h_.bus.Publish(info);  // informational lines do not count
  journald::UnitLine other = line;
  other.unit = "other.service";
  h_.bus.Publish(other);
  ASSERT_TRUE(h_.RunUntil([&] { return latest_->log_errors_in_window == 2; }));
  EXPECT_EQ(latest_->reason, "ImexHealthy");
  h_.bus.Publish(line);
  ASSERT_TRUE(ConditionIs("False", "LogErrors"));
}

TEST_F(ImexHealthModuleTest, DomainReadinessFromNvidiaImexCtl) {
  const char* src = std::getenv("GNS_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "GNS_SOURCE_DIR not set";
  fs::create_directories(root_ / "usr/bin");
  fs::copy_file(fs::path(src) / "tools/sim/systemd/host-nvidia-imex-ctl", root_ / "usr/bin/nvidia-imex-ctl");
  auto state = [&](const std::string& s) { Write("usr/bin/nvidia-imex-ctl.state", s + "\n"); };
  Start("resolvePeers: false\ndomainCheck: {interval: 1h, retryInterval: 1h, timeout: 300ms}\n");
  // (The first verdicts may still miss this node's address from its Node object.)
  ASSERT_TRUE(h_.RunUntil([&] { return latest_ && latest_->domain_checked && latest_->ready; }))
      << (latest_ ? latest_->message : "no verdict");
  EXPECT_EQ(latest_->domain_state, "READY/UP");
  ASSERT_TRUE(ConditionIs("True", "ImexHealthy"));

  // Peers down: the unit's (re)start runs the check again.
  state("down");
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(ConditionIs("False", "DomainNotReady"));
  EXPECT_NE(Condition()["message"].get<std::string>().find("10.0.0.2 UNAVAILABLE"), std::string::npos)
      << Condition()["message"];
  EXPECT_TRUE(HasEvent("DomainNotReady"));

  // A command service that never answers: killed at the deadline, its own reason, and the
  // loop goes on following the unit meanwhile.
  state("hang");
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(ConditionIs("False", "DomainCheckTimeout"));
  EXPECT_NE(latest_->message.find("no exit within"), std::string::npos) << latest_->message;
  EXPECT_EQ(bus_->ManagerCall("StopUnit", kUnit), "");
  ASSERT_TRUE(ConditionIs("False", "ServiceInactive"));
  EXPECT_FALSE(latest_->domain_checked);  // the answer belonged to the run that ended

  state("READY");
  EXPECT_EQ(bus_->ManagerCall("StartUnit", kUnit), "");
  ASSERT_TRUE(h_.RunUntil([&] { return latest_->domain_checked && latest_->ready; })) << latest_->message;
  ASSERT_TRUE(ConditionIs("True", "ImexHealthy"));
  EXPECT_NE(Condition()["message"].get<std::string>().find("nvidia-imex-ctl READY/UP"), std::string::npos);
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_imex_domain_checks_total", "", {{"result", "timeout"}}).Value(), 1);

  // The tool uninstalled: optional, so no verdict from it (and no DomainNotReady).
  fs::remove(root_ / "usr/bin/nvidia-imex-ctl");
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(h_.RunUntil([&] { return !latest_->domain_checked && latest_->ready; })) << latest_->message;
}

TEST_F(ImexHealthModuleTest, BadConfig) {
  auto bad = [&](const std::string& yaml) {
    const auto value = ParseYaml(yaml, "site.yaml");
    ConfigMap section(value, "modules.imex-health");
    EXPECT_THROW(
        {
          ImexHealthModule::ParseConfig(section, h_.site);
          section.Finish();
        },
        ConfigError)
        << yaml;
  };
  bad("unit: nounit\n");
  bad("configFiles: [relative.cfg]\n");
  bad("selfIdentity: mac\n");
  bad("restartLoop: {count: 0}\n");
  bad("bogus: 1\n");
  bad("domainCheck: {command: nvidia-imex-ctl}\n");
  bad("domainCheck: {timeout: 0s}\n");
  bad("domainCheck: {bogus: 1}\n");
}

}  // namespace
}  // namespace gns::imex_health
