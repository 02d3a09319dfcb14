// The gpu-inventory module on the test loop against the fake libnvidia-ml.so.1
// (tools/sim/fake_nvml), which the module dlopens by path exactly as it would the real one; its
// NVML event waiter is the real child process (gpu-node-supervisor nvml-events), a second client
// of the same simulated driver. Events and failures are injected through the fake's in-process
// control functions, which pass them on to that child as the driver would.
#include "loop/supervisor_messages.hpp"
#include "modules/gpu_inventory/api/health_sample.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "support/loop_harness.hpp"

#include "fake_nvml_control.h"

#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_inventory {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

constexpr const char* kLibraryPath = GNS_FAKE_NVML_LIBRARY;
constexpr const char* kSupervisor = GNS_SUPERVISOR_BIN;
constexpr const char* kGpus8Path = GNS_FAKE_NVML_GPUS8;
constexpr const char* kClique = "c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64.32766";

// NVML return codes the tests inject or expect.
constexpr int kUninitialized = 1;
constexpr int kNotSupported = 3;
constexpr int kGpuIsLost = 15;
constexpr int kArgumentVersionMismatch = 25;
constexpr int kUnknown = 999;

std::string Uuid(int i) {
  return "GPU-3f8a1c52-7e0" + std::to_string(i) + "-4b9d-9c1e-5a7d2e8f6b1" + std::to_string(i);
}

class GpuInventoryModuleTest : public ::testing::Test {
 protected:
  // The fake's state is process-wide, like NVML's. The test's own dlopen keeps it loaded while
  // the module opens and closes it; the module resolves the same object by the same path.
  static void SetUpTestSuite() {
    library_ = dlopen(kLibraryPath, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    inject_xid_ = reinterpret_cast<fakeNvmlInjectXid_t>(dlsym(library_, "fakeNvmlInjectXid"));
    set_failure_ = reinterpret_cast<fakeNvmlSetFailure_t>(dlsym(library_, "fakeNvmlSetFailure"));
    clear_failures_ = reinterpret_cast<fakeNvmlClearFailures_t>(dlsym(library_, "fakeNvmlClearFailures"));
    set_health_ = reinterpret_cast<fakeNvmlSetHealth_t>(dlsym(library_, "fakeNvmlSetHealth"));
    clear_health_ = reinterpret_cast<fakeNvmlClearHealth_t>(dlsym(library_, "fakeNvmlClearHealth"));
    hang_ = reinterpret_cast<fakeNvmlHang_t>(dlsym(library_, "fakeNvmlHang"));
    release_hangs_ = reinterpret_cast<fakeNvmlReleaseHangs_t>(dlsym(library_, "fakeNvmlReleaseHangs"));
    hung_calls_ = reinterpret_cast<fakeNvmlHungCalls_t>(dlsym(library_, "fakeNvmlHungCalls"));
  }

  void SetUp() override {
    ASSERT_NE(library_, nullptr);
    ASSERT_NE(inject_xid_, nullptr);
    ASSERT_NE(set_failure_, nullptr);
    ASSERT_NE(clear_failures_, nullptr);
    setenv("FAKE_NVML_CONFIG", kGpus8Path, 1);
    clear_failures_();
    char dir_template[] = "/tmp/gpu_inventory_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    temp_dir_ = dir_template;
    // The simulated driver's control socket: how what it does reaches the event waiter child.
    control_ = temp_dir_ + "/nvml.sock";
    setenv("FAKE_NVML_CONTROL", control_.c_str(), 1);
  }

  void TearDown() override {
    // A hung call would hold a pool thread past the test: let it return first.
    if (release_hangs_ != nullptr) release_hangs_();
    StopModule();
    if (clear_health_ != nullptr) clear_health_();
    // The session is shut down on the pool after Stop: wait until NVML is down, so the next
    // test's nvmlInit reads its own GPU description.
    clear_failures_();
    EXPECT_TRUE(h_.RunUntil([&] { return inject_xid_("GPU-none", 0) == kUninitialized; }));
    std::filesystem::remove_all(temp_dir_);
  }

  static GpuInventoryModule::Config TestConfig() {
    GpuInventoryModule::Config config;
    config.nvml_library = kLibraryPath;
    config.event_wait_timeout = milliseconds(100);
    config.event_waiter_program = kSupervisor;
    config.retry_backoff = BackoffPolicy{milliseconds(10), milliseconds(50), 2.0, 0.5};
    config.refresh_interval = std::chrono::hours(1);
    return config;
  }

  void StartModule(const GpuInventoryModule::Config& config = TestConfig()) {
    context_ = std::make_unique<ModuleContext>(
        h_.Parts(), "gpu-inventory", [this](std::string why) { failures_.push_back(std::move(why)); },
        [this](ModuleHealth health, std::string detail) {
          health_ = health;
          health_detail_ = std::move(detail);
        });
    inventory_sub_ = h_.bus.Subscribe<GpuInventory>([this](const GpuInventory& i) { inventories_.push_back(i); });
    clique_sub_ = h_.bus.Subscribe<NodeClique>([this](const NodeClique& c) { cliques_.push_back(c); });
    xid_sub_ = h_.bus.Subscribe<XidObservation>([this](const XidObservation& x) { xids_.push_back(x); });
    module_ = std::make_unique<GpuInventoryModule>(*context_, config);
    module_->Start();
  }

  void StopModule() {
    if (!module_) return;
    bool stopped = false;
    module_->Stop([&] { stopped = true; });
    EXPECT_TRUE(stopped) << "Stop must not wait for NVML";
    module_.reset();
    h_.Drain();
    EXPECT_TRUE(failures_.empty()) << "NVML trouble must never ReportFailure: " << failures_.front();
  }

  const GpuInventory* Inventory() { return h_.bus.Latest<GpuInventory>(); }
  const NodeClique* Clique() { return h_.bus.Latest<NodeClique>(); }

  // Latest() changes at publish time; Drain() then delivers to the test's subscribers too.
  bool WaitAvailable() {
    const bool ok =
        h_.RunUntil([&] { return Inventory() != nullptr && Inventory()->available && health_ == ModuleHealth::kOk; });
    h_.Drain();
    return ok;
  }
  bool WaitUnavailable() {
    const bool ok = h_.RunUntil([&] { return Inventory() != nullptr && !Inventory()->available; });
    h_.Drain();
    return ok;
  }

  double Metric(std::string_view name, MetricLabels labels = {}) {
    return h_.metrics.Counter(name, "", std::move(labels)).Value();
  }
  double GaugeValue(std::string_view name) { return h_.metrics.Gauge(name, "").Value(); }

  // Writes a variant of gpus-8.json (edited by `edit`) and points the fake at it.
  void UseVariant(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(kGpus8Path);
    nlohmann::json config = nlohmann::json::parse(in);
    edit(config);
    const std::string path = temp_dir_ + "/gpus.json";
    std::ofstream(path) << config.dump(2);
    setenv("FAKE_NVML_CONFIG", path.c_str(), 1);
  }

  // gpus-mig.json, to edit and play a MIG reconfiguration with (as demo.py and mig-parted do):
  // WriteConfig puts it where FAKE_NVML_CONFIG points, Reload has the fake re-read it.
  static nlohmann::json MigConfig() {
    std::ifstream in(GNS_FAKE_NVML_GPUS_MIG);
    return nlohmann::json::parse(in);
  }
  void WriteConfig(const nlohmann::json& config) {
    const std::string path = temp_dir_ + "/gpus-mig.json";
    std::ofstream(path, std::ios::trunc) << config.dump(2);
    setenv("FAKE_NVML_CONFIG", path.c_str(), 1);
  }
  // fakeNvmlReloadConfig: the number of GPUs whose MIG layout changed, or -1 when it failed.
  int Reload() {
    const auto reload = reinterpret_cast<fakeNvmlReloadConfig_t>(dlsym(library_, "fakeNvmlReloadConfig"));
    EXPECT_NE(reload, nullptr);
    unsigned int changed = 0;
    if (reload == nullptr || reload(&changed) != 0) return -1;
    return static_cast<int>(changed);
  }
  // fakeNvmlRegisteredEvents: what every process of the simulated driver registered on `uuid`.
  unsigned long long RegisteredEvents(const std::string& uuid) {
    const auto registered = reinterpret_cast<fakeNvmlRegisteredEvents_t>(dlsym(library_, "fakeNvmlRegisteredEvents"));
    EXPECT_NE(registered, nullptr);
    unsigned long long types = 0;
    if (registered != nullptr) {
      EXPECT_EQ(registered(uuid.c_str(), &types), 0);
    }
    return types;
  }

  static inline void* library_ = nullptr;
  static inline fakeNvmlInjectXid_t inject_xid_ = nullptr;
  static inline fakeNvmlSetFailure_t set_failure_ = nullptr;
  static inline fakeNvmlClearFailures_t clear_failures_ = nullptr;
  static inline fakeNvmlSetHealth_t set_health_ = nullptr;
  static inline fakeNvmlClearHealth_t clear_health_ = nullptr;
  static inline fakeNvmlHang_t hang_ = nullptr;
  static inline fakeNvmlReleaseHangs_t release_hangs_ = nullptr;
  static inline fakeNvmlHungCalls_t hung_calls_ = nullptr;

  std::shared_ptr<GpuHealthSampler> Sampler() { return h_.services.Find<GpuHealthSampler>(); }

  // One Sample, answered on the test loop.
  std::optional<HealthSample> SampleNow(uint32_t groups) {
    auto sampler = Sampler();
    EXPECT_NE(sampler, nullptr);
    if (!sampler) return std::nullopt;
    std::optional<HealthSample> got;
    sampler->Sample(groups, [&](HealthSample sample) { got = std::move(sample); });
    EXPECT_FALSE(got.has_value()) << "never answered inside Sample";
    EXPECT_TRUE(h_.RunUntil([&] { return got.has_value(); }));
    return got;
  }

  unsigned int HungCalls() {
    unsigned int hung = 0;
    hung_calls_(&hung);
    return hung;
  }

  // One command to the simulated driver's control socket (as the fake nvidia-smi sends it).
  nlohmann::json Control(const nlohmann::json& command) {
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un self{};
    self.sun_family = AF_UNIX;  // autobind, for the reply
    EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&self), sizeof(sa_family_t)), 0);
    sockaddr_un to{};
    to.sun_family = AF_UNIX;
    std::snprintf(to.sun_path, sizeof(to.sun_path), "%s", control_.c_str());
    timeval timeout{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    const std::string text = command.dump();
    EXPECT_GE(::sendto(fd, text.data(), text.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0);
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    ::close(fd);
    if (n <= 0) return nlohmann::json::object();
    return nlohmann::json::parse(std::string(buffer, static_cast<std::size_t>(n)), nullptr, false);
  }

  test::LoopHarness h_;
  std::string temp_dir_;
  std::string control_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<GpuInventoryModule> module_;
  ModuleHealth health_ = ModuleHealth::kOk;
  std::string health_detail_;
  std::vector<std::string> failures_;
  std::vector<GpuInventory> inventories_;
  std::vector<NodeClique> cliques_;
  std::vector<XidObservation> xids_;
  Subscription inventory_sub_;
  Subscription clique_sub_;
  Subscription xid_sub_;
};

TEST_F(GpuInventoryModuleTest, PublishesTheFullInventoryOfEightGpus) {
  StartModule();
  ASSERT_TRUE(WaitAvailable()) << health_detail_;
  const GpuInventory& inventory = *Inventory();
  EXPECT_EQ(inventory.error, "");
  EXPECT_EQ(inventory.driver_version, "550.90.07");
  EXPECT_EQ(inventory.cuda_driver_version, 12040);
  ASSERT_EQ(inventory.gpus.size(), 8u);
  const char* bus_ids[] = {"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
                           "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"};
  for (int i = 0; i < 8; ++i) {
    const GpuInfo& gpu = inventory.gpus[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(gpu.index, static_cast<uint32_t>(i));
    EXPECT_EQ(gpu.uuid, Uuid(i));
    EXPECT_EQ(gpu.name, "NVIDIA H200");
    EXPECT_EQ(gpu.brand, std::optional<uint32_t>(14));  // NVML_BRAND_NVIDIA, the fake's default
    EXPECT_EQ(gpu.pci_bus_id, bus_ids[i]);
    EXPECT_EQ(gpu.pci, *PciAddress::Parse(bus_ids[i]));
    EXPECT_EQ(gpu.minor, static_cast<uint32_t>(i));
    EXPECT_EQ(gpu.memory_total_bytes, 150754820096u);
    EXPECT_EQ(gpu.cc_major, 9);  // the fake's default (an H200)
    EXPECT_EQ(gpu.cc_minor, 0);
    EXPECT_EQ(gpu.numa_node, i < 4 ? 0 : 1);
    // Two links to the pair's other GPU: one peer, listed once.
    EXPECT_EQ(gpu.nvlink_peers, std::vector<std::string>{Uuid(i ^ 1)});
    ASSERT_TRUE(gpu.fabric);
    EXPECT_EQ(gpu.fabric->cluster_uuid, "c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64");
    EXPECT_EQ(gpu.fabric->clique_id, 32766u);
    EXPECT_TRUE(gpu.fabric->Attached());
  }
  EXPECT_EQ(inventory.FindByPci(*PciAddress::Parse("0000:5d:00"))->uuid, Uuid(3));

  h_.Drain();
  ASSERT_NE(Clique(), nullptr);
  EXPECT_EQ(Clique()->clique_id, kClique);
  EXPECT_EQ(Clique()->reason, "");
  // Published once each: nothing unavailable first, nothing repeated.
  EXPECT_EQ(inventories_.size(), 1u);
  EXPECT_EQ(cliques_.size(), 1u);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_gpus"), 8);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 1);

  const auto state = h_.bus.RetainedState();
  EXPECT_EQ(state.at("gpu-inventory.clique").at("cliqueId"), kClique);
  EXPECT_EQ(state.at("gpu-inventory.devices").at("gpus").size(), 8u);
}

// MIG through NVML: mode, sparse slots, GI/CI ids, profile names from the attributes, the GPU
// instance's placement, and an Xid naming a GPU instance keeps its attribution on the bus.
TEST_F(GpuInventoryModuleTest, MigDevicesAreEnumeratedPerGpuWithTheirProfiles) {
  setenv("FAKE_NVML_CONFIG", GNS_FAKE_NVML_GPUS_MIG, 1);
  StartModule();
  ASSERT_TRUE(WaitAvailable()) << health_detail_;
  const GpuInventory& inventory = *Inventory();
  ASSERT_EQ(inventory.gpus.size(), 4u);
  auto profiles = [&](int i) {
    std::vector<std::string> out;
    for (const auto& m : inventory.gpus[i].mig_devices) out.push_back(m.profile);
    return out;
  };
  EXPECT_TRUE(inventory.gpus[0].mig_enabled);
  EXPECT_EQ(profiles(0), (std::vector<std::string>{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}));
  EXPECT_EQ(profiles(1), std::vector<std::string>(7, "1g.10gb"));
  EXPECT_EQ(profiles(2), std::vector<std::string>{"7g.80gb"});
  EXPECT_FALSE(inventory.gpus[3].mig_enabled);
  EXPECT_TRUE(inventory.gpus[3].mig_devices.empty());
  const auto& first = inventory.gpus[0].mig_devices[0];
  EXPECT_EQ(first.uuid.rfind("MIG-", 0), 0u);
  EXPECT_EQ(first.gpu_instance, 1u);
  EXPECT_EQ(first.compute_instance, 0u);
  EXPECT_EQ(first.memory_bytes, 40192ull * 1024 * 1024);
  EXPECT_EQ(first.multiprocessors, 60u);
  EXPECT_EQ(first.gpu_instance_slices, 3u);
  EXPECT_EQ(first.compute_instance_slices, 3u);
  EXPECT_EQ(first.copy_engines, 3u);
  EXPECT_EQ(first.decoders, 3u);
  EXPECT_EQ(first.encoders, 0u);
  EXPECT_EQ(first.jpeg_engines, 3u);
  EXPECT_EQ(first.ofa_engines, 0u);
  EXPECT_EQ(inventory.gpus[1].mig_devices[6].index, 6u);
  // The GPU instance's profile id and placement (nvmlGpuInstanceGetInfo): the DRA driver's MIG
  // device name. Not configured for the others: the fake answers NOT_SUPPORTED, as an old driver.
  EXPECT_TRUE(first.placement_known);
  EXPECT_EQ(first.gi_profile_id, 9u);
  EXPECT_EQ(first.placement_start, 4u);
  EXPECT_EQ(first.placement_size, 4u);
  EXPECT_FALSE(inventory.gpus[0].mig_devices[1].placement_known);

  const auto state = h_.bus.RetainedState();
  EXPECT_EQ(state.at("gpu-inventory.devices").at("gpus")[1].at("migDevices").size(), 7u);
}

// A MIG reconfiguration (the fake re-reads its GPU description and reports
// nvmlEventMigConfigChange, as the driver does) is read and published at once: the refresh
// interval is an hour, so only the event can bring the new layout.
TEST_F(GpuInventoryModuleTest, AMigReconfigurationIsPublishedWhenNvmlReportsIt) {
  nlohmann::json config = MigConfig();
  WriteConfig(config);
  StartModule();  // refreshInterval: 1h
  ASSERT_TRUE(WaitAvailable()) << health_detail_;
  const std::string gpu2 = Inventory()->gpus[2].uuid;
  ASSERT_EQ(Inventory()->gpus[2].mig_devices.size(), 1u);
  const double reads = Metric("gpu_node_supervisor_nvml_inventory_reads_total");

  // GPU 2: its 7g.80gb instance becomes two 3g.40gb instances.
  auto& devices = config["gpus"][2]["migDevices"];
  devices = nlohmann::json::array();
  for (int i = 0; i < 2; ++i) {
    devices.push_back({{"uuid", "MIG-5eed0000-0202-5000-8000-00000000001" + std::to_string(i)},
                       {"gpuInstanceId", 1 + i},
                       {"gpuInstanceSliceCount", 3},
                       {"memorySizeMB", 40192}});
  }
  WriteConfig(config);
  ASSERT_EQ(Reload(), 1);
  auto profiles = [&](int gpu) {
    std::vector<std::string> out;
    if (Inventory() == nullptr || !Inventory()->available) return out;
    for (const auto& m : Inventory()->gpus[gpu].mig_devices) out.push_back(m.profile);
    return out;
  };
  ASSERT_TRUE(h_.RunUntil([&] { return profiles(2) == std::vector<std::string>{"3g.40gb", "3g.40gb"}; }));
  EXPECT_EQ(Inventory()->gpus[2].mig_devices[1].uuid, "MIG-5eed0000-0202-5000-8000-000000000011");
  EXPECT_GT(Metric("gpu_node_supervisor_nvml_inventory_reads_total"), reads);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_mig_config_changes_total", {{"gpu", gpu2}}), 1);
  EXPECT_EQ(health_, ModuleHealth::kOk);

  // Two reconfigurations back to back (GPU 0 loses an instance, then GPU 1 does): whichever
  // event finds a refresh running, a refresh follows it, so the last layout is what is published.
  config["gpus"][0]["migDevices"].erase(3);
  WriteConfig(config);
  ASSERT_GE(Reload(), 0);
  config["gpus"][1]["migDevices"].erase(6);
  WriteConfig(config);
  ASSERT_GE(Reload(), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return profiles(0).size() == 3 && profiles(1).size() == 6; }));
  EXPECT_EQ(profiles(0), (std::vector<std::string>{"3g.40gb", "2g.20gb", "1g.10gb"}));
  EXPECT_EQ(profiles(2).size(), 2u);
}

// How long a change reported by NVML may take to reach the inventory (well under the hour of
// refreshInterval the tests run with), and how long a restart of the waiter child may take (an
// ASan build of the whole binary starting: about 2.5 s here).
constexpr auto kSoon = std::chrono::seconds(5);
constexpr auto kWaiterRestart = std::chrono::seconds(15);

// A whole GPU switched into MIG mode and back (issue #28: mig-parted, `nvidia-smi -mig`): both
// ways are seen at once with the refresh an hour away, because the waiter listens for
// nvmlEventMigConfigChange on every GPU that supports it, MIG mode on or off (current drivers,
// as DCGM registers it: tools/sim/fake_nvml/README.md).
TEST_F(GpuInventoryModuleTest, AWholeGpuSwitchedIntoMigModeAndBackIsSeenAtOnceBothWays) {
  nlohmann::json config = MigConfig();
  const nlohmann::json whole = config["gpus"][3];  // MIG off
  WriteConfig(config);
  StartModule();  // refreshInterval: 1h
  ASSERT_TRUE(WaitAvailable()) << health_detail_;
  const std::string gpu3 = Inventory()->gpus[3].uuid;
  ASSERT_FALSE(Inventory()->gpus[3].mig_enabled);
  unsigned long long types = RegisteredEvents(gpu3);
  EXPECT_NE(types & 0x100ULL, 0u) << "migConfigChange on a GPU with MIG mode off: " << types;

  auto mig_devices = [&]() -> std::optional<std::size_t> {
    if (Inventory() == nullptr || !Inventory()->available || !Inventory()->gpus[3].mig_enabled) return std::nullopt;
    return Inventory()->gpus[3].mig_devices.size();
  };
  config["gpus"][3]["migEnabled"] = true;
  config["gpus"][3]["migDevices"] = nlohmann::json::array({{{"uuid", "MIG-5eed0003-0000-5003-8000-000000000000"},
                                                             {"gpuInstanceId", 0},
                                                             {"gpuInstanceSliceCount", 7},
                                                             {"memorySizeMB", 80384}}});
  WriteConfig(config);
  const double reads = Metric("gpu_node_supervisor_nvml_inventory_reads_total");
  ASSERT_EQ(Reload(), 1);
  ASSERT_TRUE(h_.RunUntil([&] { return mig_devices() == 1u; }, kSoon)) << "into MIG mode";
  EXPECT_EQ(Inventory()->gpus[3].mig_devices[0].profile, "7g.80gb");
  // A MIG mode change starts the waiter again (a GPU's registrations may not outlive the reset
  // that comes with it): it registers migConfigChange on GPU 3 again.
  const auto registered_again = [&] {
    return h_.RunUntil([&] { return (types = RegisteredEvents(gpu3)) == 0x11bULL; }, kWaiterRestart);
  };
  ASSERT_TRUE(registered_again()) << types;
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_event_waiter_restarts_total"), 1);
  // And once armed, the module reads the GPUs again (what changed while none listened): two reads
  // since the reload, the event's and that one. Only then is the way back the event's to report
  // (a change that came before that read is the read's, and restarts the waiter once more).
  ASSERT_TRUE(h_.RunUntil([&] { return Metric("gpu_node_supervisor_nvml_inventory_reads_total") >= reads + 2; },
                          kWaiterRestart));

  config["gpus"][3] = whole;
  WriteConfig(config);
  ASSERT_EQ(Reload(), 1);
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory() != nullptr && Inventory()->available && !Inventory()->gpus[3].mig_enabled; },
                          kSoon))
      << "back to a whole GPU";
  EXPECT_TRUE(Inventory()->gpus[3].mig_devices.empty());
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_mig_config_changes_total", {{"gpu", gpu3}}), 2) << "both ways by the event";
  ASSERT_TRUE(registered_again()) << types;
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_event_waiter_restarts_total"), 2);
  EXPECT_EQ(health_, ModuleHealth::kOk);
}

// An older driver reports nvmlEventMigConfigChange only for a GPU whose MIG mode is on (DCGM
// takes NOT_SUPPORTED for it from such drivers): the waiter registered what each GPU supported when
// it started, so a read that finds a GPU's MIG mode or supported event types changed restarts
// it. GPU 3 goes into MIG mode in the same reconfiguration as GPU 2 (whose event brings the
// read); the restarted waiter then hears GPU 3's way back to a whole GPU at once, and the
// inventory stays available throughout.
TEST_F(GpuInventoryModuleTest, AGpuChangingMigModeRestartsTheWaiterWithItsNewEventTypes) {
  constexpr unsigned long long kWithoutMig = 0x1f;  // SBE, DBE, PState, XID, clock
  constexpr unsigned long long kWithMig = kWithoutMig | 0x100;
  nlohmann::json config = MigConfig();
  for (auto& gpu : config["gpus"]) gpu["supportedEventTypes"] = gpu.value("migEnabled", false) ? kWithMig : kWithoutMig;
  const nlohmann::json whole = config["gpus"][3];
  WriteConfig(config);
  StartModule();  // refreshInterval: 1h
  ASSERT_TRUE(WaitAvailable()) << health_detail_;
  const std::string gpu3 = Inventory()->gpus[3].uuid;
  unsigned long long types = RegisteredEvents(gpu3);
  EXPECT_EQ(types, kWithoutMig & ~0x4ULL) << "no MIG event on this driver with MIG mode off";
  const std::size_t published = inventories_.size();

  config["gpus"][3]["migEnabled"] = true;
  config["gpus"][3]["supportedEventTypes"] = kWithMig;
  config["gpus"][3]["migDevices"] = nlohmann::json::array({{{"uuid", "MIG-5eed0003-0000-5003-8000-000000000000"},
                                                             {"gpuInstanceId", 0},
                                                             {"gpuInstanceSliceCount", 7},
                                                             {"memorySizeMB", 80384}}});
  config["gpus"][2]["migDevices"][0]["uuid"] = "MIG-5eed0002-0000-5002-8000-0000000000ff";
  WriteConfig(config);
  ASSERT_EQ(Reload(), 2);
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory()->available && Inventory()->gpus[3].mig_enabled; }, kSoon));
  // The waiter is started again with GPU 3's new event types.
  ASSERT_TRUE(h_.RunUntil([&] { return (types = RegisteredEvents(gpu3)) == 0x11bULL; }, kWaiterRestart))
      << types;
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_event_waiter_restarts_total"), 1);

  config["gpus"][3] = whole;
  WriteConfig(config);
  ASSERT_EQ(Reload(), 1);
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory()->available && !Inventory()->gpus[3].mig_enabled; }, kSoon))
      << "back to a whole GPU, reported by the restarted waiter";
  ASSERT_TRUE(h_.RunUntil([&] { return (types = RegisteredEvents(gpu3)) == 0x1bULL; }, kWaiterRestart))
      << types;
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_event_waiter_restarts_total"), 2);
  h_.Drain();
  for (std::size_t i = published; i < inventories_.size(); ++i) EXPECT_TRUE(inventories_[i].available) << i;
  EXPECT_EQ(health_, ModuleHealth::kOk);

  // The restarted waiter still reports XIDs, each once.
  ASSERT_EQ(inject_xid_(gpu3.c_str(), 79), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return !xids_.empty(); }, kSoon));
  h_.RunUntil([] { return false; }, milliseconds(200));
  h_.Drain();
  ASSERT_EQ(xids_.size(), 1u);
  EXPECT_EQ(xids_[0].uuid, gpu3);
}

// Kill's contract that a restart relies on: a session closed while the killed child is still
// being reaped (RestartWaiter waits for that reap too) hears of the reap as well, each caller
// once, and a Kill after the reap is told at once.
TEST_F(GpuInventoryModuleTest, EveryKillOfTheWaiterIsToldOnceItIsReaped) {
  EventWaiterOptions options;
  options.library = kLibraryPath;
  options.wait_ms = 100;
  bool armed = false;
  EventWaiterProcess::Callbacks callbacks;
  callbacks.armed = [&] { armed = true; };
  auto waiter = EventWaiterProcess::Start(h_.loop.Io(), kSupervisor, options, std::move(callbacks));
  ASSERT_TRUE(h_.RunUntil([&] { return armed; }));
  int restart = 0, close = 0, late = 0;
  waiter->Kill([&] { ++restart; });
  waiter->Kill([&] { ++close; });
  EXPECT_EQ(restart + close, 0) << "never inside Kill";
  ASSERT_TRUE(h_.RunUntil([&] { return restart == 1 && close == 1; }));
  waiter->Kill([&] { ++late; });
  EXPECT_EQ(late, 0) << "never inside Kill";
  ASSERT_TRUE(h_.RunUntil([&] { return late == 1; }));
  h_.RunUntil([] { return false; }, milliseconds(100));
  EXPECT_EQ(restart, 1);
  EXPECT_EQ(close, 1);
  EXPECT_EQ(late, 1);
}

TEST(MigProfileName, FollowsNvidiasRoundingToEighthsOfTheGpu) {
  constexpr uint64_t kH100 = 85520809984ull;  // 81559 MiB
  EXPECT_EQ(MigProfileName(1, 1, 9856, kH100), "1g.10gb");
  EXPECT_EQ(MigProfileName(2, 2, 19968, kH100), "2g.20gb");
  EXPECT_EQ(MigProfileName(3, 3, 40192, kH100), "3g.40gb");
  EXPECT_EQ(MigProfileName(4, 4, 40192, kH100), "4g.40gb");
  EXPECT_EQ(MigProfileName(7, 7, 80384, kH100), "7g.80gb");
  EXPECT_EQ(MigProfileName(3, 1, 40192, kH100), "1c.3g.40gb");
  constexpr uint64_t kA100_40 = 42949672960ull;  // 40960 MiB
  EXPECT_EQ(MigProfileName(1, 1, 4864, kA100_40), "1g.5gb");
  EXPECT_EQ(MigProfileName(2, 2, 9856, kA100_40), "2g.10gb");
}

TEST_F(GpuInventoryModuleTest, NvmlXidEventsReachTheBus) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  ASSERT_EQ(inject_xid_(Uuid(3).c_str(), 79), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return xids_.size() == 1; }));
  EXPECT_EQ(xids_[0].uuid, Uuid(3));
  EXPECT_EQ(xids_[0].xid, 79u);
  EXPECT_EQ(xids_[0].gpu_instance, 0xFFFFFFFFu);
  EXPECT_EQ(xids_[0].compute_instance, 0xFFFFFFFFu);
  EXPECT_GT(xids_[0].observed_unix_ms, 1'600'000'000'000);

  // By PCI bus id too, and every XID is published (none is "ignored" here).
  ASSERT_EQ(inject_xid_("00000000:DB:00.0", 13), 0);
  ASSERT_EQ(inject_xid_(Uuid(3).c_str(), 79), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return xids_.size() == 3; }));
  EXPECT_EQ(xids_[1].uuid, Uuid(7));
  EXPECT_EQ(xids_[1].xid, 13u);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_xid_events_total", {{"gpu", Uuid(3)}, {"xid", "79"}}), 2);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_xid_events_total", {{"gpu", Uuid(7)}, {"xid", "13"}}), 1);
  EXPECT_TRUE(Inventory()->available);
}

// NVML's ECC and clock events: registered where the GPU supports them (GPU 2 reports XIDs
// only: nothing else is registered on it, and its ECC events never come), each reaching the
// bus as an NvmlHealthEvent.
TEST_F(GpuInventoryModuleTest, EccAndClockEventsReachTheBusWhereTheGpuSupportsThem) {
  const auto inject = reinterpret_cast<fakeNvmlInjectEvent_t>(dlsym(library_, "fakeNvmlInjectEvent"));
  const auto registered = reinterpret_cast<fakeNvmlRegisteredEvents_t>(dlsym(library_, "fakeNvmlRegisteredEvents"));
  ASSERT_NE(inject, nullptr);
  ASSERT_NE(registered, nullptr);
  UseVariant([](nlohmann::json& config) { config["gpus"][2]["supportedEventTypes"] = 0x8; });
  std::vector<NvmlHealthEvent> events;
  auto sub = h_.bus.Subscribe<NvmlHealthEvent>([&](const NvmlHealthEvent& e) { events.push_back(e); });
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  unsigned long long types = 0;
  ASSERT_EQ(registered(Uuid(0).c_str(), &types), 0);
  EXPECT_EQ(types & 0x1bULL, 0x1bULL) << "XID, SBE, DBE and clock events on a GPU that has them: " << types;
  ASSERT_EQ(registered(Uuid(2).c_str(), &types), 0);
  EXPECT_EQ(types, 0x8ULL) << "XIDs only where only XIDs are supported";

  ASSERT_EQ(inject(Uuid(2).c_str(), 0x2, 0), 0);  // not registered: dropped, as by the driver
  ASSERT_EQ(inject(Uuid(1).c_str(), 0x2, 0), 0);
  ASSERT_EQ(inject(Uuid(1).c_str(), 0x1, 0), 0);
  ASSERT_EQ(inject(Uuid(4).c_str(), 0x10, 0x8), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return events.size() == 3; }));
  EXPECT_EQ(events[0].uuid, Uuid(1));
  EXPECT_EQ(events[0].kind, NvmlHealthEvent::Kind::kDoubleBitEcc);
  EXPECT_EQ(events[1].kind, NvmlHealthEvent::Kind::kSingleBitEcc);
  EXPECT_EQ(events[2].uuid, Uuid(4));
  EXPECT_EQ(events[2].kind, NvmlHealthEvent::Kind::kClock);
  EXPECT_EQ(events[2].data, 0x8u);
  EXPECT_GT(events[2].observed_unix_ms, 1'600'000'000'000);
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(200));
  EXPECT_EQ(events.size(), 3u) << "GPU 2's DBE event was never registered";
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_health_events_total", {{"gpu", Uuid(1)}, {"kind", "doubleBitEcc"}}), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_health_events_total", {{"gpu", Uuid(4)}, {"kind", "clock"}}), 1);
  EXPECT_TRUE(xids_.empty()) << "not XIDs";
}

TEST_F(GpuInventoryModuleTest, EventWaitFailureMakesTheInventoryUnavailableThenRecovers) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  const std::size_t published_before = inventories_.size();
  ASSERT_EQ(set_failure_("nvmlEventSetWait_v2", kGpuIsLost), 0);

  ASSERT_TRUE(h_.RunUntil(
      [&] { return Inventory() && !Inventory()->available && health_ == ModuleHealth::kUnhealthy; }));
  EXPECT_THAT(Inventory()->error, HasSubstr("nvmlEventSetWait_v2 failed: GPU is lost (15)"));
  EXPECT_THAT(health_detail_, HasSubstr("GPU is lost"));
  // The last known GPUs stay listed, so consumers can mark each of them unhealthy.
  EXPECT_EQ(Inventory()->gpus.size(), 8u);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 0);
  // The clique is the fabric's, not the session's: kept.
  EXPECT_EQ(Clique()->clique_id, kClique);

  // It keeps retrying (each attempt opens NVML and fails on the first wait) without flapping
  // to available: the inventory is only announced once the event set has proven to work.
  ASSERT_TRUE(h_.RunUntil(
      [&] { return Metric("gpu_node_supervisor_nvml_errors_total", {{"function", "nvmlEventSetWait_v2"}}) >= 4; }));
  for (std::size_t i = published_before; i < inventories_.size(); ++i) EXPECT_FALSE(inventories_[i].available) << i;

  ASSERT_EQ(clear_failures_(), 0);
  ASSERT_TRUE(WaitAvailable());
  EXPECT_EQ(Inventory()->gpus.size(), 8u);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 1);
  // And events flow again on the new session.
  ASSERT_EQ(inject_xid_(Uuid(0).c_str(), 48), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return !xids_.empty(); }));
  EXPECT_EQ(xids_.back().xid, 48u);
}

TEST_F(GpuInventoryModuleTest, MissingLibraryIsAClearErrorNotACrash) {
  auto config = TestConfig();
  config.nvml_library = temp_dir_ + "/no-such-dir/libnvidia-ml.so.1";
  StartModule(config);
  ASSERT_TRUE(WaitUnavailable());
  EXPECT_THAT(Inventory()->error, HasSubstr("cannot load NVML library " + config.nvml_library));
  EXPECT_THAT(Inventory()->error, HasSubstr("No such file"));
  EXPECT_TRUE(Inventory()->gpus.empty());
  EXPECT_EQ(health_, ModuleHealth::kUnhealthy);
  EXPECT_THAT(health_detail_, HasSubstr("cannot load NVML library"));
  h_.Drain();
  ASSERT_NE(Clique(), nullptr);
  EXPECT_EQ(Clique()->clique_id, "");
  EXPECT_THAT(Clique()->reason, HasSubstr("NVML unavailable: cannot load NVML library"));
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 0);
}

TEST_F(GpuInventoryModuleTest, InitFailureNamesTheNvmlErrorAndRetriesUntilItWorks) {
  unsetenv("FAKE_NVML_CONFIG");  // the fake's nvmlInit then answers DRIVER_NOT_LOADED
  StartModule();
  ASSERT_TRUE(WaitUnavailable());
  EXPECT_THAT(Inventory()->error, HasSubstr("nvmlInit_v2 failed"));
  EXPECT_THAT(Inventory()->error, HasSubstr("Driver Not Loaded (9)"));
  EXPECT_EQ(health_, ModuleHealth::kUnhealthy);
  ASSERT_TRUE(h_.RunUntil(
      [&] { return Metric("gpu_node_supervisor_nvml_errors_total", {{"function", "nvmlInit_v2"}}) >= 2; }));

  setenv("FAKE_NVML_CONFIG", kGpus8Path, 1);  // the driver "loads"
  ASSERT_TRUE(WaitAvailable());
  EXPECT_EQ(Inventory()->gpus.size(), 8u);
  h_.Drain();
  EXPECT_EQ(Clique()->clique_id, kClique);
}

TEST_F(GpuInventoryModuleTest, ReleaseShutsNvmlDownAndTakeBackRepublishes) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.bus.Publish(NvmlReleaseRequest{true, "gpu reset of GPU-3"});
  ASSERT_TRUE(h_.RunUntil([&] { return !Inventory()->available; }));
  EXPECT_EQ(Inventory()->error, "released: gpu reset of GPU-3");
  EXPECT_EQ(Inventory()->gpus.size(), 8u);
  EXPECT_EQ(health_, ModuleHealth::kDegraded);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 0);
  // Announced only after nvmlShutdown: nobody in the process holds NVML now.
  EXPECT_EQ(inject_xid_(Uuid(0).c_str(), 79), kUninitialized);
  EXPECT_EQ(Clique()->clique_id, kClique);

  h_.bus.Publish(NvmlReleaseRequest{false, "reset done"});
  ASSERT_TRUE(WaitAvailable());
  EXPECT_EQ(Inventory()->error, "");
  EXPECT_EQ(Inventory()->gpus.size(), 8u);
  ASSERT_EQ(inject_xid_(Uuid(0).c_str(), 79), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return xids_.size() == 1; }));
  EXPECT_EQ(xids_[0].uuid, Uuid(0));
}

TEST_F(GpuInventoryModuleTest, ReleasingOneGpuKeepsServingTheOthersAndTakingItBackRereadsIt) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.bus.Publish(NvmlReleaseRequest{true, "reset of GPU 3", Uuid(3)});
  // Acknowledged once no session touches GPU 3; the inventory never goes unavailable.
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory()->gpus.size() == 8 && Inventory()->gpus[3].released; }));
  // Then the session without GPU 3 is armed (degraded: a GPU is released).
  ASSERT_TRUE(h_.RunUntil([&] { return health_ == ModuleHealth::kDegraded; }));
  h_.Drain();
  for (const auto& inventory : inventories_) EXPECT_TRUE(inventory.available) << inventory.error;
  EXPECT_EQ(Inventory()->gpus[3].uuid, Uuid(3));
  EXPECT_EQ(Inventory()->gpus[3].release_reason, "reset of GPU 3");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Inventory()->gpus[i].released, i == 3) << i;
  EXPECT_EQ(health_, ModuleHealth::kDegraded);
  EXPECT_THAT(health_detail_, HasSubstr(Uuid(3)));
  EXPECT_EQ(h_.bus.RetainedState().at("gpu-inventory.devices").at("gpus")[3].at("released"), "reset of GPU 3");

  // Its events are no longer ours; the other GPUs' still are.
  ASSERT_EQ(inject_xid_(Uuid(3).c_str(), 79), 0);
  ASSERT_EQ(inject_xid_(Uuid(4).c_str(), 48), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return !xids_.empty(); }));
  h_.Drain();
  ASSERT_EQ(xids_.size(), 1u);
  EXPECT_EQ(xids_[0].uuid, Uuid(4));

  h_.bus.Publish(NvmlReleaseRequest{false, "reset done", Uuid(3)});
  ASSERT_TRUE(h_.RunUntil([&] { return !Inventory()->gpus[3].released && health_ == ModuleHealth::kOk; }));
  EXPECT_TRUE(Inventory()->available);
  EXPECT_EQ(Inventory()->gpus.size(), 8u);
  EXPECT_EQ(Inventory()->gpus[3].uuid, Uuid(3));
  ASSERT_EQ(inject_xid_(Uuid(3).c_str(), 79), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return xids_.size() == 2; }));
  EXPECT_EQ(xids_[1].uuid, Uuid(3));
  h_.Drain();
  for (const auto& inventory : inventories_) EXPECT_TRUE(inventory.available) << inventory.error;
  // NVML was read again for it: the reads counter moved past the first open and the reopen.
  EXPECT_GE(Metric("gpu_node_supervisor_nvml_inventory_reads_total"), 3);
}

// NVML cannot interrupt a wait, and a GPU can be reset only once nothing holds it. The waiter
// is a child process that a release kills: the release does not wait for the wait it is in, and
// afterwards no process holds the GPU. The wait here would last ten minutes.
TEST_F(GpuInventoryModuleTest, ReleasingOneGpuDoesNotWaitOutTheEventWait) {
  auto config = TestConfig();
  config.event_wait_timeout = std::chrono::minutes(10);
  StartModule(config);
  ASSERT_TRUE(WaitAvailable());
  // The child's event set holds every GPU: a reset is refused.
  const nlohmann::json reset = {{"resetGpu", {{"uuid", Uuid(2)}}}};
  auto reply = Control(reset);
  EXPECT_EQ(reply.value("ok", true), false) << reply.dump();
  EXPECT_THAT(reply.value("error", ""), HasSubstr("in use by an NVML client")) << reply.dump();

  h_.bus.Publish(NvmlReleaseRequest{true, "reset of GPU 2", Uuid(2)});
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory()->gpus[2].released; }));
  // The others are watched again, by a new child that leaves GPU 2 alone (the session, and with
  // it the simulated driver's control socket, is open again).
  ASSERT_TRUE(h_.RunUntil([&] { return health_ == ModuleHealth::kDegraded; }));
  // Nothing holds GPU 2 any more, in this process or another: the reset goes.
  reply = Control(reset);
  EXPECT_EQ(reply.value("ok", false), true) << reply.dump();
  ASSERT_EQ(inject_xid_(Uuid(2).c_str(), 79), 0);
  ASSERT_EQ(inject_xid_(Uuid(5).c_str(), 48), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return !xids_.empty(); }));
  h_.Drain();
  ASSERT_EQ(xids_.size(), 1u);
  EXPECT_EQ(xids_[0].uuid, Uuid(5));

  // Taken back without waiting either; its events are watched again.
  h_.bus.Publish(NvmlReleaseRequest{false, "reset done", Uuid(2)});
  ASSERT_TRUE(h_.RunUntil([&] { return !Inventory()->gpus[2].released && health_ == ModuleHealth::kOk; }));
  ASSERT_EQ(inject_xid_(Uuid(2).c_str(), 79), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return xids_.size() == 2; }));
  EXPECT_EQ(xids_[1].uuid, Uuid(2));
}

TEST_F(GpuInventoryModuleTest, AnEventWaiterThatDiesIsAFailureAndIsStartedAgain) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  // Whatever child holds GPU 0's events now: kill it from outside.
  const std::string needle = std::string("nvml-events");
  pid_t child = -1;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream status(entry.path() / "status");
    std::string line;
    bool ours = false;
    while (std::getline(status, line)) {
      if (line.rfind("PPid:", 0) == 0) ours = std::stoi(line.substr(5)) == ::getpid();
    }
    std::ifstream cmdline(entry.path() / "cmdline");
    const std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (ours && args.find(needle) != std::string::npos) child = std::stoi(entry.path().filename().string());
  }
  ASSERT_GT(child, 0) << "no event waiter child";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory() && !Inventory()->available; }));
  EXPECT_THAT(Inventory()->error, HasSubstr("the NVML event waiter (pid " + std::to_string(child) + ") was killed by signal 9"));
  // Opened again with a new child: XIDs flow again.
  ASSERT_TRUE(WaitAvailable());
  ASSERT_EQ(inject_xid_(Uuid(0).c_str(), 48), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return !xids_.empty(); }));
}

TEST_F(GpuInventoryModuleTest, ReleaseWhileFailingStopsRetryingUntilTakenBack) {
  ASSERT_EQ(set_failure_("nvmlEventSetWait_v2", kUnknown), 0);
  StartModule();
  ASSERT_TRUE(WaitUnavailable());
  h_.bus.Publish(NvmlReleaseRequest{true, "maintenance"});
  ASSERT_TRUE(h_.RunUntil([&] { return Inventory()->error == "released: maintenance"; }));
  ASSERT_EQ(clear_failures_(), 0);
  h_.bus.Publish(NvmlReleaseRequest{false, ""});
  ASSERT_TRUE(WaitAvailable());
}

TEST_F(GpuInventoryModuleTest, FabricDisagreementGivesAnEmptyCliqueWithTheReason) {
  UseVariant([](nlohmann::json& config) {
    for (int i = 4; i < 8; ++i) config["gpus"][i]["fabric"]["cliqueId"] = 1;
  });
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.Drain();
  ASSERT_NE(Clique(), nullptr);
  EXPECT_EQ(Clique()->clique_id, "");
  EXPECT_THAT(Clique()->reason, HasSubstr("disagree"));
  EXPECT_THAT(Clique()->reason, HasSubstr(std::string(kClique) + " (" + Uuid(0) + ", " + Uuid(1)));
  EXPECT_THAT(Clique()->reason, HasSubstr("c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64.1 (" + Uuid(4) + ", " + Uuid(5)));
  EXPECT_EQ(Inventory()->gpus[5].fabric->clique_id, 1u);
}

TEST_F(GpuInventoryModuleTest, NoFabricAttachedGpuGivesAnEmptyCliqueWithTheReason) {
  UseVariant([](nlohmann::json& config) {
    for (int i = 0; i < 4; ++i) config["gpus"][i].erase("fabric");
    for (int i = 4; i < 8; ++i) config["gpus"][i]["fabric"]["state"] = "inProgress";
  });
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.Drain();
  EXPECT_EQ(Clique()->clique_id, "");
  EXPECT_THAT(Clique()->reason, HasSubstr("no fabric-attached GPU"));
  EXPECT_THAT(Clique()->reason, HasSubstr("no fabric support: 4 of 8"));
  EXPECT_THAT(Clique()->reason, HasSubstr("fabric in progress: 4 of 8"));
  EXPECT_FALSE(Inventory()->gpus[0].fabric);
  ASSERT_TRUE(Inventory()->gpus[4].fabric);
  EXPECT_EQ(Inventory()->gpus[4].fabric->state, 2u);
}

TEST_F(GpuInventoryModuleTest, AllZeroClusterUuidGivesNoClique) {
  // An HGX node whose NVSwitches register the GPUs but without multi-node NVLink.
  UseVariant([](nlohmann::json& config) {
    for (auto& gpu : config["gpus"]) {
      gpu["fabric"]["clusterUuid"] = "00000000-0000-0000-0000-000000000000";
      gpu["fabric"]["cliqueId"] = 0;
    }
  });
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.Drain();
  ASSERT_NE(Clique(), nullptr);
  EXPECT_EQ(Clique()->clique_id, "");
  EXPECT_THAT(Clique()->reason, HasSubstr("no multi-node NVLink"));
  EXPECT_THAT(Clique()->reason, HasSubstr("(8 of 8)"));
  ASSERT_TRUE(Inventory()->gpus[0].fabric);
  EXPECT_TRUE(Inventory()->gpus[0].fabric->Attached());
  EXPECT_TRUE(Inventory()->gpus[0].fabric->ZeroClusterUuid());
}

TEST_F(GpuInventoryModuleTest, FabricInfoFallsBackFromTheVApiToV1) {
  // A driver whose V entry point knows neither the v3 nor the v2 tag.
  ASSERT_EQ(set_failure_("nvmlDeviceGetGpuFabricInfoV", kArgumentVersionMismatch), 0);
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.Drain();
  EXPECT_EQ(Clique()->clique_id, kClique);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_errors_total", {{"function", "nvmlDeviceGetGpuFabricInfoV"}}), 0);
}

TEST_F(GpuInventoryModuleTest, UnreadableFabricInfoMakesTheCliqueUnknown) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetGpuFabricInfoV", kUnknown), 0);
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.Drain();
  EXPECT_EQ(Clique()->clique_id, "");
  EXPECT_THAT(Clique()->reason, HasSubstr("fabric info unreadable: " + Uuid(0) + ", " + Uuid(1)));
  EXPECT_THAT(Clique()->reason, HasSubstr("(first error: nvmlDeviceGetGpuFabricInfoV: Unknown Error (999))"));
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_errors_total", {{"function", "nvmlDeviceGetGpuFabricInfoV"}}), 8);
}

TEST_F(GpuInventoryModuleTest, NumaFallsBackToMemoryAffinity) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetNumaNodeId", kNotSupported), 0);  // as on x86 drivers
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Inventory()->gpus[i].numa_node, i < 4 ? 0 : 1) << i;
}

TEST_F(GpuInventoryModuleTest, NumaFallsBackToSysfsUnderTheHostRoot) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetNumaNodeId", kNotSupported), 0);
  ASSERT_EQ(set_failure_("nvmlDeviceGetMemoryAffinity", kNotSupported), 0);
  const auto device_dir = std::filesystem::path(temp_dir_) / "sys/bus/pci/devices/0000:2a:00.0";
  std::filesystem::create_directories(device_dir);
  std::ofstream(device_dir / "numa_node") << "3\n";
  h_.site.paths.host_root = temp_dir_;
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  EXPECT_EQ(Inventory()->gpus[1].numa_node, 3);
  EXPECT_EQ(Inventory()->gpus[0].numa_node, -1);  // no file: unknown, not 0
}

TEST_F(GpuInventoryModuleTest, RefreshRepublishesOnlyOnChange) {
  auto config = TestConfig();
  config.refresh_interval = milliseconds(20);
  StartModule(config);
  ASSERT_TRUE(WaitAvailable());
  ASSERT_TRUE(h_.RunUntil([&] { return Metric("gpu_node_supervisor_nvml_inventory_reads_total") >= 4; }));
  EXPECT_EQ(inventories_.size(), 1u);
  EXPECT_EQ(cliques_.size(), 1u);

  // Fabric info goes away (as if the fabric manager lost the GPUs): the next refresh says so.
  ASSERT_EQ(set_failure_("nvmlDeviceGetGpuFabricInfoV", kNotSupported), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return Clique()->clique_id.empty(); }));
  EXPECT_THAT(Clique()->reason, HasSubstr("no fabric support: 8 of 8"));
  EXPECT_FALSE(Inventory()->gpus[0].fabric);
  EXPECT_TRUE(Inventory()->available);

  ASSERT_EQ(clear_failures_(), 0);
  ASSERT_TRUE(h_.RunUntil([&] { return Clique()->clique_id == kClique; }));
  h_.Drain();
  EXPECT_EQ(cliques_.size(), 3u);
}

TEST_F(GpuInventoryModuleTest, RefreshFailureMakesTheInventoryUnavailable) {
  auto config = TestConfig();
  config.refresh_interval = milliseconds(20);
  StartModule(config);
  ASSERT_TRUE(WaitAvailable());
  ASSERT_EQ(set_failure_("nvmlDeviceGetCount_v2", kGpuIsLost), 0);
  ASSERT_TRUE(WaitUnavailable());
  EXPECT_THAT(Inventory()->error, HasSubstr("nvmlDeviceGetCount_v2 failed: GPU is lost (15)"));
  ASSERT_EQ(clear_failures_(), 0);
  ASSERT_TRUE(WaitAvailable());
}

TEST_F(GpuInventoryModuleTest, StopPublishesUnavailableAndShutsNvmlDown) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  StopModule();
  EXPECT_FALSE(Inventory()->available);
  EXPECT_EQ(Inventory()->error, "gpu-inventory stopped");
  // The close runs on the pool (joining the waiter), then NVML is down.
  EXPECT_TRUE(h_.RunUntil([&] { return inject_xid_(Uuid(0).c_str(), 79) == kUninitialized; }));
}

TEST_F(GpuInventoryModuleTest, StopWhileOpeningIsSafe) {
  StartModule();
  StopModule();  // the open is still on the pool: its session is closed off the loop when it lands
  EXPECT_TRUE(h_.RunUntil([&] { return inject_xid_(Uuid(0).c_str(), 79) == kUninitialized; }));
}

// ---- GpuHealthSampler (issue 26) -----------------------------------------------------------------

TEST_F(GpuInventoryModuleTest, TheHealthSamplerReadsEveryGpuWhenAsked) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  ASSERT_EQ(set_health_(Uuid(2).c_str(), R"({"pcieWidth":8,"nvlinkDown":[0]})"), 0);
  auto sample = SampleNow(kHealthAll);
  ASSERT_TRUE(sample);
  ASSERT_TRUE(sample->ok) << sample->error;
  EXPECT_EQ(sample->groups, static_cast<uint32_t>(kHealthAll));
  ASSERT_EQ(sample->gpus.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(sample->gpus[i].uuid, Uuid(i));
    EXPECT_EQ(sample->gpus[i].pci_bus_id, Inventory()->gpus[i].pci_bus_id);
  }
  EXPECT_EQ(sample->gpus[2].pcie.width, 8u);
  EXPECT_FALSE(sample->gpus[2].nvlinks[0].active);
  EXPECT_EQ(sample->gpus[3].pcie.width, 16u);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_health_reads_total"), 1);

  // Requests made while a pass runs are answered too (by the next pass, which reads their groups).
  std::vector<HealthSample> answers;
  auto sampler = Sampler();
  sampler->Sample(kHealthPcie, [&](HealthSample s) { answers.push_back(std::move(s)); });
  sampler->Sample(kHealthThermal, [&](HealthSample s) { answers.push_back(std::move(s)); });
  sampler->Sample(kHealthHost, [&](HealthSample s) { answers.push_back(std::move(s)); });
  ASSERT_TRUE(h_.RunUntil([&] { return answers.size() == 3; }));
  for (const auto& answer : answers) {
    EXPECT_TRUE(answer.ok) << answer.error;
    EXPECT_EQ(answer.gpus.size(), 8u);
  }
  EXPECT_TRUE(answers[1].gpus[0].thermal.gpu_temperature_c.has_value());
  EXPECT_TRUE(answers[2].gpus[0].persistence_mode.has_value());
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_health_reads_total"), 3) << "the two that waited shared one pass";
}

TEST_F(GpuInventoryModuleTest, AHungHealthReadMakesTheInventoryUnavailableUntilItReturns) {
  auto config = TestConfig();
  config.health_read_timeout = milliseconds(300);
  StartModule(config);
  ASSERT_TRUE(WaitAvailable());
  const double reads_before = Metric("gpu_node_supervisor_nvml_inventory_reads_total");
  ASSERT_EQ(hang_("nvmlDeviceGetTemperature", 0), 0);

  auto sample = SampleNow(kHealthThermal);
  ASSERT_TRUE(sample);
  EXPECT_FALSE(sample->ok);
  EXPECT_THAT(sample->error, HasSubstr("NVML health read did not return within 300ms"));
  EXPECT_EQ(HungCalls(), 1u);
  ASSERT_TRUE(WaitUnavailable());
  EXPECT_EQ(Inventory()->error, sample->error);
  EXPECT_EQ(Inventory()->gpus.size(), 8u) << "the GPUs stay listed, unavailable";
  EXPECT_EQ(health_, ModuleHealth::kUnhealthy);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 0);
  EXPECT_EQ(Metric("gpu_node_supervisor_nvml_health_read_hangs_total"), 1);

  // No second pass beside the hung one: later requests get the same answer at once, even for
  // groups that would not hang.
  auto again = SampleNow(kHealthPcie);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->ok);
  EXPECT_EQ(again->error, sample->error);
  (void)h_.RunUntil([] { return false; }, milliseconds(200));
  EXPECT_EQ(HungCalls(), 1u) << "no second NVML read started";
  EXPECT_FALSE(Inventory()->available);

  // The call returns: the inventory is read again and available, and passes work again.
  release_hangs_();
  ASSERT_TRUE(WaitAvailable()) << health_detail_;
  EXPECT_GT(Metric("gpu_node_supervisor_nvml_inventory_reads_total"), reads_before);
  EXPECT_EQ(GaugeValue("gpu_node_supervisor_nvml_up"), 1);
  auto after = SampleNow(kHealthAll);
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->ok) << after->error;
  EXPECT_EQ(after->gpus.size(), 8u);
  EXPECT_TRUE(failures_.empty());
}

TEST_F(GpuInventoryModuleTest, TheHealthSamplerSaysWhyWhenNvmlIsUnavailable) {
  auto config = TestConfig();
  config.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  StartModule(config);
  ASSERT_TRUE(WaitUnavailable());
  auto sample = SampleNow(kHealthAll);
  ASSERT_TRUE(sample);
  EXPECT_FALSE(sample->ok);
  EXPECT_THAT(sample->error, HasSubstr("NVML unavailable"));
  EXPECT_THAT(sample->error, HasSubstr("/nonexistent/libnvidia-ml.so.1"));
  EXPECT_TRUE(sample->gpus.empty());
}

TEST_F(GpuInventoryModuleTest, AGpuOutForAResetIsLeftOutOfTheSampleAndStopWithdrawsTheSampler) {
  StartModule();
  ASSERT_TRUE(WaitAvailable());
  h_.bus.Publish(NvmlReleaseRequest{true, "reset of GPU 3", Uuid(3)});
  ASSERT_TRUE(h_.RunUntil([&] { return health_ == ModuleHealth::kDegraded && Inventory()->gpus[3].released; }));
  // A call naming GPU 3 would fail the reading; none is made.
  ASSERT_EQ(set_health_(Uuid(3).c_str(), R"({"lost":true})"), 0);
  auto sample = SampleNow(kHealthAll);
  ASSERT_TRUE(sample);
  ASSERT_TRUE(sample->ok) << sample->error;
  ASSERT_EQ(sample->gpus.size(), 7u);
  for (const auto& gpu : sample->gpus) {
    EXPECT_NE(gpu.uuid, Uuid(3));
    EXPECT_FALSE(gpu.lost);
  }
  // Withdrawn on Stop: a consumer that still holds it gets no answer, ever.
  auto sampler = Sampler();
  bool answered = false;
  StopModule();
  EXPECT_EQ(Sampler(), nullptr);
  sampler->Sample(kHealthAll, [&](HealthSample) { answered = true; });
  (void)h_.RunUntil([] { return false; }, milliseconds(100));
  EXPECT_FALSE(answered);
}

}  // namespace
}  // namespace gns::gpu_inventory
