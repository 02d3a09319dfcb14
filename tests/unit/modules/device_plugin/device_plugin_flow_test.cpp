// The device plugin and the kubelet simulator through real gRPC on unix sockets:
// registration, ListAndWatch with live health (gpu-health's verdicts only), Allocate,
// GetPreferredAllocation, kubelet restarts, NVML down, and starting before the kubelet.
#include "kubelet_sim.h"
#include "loop/logging.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gns::device_plugin {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kResource = "nvidia.com/gpu";

gpu_inventory::GpuInventory InventoryOfEight() {
  gpu_inventory::GpuInventory inv;
  inv.available = true;
  for (uint32_t i = 0; i < 8; ++i) {
    gpu_inventory::GpuInfo g;
    g.index = i;
    g.uuid = "GPU-0000000" + std::to_string(i);
    g.minor = i;
    g.numa_node = i < 4 ? 0 : 1;
    g.pci.bus = 0x10 * (i + 1);
    g.nvlink_peers = {"GPU-0000000" + std::to_string(i ^ 1)};
    inv.gpus.push_back(g);
  }
  return inv;
}

class DevicePluginFlowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnsdp-XXXXXX";  // unix socket paths must stay short
    dir_ = ::mkdtemp(tmpl);
    h_.site.paths.kubelet_dir = dir_ + "/kubelet";
    h_.site.paths.host_root = dir_ + "/host";
    fs::create_directories(h_.site.paths.kubelet_dir);
    sim::KubeletSimOptions options;
    options.kubelet_dir = h_.site.paths.kubelet_dir;
    sim_ = std::make_unique<sim::KubeletSim>(options);
  }

  void TearDown() override {
    StopModule();
    sim_.reset();
    fs::remove_all(dir_);
  }

  void StartModule(DevicePluginModule::Config config = {}) {
    module_.Start(config);
    h_.Drain();
  }

  void StopModule() {
    module_.Stop();
  }

  // Waits on the simulator from another thread while the loop serves the plugin.
  bool Await(std::function<bool(sim::KubeletSim&)> wait) {
    return h_.OffLoop([&] { return wait(*sim_); });
  }

  bool AwaitHealth(const std::string& id, const std::string& health) {
    return Await([&](sim::KubeletSim& s) { return s.WaitForDeviceHealth(kResource, id, health, seconds(20)); });
  }

  test::LoopHarness h_;
  std::string dir_;
  std::unique_ptr<sim::KubeletSim> sim_;
  test::ModuleUnderTest<DevicePluginModule> module_{h_};
};

TEST_F(DevicePluginFlowTest, RegistersAndAdvertisesEveryGpuWithNumaTopology) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(Await([](auto& s) { return s.WaitForRegistrations(kResource, 1, seconds(20)); }));
  ASSERT_TRUE(Await([](auto& s) {
    return s.WaitForDevices(kResource, [](const auto& d) { return d.size() == 8; }, seconds(20));
  }));
  const auto devices = sim_->Devices(kResource);
  for (const auto& d : devices) {
    EXPECT_EQ(d.health, "Healthy");
    const int index = d.id.back() - '0';
    EXPECT_EQ(d.numa_nodes, std::vector<int64_t>{index < 4 ? 0 : 1}) << d.id;
  }
  const auto options = sim_->LastOptions(kResource);
  ASSERT_TRUE(options);
  EXPECT_TRUE(options->get_preferred_allocation_available);
  EXPECT_FALSE(options->pre_start_required);
  // The socket is ours alone.
  struct stat st {};
  ASSERT_EQ(::stat((h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

gpu_health::DeviceHealth FlowVerdict(const std::string& uuid, bool healthy, const std::string& reason) {
  gpu_health::DeviceHealth health;
  health.uuid = uuid;
  health.healthy = healthy;
  health.reason = reason;
  return health;
}

TEST_F(DevicePluginFlowTest, NvmlXidAloneLeavesTheDeviceHealthyOnlyGpuHealthDecides) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(AwaitHealth("GPU-00000003", "Healthy"));
  // XID 79 (fallen off the bus) as NVML reports it: gpu-health judges it, not the plugin.
  h_.bus.Publish(gpu_inventory::XidObservation{"GPU-00000003", 79});
  // A verdict on another GPU, published after: once the kubelet sees it, the XID was seen too.
  h_.bus.Publish(FlowVerdict("GPU-00000004", false, "XID 48: double-bit ECC error"));
  ASSERT_TRUE(AwaitHealth("GPU-00000004", "Unhealthy"));
  EXPECT_EQ(sim_->Resource(kResource)->CountHealth("Unhealthy"), 1u);
  const auto* state = h_.bus.Latest<DevicePluginState>();
  ASSERT_NE(state, nullptr);
  for (const auto& d : state->devices) EXPECT_EQ(d.healthy, d.id != "GPU-00000004") << d.id;
}

TEST_F(DevicePluginFlowTest, DeviceHealthTurnsTheDeviceUnhealthyAndAHealthyVerdictTurnsItBack) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(AwaitHealth("GPU-00000003", "Healthy"));
  h_.bus.Publish(FlowVerdict("GPU-00000003", false, "XID 79: GPU has fallen off the bus"));
  ASSERT_TRUE(AwaitHealth("GPU-00000003", "Unhealthy"));
  EXPECT_EQ(sim_->Resource(kResource)->devices.size(), 8u);
  EXPECT_EQ(sim_->Resource(kResource)->CountHealth("Unhealthy"), 1u);
  const auto* sick = h_.bus.Latest<DevicePluginState>();
  ASSERT_NE(sick, nullptr);
  for (const auto& d : sick->devices) {
    if (d.id == "GPU-00000003") {
      EXPECT_EQ(d.reason, "XID 79: GPU has fallen off the bus");
    }
  }

  h_.bus.Publish(FlowVerdict("GPU-00000003", true, "GPU reset occurred"));
  ASSERT_TRUE(AwaitHealth("GPU-00000003", "Healthy"));
  const auto* state = h_.bus.Latest<DevicePluginState>();
  ASSERT_NE(state, nullptr);
  EXPECT_TRUE(state->registered);
}

// Counts the module's log lines that contain a text.
class DevicePluginLogTest : public DevicePluginFlowTest {
 protected:
  void SetUp() override {
    DevicePluginFlowTest::SetUp();
    sink_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
    GetLogger(std::string(DevicePluginModule::kName))->sinks().push_back(sink_);
  }
  void TearDown() override {
    auto& sinks = GetLogger(std::string(DevicePluginModule::kName))->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    DevicePluginFlowTest::TearDown();
  }
  int Lines(const std::string& text) const {
    int n = 0;
    for (const auto& line : sink_->last_formatted())
      if (line.find(text) != std::string::npos) ++n;
    return n;
  }
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// What the operator reads when gpu-health is not in the enabled set (the supervisor's retained
// module states list every enabled module before any starts).
class HealthModuleNotice : public DevicePluginLogTest {
 protected:
  void PublishEnabled(std::vector<std::string> names) {
    ModuleStates states;
    for (auto& name : names) {
      ModuleStatus status;
      status.name = std::move(name);
      status.state = ModuleState::kStarting;
      states.modules.push_back(std::move(status));
    }
    h_.bus.Publish(std::move(states));
  }
  int Notices() const { return Lines("gpu-health is not enabled"); }
};

TEST_F(HealthModuleNotice, WithoutGpuHealthTheLogSaysOnceThatOnlyNvmlAvailabilityCounts) {
  PublishEnabled({"metrics", "gpu-inventory", "device-plugin"});
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  EXPECT_EQ(Notices(), 1);
  bool said = false;
  for (const auto& line : sink_->last_formatted())
    if (line.find("only while NVML cannot reach them") != std::string::npos) said = true;
  EXPECT_TRUE(said);
  // Later state changes do not repeat it.
  PublishEnabled({"metrics", "gpu-inventory", "device-plugin"});
  h_.Drain();
  EXPECT_EQ(Notices(), 1);
}

TEST_F(HealthModuleNotice, WithGpuHealthEnabledNothingIsSaid) {
  PublishEnabled({"metrics", "gpu-inventory", "journald", "gpu-health", "device-plugin"});
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  EXPECT_EQ(Notices(), 0);
}

// Issue #24 §6: gpu-health restores this boot's verdicts off the loop, possibly after the device
// plugin started. With gpu-health enabled nothing is advertised until it has published its
// state, so a GPU restored Unhealthy is never offered to the kubelet as Healthy first.
TEST_F(HealthModuleNotice, WithGpuHealthEnabledNothingIsAdvertisedBeforeItsState) {
  sim_->Start();
  PublishEnabled({"metrics", "gpu-inventory", "journald", "gpu-health", "device-plugin"});
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(300));
  EXPECT_FALSE(fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.sock"))
      << "advertised before gpu-health said what it restored";
  h_.bus.Publish(FlowVerdict("GPU-00000003", false, "XID 79 (restored)"));
  h_.bus.Publish(gpu_health::GpuHealthState{});
  ASSERT_TRUE(Await([](auto& s) { return s.WaitForRegistrations(kResource, 1, seconds(20)); }));
  ASSERT_TRUE(AwaitHealth("GPU-00000003", "Unhealthy"));
}

TEST_F(DevicePluginFlowTest, NvmlDownAdvertisesEveryDeviceUnhealthyNeverStaleHealthy) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(AwaitHealth("GPU-00000000", "Healthy"));
  gpu_inventory::GpuInventory down;
  down.available = false;
  down.error = "nvmlEventSetWait_v2: Unknown Error";
  h_.bus.Publish(down);
  ASSERT_TRUE(Await([](auto& s) {
    return s.WaitForDevices(
        kResource,
        [](const auto& devices) {
          return devices.size() == 8 &&
                 std::all_of(devices.begin(), devices.end(), [](const auto& d) { return d.health == "Unhealthy"; });
        },
        seconds(20));
  }));
  h_.bus.Publish(InventoryOfEight());
  ASSERT_TRUE(Await([](auto& s) {
    return s.WaitForDevices(kResource, [](const auto& d) {
      return std::all_of(d.begin(), d.end(), [](const auto& x) { return x.health == "Healthy"; });
    }, seconds(20));
  }));
}

TEST_F(DevicePluginFlowTest, AGpuReleasedForItsResetIsTheOnlyUnhealthyOne) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(AwaitHealth("GPU-00000006", "Healthy"));
  auto released = InventoryOfEight();
  released.gpus[6].released = true;
  released.gpus[6].release_reason = "GPU reset requested by an operator";
  h_.bus.Publish(released);
  ASSERT_TRUE(AwaitHealth("GPU-00000006", "Unhealthy"));
  EXPECT_EQ(sim_->Resource(kResource)->devices.size(), 8u);
  EXPECT_EQ(sim_->Resource(kResource)->CountHealth("Unhealthy"), 1u);
  h_.bus.Publish(InventoryOfEight());  // taken back and read again
  ASSERT_TRUE(AwaitHealth("GPU-00000006", "Healthy"));
  EXPECT_EQ(sim_->Resource(kResource)->CountHealth("Unhealthy"), 0u);
}

TEST_F(DevicePluginFlowTest, KubeletRestartsAreFollowedByServingAndRegisteringAgain) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(Await([](auto& s) { return s.WaitForRegistrations(kResource, 1, seconds(20)); }));
  for (int restart = 1; restart <= 5; ++restart) {
    h_.OffLoop([&] { sim_->Restart(); return 0; });
    ASSERT_TRUE(Await([&](auto& s) { return s.WaitForRegistrations(kResource, restart + 1, seconds(20)); }))
        << "restart " << restart;
    ASSERT_TRUE(Await([](auto& s) {
      return s.WaitFor([](const sim::KubeletState& st) {
        const auto* r = st.FindResource(kResource);
        return r != nullptr && r->connected && r->devices.size() == 8;
      }, seconds(20));
    })) << "restart " << restart;
  }
  // And the plugin still answers on the new connection.
  const auto result = h_.OffLoop([&] { return sim_->Allocate(kResource, {{"GPU-00000001"}}); });
  EXPECT_TRUE(result.ok()) << result.status.ToString();
  EXPECT_TRUE(module_.failures.empty());
}

// After kill -9 our socket file stays behind; the next run removes it as it starts serving. That
// removal is not the kubelet removing the socket we serve: one start, one registration.
TEST_F(DevicePluginLogTest, TheStaleSocketOfAKilledRunIsNotTakenForOursRemoved) {
  sim_->Start();  // cleans device-plugins/: the stale socket comes after it, as after a kill -9
  const std::string socket = h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.sock";
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    ::close(fd);  // the process died: the file stays
  }
  h_.bus.Publish(InventoryOfEight());
  StartModule();  // runs the loop until idle: the deletion's inotify event is handled by now
  ASSERT_TRUE(Await([](auto& s) {
    return s.WaitFor([](const sim::KubeletState& st) {
      const auto* r = st.FindResource(kResource);
      return r != nullptr && r->connected && r->devices.size() == 8;
    }, seconds(20));
  }));
  ASSERT_TRUE(h_.RunUntil([&] { return h_.bus.Latest<DevicePluginState>()->registered; }));
  h_.Drain();
  EXPECT_EQ(Lines("serving nvidia.com/gpu on"), 1);
  EXPECT_EQ(Lines("was removed"), 0);
  EXPECT_EQ(sim_->State().FindResource(kResource)->registrations, 1);
  EXPECT_EQ(h_.bus.Latest<DevicePluginState>()->registrations, 1);
  EXPECT_TRUE(sim_->Resource(kResource)->connected);
}

// kubelet.sock appears at the kubelet's bind(), before its listen(). A registration dialled in
// between was refused and waited out gRPC's reconnect backoff (0.8 to 1.2 s); the plugin now
// registers once the kubelet listens. With a registerTimeout below that backoff, a dial made
// too early shows as a failed registration.
TEST_F(DevicePluginLogTest, RegistersAsSoonAsTheKubeletListensAtStartAndAfterEachRestart) {
  sim::KubeletSimOptions options;
  options.kubelet_dir = h_.site.paths.kubelet_dir;
  options.registration_listen_delay = milliseconds(100);
  sim_ = std::make_unique<sim::KubeletSim>(options);
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  DevicePluginModule::Config config;
  config.register_timeout = milliseconds(750);
  StartModule(config);
  ASSERT_TRUE(Await([](auto& s) { return s.WaitForRegistrations(kResource, 1, seconds(20)); }));
  for (int restart = 1; restart <= 3; ++restart) {
    h_.OffLoop([&] { sim_->Restart(); return 0; });
    ASSERT_TRUE(Await([&](auto& s) { return s.WaitForRegistrations(kResource, restart + 1, seconds(20)); }))
        << "restart " << restart;
  }
  ASSERT_TRUE(h_.RunUntil([&] { return h_.bus.Latest<DevicePluginState>()->registered; }));
  EXPECT_EQ(Lines("registration of nvidia.com/gpu failed"), 0);
  EXPECT_EQ(sim_->State().FindResource(kResource)->registrations, 4);
}

TEST_F(DevicePluginFlowTest, StartsBeforeTheKubeletAndRegistersOnceKubeletSockAppears) {
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  h_.RunUntil([] { return false; }, milliseconds(100));
  EXPECT_FALSE(h_.bus.Latest<DevicePluginState>()->registered);
  h_.OffLoop([&] { sim_->Start(); return 0; });
  ASSERT_TRUE(Await([](auto& s) { return s.WaitForRegistrations(kResource, 1, seconds(20)); }));
  ASSERT_TRUE(h_.RunUntil([&] { return h_.bus.Latest<DevicePluginState>()->registered; }));
}

TEST_F(DevicePluginFlowTest, AllocateAnswersPerStrategyAndRejectsBadIds) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  DevicePluginModule::Config config;
  config.allocation.strategies = {.envvar = false, .cdi_cri = true};
  config.allocation.pass_device_specs = true;
  fs::create_directories(h_.site.paths.host_root + "/dev");
  std::ofstream(h_.site.paths.host_root + "/dev/nvidiactl") << "";
  StartModule(config);
  ASSERT_TRUE(AwaitHealth("GPU-00000002", "Healthy"));

  auto ok = h_.OffLoop([&] { return sim_->Allocate(kResource, {{"GPU-00000002", "GPU-00000003"}, {"GPU-00000005"}}); });
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  ASSERT_EQ(ok.response.container_responses_size(), 2);
  const auto& first = ok.response.container_responses(0);
  ASSERT_EQ(first.cdi_devices_size(), 2);
  EXPECT_EQ(first.cdi_devices(0).name(), "nvidia.com/gpu=GPU-00000002");
  ASSERT_EQ(first.devices_size(), 3);
  EXPECT_EQ(first.devices(0).host_path(), "/dev/nvidia2");
  EXPECT_EQ(first.devices(2).container_path(), "/dev/nvidiactl");
  EXPECT_TRUE(first.envs().empty());

  auto unknown = h_.OffLoop([&] { return sim_->Allocate(kResource, {{"GPU-00000002", "GPU-nope"}}); });
  EXPECT_EQ(unknown.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(unknown.status.message, "unknown device IDs: GPU-nope");

  h_.bus.Publish(FlowVerdict("GPU-00000005", false, "XID 79: GPU has fallen off the bus"));
  ASSERT_TRUE(AwaitHealth("GPU-00000005", "Unhealthy"));
  auto sick = h_.OffLoop([&] { return sim_->Allocate(kResource, {{"GPU-00000005"}}); });
  EXPECT_EQ(sick.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(sick.status.message, "unhealthy device IDs: GPU-00000005");
}

TEST_F(DevicePluginFlowTest, PreferredAllocationThroughTheKubelet) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(AwaitHealth("GPU-00000000", "Healthy"));
  std::vector<std::string> all;
  for (int i = 0; i < 8; ++i) all.push_back("GPU-0000000" + std::to_string(i));
  auto pair = h_.OffLoop([&] { return sim_->GetPreferredAllocation(kResource, all, {"GPU-00000004"}, 2); });
  ASSERT_TRUE(pair.ok()) << pair.status.ToString();
  ASSERT_EQ(pair.response.container_responses_size(), 1);
  const auto& ids = pair.response.container_responses(0).deviceids();
  EXPECT_EQ(std::vector<std::string>(ids.begin(), ids.end()), (std::vector<std::string>{"GPU-00000004", "GPU-00000005"}));
}

TEST_F(DevicePluginFlowTest, StopRemovesOurSocket) {
  sim_->Start();
  h_.bus.Publish(InventoryOfEight());
  StartModule();
  ASSERT_TRUE(Await([](auto& s) { return s.WaitForRegistrations(kResource, 1, seconds(20)); }));
  ASSERT_TRUE(Await([](auto& s) {
    return s.WaitForDevices(kResource, [](const auto& d) { return d.size() == 8; }, seconds(20));
  }));
  StopModule();
  EXPECT_FALSE(fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.sock"));
  ASSERT_TRUE(Await([](auto& s) {
    return s.WaitFor([](const sim::KubeletState& st) {
      const auto* r = st.FindResource(kResource);
      return r != nullptr && !r->connected;
    }, seconds(20));
  }));
  // The plugin ends the kubelet's ListAndWatch itself; left open, the stream was cancelled only
  // when the gRPC server's shutdown deadline ran out (a second on every stop).
  const auto resource = sim_->Resource(kResource);
  ASSERT_TRUE(resource.has_value());
  EXPECT_NE(resource->disconnect_reason.find("device plugin is stopping"), std::string::npos)
      << resource->disconnect_reason;
}

}  // namespace
}  // namespace gns::device_plugin
