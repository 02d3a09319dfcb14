// MPS sharing and passDeviceSpecs with MIG devices through the kubelet simulator (real gRPC on
// unix sockets): an MPS resource registers only once a (fake) control daemon answers on its
// pipe directory, advertises replicas, hands out one replica per container with the pipe and
// shm mounts, the pipe variable and the client limits; MIG devices are refused with MPS; a MIG
// device's Allocate passes its capability nodes. And the config's precise errors.
#include "kubelet_sim.h"
#include "loop/config.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/device_plugin/mps.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace gns::device_plugin {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kGiB = 1024ull * 1024 * 1024;

gpu_inventory::GpuInventory TwoGpus() {
  gpu_inventory::GpuInventory inv;
  inv.available = true;
  for (uint32_t i = 0; i < 2; ++i) {
    gpu_inventory::GpuInfo g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.minor = i;
    g.numa_node = 0;
    g.memory_total_bytes = 80 * kGiB;
    inv.gpus.push_back(g);
  }
  return inv;
}

gpu_inventory::MigDeviceInfo Mig(uint32_t gpu, uint32_t slot, uint32_t gi, uint32_t ci, const std::string& profile) {
  gpu_inventory::MigDeviceInfo m;
  m.index = slot;
  m.uuid = "MIG-" + std::to_string(gpu) + "-" + std::to_string(slot);
  m.gpu_instance = gi;
  m.compute_instance = ci;
  m.profile = profile;
  return m;
}

// Both GPUs in MIG mode: GPU 0 (minor 0) 2× 1g.10gb in GI 9 and 10; GPU 1 (minor 1) one 3g.40gb.
gpu_inventory::GpuInventory MigNode() {
  auto inv = TwoGpus();
  inv.gpus[0].mig_enabled = true;
  inv.gpus[0].mig_devices = {Mig(0, 0, 9, 0, "1g.10gb"), Mig(0, 1, 10, 0, "1g.10gb")};
  inv.gpus[1].mig_enabled = true;
  inv.gpus[1].mig_devices = {Mig(1, 0, 1, 0, "3g.40gb")};
  return inv;
}

// The operator's control daemon, as far as the plugin can see it: a unix socket named `control`
// in the pipe directory that accepts connections (the backlog holds them; nobody reads).
class FakeControlDaemon {
 public:
  explicit FakeControlDaemon(std::string path) : path_(std::move(path)) {}
  ~FakeControlDaemon() { Quit(); }
  void Listen() {
    fs::create_directories(fs::path(path_).parent_path());
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    ASSERT_LT(path_.size(), sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    ASSERT_EQ(::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    ASSERT_EQ(::listen(fd_, 64), 0);
  }
  // Stops listening but leaves the socket file behind, as a crashed daemon does.
  void Crash() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void Quit() {
    Crash();
    ::unlink(path_.c_str());
  }

 private:
  std::string path_;
  int fd_ = -1;
};

class DevicePluginMpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnsmp-XXXXXX";  // unix socket paths must stay short
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

  static DevicePluginModule::Config MpsConfig(int replicas) {
    DevicePluginModule::Config config;
    config.sharing.strategy = SharingStrategy::kMps;
    config.sharing.fail_requests_greater_than_one = true;
    config.sharing.resources = {{"nvidia.com/gpu", "", replicas}};
    config.mps.root = "/run/nvidia/mps";
    config.mps.check_interval = milliseconds(20);
    return config;
  }
  std::string ControlPath(const std::string& resource) const {
    return h_.site.paths.host_root + "/run/nvidia/mps/" + resource + "/pipe/control";
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
  bool AwaitAll(const std::string& resource, const std::string& health) {
    return h_.OffLoop([&] {
      return sim_->WaitForDevices(resource, [&](const auto& d) {
        return !d.empty() && std::all_of(d.begin(), d.end(), [&](const auto& x) { return x.health == health; });
      }, seconds(20));
    });
  }
  auto Allocate(const std::string& resource, std::vector<std::vector<std::string>> requests) {
    return h_.OffLoop([&] { return sim_->Allocate(resource, requests); });
  }
  const DevicePluginState::Resource* StateOf(const std::string& resource) {
    const auto* state = h_.bus.Latest<DevicePluginState>();
    if (state == nullptr) return nullptr;
    for (const auto& r : state->resources)
      if (r.name == resource) return &r;
    return nullptr;
  }

  test::LoopHarness h_;
  std::string dir_;
  std::unique_ptr<sim::KubeletSim> sim_;
  test::ModuleUnderTest<DevicePluginModule> module_{h_};
};

TEST_F(DevicePluginMpsTest, RegistersOnlyOnceTheControlDaemonAnswersThenServesOneReplicaPerContainer) {
  h_.bus.Publish(TwoGpus());
  StartModule(MpsConfig(4));
  FakeControlDaemon daemon(ControlPath("nvidia.com/gpu"));

  // No daemon: no socket, no registration, and the state says why.
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto* r = StateOf("nvidia.com/gpu");
    return r != nullptr && r->mps_daemon.find("No such file or directory") != std::string::npos;
  }));
  const std::string socket = h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.sock";
  // Several probe intervals pass without a registration.
  h_.RunUntil([] { return false; }, milliseconds(200));
  EXPECT_FALSE(fs::exists(socket));
  EXPECT_EQ(sim_->Registrations("nvidia.com/gpu"), 0);
  EXPECT_FALSE(h_.bus.Latest<DevicePluginState>()->registered);

  // A socket left by a dead daemon does not answer either.
  daemon.Listen();
  daemon.Crash();
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto* r = StateOf("nvidia.com/gpu");
    return r != nullptr && r->mps_daemon.find("connection refused") != std::string::npos;
  }));
  EXPECT_FALSE(fs::exists(socket));

  // The daemon answers: the resource registers with 2 GPUs × 4 replicas.
  daemon.Quit();
  daemon.Listen();
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 8));
  EXPECT_EQ(sim_->Registrations("nvidia.com/gpu"), 1);
  ASSERT_TRUE(AwaitAll("nvidia.com/gpu", "Healthy"));
  const auto* state = h_.bus.Latest<DevicePluginState>();
  EXPECT_EQ(state->sharing_strategy, "mps");
  EXPECT_EQ(state->gpu_replicas, 4);
  EXPECT_EQ(StateOf("nvidia.com/gpu")->mps_daemon, "answers");
  EXPECT_EQ(StateOf("nvidia.com/gpu")->mps_pipe_dir, "/run/nvidia/mps/nvidia.com/gpu/pipe");

  auto ok = Allocate("nvidia.com/gpu", {{"GPU-1::2"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  const auto& c = ok.response.container_responses(0);
  EXPECT_EQ(c.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");
  EXPECT_EQ(c.envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com/gpu/pipe");
  EXPECT_EQ(c.envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  EXPECT_EQ(c.envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=20480M");  // 80 GiB / 4
  ASSERT_EQ(c.mounts_size(), 2);
  EXPECT_EQ(c.mounts(0).container_path(), "/mps/nvidia.com/gpu/pipe");
  EXPECT_EQ(c.mounts(0).host_path(), "/run/nvidia/mps/nvidia.com/gpu/pipe");
  EXPECT_FALSE(c.mounts(0).read_only());
  EXPECT_EQ(c.mounts(1).container_path(), "/dev/shm");
  EXPECT_EQ(c.mounts(1).host_path(), "/run/nvidia/mps/shm");
  EXPECT_FALSE(c.mounts(1).read_only());

  // More than one replica per container is refused, even of two GPUs.
  auto two = Allocate("nvidia.com/gpu", {{"GPU-0::0", "GPU-1::0"}});
  EXPECT_EQ(two.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(two.status.message, "request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1");

  // The daemon stops answering: every replica is Unhealthy, Allocate refuses; it comes back.
  daemon.Crash();
  ASSERT_TRUE(AwaitAll("nvidia.com/gpu", "Unhealthy"));
  auto sick = Allocate("nvidia.com/gpu", {{"GPU-0::1"}});
  EXPECT_EQ(sick.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(sick.status.message.find("exceeds the 0 healthy devices"), std::string::npos) << sick.status.message;
  EXPECT_EQ(sim_->Registrations("nvidia.com/gpu"), 1);  // still registered: the kubelet keeps the capacity
  daemon.Quit();
  daemon.Listen();
  ASSERT_TRUE(AwaitAll("nvidia.com/gpu", "Healthy"));
}

TEST_F(DevicePluginMpsTest, RenamedResourceUsesItsOwnPipeDirectory) {
  h_.bus.Publish(TwoGpus());
  auto config = MpsConfig(2);
  config.sharing.rename_by_default = true;
  FakeControlDaemon daemon(ControlPath("nvidia.com/gpu.shared"));
  daemon.Listen();
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu.shared", 4));
  EXPECT_TRUE(fs::exists(h_.site.paths.kubelet_dir + "/device-plugins/nvidia-gpu.shared.sock"));
  auto ok = Allocate("nvidia.com/gpu.shared", {{"GPU-0::1"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  const auto& c = ok.response.container_responses(0);
  EXPECT_EQ(c.envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com/gpu.shared/pipe");
  EXPECT_EQ(c.envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "50");
  EXPECT_EQ(c.mounts(0).host_path(), "/run/nvidia/mps/nvidia.com/gpu.shared/pipe");
}

TEST_F(DevicePluginMpsTest, MigDevicesAreRefusedWithMps) {
  auto inv = MigNode();
  inv.gpus[1].mig_devices = {Mig(1, 0, 7, 0, "1g.10gb")};  // one profile: what `single` serves
  h_.bus.Publish(inv);
  auto config = MpsConfig(2);
  config.mig_strategy = MigStrategy::kSingle;
  FakeControlDaemon daemon(ControlPath("nvidia.com/gpu"));
  daemon.Listen();
  StartModule(config);
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto* state = h_.bus.Latest<DevicePluginState>();
    return state != nullptr && !state->error.empty();
  }));
  const auto* state = h_.bus.Latest<DevicePluginState>();
  EXPECT_EQ(state->error, "sharing using MPS is not supported for MIG devices: MIG-0-0, MIG-0-1, MIG-1-0");
  ASSERT_TRUE(AwaitCount("nvidia.com/gpu", 0));
  EXPECT_EQ(module_.health, ModuleHealth::kUnhealthy);
}

TEST_F(DevicePluginMpsTest, PassDeviceSpecsAddsTheMigCapabilityNodes) {
  fs::create_directories(h_.site.paths.host_root + "/proc/driver/nvidia-caps");
  std::ofstream(h_.site.paths.host_root + "/proc/driver/nvidia-caps/mig-minors")
      << "config 1\nmonitor 2\ngpu0/gi9/access 84\ngpu0/gi9/ci0/access 85\ngpu0/gi10/access 93\n"
         "gpu0/gi10/ci0/access 94\ngpu1/gi1/access 147\n";
  h_.bus.Publish(MigNode());
  DevicePluginModule::Config config;
  config.mig_strategy = MigStrategy::kMixed;
  config.allocation.pass_device_specs = true;
  StartModule(config);
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-1g.10gb", 2));

  auto ok = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-0-0", "MIG-0-1"}});
  ASSERT_TRUE(ok.ok()) << ok.status.ToString();
  std::vector<std::string> nodes;
  for (const auto& d : ok.response.container_responses(0).devices()) {
    EXPECT_EQ(d.host_path(), d.container_path());
    EXPECT_EQ(d.permissions(), "rw");
    nodes.push_back(d.container_path());
  }
  // The GPU's node once, then each MIG device's GPU-instance and compute-instance caps.
  EXPECT_EQ(nodes, (std::vector<std::string>{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap84",
                                             "/dev/nvidia-caps/nvidia-cap85", "/dev/nvidia-caps/nvidia-cap93",
                                             "/dev/nvidia-caps/nvidia-cap94"}));

  // GPU 1's compute instance has no entry: refused, saying which.
  ASSERT_TRUE(AwaitCount("nvidia.com/mig-3g.40gb", 1));
  auto missing = Allocate("nvidia.com/mig-3g.40gb", {{"MIG-1-0"}});
  EXPECT_EQ(missing.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(missing.status.message,
            "cannot pass the MIG capability device nodes: MIG-1-0: no gpu1/gi1/ci0/access in "
            "/proc/driver/nvidia-caps/mig-minors");

  // No mig-minors at all: refused with the path.
  fs::remove(h_.site.paths.host_root + "/proc/driver/nvidia-caps/mig-minors");
  auto unreadable = Allocate("nvidia.com/mig-1g.10gb", {{"MIG-0-0"}});
  EXPECT_EQ(unreadable.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unreadable.status.message.find("cannot read " + h_.site.paths.host_root +
                                           "/proc/driver/nvidia-caps/mig-minors"),
            std::string::npos)
      << unreadable.status.message;
}

// ---- config ----

std::string ConfigErrorOf(const std::string& yaml, MigStrategy* mig = nullptr) {
  SiteConfig site;
  const auto value = ParseYaml(yaml, "site.yaml");
  ConfigMap section(value, "modules.device-plugin");
  try {
    const auto config = DevicePluginModule::ParseConfig(section, site);
    section.Finish();
    if (mig != nullptr) *mig = config.mig_strategy;
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

TEST(DevicePluginMpsConfig, ParsesMpsWithDefaults) {
  const auto value = ParseYaml(
      "sharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n",
      "site.yaml");
  ConfigMap section(value, "modules.device-plugin");
  const auto config = DevicePluginModule::ParseConfig(section, SiteConfig{});
  section.Finish();
  EXPECT_EQ(config.sharing.strategy, SharingStrategy::kMps);
  EXPECT_TRUE(config.sharing.rename_by_default);
  EXPECT_TRUE(config.sharing.fail_requests_greater_than_one);  // forced
  ASSERT_EQ(config.sharing.resources.size(), 1u);
  EXPECT_EQ(config.sharing.resources[0].replicas, 10);
  EXPECT_EQ(config.mps.root, "/run/nvidia/mps");
  EXPECT_EQ(config.mps.check_interval, seconds(1));

  const auto custom = ParseYaml(
      "mpsRoot: /var/mps\nmpsCheckInterval: 250ms\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
      "site.yaml");
  ConfigMap custom_section(custom, "modules.device-plugin");
  const auto c2 = DevicePluginModule::ParseConfig(custom_section, SiteConfig{});
  EXPECT_EQ(c2.mps.root, "/var/mps");
  EXPECT_EQ(c2.mps.check_interval, milliseconds(250));
}

TEST(DevicePluginMpsConfig, BadMpsConfigsSayWhatIsWrong) {
  const std::string one = "    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n";
  struct Case {
    std::string yaml;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"sharing:\n  mps:\n    renameByDefault: true\n", "sharing.mps.resources: MPS needs at least one resource"},
      {"sharing:\n  mps:\n    resources: []\n", "sharing.mps.resources: MPS needs at least one resource"},
      {"sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
       "sharing.mps.resources[0].name: MPS shares whole GPUs only: must be nvidia.com/gpu, got \"nvidia.com/mig-1g.10gb\""},
      {"sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu}\n", "sharing.mps.resources[0].replicas: required key is missing"},
      {"sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1}\n",
       "sharing.mps.resources[0].replicas: MPS needs at least 2 replicas, got 1"},
      {"sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 49}\n",
       "sharing.mps.resources[0].replicas: an MPS server serves at most 48 clients per GPU"},
      {"sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n" + one,
       "sharing.mps.failRequestsGreaterThanOne: must be true with MPS"},
      {"migStrategy: mixed\nsharing:\n  mps:\n" + one, "sharing.mps: MPS is not supported with migStrategy mixed"},
      {"sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n  mps:\n" + one,
       "sharing.timeSlicing: cannot be set together with sharing.mps"},
      {"sharing:\n  mps:\n    replicas: 2\n" + one, "replicas"},  // an unknown key in sharing.mps
      {"mpsRoot: run/mps\n", "mpsRoot: must be an absolute path"},
      {"mpsCheckInterval: 1ms\n", "mpsCheckInterval"},
  };
  for (const auto& c : cases) {
    const std::string error = ConfigErrorOf(c.yaml);
    EXPECT_NE(error.find(c.error), std::string::npos) << c.yaml << "\n-> " << error;
  }
}

// Not MPS, but the same parser: the CDI hook binary.
TEST(DevicePluginCdiConfig, HookPathIsAutoAnAbsolutePathOrOff) {
  const auto parse = [](const std::string& yaml) {
    const auto value = ParseYaml(yaml, "site.yaml");
    ConfigMap section(value, "modules.device-plugin");
    return DevicePluginModule::ParseConfig(section, SiteConfig{}).cdi_hook_path;
  };
  EXPECT_EQ(parse("cdi: {enabled: true}\n"), "auto");
  EXPECT_EQ(parse("cdi: {enabled: true, hookPath: /opt/nvidia/nvidia-cdi-hook}\n"), "/opt/nvidia/nvidia-cdi-hook");
  EXPECT_EQ(parse("cdi: {enabled: true, hookPath: \"\"}\n"), "");
  const std::string error = ConfigErrorOf("cdi: {enabled: true, hookPath: bin/nvidia-cdi-hook}\n");
  EXPECT_NE(error.find("cdi.hookPath: must be \"auto\", an absolute path"), std::string::npos) << error;
}

}  // namespace
}  // namespace gns::device_plugin
