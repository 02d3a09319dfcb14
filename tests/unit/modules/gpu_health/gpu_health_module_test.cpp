// The gpu-health module: kernel lines → DeviceHealth, HealthEvents and metrics (bus), a
// 50,000-line flood, new boot, operator set-healthy through the admin socket and the CLI client,
// the Node condition and Events in the API simulator, and the whole chain journal file →
// journald → gpu-health → device plugin → kubelet simulator.
#include "cli/admin_client.hpp"
#include "support/api_sim.hpp"
#include "journal_writer.h"
#include "kubelet_sim.h"
#include "loop/supervisor_messages.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/gpu_health/gpu_health_module.hpp"
#include "modules/journald/journald_module.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "support/loop_harness.hpp"
#include "support/held_pool.hpp"
#include "support/module_under_test.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <sys/stat.h>

namespace gns::gpu_health {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

constexpr const char* kUuid = "GPU-455d8f70-2051-db6c-0430-ffc457bff834";
constexpr const char* kOther = "GPU-00000000-0000-0000-0000-000000000002";

std::string ModuleSourceDir() {
  const char* dir = std::getenv("GNS_SOURCE_DIR");
  return dir ? dir : GNS_TEST_SOURCE_DIR;
}

gpu_inventory::GpuInventory TwoGpus() {
  gpu_inventory::GpuInventory inv;
  inv.available = true;
  gpu_inventory::GpuInfo a;
  a.uuid = kUuid;
  a.pci_bus_id = "00000000:03:00.0";
  a.pci = *gpu_inventory::PciAddress::Parse("00000000:03:00.0");
  gpu_inventory::GpuInfo b;
  b.index = 1;
  b.uuid = kOther;
  b.minor = 1;
  b.pci_bus_id = "00000000:3B:00.0";
  b.pci = *gpu_inventory::PciAddress::Parse("00000000:3B:00.0");
  inv.gpus = {a, b};
  return inv;
}

journald::KernelLine Kernel(const std::string& message, const std::string& boot = std::string(32, 'a'),
                            uint64_t realtime = 1'700'000'000'000'000) {
  journald::KernelLine line;
  line.message = message;
  line.boot_id = boot;
  line.realtime_usec = realtime;
  return line;
}

journald::UnitLine Ack(const std::string& uuid, const std::string& boot = std::string(32, 'a')) {
  journald::UnitLine line;
  line.message = sim::ResetAckMessage(uuid);
  line.boot_id = boot;
  line.identifier = "gpu-reset";
  line.acknowledgement = true;
  return line;
}

class GpuHealthModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnsgh-XXXXXX";  // unix socket paths must stay short
    dir_ = ::mkdtemp(tmpl);
    h_.site.paths.state_dir = dir_ + "/state";
    h_.site.node_name = "node1";
    fs::create_directories(h_.site.paths.state_dir);
    config_.catalog_path = ModuleSourceDir() + "/config/xid-catalog.yaml";
    config_.catalog = XidCatalog::LoadFile(config_.catalog_path);
    health_sub_ = h_.bus.Subscribe<DeviceHealth>([this](const DeviceHealth& d) { health_.push_back(d); });
    event_sub_ = h_.bus.Subscribe<HealthEvent>([this](const HealthEvent& e) { events_.push_back(e); });
  }

  void TearDown() override {
    StopModule();
    health_sub_.Reset();
    event_sub_.Reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void StartModule() {
    module_.Start(config_);
    // devices.json is read on the pool: started once it is back.
    EXPECT_TRUE(h_.RunUntil([&] { return !module_->Loading(); })) << "devices.json never loaded";
    h_.Drain();
  }

  void StopModule() {
    module_.Stop();
  }

  const DeviceHealth* Health(const std::string& uuid) {
    const auto& all = h_.bus.LatestByKey<DeviceHealth>();
    const auto it = all.find(uuid);
    return it == all.end() ? nullptr : &it->second;
  }

  bool IsHealthy(const std::string& uuid) {
    const auto* h = Health(uuid);
    return h != nullptr && h->healthy;
  }
  bool IsUnhealthy(const std::string& uuid) {
    const auto* h = Health(uuid);
    return h != nullptr && !h->healthy;
  }

  // A kubelet simulator on <dir>/kubelet, the device plugin's kubelet directory.
  std::unique_ptr<sim::KubeletSim> StartKubelet() {
    h_.site.paths.kubelet_dir = dir_ + "/kubelet";
    h_.site.paths.host_root = dir_ + "/host";
    fs::create_directories(h_.site.paths.kubelet_dir);
    sim::KubeletSimOptions kubelet_options;
    kubelet_options.kubelet_dir = h_.site.paths.kubelet_dir;
    auto kubelet = std::make_unique<sim::KubeletSim>(kubelet_options);
    kubelet->Start();
    return kubelet;
  }

  double Metric(const std::string& text) {
    const auto rendered = h_.metrics.Render();
    const auto at = rendered.find("\n" + text + " ");
    if (at == std::string::npos) return -1;
    return std::stod(rendered.substr(at + text.size() + 2));
  }

  test::LoopHarness h_;
  std::string dir_;
  GpuHealthModule::Config config_;
  test::ModuleUnderTest<GpuHealthModule> module_{h_};
  std::vector<DeviceHealth> health_;
  std::vector<HealthEvent> events_;
  Subscription health_sub_;
  Subscription event_sub_;
};

TEST_F(GpuHealthModuleTest, FatalXidMakesTheDeviceUnhealthyAndTheResetAckHealthyAgain) {
  StartModule();
  // No inventory: the GPU-UUID line teaches PCI → UUID (seed 003's example).
  h_.bus.Publish(Kernel(sim::GpuUuidMessage("0000:03:00", kUuid)));
  h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:03:00): 48, pid=91237, name=nv-hostengine, Ch 00000076, errorString "
                        "CTX SWITCH TIMEOUT, Info 0x3c046"));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  const auto* h = Health(kUuid);
  EXPECT_EQ(h->xid, 48u);
  EXPECT_EQ(h->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(h->pci, "0000:03:00");
  EXPECT_NE(h->reason.find("ROBUST_CHANNEL_GPU_ECC_DBE"), std::string::npos) << h->reason;
  ASSERT_TRUE(h_.RunUntil([&] { return !events_.empty(); }));
  const HealthEvent& e = events_.front();
  EXPECT_EQ(e.agent, "gpu-node-supervisor");
  EXPECT_EQ(e.component_class, "GPU");
  EXPECT_EQ(e.check_name, "SysLogsXIDError");
  EXPECT_TRUE(e.is_fatal);
  EXPECT_FALSE(e.is_healthy);
  EXPECT_EQ(e.recommended_action, 2);
  EXPECT_EQ(e.error_code, std::vector<std::string>{"48"});
  EXPECT_EQ(e.entities_impacted,
            (std::vector<ImpactedEntity>{{"PCI", "0000:03:00"}, {"GPU_UUID", kUuid}}));
  EXPECT_EQ(e.node_name, "node1");
  EXPECT_GT(e.generated_seconds, 0);
  const nlohmann::json j = e;
  EXPECT_EQ(j["entitiesImpacted"][1]["entityValue"], kUuid);
  EXPECT_TRUE(j.contains("generatedTimestamp"));

  h_.bus.Publish(Ack(kUuid));
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
  EXPECT_EQ(Health(kUuid)->reason, "GPU reset occurred");
  ASSERT_TRUE(h_.RunUntil([&] { return events_.size() == 2; }));
  EXPECT_TRUE(events_[1].is_healthy);
  EXPECT_EQ(events_[1].entities_impacted,
            (std::vector<ImpactedEntity>{{"PCI", "0000:03:00"}, {"GPU_UUID", kUuid}}));
  EXPECT_EQ(Metric("gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(kUuid) + "\",xid=\"48\"}"), 1);
  // /debug/state holds the module's view.
  const auto state = h_.bus.RetainedState();
  EXPECT_TRUE(state.contains("gpu-health.state")) << state.dump();
}

TEST_F(GpuHealthModuleTest, InventoryMapsPciNumericallyNonFatalAndUnknownXids) {
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python3, Graphics Exception"));
  h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:3b:00): 999, pid='<unknown>', name=<unknown>, new"));
  h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:99:00): 48, pid='<unknown>', name=<unknown>, not ours"));
  h_.bus.Publish(Kernel("NVRM: Xid (PCI:zz"));
  ASSERT_TRUE(h_.RunUntil([&] { return events_.size() >= 3; }));
  EXPECT_FALSE(events_[0].is_fatal);  // 13: application error
  EXPECT_EQ(events_[0].entities_impacted[1].value, kOther);
  EXPECT_TRUE(events_[1].is_fatal);   // unknown → CONTACT_SUPPORT, fatal
  EXPECT_EQ(events_[1].recommended_action_name, "CONTACT_SUPPORT");
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kOther); }));
  EXPECT_EQ(Health(kUuid), nullptr);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_bad_input_total{kind=\"unknown_xid\"}"), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_bad_input_total{kind=\"unknown_pci\"}"), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_bad_input_total{kind=\"malformed_xid\"}"), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_devices{health=\"Unhealthy\"}"), 1);
  // NVML's own XID reports go through the same policy.
  h_.bus.Publish(gpu_inventory::XidObservation{kUuid, 79});
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  EXPECT_EQ(Health(kUuid)->pci, "0000:03:00");
}

TEST_F(GpuHealthModuleTest, AnXidSeenByNvmlAndTheKernelLogCountsOnce) {
  config_.overrides = LoadSiteOverridesString("thresholds: [{xid: 13, count: 2, window: 10m}]\n", "site.yaml");
  h_.bus.Publish(TwoGpus());
  StartModule();
  const uint64_t t = 1'700'000'000'000'000;  // µs
  const auto both = [&](uint64_t at_usec) {
    h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:03:00): 13, pid=1, name=python3, Graphics Exception",
                          std::string(32, 'a'), at_usec));
    // NVML's event for the same occurrence, a little later.
    h_.bus.Publish(gpu_inventory::XidObservation{kUuid, 13, 0xFFFFFFFF, 0xFFFFFFFF,
                                                 static_cast<int64_t>(at_usec / 1000 + 300)});
    h_.Drain();
  };
  both(t);
  const std::string counter = "gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(kUuid) + "\",xid=\"13\"}";
  EXPECT_EQ(Metric(counter), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_xid_duplicates_total"), 1);
  ASSERT_TRUE(h_.RunUntil([&] { return events_.size() == 1u; }));  // once its checkpoint is written
  EXPECT_EQ(Health(kUuid), nullptr);  // one occurrence of two needed: still healthy
  both(t + 5'000'000);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  EXPECT_EQ(Metric(counter), 2);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_xid_duplicates_total"), 2);
}

// The correctness of a flood: every line counted, one event per dedup window, one health update.
// 50,000 lines over ~17 minutes of journal time (four 5-minute dedup windows); the million-line
// flood and its speed and memory are bench/macro/journal_health_bench's (c) (`make bench`), since
// a million lines take ~100 s of the -O0 ASan test build.
TEST_F(GpuHealthModuleTest, AFloodOfIdenticalXidLinesStaysBounded) {
  h_.bus.Publish(TwoGpus());
  StartModule();
  const std::string line = "NVRM: Xid (PCI:0000:03:00): 48, pid='<unknown>', name=<unknown>, flood";
  constexpr int kLines = 50'000;
  constexpr int kChunk = 10'000;
  constexpr uint64_t kStepUsec = 20'000;  // 50 lines per second of journal time: ~17 minutes in all
  for (int sent = 0; sent < kLines; sent += kChunk) {
    for (int i = 0; i < kChunk; ++i) {
      h_.bus.Publish(
          Kernel(line, std::string(32, 'a'), 1'700'000'000'000'000 + static_cast<uint64_t>(sent + i) * kStepUsec));
    }
    h_.Drain();
  }
  EXPECT_EQ(Metric("gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(kUuid) + "\",xid=\"48\"}"), kLines);
  // Every event that was not suppressed leaves once its checkpoint is on disk.
  ASSERT_TRUE(h_.RunUntil([&] {
    return static_cast<double>(events_.size()) == kLines - Metric("gpu_node_supervisor_gpu_health_suppressed_total");
  }));
  // One event per dedup window (5 minutes by default), however many lines.
  EXPECT_LE(events_.size(), 5u);
  EXPECT_GE(events_.size(), 1u);
  EXPECT_EQ(health_.size(), 1u);  // published once: Unhealthy
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_suppressed_total"), kLines - static_cast<double>(events_.size()));
  const auto* state = h_.bus.Latest<GpuHealthState>();
  ASSERT_NE(state, nullptr);
  EXPECT_LE(state->recent_events.size(), config_.recent_events);
}

TEST_F(GpuHealthModuleTest, AnUnhealthyGpusEventNamesThePodsOnIt) {
  h_.bus.Publish(TwoGpus());
  pod_resources::GpuPodMap pods;
  pods.listed = pods.fresh = true;
  pods.gpus[kUuid] = {{"team-a", "trainer-0", "uid-1", "main", "nvidia.com/gpu"},
                      {"team-a", "trainer-0", "uid-1", "sidecar", "nvidia.com/gpu"}};
  h_.bus.Publish(pods);
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48)));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 48)));
  ASSERT_TRUE(h_.RunUntil([&] { return events_.size() == 2; }));
  for (const auto& e : events_) {
    const bool on_a = e.entities_impacted.back().value == kUuid;
    EXPECT_EQ(e.pods, on_a ? std::vector<std::string>{"team-a/trainer-0"} : std::vector<std::string>{});
  }
  EXPECT_EQ(nlohmann::json(events_[0])["pods"], nlohmann::json({"team-a/trainer-0"}));
}

TEST_F(GpuHealthModuleTest, NewBootMakesEveryDeviceHealthy) {
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48)));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 79)));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid) && IsUnhealthy(kOther); }));
  h_.bus.Publish(Kernel("Linux version 6.1", std::string(32, 'b')));
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid) && IsHealthy(kOther); }));
  EXPECT_EQ(Health(kUuid)->reason, "new boot");
  ASSERT_TRUE(h_.RunUntil([&] { return !events_.empty() && events_.back().is_healthy; }));
  EXPECT_TRUE(events_.back().is_healthy);
  EXPECT_TRUE(events_.back().entities_impacted.empty());  // all entities of the check
}

TEST_F(GpuHealthModuleTest, OperatorSetHealthyThroughTheAdminSocket) {
  h_.bus.Publish(TwoGpus());
  StartModule();
  const std::string socket = h_.site.paths.state_dir + "/admin.sock";
  struct stat st {};
  ASSERT_EQ(::stat(socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48)));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 48)));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid) && IsUnhealthy(kOther); }));

  EXPECT_EQ(h_.OffLoop([&] { return RunSetHealthy(h_.site.paths.state_dir, kUuid); }), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
  EXPECT_TRUE(IsUnhealthy(kOther));
  EXPECT_NE(Health(kUuid)->reason.find("admin socket"), std::string::npos);

  std::string answer;
  std::string error;
  ASSERT_TRUE(h_.OffLoop([&] { return AdminRequest(socket, "set-healthy bogus", answer, error); })) << error;
  EXPECT_EQ(answer.rfind("error", 0), 0u) << answer;
  EXPECT_EQ(h_.OffLoop([&] { return RunSetHealthy(h_.site.paths.state_dir, "bogus"); }), 1);
  EXPECT_TRUE(h_.OffLoop([&] { return AdminRequest(socket, "what", answer, error); }));
  EXPECT_EQ(answer.rfind("error", 0), 0u) << answer;
  EXPECT_TRUE(h_.OffLoop([&] { return AdminRequest(socket, std::string(10000, 'x'), answer, error); }) == false ||
              answer.rfind("error", 0) == 0);

  EXPECT_EQ(h_.OffLoop([&] { return RunSetHealthy(h_.site.paths.state_dir, "all"); }), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kOther); }));
  // After set-healthy the same XID counts afresh: it makes the device Unhealthy again at once.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48)));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  EXPECT_EQ(RunSetHealthy(dir_ + "/nowhere", "all"), 3);
}

TEST_F(GpuHealthModuleTest, ConfigOverridesAndBadCatalog) {
  const auto yaml = ParseYaml("catalog: " + ModuleSourceDir() +
                                  "/config/xid-catalog.yaml\noverrides:\n  ignore: [48]\n  critical: [13]\n"
                                  "  thresholds:\n    - {xid: 31, count: 3, window: 10m}\n",
                              "site.yaml");
  ConfigMap section(yaml, "modules.gpu-health");
  const auto config = GpuHealthModule::ParseConfig(section, h_.site);
  section.Finish();
  EXPECT_TRUE(config.overrides.ignore.count(48));
  EXPECT_TRUE(config.overrides.critical.count(13));
  EXPECT_EQ(config.overrides.thresholds.at(31).count, 3u);
  const auto missing = ParseYaml("catalog: /nonexistent/xid.yaml\n", "site.yaml");
  ConfigMap missing_section(missing, "modules.gpu-health");
  EXPECT_THROW(GpuHealthModule::ParseConfig(missing_section, h_.site), gns::ConfigError);
  // A disabled module's files are not opened: its section is still checked.
  ConfigMap disabled_section(missing, "modules.gpu-health");
  disabled_section.SetModuleEnabled(false);
  EXPECT_NO_THROW(GpuHealthModule::ParseConfig(disabled_section, h_.site));
  // Without a catalog file the built-in one is the whole catalog.
  const auto none = ParseYaml("checkName: SysLogsXIDError\n", "site.yaml");
  ConfigMap none_section(none, "modules.gpu-health");
  const auto builtin = GpuHealthModule::ParseConfig(none_section, h_.site);
  EXPECT_EQ(builtin.catalog.size(), XidCatalog::Builtin().size());
  EXPECT_GE(builtin.catalog.size(), 90u);
  EXPECT_TRUE(builtin.catalog.Lookup(48).fatal);
  // A site file is laid over it: its entries win, the others stay.
  const std::string site_catalog = dir_ + "/site-catalog.yaml";
  std::ofstream(site_catalog) << "version: 1\nxids:\n"
                                 "  - {xid: 48, mnemonic: SITE_48, description: d, fatal: false, action: NONE}\n"
                                 "  - {xid: 1001, mnemonic: SITE_NEW, description: d, fatal: true, action: RESTART_BM}\n";
  const auto overlay = ParseYaml("catalog: " + site_catalog + "\n", "site.yaml");
  ConfigMap overlay_section(overlay, "modules.gpu-health");
  const auto laid = GpuHealthModule::ParseConfig(overlay_section, h_.site);
  EXPECT_FALSE(laid.catalog.Lookup(48).fatal);
  EXPECT_EQ(laid.catalog.Lookup(48).mnemonic, "SITE_48");
  EXPECT_EQ(laid.catalog.Lookup(1001).action, RecommendedAction::kRestartBm);
  EXPECT_TRUE(laid.catalog.Lookup(79).fatal);
  EXPECT_EQ(laid.catalog.size(), XidCatalog::Builtin().size() + 1);
  EXPECT_NE(laid.catalog_source.find(site_catalog), std::string::npos) << laid.catalog_source;
  const auto bad = ParseYaml("catalog: " + ModuleSourceDir() + "/config/xid-catalog.yaml\noverrides:\n  ignore: [x]\n",
                             "site.yaml");
  ConfigMap bad_section(bad, "modules.gpu-health");
  EXPECT_THROW(GpuHealthModule::ParseConfig(bad_section, h_.site), gns::ConfigError);
}

// --- the API simulator: Node condition, Events and the set-healthy annotation -------------

class GpuHealthKubeTest : public GpuHealthModuleTest {
 protected:
  void SetUp() override {
    GpuHealthModuleTest::SetUp();
    server_ = std::make_unique<gns::test::ApiSim>(fs::path(dir_) / "api");
    server_->Seed(nlohmann::json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node1"}}}});
    StartKube();
  }

  // What the kube module does at Start and Stop, as far as its users can tell.
  void StartKube() {
    kube::ClientConfig config = server_->ClientConfig();
    const auto log = gns::test::QuietLogger("gpu-health-test");
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, log}, config);
    kube::EventRecorderConfig events;
    events.reporting_instance = "node1";
    recorder_ = std::make_shared<kube::EventRecorder>(client_, h_.clock, h_.metrics, log, events);
    informers_ = std::make_shared<kube::InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics, log);
    h_.services.Provide<kube::KubeClient>(client_);
    h_.services.Provide<kube::EventRecorder>(recorder_);
    h_.services.Provide<kube::InformerRegistry>(informers_);
  }

  void StopKube() {
    h_.services.Withdraw<kube::KubeClient>();
    h_.services.Withdraw<kube::EventRecorder>();
    h_.services.Withdraw<kube::InformerRegistry>();
    informers_->StopAll();
    client_->Shutdown();
    h_.Drain();
  }

  void TearDown() override {
    StopModule();
    StopKube();
    recorder_.reset();
    informers_.reset();
    client_.reset();
    server_->Stop();
    GpuHealthModuleTest::TearDown();
  }

  nlohmann::json Condition() {
    const auto node = server_->Call("GET", "/api/v1/nodes/node1").Json();
    for (const auto& c : node.value("/status/conditions"_json_pointer, nlohmann::json::array())) {
      if (c.value("type", "") == "GpuXidHealthy") return c;
    }
    return nullptr;
  }

  // kubectl annotate node node1 gpu-node-supervisor.nvidia.com/set-healthy=all, then wait for
  // the GPU and the Node condition to be healthy again.
  void SetHealthyByAnnotation() {
    const auto patched = server_->Call(
        "PATCH", "/api/v1/nodes/node1",
        R"({"metadata":{"annotations":{"gpu-node-supervisor.nvidia.com/set-healthy":"all"}}})",
        "application/merge-patch+json");
    ASSERT_EQ(patched.status, 200) << patched.body;
    ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
    ASSERT_TRUE(h_.RunUntil([&] { return Condition()["status"] == "True"; }));
  }

  std::vector<nlohmann::json> Events() {
    std::vector<nlohmann::json> out;
    const auto list = server_->Call("GET", "/apis/events.k8s.io/v1/namespaces/default/events").Json();
    for (const auto& e : list.value("items", nlohmann::json::array())) out.push_back(e);
    return out;
  }

  std::unique_ptr<gns::test::ApiSim> server_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::EventRecorder> recorder_;
  std::shared_ptr<kube::InformerRegistry> informers_;
};

TEST_F(GpuHealthKubeTest, NodeConditionEventsAndTheSetHealthyAnnotation) {
  h_.bus.Publish(TwoGpus());
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return !Condition().is_null() && Condition()["status"] == "True"; }));
  for (int i = 0; i < 3; ++i) h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48)));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 79)));
  ASSERT_TRUE(h_.RunUntil([&] { return Condition()["status"] == "False"; }));
  const auto condition = Condition();
  EXPECT_EQ(condition["reason"], "FatalXid");
  EXPECT_NE(condition["message"].get<std::string>().find(kUuid), std::string::npos) << condition.dump();
  ASSERT_TRUE(h_.RunUntil([&] { return Events().size() >= 2; }));
  bool saw_48 = false;
  for (const auto& e : Events()) {
    EXPECT_EQ(e["regarding"]["name"], "node1");
    EXPECT_EQ(e["type"], "Warning");
    if (e["note"].get<std::string>().find("ROBUST_CHANNEL_GPU_ECC_DBE") != std::string::npos) saw_48 = true;
  }
  EXPECT_TRUE(saw_48);

  // Remote set-healthy: annotate the Node.
  ASSERT_NO_FATAL_FAILURE(SetHealthyByAnnotation());
  // The annotation is taken off once acted upon.
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto node = server_->Call("GET", "/api/v1/nodes/node1").Json();
    return !node["metadata"].contains("annotations") ||
           !node["metadata"]["annotations"].contains("gpu-node-supervisor.nvidia.com/set-healthy");
  }));
}

TEST_F(GpuHealthKubeTest, AStateDirThatCannotBeWrittenIsSaidOnTheNodeConditionAndReadyz) {
  // A file where the state directory should be: mkdir, the admin socket and every write fail
  // (as on a read-only state directory, even for root).
  std::ofstream(dir_ + "/not-a-dir") << "x";
  h_.site.paths.state_dir = dir_ + "/not-a-dir";
  h_.bus.Publish(TwoGpus());
  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 79)));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto c = Condition();
    return !c.is_null() && c["status"] == "False" &&
           c["message"].get<std::string>().find("health is not persisted: ") != std::string::npos;
  })) << Condition().dump();
  EXPECT_EQ(Condition()["reason"], "FatalXid");
  // /readyz lists the module with the reason.
  EXPECT_EQ(module_.health, ModuleHealth::kUnhealthy);
  EXPECT_NE(module_.health_detail.find("health is not persisted"), std::string::npos) << module_.health_detail;
}

TEST_F(GpuHealthKubeTest, AStartFindsTheKubeServicesOfThatMoment) {
  // gpu-health follows kube (kFollows): the supervisor restarts it around kube's restarts
  // (supervisor_test), and each start picks up the services that are there then.
  h_.bus.Publish(TwoGpus());
  StopKube();
  StartModule();  // kube not running: no condition, no annotation watch, and no failure
  EXPECT_TRUE(module_.failures.empty());
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 79)));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kOther); }));
  EXPECT_TRUE(Condition().is_null());

  const auto old_informers = informers_;
  StopModule();
  StartKube();
  StartModule();
  // The Node condition goes through the new client (the restored verdict included)...
  ASSERT_TRUE(h_.RunUntil([&] { return !Condition().is_null() && Condition()["status"] == "False"; }));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 79)));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  // ...and the set-healthy annotation is seen by an informer of the new registry.
  ASSERT_NO_FATAL_FAILURE(SetHealthyByAnnotation());
  EXPECT_EQ(old_informers->Active(), 0u);  // nothing left on the old registry
}

// --- the whole chain through a real journal file and the kubelet simulator -----------------

TEST_F(GpuHealthModuleTest, JournalXidToUnhealthyAtTheKubeletAndResetAckBackToHealthy) {
  const std::string journal_dir = dir_ + "/journal";
  fs::create_directories(journal_dir);
  auto kubelet = StartKubelet();
  h_.bus.Publish(TwoGpus());

  auto noop_failure = [](std::string) {};
  auto noop_health = [](ModuleHealth, std::string) {};
  ModuleContext dp_context(h_.Parts(), "device-plugin", noop_failure, noop_health);
  device_plugin::DevicePluginModule::Config dp_config;
  auto dp = std::make_unique<device_plugin::DevicePluginModule>(dp_context, dp_config);
  dp->Start();
  config_.overrides = LoadSiteOverridesString("ignore: [94]\n", "site.yaml");
  StartModule();
  ModuleContext journal_context(h_.Parts(), "journald", noop_failure, noop_health);
  journald::JournaldModule::Config journal_config;
  journal_config.directory = journal_dir;
  auto journal = std::make_unique<journald::JournaldModule>(journal_context, journal_config);
  sim::JournalWriter writer(journal_dir);
  writer.Append(sim::JournalWriter::Kernel("Linux version 6.1.0"));
  journal->Start();

  auto await_health = [&](const std::string& health) {
    return h_.OffLoop([&] {
      return kubelet->WaitForDeviceHealth("nvidia.com/gpu", kUuid, health, seconds(20));
    });
  };
  ASSERT_TRUE(await_health("Healthy"));
  // One judge: an NVML XID the site ignores leaves the GPU Healthy at the kubelet too. (The
  // XID 48 on the other GPU, which is not ignored, is the point after which to look.)
  h_.bus.Publish(gpu_inventory::XidObservation{kUuid, 94});
  h_.bus.Publish(gpu_inventory::XidObservation{kOther, 48});
  ASSERT_TRUE(h_.OffLoop([&] { return kubelet->WaitForDeviceHealth("nvidia.com/gpu", kOther, "Unhealthy", seconds(20)); }));
  EXPECT_TRUE(h_.OffLoop([&] { return kubelet->WaitForDeviceHealth("nvidia.com/gpu", kUuid, "Healthy", seconds(1)); }));
  EXPECT_EQ(Metric("gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(kUuid) + "\",xid=\"94\"}"), 1);
  writer.Append({sim::JournalWriter::Kernel(sim::GpuUuidMessage("0000:03:00", kUuid)),
                 sim::JournalWriter::Kernel(sim::XidMessage("0000:03:00", 48))});
  ASSERT_TRUE(await_health("Unhealthy"));
  writer.Append(sim::JournalWriter::Syslog("gpu-reset", sim::ResetAckMessage(kUuid)));
  ASSERT_TRUE(await_health("Healthy"));

  for (Module* m : std::initializer_list<Module*>{journal.get(), dp.get()}) {
    bool stopped = false;
    m->Stop([&] { stopped = true; });
    ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
  }
  journal.reset();
  dp.reset();
  StopModule();
  h_.OffLoop([&] {
    kubelet.reset();
    return 0;
  });
}

// A MIG GPU: an XID that names a GPU instance (kernel GPU-I, NVML's gpuInstanceId) makes that
// MIG device alone Unhealthy at the kubelet; one without makes all of them; the reset heals all.
TEST_F(GpuHealthModuleTest, AnXidOnOneGpuInstanceMarksOnlyItsMigDeviceAtTheKubelet) {
  auto kubelet = StartKubelet();
  gpu_inventory::GpuInventory inventory = TwoGpus();
  inventory.gpus[0].mig_enabled = true;
  for (uint32_t gi : {1u, 2u}) {
    gpu_inventory::MigDeviceInfo mig;
    mig.index = gi - 1;
    mig.uuid = "MIG-gi" + std::to_string(gi);
    mig.gpu_instance = gi;
    mig.profile = "3g.40gb";
    inventory.gpus[0].mig_devices.push_back(mig);
  }
  h_.bus.Publish(inventory);

  auto noop_failure = [](std::string) {};
  auto noop_health = [](ModuleHealth, std::string) {};
  ModuleContext dp_context(h_.Parts(), "device-plugin", noop_failure, noop_health);
  device_plugin::DevicePluginModule::Config dp_config;
  dp_config.mig_strategy = device_plugin::MigStrategy::kMixed;
  auto dp = std::make_unique<device_plugin::DevicePluginModule>(dp_context, dp_config);
  dp->Start();
  StartModule();
  const std::string resource = "nvidia.com/mig-3g.40gb";
  auto health_of = [&](const std::string& id, const std::string& health) {
    return h_.OffLoop([&] { return kubelet->WaitForDeviceHealth(resource, id, health, seconds(20)); });
  };
  ASSERT_TRUE(health_of("MIG-gi1", "Healthy"));
  ASSERT_TRUE(health_of("MIG-gi2", "Healthy"));

  h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:03:00 GPU-I:02): 48, pid=1, name=python, DBE"));
  ASSERT_TRUE(health_of("MIG-gi2", "Unhealthy"));
  EXPECT_TRUE(health_of("MIG-gi1", "Healthy"));
  EXPECT_FALSE(IsUnhealthy(kUuid));  // the GPU's own verdict is untouched
  const auto& retained = h_.bus.LatestByKey<DeviceHealth>();
  const auto gi2 = retained.find(std::string(kUuid) + "/gi2");
  ASSERT_NE(gi2, retained.end());
  EXPECT_FALSE(gi2->second.healthy);
  EXPECT_EQ(gi2->second.gpu_instance, 2u);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_instance_healthy{gpu=\"" + std::string(kUuid) + "\",gpu_instance=\"2\"}"), 0);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_devices{health=\"Unhealthy\"}"), 0);  // whole GPUs

  // NVML names GPU instance 1 in a later occurrence.
  h_.bus.Publish(gpu_inventory::XidObservation{kUuid, 48, 1, 0, 1'700'000'100'000});
  ASSERT_TRUE(health_of("MIG-gi1", "Unhealthy"));

  // A reset of the GPU heals both GPU instances.
  h_.bus.Publish(Ack(kUuid));
  ASSERT_TRUE(health_of("MIG-gi1", "Healthy"));
  ASSERT_TRUE(health_of("MIG-gi2", "Healthy"));

  // No instance named: the whole GPU, so every MIG device of it.
  h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:03:00): 79, pid=1, name=x, GPU has fallen off the bus.",
                        std::string(32, 'a'), 1'700'000'200'000'000));
  ASSERT_TRUE(health_of("MIG-gi1", "Unhealthy"));
  ASSERT_TRUE(health_of("MIG-gi2", "Unhealthy"));

  bool stopped = false;
  dp->Stop([&] { stopped = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
  dp.reset();
  StopModule();
  h_.OffLoop([&] {
    kubelet.reset();
    return 0;
  });
}

// --- verdicts survive a restart within the boot: <stateDir>/gpu-health/devices.json ---------

constexpr const char* kBootA = "6f1c2a1e-0b7d-4c57-9a31-3d2f4be1c0aa";
constexpr const char* kBootAHex = "6f1c2a1e0b7d4c579a313d2f4be1c0aa";
constexpr const char* kBootB = "0d9e8f7a-6b5c-4d3e-8f2a-1b0c9d8e7f6b";
constexpr const char* kBootBHex = "0d9e8f7a6b5c4d3e8f2a1b0c9d8e7f6b";

class GpuHealthPersistTest : public GpuHealthModuleTest {
 protected:
  void SetUp() override {
    GpuHealthModuleTest::SetUp();
    h_.site.paths.host_root = dir_ + "/host";
    fs::create_directories(h_.site.paths.host_root + "/proc/sys/kernel/random");
  }

  void SetHostBoot(const std::string& boot) {
    std::ofstream(h_.site.paths.host_root + "/proc/sys/kernel/random/boot_id", std::ios::trunc) << boot << "\n";
  }
  void RemoveHostBoot() { fs::remove(h_.site.paths.host_root + "/proc/sys/kernel/random/boot_id"); }

  std::string StateFile() const { return h_.site.paths.state_dir + "/gpu-health/devices.json"; }

  // The saved verdicts, when the file is there and valid.
  std::optional<HealthCheckpoint> Saved() {
    std::ifstream in(StateFile());
    if (!in) return std::nullopt;
    std::stringstream text;
    text << in.rdbuf();
    std::string error;
    return HealthCheckpoint::Parse(text.str(), error);
  }
  std::optional<bool> SavedHealthy(const std::string& uuid) {
    const auto saved = Saved();
    if (!saved) return std::nullopt;
    for (const auto& d : saved->devices) {
      if (d.uuid == uuid) return d.healthy;
    }
    return std::nullopt;
  }

  // What the new instance published for `uuid` (the bus outlives the instances).
  const DeviceHealth* PublishedSinceRestart(const std::string& uuid) {
    const DeviceHealth* last = nullptr;
    for (const auto& h : health_) {
      if (h.uuid == uuid) last = &h;
    }
    return last;
  }

  // Stops the instance and forgets what it published (delivered first: the bus queues).
  void StopAndForget() {
    StopModule();
    h_.Drain();
    health_.clear();
    events_.clear();
  }
  void Restart() {
    StopAndForget();
    StartModule();
  }

  // Boot A, XID 48 on kUuid: Unhealthy, on disk; then the instance stops.
  void SaveAnUnhealthyVerdictAndStop() {
    SetHostBoot(kBootA);
    h_.bus.Publish(TwoGpus());
    StartModule();
    h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
    EXPECT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
    StopAndForget();
  }

  std::vector<fs::path> CorruptCopies() {
    std::vector<fs::path> out;
    for (const auto& entry : fs::directory_iterator(h_.site.paths.state_dir + "/gpu-health")) {
      if (entry.path().filename().string().rfind("devices.json.corrupt-", 0) == 0) out.push_back(entry.path());
    }
    return out;
  }
};

TEST_F(GpuHealthPersistTest, UnhealthySurvivesARestartInTheSameBoot) {
  SetHostBoot(kBootA);
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  // On disk before any stop: a crash now loses nothing.
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
  EXPECT_EQ(Saved()->boot_id, kBootAHex);
  struct stat st {};
  ASSERT_EQ(::stat(StateFile().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((h_.site.paths.state_dir + "/gpu-health").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const double xids = Metric("gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(kUuid) + "\",xid=\"48\"}");

  Restart();  // journald resumes after its cursor: the XID line is not read again
  const auto* restored = PublishedSinceRestart(kUuid);
  ASSERT_NE(restored, nullptr) << "no DeviceHealth published at start";
  EXPECT_FALSE(restored->healthy);
  EXPECT_EQ(restored->xid, 48u);
  EXPECT_EQ(restored->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(restored->pci, "0000:03:00");
  EXPECT_NE(restored->reason.find("XID 48"), std::string::npos) << restored->reason;
  EXPECT_EQ(PublishedSinceRestart(kOther), nullptr);
  EXPECT_TRUE(events_.empty());  // nothing new happened
  EXPECT_EQ(Metric("gpu_node_supervisor_xid_errors_total{gpu=\"" + std::string(kUuid) + "\",xid=\"48\"}"), xids);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_restored_total"), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_devices{health=\"Unhealthy\"}"), 1);
  EXPECT_NE(module_->HandleAdminLine("status").find("\"healthy\":false"), std::string::npos);

  // The same XID again is the same verdict: not published twice.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return !events_.empty(); }));
  EXPECT_EQ(health_.size(), 1u);
}

TEST_F(GpuHealthPersistTest, AGpuInstanceVerdictSurvivesARestartAsItsOwn) {
  SetHostBoot(kBootA);
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel("NVRM: Xid (PCI:0000:03:00 GPU-I:03): 48, pid=1, name=x, DBE", kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto saved = Saved();
    return saved && saved->devices.size() == 1 && saved->devices[0].gpu_instance == 3;
  }));
  Restart();
  const auto* restored = PublishedSinceRestart(kUuid);
  ASSERT_NE(restored, nullptr) << "no DeviceHealth published at start";
  EXPECT_FALSE(restored->healthy);
  EXPECT_EQ(restored->gpu_instance, 3u);
  EXPECT_FALSE(IsUnhealthy(kUuid));  // the whole GPU's key stays clear
}

TEST_F(GpuHealthPersistTest, AnotherBootRestoresNothing) {
  SetHostBoot(kBootA);
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 79), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false && SavedHealthy(kOther) == false; }));
  StopAndForget();

  SetHostBoot(kBootB);  // rebooted
  StartModule();
  for (const auto& h : health_) EXPECT_TRUE(h.healthy) << h.uuid;
  EXPECT_EQ(module_->HandleAdminLine("status"), "ok: {}");
  const auto* state = h_.bus.Latest<GpuHealthState>();
  ASSERT_NE(state, nullptr);
  EXPECT_TRUE(state->devices.empty());
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_restored_total"), 0);
  // The file is overwritten for the new boot.
  ASSERT_TRUE(h_.RunUntil([&] { return Saved() && Saved()->boot_id == kBootBHex; }));
  EXPECT_TRUE(Saved()->devices.empty());
  StopAndForget();
  SetHostBoot(kBootA);  // even the old boot's ID (it cannot come back) finds nothing to restore now
  StartModule();
  EXPECT_TRUE(health_.empty());
}

// Issue 26, XID policy: XID 163 clears the verdict XID 162 holds (also one restored from the
// checkpoint), through the real module, at the device-health topic and in the HealthEvents.
TEST_F(GpuHealthPersistTest, Xid163ClearsXid162AtTheDeviceHealthTopicAlsoAfterARestart) {
  SetHostBoot(kBootA);
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 162), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  EXPECT_EQ(Health(kUuid)->xid, 162u);
  EXPECT_EQ(Health(kUuid)->recommended_action, "CONTACT_SUPPORT");
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 163), kBootAHex));  // another GPU: nothing
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 163), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
  EXPECT_EQ(Health(kUuid)->reason, "XID 163 (XID_163) clears XID 162");
  ASSERT_TRUE(h_.RunUntil([&] {
    return std::any_of(events_.begin(), events_.end(), [](const HealthEvent& e) { return e.is_healthy; });
  }));
  const auto cleared = std::find_if(events_.begin(), events_.end(), [](const HealthEvent& e) { return e.is_healthy; });
  EXPECT_EQ(cleared->error_code, std::vector<std::string>{"163"});
  EXPECT_EQ(cleared->entities_impacted, (std::vector<ImpactedEntity>{{"PCI", "0000:03:00"}, {"GPU_UUID", kUuid}}));
  EXPECT_FALSE(IsUnhealthy(kOther));

  // Held again, saved, and cleared by a 163 read after a restart.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 162), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
  Restart();
  ASSERT_NE(PublishedSinceRestart(kUuid), nullptr);
  EXPECT_FALSE(PublishedSinceRestart(kUuid)->healthy);
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 163), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == true; }));
}

// Issue 26, XID policy: XID 79 (RESTART_BM) in a third boot within 7 days is a hardware problem:
// the HealthEvent recommends CONTACT_SUPPORT. The boot history lives in the checkpoint, across
// restarts in new boots.
TEST_F(GpuHealthPersistTest, AnXidAskingForARebootInAThirdBootEscalatesToContactSupport) {
  const std::string boots[] = {kBootAHex, kBootBHex, std::string(32, 'c')};
  for (int i = 0; i < 3; ++i) {
    SetHostBoot(boots[i]);
    h_.bus.Publish(TwoGpus());
    StartModule();
    h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 79), boots[i]));
    ASSERT_TRUE(h_.RunUntil([&] { return !events_.empty() && IsUnhealthy(kUuid); })) << "boot " << i;
    const HealthEvent& e = events_.back();
    EXPECT_EQ(e.error_code, std::vector<std::string>{"79"});
    if (i < 2) {
      EXPECT_EQ(e.recommended_action_name, "RESTART_BM") << "boot " << i;
      EXPECT_EQ(Health(kUuid)->recommended_action, "RESTART_BM");
    } else {
      EXPECT_EQ(e.recommended_action_name, "CONTACT_SUPPORT");
      EXPECT_EQ(e.recommended_action, 5);
      EXPECT_NE(e.message.find("XID 79 in 3 boots within 7d"), std::string::npos) << e.message;
      EXPECT_EQ(Health(kUuid)->recommended_action, "CONTACT_SUPPORT");
    }
    ASSERT_TRUE(h_.RunUntil([&] { return Saved() && Saved()->xid_boots.size() == 1 &&
                                         Saved()->xid_boots[0].boots.size() == static_cast<std::size_t>(i + 1); }));
    StopAndForget();
  }
}

TEST_F(GpuHealthPersistTest, SetHealthyResetAckAndNewBootArePersisted) {
  SetHostBoot(kBootA);
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  h_.bus.Publish(Kernel(sim::XidMessage("0000:3b:00", 48), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid) && IsUnhealthy(kOther); }));
  EXPECT_EQ(module_->SetHealthy(kUuid, "test"), "ok: 1 device(s) set healthy");
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == true && SavedHealthy(kOther) == false; }));

  Restart();
  EXPECT_EQ(PublishedSinceRestart(kUuid), nullptr);  // Healthy: nothing to restore
  ASSERT_NE(PublishedSinceRestart(kOther), nullptr);
  EXPECT_FALSE(PublishedSinceRestart(kOther)->healthy);

  // The reset acknowledgement clears the other one, and that survives a restart too.
  h_.bus.Publish(Ack(kOther, kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kOther) && SavedHealthy(kOther) == true; }));
  Restart();
  EXPECT_TRUE(health_.empty());

  // A new boot seen in the journal heals every device, persisted as well.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 79), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
  h_.bus.Publish(Kernel("Linux version 6.1", kBootBHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == true; }));
  EXPECT_EQ(Saved()->devices.front().reason, "new boot");
  Restart();
  EXPECT_TRUE(health_.empty());
}

TEST_F(GpuHealthPersistTest, CorruptOrUnknownVersionFileIsMovedAsideAndStartIsClean) {
  SetHostBoot(kBootA);
  fs::create_directories(h_.site.paths.state_dir + "/gpu-health");
  std::ofstream(StateFile()) << "{\"version\":1,\"bootId\":\"" << kBootAHex << "\",\"devices\":[{\"uuid\":";
  h_.bus.Publish(TwoGpus());
  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_state_file_corrupt_total"), 1);
  ASSERT_EQ(CorruptCopies().size(), 1u);
  EXPECT_FALSE(fs::exists(StateFile()));
  EXPECT_TRUE(health_.empty());
  // A clean start: the next verdict writes a valid file.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
  StopAndForget();

  // A version this build does not know: the same, never guessed at.
  for (const auto& copy : CorruptCopies()) fs::remove(copy);
  std::ofstream(StateFile(), std::ios::trunc) << "{\"version\":3,\"bootId\":\"" << kBootAHex << "\",\"devices\":[]}";
  StartModule();
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_state_file_corrupt_total"), 2);
  EXPECT_EQ(CorruptCopies().size(), 1u);
  EXPECT_TRUE(health_.empty());
  EXPECT_TRUE(module_.failures.empty());
}

TEST_F(GpuHealthPersistTest, AStateDirThatCannotBeWrittenLeavesTheVerdictsFlowing) {
  // A file where the state directory should be (a read-only one refuses the same writes, even
  // to root): the admin socket cannot be bound, the checkpoint cannot be written.
  SetHostBoot(kBootA);
  std::ofstream(dir_ + "/not-a-dir") << "x";
  h_.site.paths.state_dir = dir_ + "/not-a-dir";
  h_.bus.Publish(TwoGpus());
  ASSERT_NO_THROW(StartModule());
  EXPECT_TRUE(module_.failures.empty());
  // Running without its admin socket: degraded, set-healthy through the annotation only.
  ASSERT_TRUE(h_.RunUntil([&] { return module_.health == ModuleHealth::kDegraded; }));
  EXPECT_NE(module_.health_detail.find("admin socket unavailable"), std::string::npos) << module_.health_detail;
  // An XID 79: Unhealthy at once, its event sent without waiting for a disk that will not take it.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 79), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid) && !events_.empty(); }));
  EXPECT_EQ(Health(kUuid)->recommended_action, "RESTART_BM");
  EXPECT_FALSE(events_.back().is_healthy);
  ASSERT_TRUE(h_.RunUntil([&] { return Metric("gpu_node_supervisor_gpu_health_state_write_failures_total") >= 1; }));
  // Not persisted: not ready, and why.
  ASSERT_TRUE(h_.RunUntil([&] { return module_.health == ModuleHealth::kUnhealthy; }));
  EXPECT_NE(module_.health_detail.find("health is not persisted (verdicts still published)"), std::string::npos)
      << module_.health_detail;
  EXPECT_EQ(module_->SetHealthy(kUuid, "test"), "ok: 1 device(s) set healthy");
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
  EXPECT_TRUE(module_.failures.empty());
  StopAndForget();  // stops although its last write fails too
}

// Issue #24 §6: devices.json replaced by a FIFO (once: the start waited for a writer for ever,
// /healthz with it) or a link to /dev/zero (once: read until memory ran out) is refused without
// being read, moved aside under a name of its own, and the start is clean.
TEST_F(GpuHealthPersistTest, AFifoOrALinkToADeviceInPlaceOfTheFileIsMovedAsideNotRead) {
  SetHostBoot(kBootA);
  fs::create_directories(h_.site.paths.state_dir + "/gpu-health");
  ASSERT_EQ(::mkfifo(StateFile().c_str(), 0600), 0);
  h_.bus.Publish(TwoGpus());
  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_state_file_corrupt_total"), 1);
  ASSERT_EQ(CorruptCopies().size(), 1u);
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(CorruptCopies().front())));
  StopAndForget();  // writes a good file again

  fs::remove(StateFile());
  fs::create_symlink("/dev/zero", StateFile());
  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_state_file_corrupt_total"), 2);
  EXPECT_EQ(CorruptCopies().size(), 2u);  // the first one kept, even within the same second
  EXPECT_FALSE(fs::exists(fs::symlink_status(StateFile())));
  // A clean start: the next verdict writes a regular file.
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
}

// Issue #24 §6: devices.json is read on the pool, not on the loop (a slow disk or a large file
// once stalled every module and /healthz for as long as it took). While it loads the loop keeps
// serving, the module is running but not ready and says why, and nothing is judged or published
// that the restored verdicts would have to override; once it is back they are restored once.
TEST_F(GpuHealthPersistTest, TheCheckpointIsReadOffTheLoopAndNothingIsPublishedBeforeIt) {
  SaveAnUnhealthyVerdictAndStop();

  gns::test::HeldPool held(h_.pool);  // the read cannot finish
  module_.Start(config_);
  bool served = false;
  h_.loop.Post([&] { served = true; });
  h_.Drain();
  EXPECT_TRUE(served) << "the loop did not turn while devices.json loads";
  EXPECT_TRUE(module_->Loading());
  EXPECT_EQ(module_.health, ModuleHealth::kUnhealthy);
  EXPECT_NE(module_.health_detail.find("loading " + StateFile()), std::string::npos) << module_.health_detail;
  EXPECT_TRUE(health_.empty()) << "a verdict was published before the checkpoint was restored";
  EXPECT_NE(module_->HandleAdminLine("status").find("{}"), std::string::npos);

  held.Release();
  ASSERT_TRUE(h_.RunUntil([&] { return !module_->Loading(); }));
  h_.Drain();
  EXPECT_EQ(module_.health, ModuleHealth::kOk) << module_.health_detail;
  ASSERT_EQ(health_.size(), 1u);  // restored once, nothing before it
  EXPECT_EQ(health_[0].uuid, kUuid);
  EXPECT_FALSE(health_[0].healthy);
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_restored_total"), 1);
}

// A stop while devices.json loads: the late read touches nothing of the gone instance (ASan
// would say), the file is not overwritten with the empty state of an instance that never
// loaded it, and the next start restores it.
TEST_F(GpuHealthPersistTest, AStopWhileTheCheckpointLoadsKeepsItForTheNextStart) {
  SaveAnUnhealthyVerdictAndStop();

  {
    gns::test::HeldPool held(h_.pool);
    module_.Start(config_);
    h_.Drain();
    StopModule();  // finishes without the pool
  }
  // The read comes back to no one.
  ASSERT_TRUE(gns::test::FlushPool(h_));  // the late read has come back to no one
  EXPECT_TRUE(health_.empty());
  EXPECT_EQ(SavedHealthy(kUuid), false);

  StartModule();
  ASSERT_NE(PublishedSinceRestart(kUuid), nullptr);
  EXPECT_FALSE(PublishedSinceRestart(kUuid)->healthy);
}

TEST_F(GpuHealthPersistTest, WithoutTheHostBootIdTheJournalsBootDecides) {
  RemoveHostBoot();
  h_.bus.Publish(TwoGpus());
  StartModule();
  h_.bus.Publish(Kernel(sim::XidMessage("0000:03:00", 48), kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return SavedHealthy(kUuid) == false; }));
  EXPECT_EQ(Saved()->boot_id, kBootAHex);

  Restart();
  EXPECT_TRUE(health_.empty());  // the boot is not known yet
  h_.bus.Publish(Kernel("NVRM: loading NVIDIA UNIX x86_64 Kernel Module", kBootAHex));
  ASSERT_TRUE(h_.RunUntil([&] { return PublishedSinceRestart(kUuid) != nullptr; }));
  EXPECT_FALSE(PublishedSinceRestart(kUuid)->healthy);
  EXPECT_EQ(PublishedSinceRestart(kUuid)->xid, 48u);

  Restart();
  h_.bus.Publish(Kernel("NVRM: loading NVIDIA UNIX x86_64 Kernel Module", kBootBHex));  // another boot
  ASSERT_TRUE(h_.RunUntil([&] { return Saved() && Saved()->boot_id == kBootBHex; }));
  EXPECT_TRUE(health_.empty());
  EXPECT_TRUE(Saved()->devices.empty());
}

// The last events, in the checkpoint, for a consumer a kill -9 kept them from (nvsentinel-export):
// kept whatever boot, and published again at start from the file alone.
TEST_F(GpuHealthPersistTest, TheEventLogIsInTheCheckpointAndPublishedAgainAtStart) {
  SaveAnUnhealthyVerdictAndStop();
  const auto saved = Saved();
  ASSERT_TRUE(saved);
  ASSERT_EQ(saved->event_log.size(), 1u);
  EXPECT_EQ(saved->event_log[0].error_code, std::vector<std::string>{"48"});
  h_.bus.Publish(HealthEventLog{});  // as in a new process: nothing retained on the bus
  SetHostBoot(kBootB);               // and another boot: the log is kept all the same
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto* log = h_.bus.Latest<HealthEventLog>();
    return log != nullptr && log->events.size() == 1;
  }));
  EXPECT_EQ(nlohmann::json(h_.bus.Latest<HealthEventLog>()->events[0]), nlohmann::json(saved->event_log[0]));
}

TEST(GpuHealthStateFile, TheEventLogRoundTripsAndABadEntryIsNamed) {
  HealthCheckpoint saved;
  HealthEvent e;
  e.is_fatal = true;
  e.message = "Xid 48, an uncorrectable double bit error";
  e.recommended_action = 2;
  e.recommended_action_name = "COMPONENT_RESET";
  e.error_code = {"48"};
  e.entities_impacted = {{"PCI", "0000:03:00"}, {"GPU_UUID", kUuid}};
  e.node_name = "node-1";
  e.generated_seconds = 1'700'000'000;
  e.generated_nanos = 123;
  e.source = "kernel";
  e.suppressed_before = 4;
  e.pods = {"team/train-0"};
  HealthEvent healthy;
  healthy.is_healthy = true;
  healthy.source = "boot";
  saved.event_log = {e, healthy};
  std::string error;
  const auto back = HealthCheckpoint::Parse(saved.Serialize(), error);
  ASSERT_TRUE(back) << error;
  ASSERT_EQ(back->event_log.size(), 2u);
  EXPECT_EQ(nlohmann::json(back->event_log[0]), nlohmann::json(e));
  EXPECT_EQ(nlohmann::json(back->event_log[1]), nlohmann::json(healthy));
  // A damaged entry rejects the file (it is moved aside), saying which entry and why.
  auto doc = nlohmann::json::parse(saved.Serialize());
  doc["eventLog"][1].erase("isHealthy");
  EXPECT_FALSE(HealthCheckpoint::Parse(doc.dump(), error));
  EXPECT_NE(error.find("eventLog[1]"), std::string::npos) << error;
  doc = nlohmann::json::parse(saved.Serialize());
  doc["eventLog"][0]["generatedTimestamp"] = "yesterday";
  EXPECT_FALSE(HealthCheckpoint::Parse(doc.dump(), error));
  EXPECT_NE(error.find("generatedTimestamp"), std::string::npos) << error;
  doc["eventLog"] = nlohmann::json::object();
  EXPECT_FALSE(HealthCheckpoint::Parse(doc.dump(), error));
  EXPECT_NE(error.find("eventLog is not an array"), std::string::npos) << error;
}

TEST(GpuHealthStateFile, RoundTripAndValidation) {
  HealthCheckpoint saved;
  saved.boot_id = kBootAHex;
  DeviceHealth d;
  d.uuid = kUuid;
  d.healthy = false;
  d.reason = "XID 48 (ROBUST_CHANNEL_GPU_ECC_DBE)";
  d.xid = 48;
  d.recommended_action = "COMPONENT_RESET";
  d.since_unix_ms = 1'700'000'000'123;
  d.pci = "0000:03:00";
  saved.devices.push_back(d);
  DeviceHealth instance = d;  // a MIG GPU instance's verdict beside its GPU's
  instance.gpu_instance = 5;
  instance.reason = "XID 48 (ROBUST_CHANNEL_GPU_ECC_DBE) on GPU instance 5";
  saved.devices.push_back(instance);
  DeviceHealth switched = d;  // a verdict an NVSwitch SXid made (no XID holds it)
  switched.uuid = "GPU-5e1c4f1a-7a37-4bd6-9b0e-6e8a3c6a2a11";
  switched.xid = 0;
  switched.sxid = 20034;
  switched.reason = "SXid 20034 (LTSSM_FAULT_UP) on NVSwitch 0 at 0000:c3:00.0 port 15, wired to GPU 1 link 1";
  saved.devices.push_back(switched);
  saved.journal = {kBootAHex, "s=abc;i=12;b=" + std::string(kBootAHex) + ";m=1f;t=5;x=9", 31, 1'700'000'000'000'005};
  saved.xid_counts = {{kUuid, 48, 3}, {"0000:99:00", 13, 1}};
  std::string error;
  const auto back = HealthCheckpoint::Parse(saved.Serialize(), error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->boot_id, kBootAHex);
  ASSERT_EQ(back->devices.size(), 3u);
  EXPECT_EQ(nlohmann::json(back->devices[0]), nlohmann::json(d));
  EXPECT_EQ(nlohmann::json(back->devices[1]), nlohmann::json(instance));
  EXPECT_EQ(back->devices[1].gpu_instance, 5u);
  EXPECT_EQ(back->devices[2].sxid, 20034u) << "the SXid cause survives a restart";
  EXPECT_EQ(nlohmann::json::parse(saved.Serialize())["devices"][0].count("sxid"), 0u) << "only on an SXid's verdict";
  EXPECT_EQ(back->journal, saved.journal);
  EXPECT_EQ(back->xid_counts, saved.xid_counts);
  // Version 1 files (verdicts only) are still read: no position, no counts.
  const auto v1 = HealthCheckpoint::Parse("{\"version\":1,\"bootId\":\"" + std::string(kBootAHex) +
                                              "\",\"devices\":[]}", error);
  ASSERT_TRUE(v1) << error;
  EXPECT_TRUE(v1->journal.cursor.empty());
  EXPECT_TRUE(v1->xid_counts.empty());
  for (const char* bad : {"", "[]", "{\"version\":\"1\"}", "{\"version\":1,\"bootId\":\"xyz\",\"devices\":[]}",
                          "{\"version\":1,\"bootId\":\"\",\"devices\":[{\"uuid\":\"nope\"}]}",
                          "{\"version\":1,\"bootId\":\"\",\"devices\":{}}",
                          "{\"version\":1,\"bootId\":\"\",\"devices\":[{\"uuid\":\"GPU-1\",\"healthy\":false,"
                          "\"reason\":\"\",\"xid\":1,\"recommendedAction\":\"\",\"sinceUnixMs\":1,\"pci\":\"\","
                          "\"gpuInstance\":4294967295}]}",
                          "{\"version\":1,\"bootId\":\"\",\"devices\":[{\"uuid\":\"GPU-1\",\"healthy\":false,"
                          "\"reason\":\"\",\"xid\":0,\"recommendedAction\":\"\",\"sinceUnixMs\":1,\"pci\":\"\","
                          "\"sxid\":\"20034\"}]}",
                          "{\"version\":2,\"bootId\":\"\",\"devices\":[]}",
                          "{\"version\":2,\"bootId\":\"\",\"devices\":[],\"journal\":{\"bootId\":\"\",\"cursor\":\"\","
                          "\"monotonicUsec\":0,\"realtimeUsec\":0},\"xidCounts\":[{\"gpu\":1}]}"}) {
    EXPECT_FALSE(HealthCheckpoint::Parse(bad, error)) << bad;
  }
  EXPECT_EQ(NormalizeBootId(std::string(kBootA) + "\n"), kBootAHex);
  EXPECT_EQ(NormalizeBootId("6F1C2A1E0B7D4C579A313D2F4BE1C0AA"), kBootAHex);
  EXPECT_EQ(NormalizeBootId("6f1c2a1e"), "");
}

}  // namespace
}  // namespace gns::gpu_health
