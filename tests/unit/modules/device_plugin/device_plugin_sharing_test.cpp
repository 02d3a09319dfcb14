// MIG strategies, time-slicing and the device-list strategies through the kubelet simulator
// (real gRPC on unix sockets): each resource's registration and device list, Allocate per
// strategy, replicas, and MIG health following gpu-health's verdicts.
#include "kubelet_sim.h"
#include "loop/atomic_file.hpp"
#include "modules/device_plugin/cdi_spec.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace gns::device_plugin {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

gpu_inventory::MigDeviceInfo SharingMig(uint32_t gpu, uint32_t slot, uint32_t gi, const std::string& profile) {
  gpu_inventory::MigDeviceInfo m;
  m.index = slot;
  m.uuid = "MIG-" + std::to_string(gpu) + "-" + std::to_string(slot);
  m.gpu_instance = gi;
  m.profile = profile;
  return m;
}

// GPU 0: 3g.40gb + 2g.20gb + 2× 1g.10gb; GPU 1: 7× 1g.10gb; GPU 2: MIG off; GPU 3: MIG off.
gpu_inventory::GpuInventory MixedNode() {
  gpu_inventory::GpuInventory inv;
  inv.available = true;
  for (uint32_t i = 0; i < 4; ++i) {
    gpu_inventory::GpuInfo g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.minor = i;
    g.numa_node = 0;
    inv.gpus.push_back(g);
  }
  inv.gpus[0].mig_enabled = true;
  inv.gpus[0].mig_devices = {SharingMig(0, 0, 1, "3g.40gb"), SharingMig(0, 1, 3, "2g.20gb"), SharingMig(0, 2, 9, "1g.10gb"),
                             SharingMig(0, 3, 10, "1g.10gb")};
  inv.gpus[1].mig_enabled = true;
  for (uint32_t s = 0; s < 7; ++s) inv.gpus[1].mig_devices.push_back(SharingMig(1, s, 7 + s, "1g.10gb"));
  return inv;
}

gpu_health::DeviceHealth SharingVerdict(const std::string& uuid, bool healthy, uint32_t gi = 0xFFFFFFFFu) {
  gpu_health::DeviceHealth h;
  h.uuid = uuid;
  h.healthy = healthy;
  h.reason = healthy ? "recovered" : "XID 94: contained ECC error";
  h.gpu_instance = gi;
  return h;
}

std::vector<std::string> Ids(const std::vector<sim::DeviceInfo>& devices) {
  std::vector<std::string> ids;
  for (const auto& d : devices) ids.push_back(d.id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

class DevicePluginSharingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnsds-XXXXXX";  // unix socket paths must stay short
    dir_ = ::mkdtemp(tmpl);
    h_.site.paths.kubelet_dir = dir_ + "/kubelet";
    h_.site.paths.host_root = dir_ + "/host";
    fs::create_directories(h_.site.paths.kubelet_dir);
    sim::KubeletSimOptions options;
    options.kubelet_dir = h_.site.paths.kubelet_dir;
    sim_ = std::make_unique<sim::KubeletSim>(options);
    sim_->Start();
  }

  void TearDown() override {
    module_.Stop();
    sim_.reset();
    fs::remove_all(dir_);
  }

  void StartModule(const DevicePluginModule::Config& config) {
    module_.Start(config);
    h_.Drain();
  }

  bool AwaitCount(const std::string& resource, std::size_t n) {
    return h_.OffLoop([&] {
      return sim_->WaitForDevices(resource, [n](const auto& d) { return d.size() == n; }, seconds(20));
    });
  }
  bool AwaitHealth(const std::string& resource, const std::string& id, const std::string& health) {
    return h_.OffLoop([&] { return sim_->WaitForDeviceHealth(resource, id, health, seconds(20)); });
  }
  auto Allocate(const std::string& resource, std::vector<std::vector<std::string>> requests) {
    return h_.OffLoop([&] { return sim_->Allocate(resource, requests); });
  }

  test::LoopHarness h_;
  std::string dir_;
  std::unique_ptr<sim::KubeletSim> sim_;
  test::ModuleUnderTest<DevicePluginModule> module_{h_};
};

TEST_F(DevicePluginSharingTest, MixedStrategyRegistersOneResourcePerMigProfileAndWholeGpusAsGpu) {
  h_.bus.Publish(MixedNode());
  DevicePluginModule::Config config;
  config.mig_strategy = MigStrategy::kMixed;
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 2));
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-1g.10gb", 9));
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-2g.20gb", 1));
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-3g.40gb", 1));
  EXPECT_EQ(Ids(sim_->Devices("nvidia.com/gpu")), (std::vector<std::string>{"GPU-2", "GPU-3"}));
  EXPECT_EQ(Ids(sim_->Devices("nvidia.com/mig-3g.40gb")), std::vector<std::string>{"MIG-0-0"});
  // One registration per resource, each on its own socket named as upstream names them.
  for (const char* r : {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"}) {
    EXPECT_EQ(sim_->Registrations(r), 1) << r;
  }
  EXPECT_TRUE(fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-mig-1g.10gb.sock"));
  EXPECT_TRUE(fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.sock"));

  // Allocate hands out the MIG device by its UUID; a CDI name uses the same ID.
  auto ok = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-1-3", "MIG-0-2"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  EXPECT_EQ(ok.response.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "MIG-1-3,MIG-0-2");
  // A MIG device of another profile is not this resource's.
  auto wrong = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-0-0"}});
  EXPECT_EQ(wrong.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(wrong.status.message, "unknown device IDs: MIG-0-0");

  // MIG reconfigured (GPU 0 leaves MIG mode): its profiles' devices go, 2g/3g resources go away.
  auto inv = MixedNode();
  inv.gpus[0].mig_enabled = false;
  inv.gpus[0].mig_devices.clear();
  h_.bus.Publish(inv);
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 3));
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-1g.10gb", 7));
  ASSERT_TRUE(h_.RunUntil([&] { return !fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-mig-3g.40gb.sock"); }));
  const auto* state = h_.bus.Latest<DevicePluginState>();
  ASSERT_NE(state, nullptr);
  std::set<std::string> names;
  for (const auto& r : state->resources) names.insert(r.name);
  EXPECT_EQ(names, (std::set<std::string>{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}));
}

TEST_F(DevicePluginSharingTest, MigHealthFollowsGpuHealthPerGpuInstanceAndPerGpu) {
  h_.bus.Publish(MixedNode());
  DevicePluginModule::Config config;
  config.mig_strategy = MigStrategy::kMixed;
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-1g.10gb", 9));
  // Every profile's endpoint registers on its own: wait for the one checked below as well
  // (reading a resource the kubelet does not have yet was a flaky empty optional).
  ASSERT_TRUE(h_.OffLoop([&] {
    return sim_->WaitForDevices("nvidia.com/mig-3g.40gb", [](const auto& d) { return !d.empty(); }, seconds(20));
  }));

  // A verdict naming GPU instance 9 of GPU 0: that MIG device alone.
  h_.bus.Publish(SharingVerdict("GPU-0", false, 9));
  ASSERT_TRUE(AwaitHealth("nvidia.com/mig-1g.10gb", "MIG-0-2", "Unhealthy"));
  const auto small = sim_->Resource("nvidia.com/mig-1g.10gb");
  const auto large = sim_->Resource("nvidia.com/mig-3g.40gb");
  ASSERT_TRUE(small.has_value() && large.has_value());
  EXPECT_EQ(small->CountHealth("Unhealthy"), 1u);
  EXPECT_EQ(large->CountHealth("Unhealthy"), 0u);
  auto sick = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-0-2"}});
  EXPECT_EQ(sick.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(sick.status.message, "unhealthy device IDs: MIG-0-2");

  // A whole-GPU verdict on GPU 1: all seven of its MIG devices.
  h_.bus.Publish(SharingVerdict("GPU-1", false));
  ASSERT_TRUE(h_.OffLoop([&] {
    return sim_->WaitForDevices("nvidia.com/mig-1g.10gb", [](const auto& d) {
      return std::count_if(d.begin(), d.end(), [](const auto& x) { return x.health == "Unhealthy"; }) == 8;
    }, seconds(20));
  }));
  // More than the healthy devices: a clear error.
  auto big = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-0-3", "MIG-1-0"}});
  EXPECT_EQ(big.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(big.status.message,
            "request for 2 devices of nvidia.com/mig-1g.10gb exceeds the 1 healthy devices; unhealthy device IDs: MIG-1-0");

  // The GPU instance recovers; GPU 1 recovers.
  h_.bus.Publish(SharingVerdict("GPU-0", true, 9));
  h_.bus.Publish(SharingVerdict("GPU-1", true));
  ASSERT_TRUE(h_.OffLoop([&] {
    return sim_->WaitForDevices("nvidia.com/mig-1g.10gb", [](const auto& d) {
      return std::all_of(d.begin(), d.end(), [](const auto& x) { return x.health == "Healthy"; });
    }, seconds(20));
  }));
}

TEST_F(DevicePluginSharingTest, SingleStrategyAdvertisesMigDevicesAsGpuOrRefusesAMixedLayout) {
  auto uniform = MixedNode();
  uniform.gpus.resize(2);
  uniform.gpus[0].mig_devices = {SharingMig(0, 0, 7, "1g.10gb"), SharingMig(0, 1, 8, "1g.10gb")};
  h_.bus.Publish(uniform);
  DevicePluginModule::Config config;
  config.mig_strategy = MigStrategy::kSingle;
  config.id_strategy = DeviceIdStrategy::kIndex;
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 9));
  // deviceIDStrategy index: "<gpu index>:<mig slot>".
  const auto ids = Ids(sim_->Devices("nvidia.com/gpu"));
  EXPECT_EQ(ids.front(), "0:0");
  EXPECT_EQ(ids.back(), "1:6");
  auto ok = Allocate("nvidia.com/gpu", {{"1:6"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  EXPECT_EQ(ok.response.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "1:6");

  // Two profiles on the node: single cannot serve it; nothing is advertised, and the state says why.
  h_.bus.Publish(MixedNode());
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 0));
  const auto* state = h_.bus.Latest<DevicePluginState>();
  ASSERT_NE(state, nullptr);
  EXPECT_NE(state->error.find("migStrategy single needs MIG enabled on every GPU"), std::string::npos) << state->error;
}

TEST_F(DevicePluginSharingTest, TimeSlicingAdvertisesReplicasAndMapsThemBackToTheGpu) {
  auto inv = MixedNode();
  h_.bus.Publish(inv);
  DevicePluginModule::Config config;
  config.sharing.resources = {{"nvidia.com/gpu", "", 4}};
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 16));  // migStrategy none: 4 GPUs × 4 replicas
  const auto ids = Ids(sim_->Devices("nvidia.com/gpu"));
  EXPECT_EQ(ids[0], "GPU-0::0");
  EXPECT_EQ(ids[3], "GPU-0::3");

  // Two replicas of one GPU: the runtime is told the GPU once.
  auto ok = Allocate("nvidia.com/gpu", {{"GPU-2::1", "GPU-2::3", "GPU-3::0"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  EXPECT_EQ(ok.response.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-2,GPU-3");

  // The GPU's health applies to each of its replicas.
  h_.bus.Publish(SharingVerdict("GPU-3", false));
  for (int n = 0; n < 4; ++n) ASSERT_TRUE(AwaitHealth("nvidia.com/gpu", "GPU-3::" + std::to_string(n), "Unhealthy"));
  EXPECT_EQ(sim_->Resource("nvidia.com/gpu")->CountHealth("Unhealthy"), 4u);

  // The preferred allocation spreads replicas over GPUs.
  auto preferred = h_.OffLoop([&] {
    return sim_->GetPreferredAllocation("nvidia.com/gpu", {"GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"}, {}, 2);
  });
  ASSERT_TRUE(preferred.ok()) << preferred.status.ToString();
  const auto& chosen = preferred.response.container_responses(0).deviceids();
  EXPECT_EQ(std::vector<std::string>(chosen.begin(), chosen.end()), (std::vector<std::string>{"GPU-0::0", "GPU-1::0"}));
}

TEST_F(DevicePluginSharingTest, RenameByDefaultAndFailRequestsGreaterThanOne) {
  h_.bus.Publish(MixedNode());
  DevicePluginModule::Config config;
  config.mig_strategy = MigStrategy::kMixed;
  config.sharing.rename_by_default = true;
  config.sharing.fail_requests_greater_than_one = true;
  config.sharing.resources = {{"nvidia.com/mig-1g.10gb", "", 2}};
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-1g.10gb.shared", 18));
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 2));  // not listed: not shared, not renamed
  EXPECT_TRUE(fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-mig-1g.10gb.shared.sock"));
  EXPECT_FALSE(sim_->Resource("nvidia.com/mig-1g.10gb").has_value());

  auto one = Allocate("nvidia.com/mig-1g.10gb.shared", {{"MIG-1-2::1"}});
  ASSERT_TRUE(one.ok()) << one.status.ToString();
  EXPECT_EQ(one.response.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "MIG-1-2");
  auto two = Allocate("nvidia.com/mig-1g.10gb.shared", {{"MIG-1-2::1", "MIG-1-3::0"}});
  EXPECT_EQ(two.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(two.status.message,
            "request for 'nvidia.com/mig-1g.10gb.shared: 2' too large: maximum request size for shared resources is 1");
}

TEST_F(DevicePluginSharingTest, SeveralDeviceListStrategiesAtOnce) {
  h_.bus.Publish(MixedNode());
  DevicePluginModule::Config config;
  config.allocation.strategies = {.envvar = true, .volume_mounts = true, .cdi_annotations = true, .cdi_cri = true};
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 4));
  auto ok = Allocate("nvidia.com/gpu", {{"GPU-1", "GPU-2"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  const auto& c = ok.response.container_responses(0);
  // volume-mounts points the variable at the mount root (as upstream does with both on).
  EXPECT_EQ(c.envs().at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  ASSERT_EQ(c.mounts_size(), 2);
  EXPECT_EQ(c.mounts(0).container_path(), "/var/run/nvidia-container-devices/GPU-1");
  EXPECT_EQ(c.mounts(0).host_path(), "/dev/null");
  ASSERT_EQ(c.annotations_size(), 1);
  const auto& [key, value] = *c.annotations().begin();
  EXPECT_EQ(key.rfind("cdi.k8s.io/", 0), 0u) << key;
  EXPECT_EQ(value, "nvidia.com/gpu=GPU-1,nvidia.com/gpu=GPU-2");
  ASSERT_EQ(c.cdi_devices_size(), 2);
  EXPECT_EQ(c.cdi_devices(1).name(), "nvidia.com/gpu=GPU-2");
}

TEST_F(DevicePluginSharingTest, CdiSpecIsWrittenForTheAdvertisedDevicesRewrittenOnChangeAndRemovedAtStop) {
  h_.site.paths.cdi_dir = dir_ + "/cdi";
  fs::create_directories(h_.site.paths.host_root + "/dev");
  std::ofstream(h_.site.paths.host_root + "/dev/nvidiactl") << "";
  h_.bus.Publish(MixedNode());
  DevicePluginModule::Config config;
  config.mig_strategy = MigStrategy::kMixed;
  config.allocation.strategies = {.envvar = false, .cdi_cri = true};
  config.cdi_spec = true;
  config.cdi_remove_on_stop = true;
  StartModule(config);
  const std::string path = dir_ + "/cdi/nvidia.com-gpu.json";
  auto writes = [&] {
    const auto* state = h_.bus.Latest<DevicePluginState>();
    return state == nullptr ? -1 : state->cdi_writes;
  };
  ASSERT_TRUE(h_.RunUntil([&] { return writes() == 1; }));
  auto read = [&] {
    std::string text, error;
    EXPECT_TRUE(ReadWholeFile(path, text, error)) << error;
    return nlohmann::json::parse(text);
  };
  auto spec = read();
  EXPECT_EQ(ValidateCdiSpec(spec), "");
  EXPECT_EQ(spec["devices"].size(), 2u + 11u + 1u);  // 2 GPUs, 11 MIG devices, all
  EXPECT_EQ(spec["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidiactl");
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);

  // Every name Allocate hands out is in the spec.
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-1g.10gb", 9));
  auto ok = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-1-4"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  const std::string name = ok.response.container_responses(0).cdi_devices(0).name();
  EXPECT_EQ(name, "nvidia.com/gpu=MIG-1-4");
  bool found = false;
  for (const auto& d : spec["devices"]) found = found || "nvidia.com/gpu=" + d["name"].get<std::string>() == name;
  EXPECT_TRUE(found);

  // A health change does not change the devices: no write.
  h_.bus.Publish(SharingVerdict("GPU-2", false));
  ASSERT_TRUE(AwaitHealth("nvidia.com/gpu", "GPU-2", "Unhealthy"));
  h_.Drain();
  EXPECT_EQ(writes(), 1);
  // MIG reconfigured: rewritten.
  auto inv = MixedNode();
  inv.gpus[1].mig_devices.resize(3);
  h_.bus.Publish(inv);
  ASSERT_TRUE(h_.RunUntil([&] { return writes() == 2; }));
  EXPECT_EQ(read()["devices"].size(), 2u + 7u + 1u);

  module_.Stop();
  EXPECT_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace gns::device_plugin
