// node-labels: the label rules (GFD's names and values), and the module applying them to its
// Node at the API simulator: one server-side apply per change, nothing at steady state, labels
// it stops computing removed, the clique label taken over from imex-peers' old apply.
#include "loop/supervisor_messages.hpp"
#include "modules/node_labels/labels.hpp"
#include "modules/node_labels/node_labels_module.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"

#if GNS_HAVE_APISERVER_SIM
#include "support/api_sim.hpp"
#include "support/quiet_logger.hpp"
#include "modules/kube/api/client.hpp"
#endif

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

namespace gns::node_labels {
namespace {

gpu_inventory::GpuInventory Inventory() {
  gpu_inventory::GpuInventory inv;
  inv.available = true;
  inv.driver_version = "550.90.07";
  inv.cuda_driver_version = 12040;
  for (uint32_t i = 0; i < 8; ++i) {
    gpu_inventory::GpuInfo g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.name = "NVIDIA H100 80GB HBM3";
    g.memory_total_bytes = 85520809984ull;
    g.cc_major = 9;
    inv.gpus.push_back(g);
  }
  return inv;
}

// A MIG device as NVML describes an H100's profiles (attributes of nvmlDeviceGetAttributes_v2).
gpu_inventory::MigDeviceInfo Mig(uint32_t slot, const std::string& uuid, const std::string& profile, uint32_t slices,
                                 uint64_t mib) {
  gpu_inventory::MigDeviceInfo m;
  m.index = slot;
  m.uuid = uuid;
  m.gpu_instance = slot + 1;
  m.profile = profile;
  m.memory_bytes = mib * 1024 * 1024;
  m.multiprocessors = 16 * slices + (slices == 7 ? 20 : 0);
  m.gpu_instance_slices = slices;
  m.compute_instance_slices = slices;
  m.copy_engines = slices;
  m.decoders = slices;
  m.jpeg_engines = slices;
  m.ofa_engines = slices == 7 ? 1 : 0;
  return m;
}

// GPUs 0 and 1 in MIG mode: GPU 0 as 3g.40gb + 2 × 1g.10gb, GPU 1 as 7 × 1g.10gb when `uniform`
// is false; with `uniform` both are 7 × 1g.10gb.
gpu_inventory::GpuInventory MigInventory(bool uniform) {
  auto inv = Inventory();
  inv.gpus.resize(2);
  for (uint32_t g = 0; g < 2; ++g) {
    auto& gpu = inv.gpus[g];
    gpu.mig_enabled = true;
    if (g == 0 && !uniform) {
      gpu.mig_devices.push_back(Mig(0, "MIG-0-0", "3g.40gb", 3, 40192));
      gpu.mig_devices.push_back(Mig(1, "MIG-0-1", "1g.10gb", 1, 9856));
      gpu.mig_devices.push_back(Mig(2, "MIG-0-2", "1g.10gb", 1, 9856));
      continue;
    }
    for (uint32_t slot = 0; slot < 7; ++slot) {
      gpu.mig_devices.push_back(
          Mig(slot, "MIG-" + std::to_string(g) + "-" + std::to_string(slot), "1g.10gb", 1, 9856));
    }
  }
  return inv;
}

device_plugin::DevicePluginState Plugin(const std::string& mig, int replicas, bool renamed) {
  device_plugin::DevicePluginState s;
  s.mig_strategy = mig;
  s.gpu_replicas = replicas;
  s.gpu_shared_renamed = renamed;
  s.sharing_strategy = replicas > 1 ? "time-slicing" : "none";
  s.inventory_read = true;
  return s;
}

TEST(Labels, GpuFeatureDiscoveryNamesAndValues) {
  const auto inv = Inventory();
  const gpu_inventory::NodeClique clique{"c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64.32766", "", true};
  const auto plugin = Plugin("mixed", 1, false);
  const Labels labels = ComputeLabels(&inv, &clique, &plugin);
  const Labels expected = {
      {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
      {"nvidia.com/gpu.count", "8"},
      {"nvidia.com/gpu.memory", "81559"},
      {"nvidia.com/gpu.family", "hopper"},
      {"nvidia.com/gpu.compute.major", "9"},
      {"nvidia.com/gpu.compute.minor", "0"},
      {"nvidia.com/cuda.driver.major", "550"},
      {"nvidia.com/cuda.driver.minor", "90"},
      {"nvidia.com/cuda.driver.rev", "07"},
      {"nvidia.com/cuda.driver-version.major", "550"},
      {"nvidia.com/cuda.driver-version.minor", "90"},
      {"nvidia.com/cuda.driver-version.revision", "07"},
      {"nvidia.com/cuda.driver-version.full", "550.90.07"},
      {"nvidia.com/cuda.runtime.major", "12"},
      {"nvidia.com/cuda.runtime.minor", "4"},
      {"nvidia.com/cuda.runtime-version.major", "12"},
      {"nvidia.com/cuda.runtime-version.minor", "4"},
      {"nvidia.com/cuda.runtime-version.full", "12.4"},
      {"nvidia.com/mig.strategy", "mixed"},
      {"nvidia.com/gpu.replicas", "1"},
      {"nvidia.com/gpu.sharing-strategy", "none"},
      {"nvidia.com/gpu.clique", "c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64.32766"},
  };
  EXPECT_EQ(labels, expected);
}

TEST(Labels, TimeSlicedGpusAreSharedProductsUnlessRenamed) {
  const auto inv = Inventory();
  const auto shared = Plugin("none", 4, false);
  auto labels = ComputeLabels(&inv, nullptr, &shared);
  EXPECT_EQ(labels.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-SHARED");
  EXPECT_EQ(labels.at("nvidia.com/gpu.replicas"), "4");
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing-strategy"), "time-slicing");
  EXPECT_EQ(labels.count("nvidia.com/gpu.clique"), 0u);
  const auto renamed = Plugin("none", 4, true);
  EXPECT_EQ(ComputeLabels(&inv, nullptr, &renamed).at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
}

TEST(Labels, OnlyWhatIsKnownAndValuesKubernetesAccepts) {
  EXPECT_TRUE(ComputeLabels(nullptr, nullptr, nullptr).empty());
  const gpu_inventory::NodeClique unknown{"", "not read yet", false};
  EXPECT_TRUE(ComputeLabels(nullptr, &unknown, nullptr).empty());
  EXPECT_EQ(LabelValue("NVIDIA A100-SXM4-40GB (rev 1)"), "NVIDIA-A100-SXM4-40GB--rev-1");
  EXPECT_EQ(LabelValue(std::string(80, 'a')).size(), 63u);
  EXPECT_EQ(ArchFamily(8, 0), "ampere");
  EXPECT_EQ(ArchFamily(8, 9), "ada-lovelace");
  EXPECT_EQ(ArchFamily(7, 5), "turing");
  EXPECT_EQ(ArchFamily(10, 0), "blackwell");
  EXPECT_EQ(ArchFamily(0, 0), "undefined");
  EXPECT_EQ(ArchFamily(13, 0), "rubin");
  // GFD drops what it does not allow (no '-' for '(') and joins the words and parts with '-'.
  EXPECT_EQ(ProductName({"NVIDIA A100-SXM4-40GB (rev 1)", "MIG", "1g.5gb"}), "NVIDIA-A100-SXM4-40GB-rev-1-MIG-1g.5gb");
  EXPECT_EQ(ProductName({"  Tesla  T4 ", "", "SHARED"}), "Tesla-T4-SHARED");

  // No compute capability from NVML: no family or compute labels (GFD's rule); no CUDA
  // version from NVML: no runtime labels.
  auto inv = Inventory();
  inv.gpus[0].cc_major = 0;
  inv.cuda_driver_version = 0;
  const auto labels = ComputeLabels(&inv, nullptr, nullptr);
  EXPECT_EQ(labels.count("nvidia.com/gpu.family"), 0u);
  EXPECT_EQ(labels.count("nvidia.com/gpu.compute.major"), 0u);
  EXPECT_EQ(labels.count("nvidia.com/cuda.runtime.major"), 0u);
  EXPECT_EQ(labels.at("nvidia.com/cuda.driver.major"), "550");
  EXPECT_EQ(labels.count("nvidia.com/gpu.replicas"), 0u) << "no plugin state: no sharing labels";
}

TEST(Labels, MigStrategyNoneHasNoStrategyLabelAndMigEnabledGpusAreNotShared) {
  const auto inv = MigInventory(true);
  const auto plugin = Plugin("none", 4, false);
  const Labels labels = ComputeLabels(&inv, nullptr, &plugin);
  EXPECT_EQ(labels.count("nvidia.com/mig.strategy"), 0u);
  // GFD: nvidia.com/gpu's sharing applies to whole GPUs; a model whose GPUs are all in MIG
  // mode gets replicas 0 and no "-SHARED".
  EXPECT_EQ(labels.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(labels.at("nvidia.com/gpu.replicas"), "0");
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing-strategy"), "none");
  EXPECT_EQ(labels.at("nvidia.com/gpu.count"), "2");
  for (const auto& [key, value] : labels) EXPECT_EQ(key.rfind("nvidia.com/mig-", 0), std::string::npos) << key;
  // One GPU of the model outside MIG mode: the whole-GPU labels carry the sharing again.
  auto mixed_modes = inv;
  mixed_modes.gpus[1].mig_enabled = false;
  mixed_modes.gpus[1].mig_devices.clear();
  const Labels whole = ComputeLabels(&mixed_modes, nullptr, &plugin);
  EXPECT_EQ(whole.at("nvidia.com/gpu.replicas"), "4");
  EXPECT_EQ(whole.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-SHARED");
}

TEST(Labels, MigStrategySingleDescribesTheProfileAsTheGpu) {
  const auto inv = MigInventory(true);
  const auto plugin = Plugin("single", 1, false);
  const Labels labels = ComputeLabels(&inv, nullptr, &plugin);
  const Labels expected = {
      {"nvidia.com/mig.strategy", "single"},
      {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},
      {"nvidia.com/gpu.count", "14"},
      {"nvidia.com/gpu.replicas", "1"},
      {"nvidia.com/gpu.sharing-strategy", "none"},
      {"nvidia.com/gpu.memory", "9856"},
      {"nvidia.com/gpu.multiprocessors", "16"},
      {"nvidia.com/gpu.slices.gi", "1"},
      {"nvidia.com/gpu.slices.ci", "1"},
      {"nvidia.com/gpu.engines.copy", "1"},
      {"nvidia.com/gpu.engines.decoder", "1"},
      {"nvidia.com/gpu.engines.encoder", "0"},
      {"nvidia.com/gpu.engines.jpeg", "1"},
      {"nvidia.com/gpu.engines.ofa", "0"},
      // The architecture stays the parent GPU's.
      {"nvidia.com/gpu.family", "hopper"},
      {"nvidia.com/gpu.compute.major", "9"},
      {"nvidia.com/gpu.compute.minor", "0"},
  };
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(labels.contains(key)) << key;
    EXPECT_EQ(labels.at(key), value) << key;
  }
  // Time-sliced MIG devices under single: nvidia.com/gpu's replicas, "-SHARED" unless renamed.
  const auto shared = Plugin("single", 2, false);
  const Labels s = ComputeLabels(&inv, nullptr, &shared);
  EXPECT_EQ(s.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED");
  EXPECT_EQ(s.at("nvidia.com/gpu.replicas"), "2");
  EXPECT_EQ(s.at("nvidia.com/gpu.sharing-strategy"), "time-slicing");

  // Two profiles, a MIG-enabled GPU with no MIG devices, or a GPU outside MIG mode beside MIG
  // ones: GFD's invalid set.
  auto two_profiles = MigInventory(false);
  auto empty_gpu = inv;
  empty_gpu.gpus[1].mig_devices.clear();
  auto outside = inv;
  outside.gpus[1].mig_enabled = false;
  outside.gpus[1].mig_devices.clear();
  for (const auto* bad : {&two_profiles, &empty_gpu, &outside}) {
    const Labels invalid = ComputeLabels(bad, nullptr, &plugin);
    EXPECT_EQ(invalid.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3-MIG-INVALID");
    EXPECT_EQ(invalid.at("nvidia.com/gpu.count"), "0");
    EXPECT_EQ(invalid.at("nvidia.com/gpu.replicas"), "0");
    EXPECT_EQ(invalid.at("nvidia.com/gpu.sharing-strategy"), "");
    EXPECT_EQ(invalid.at("nvidia.com/gpu.memory"), "0");
    EXPECT_EQ(invalid.count("nvidia.com/gpu.slices.gi"), 0u);
  }
  // No GPU in MIG mode: the whole-GPU labels stand.
  const auto whole = Inventory();
  EXPECT_EQ(ComputeLabels(&whole, nullptr, &plugin).at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
}

TEST(Labels, MigStrategyMixedLabelsEachProfile) {
  const auto inv = MigInventory(false);
  auto plugin = Plugin("mixed", 1, false);
  // The plugin time-slices 1g.10gb (renamed) and serves 3g.40gb plainly; IDs by index here.
  device_plugin::DevicePluginState::Resource small;
  small.name = "nvidia.com/mig-1g.10gb.shared";
  small.replicas = 3;
  small.device_ids = {"0:1::0", "0:1::1", "0:1::2"};
  device_plugin::DevicePluginState::Resource large;
  large.name = "nvidia.com/mig-3g.40gb";
  large.device_ids = {"MIG-0-0"};
  plugin.resources = {small, large};
  plugin.sharing_strategy = "time-slicing";
  const Labels labels = ComputeLabels(&inv, nullptr, &plugin);
  const Labels expected = {
      {"nvidia.com/mig.strategy", "mixed"},
      {"nvidia.com/mig-3g.40gb.product", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"},
      {"nvidia.com/mig-3g.40gb.count", "1"},
      {"nvidia.com/mig-3g.40gb.replicas", "1"},
      {"nvidia.com/mig-3g.40gb.sharing-strategy", "none"},
      {"nvidia.com/mig-3g.40gb.memory", "40192"},
      {"nvidia.com/mig-3g.40gb.multiprocessors", "48"},
      {"nvidia.com/mig-3g.40gb.slices.gi", "3"},
      {"nvidia.com/mig-3g.40gb.slices.ci", "3"},
      {"nvidia.com/mig-3g.40gb.engines.copy", "3"},
      {"nvidia.com/mig-3g.40gb.engines.decoder", "3"},
      {"nvidia.com/mig-3g.40gb.engines.encoder", "0"},
      {"nvidia.com/mig-3g.40gb.engines.jpeg", "3"},
      {"nvidia.com/mig-3g.40gb.engines.ofa", "0"},
      {"nvidia.com/mig-1g.10gb.product", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},  // renamed: no -SHARED
      {"nvidia.com/mig-1g.10gb.count", "9"},
      {"nvidia.com/mig-1g.10gb.replicas", "3"},
      {"nvidia.com/mig-1g.10gb.sharing-strategy", "time-slicing"},
      {"nvidia.com/mig-1g.10gb.memory", "9856"},
      {"nvidia.com/mig-1g.10gb.slices.gi", "1"},
  };
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(labels.contains(key)) << key;
    EXPECT_EQ(labels.at(key), value) << key;
  }
  std::set<std::string> profiles;
  for (const auto& [key, value] : labels) {
    if (key.rfind("nvidia.com/mig-", 0) == 0) profiles.insert(key.substr(0, key.find('.', 15)));
  }
  EXPECT_EQ(profiles, (std::set<std::string>{"nvidia.com/mig-1g", "nvidia.com/mig-3g"}));
  EXPECT_EQ(labels.count("nvidia.com/gpu.slices.gi"), 0u) << "mixed: nvidia.com/gpu.* stay the whole GPU's";
  EXPECT_EQ(labels.at("nvidia.com/gpu.memory"), "81559");
  // Not renamed: the product says it is shared.
  plugin.resources[0].name = "nvidia.com/mig-1g.10gb";
  EXPECT_EQ(ComputeLabels(&inv, nullptr, &plugin).at("nvidia.com/mig-1g.10gb.product"),
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED");
}

#if GNS_HAVE_APISERVER_SIM
class NodeLabelsModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnslabels-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    server_ = std::make_unique<gns::test::ApiSim>(dir_ + "/api");
    server_->Seed(nlohmann::json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node1"}}}});
    // imex-peers' apply of an earlier version owned the clique label.
    const auto old = server_->Call(
        "PATCH", "/api/v1/nodes/node1?fieldManager=imex-peers",
        R"({"apiVersion":"v1","kind":"Node","metadata":{"name":"node1","labels":{"nvidia.com/gpu.clique":"old.1"}}})",
        "application/apply-patch+yaml");
    ASSERT_EQ(old.status, 200) << old.body;
    kube::ClientConfig config = server_->ClientConfig();
    const auto log = gns::test::QuietLogger("node-labels-test");
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, log}, config);
    h_.services.Provide<kube::KubeClient>(client_);
    h_.site.node_name = "node1";
    state_sub_ = h_.bus.Subscribe<NodeLabelsState>([this](const NodeLabelsState& s) { state_ = s; });
  }

  void TearDown() override {
    module_.Stop();
    state_sub_.Reset();
    h_.services.Withdraw<kube::KubeClient>();
    client_->Shutdown();
    h_.Drain();
    server_->Stop();
    std::filesystem::remove_all(dir_);
  }

  nlohmann::json NodeLabels() {
    return server_->Call("GET", "/api/v1/nodes/node1").Json()["metadata"].value("labels", nlohmann::json::object());
  }

  test::LoopHarness h_;
  std::string dir_;
  std::unique_ptr<gns::test::ApiSim> server_;
  std::shared_ptr<kube::KubeClient> client_;
  test::ModuleUnderTest<NodeLabelsModule> module_{h_};
  std::optional<NodeLabelsState> state_;
  Subscription state_sub_;
};

TEST_F(NodeLabelsModuleTest, OneApplyPerChangeNothingAtSteadyStateAndDroppedLabelsRemoved) {
  h_.bus.Publish(Inventory());
  h_.bus.Publish(gpu_inventory::NodeClique{"c1.7", "", true});
  h_.bus.Publish(Plugin("mixed", 1, false));
  server_->ResetRequestCounts();
  module_.Start({});
  ASSERT_TRUE(h_.RunUntil([&] { return state_ && state_->applies >= 1; }));
  h_.Drain();
  auto labels = NodeLabels();
  EXPECT_EQ(labels["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(labels["nvidia.com/mig.strategy"], "mixed");
  // Taken over from imex-peers' old apply: one writer now.
  EXPECT_EQ(labels["nvidia.com/gpu.clique"], "c1.7");
  EXPECT_EQ(server_->RequestCount("patch"), 1u) << "the three inputs arrived before start: one apply";

  // The same facts again: no request.
  h_.bus.Publish(Inventory());
  h_.bus.Publish(Plugin("mixed", 1, false));
  h_.Drain();
  EXPECT_EQ(server_->RequestCount("patch"), 1u);

  // Time-slicing turned on, and the node leaves its clique: one apply; the clique label goes.
  h_.bus.Publish(Plugin("mixed", 4, true));
  h_.bus.Publish(gpu_inventory::NodeClique{"", "no fabric", true});
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto& a = state_->applied;
    return a.count("nvidia.com/gpu.clique") == 0 && a.count("nvidia.com/gpu.replicas") != 0 &&
           a.at("nvidia.com/gpu.replicas") == "4";
  }));
  EXPECT_EQ(server_->RequestCount("patch"), 2u) << "two inputs changed in one loop turn: one apply";
  labels = NodeLabels();
  EXPECT_FALSE(labels.contains("nvidia.com/gpu.clique")) << labels.dump();
  EXPECT_EQ(labels["nvidia.com/gpu.replicas"], "4");
  EXPECT_EQ(labels["nvidia.com/gpu.sharing-strategy"], "time-slicing");
}

// Per-profile MIG labels at the API server; a MIG reconfiguration that removes a profile
// removes its labels with the same one apply.
TEST_F(NodeLabelsModuleTest, MigProfileLabelsFollowTheLayout) {
  h_.bus.Publish(MigInventory(false));
  h_.bus.Publish(Plugin("mixed", 1, false));
  module_.Start({});
  ASSERT_TRUE(h_.RunUntil([&] { return state_ && state_->applies >= 1; }));
  h_.Drain();
  auto labels = NodeLabels();
  EXPECT_EQ(labels["nvidia.com/mig.strategy"], "mixed");
  EXPECT_EQ(labels["nvidia.com/mig-3g.40gb.count"], "1");
  EXPECT_EQ(labels["nvidia.com/mig-3g.40gb.engines.copy"], "3");
  EXPECT_EQ(labels["nvidia.com/mig-1g.10gb.count"], "9");
  EXPECT_EQ(labels["nvidia.com/gpu.compute.major"], "9");
  EXPECT_EQ(labels["nvidia.com/cuda.runtime.major"], "12");
  server_->ResetRequestCounts();

  // GPU 0 recut as 7 × 1g.10gb: the 3g.40gb labels go.
  h_.bus.Publish(MigInventory(true));
  ASSERT_TRUE(h_.RunUntil([&] { return state_->applied.count("nvidia.com/mig-3g.40gb.count") == 0; }));
  h_.Drain();
  labels = NodeLabels();
  for (const auto& [key, value] : labels.items()) EXPECT_EQ(key.rfind("nvidia.com/mig-3g", 0), std::string::npos) << key;
  EXPECT_EQ(labels["nvidia.com/mig-1g.10gb.count"], "14");
  EXPECT_EQ(server_->RequestCount("patch"), 1u);
}

// Under mig.strategy single the device plugin's state (the strategy, from its config) is there
// before the GPUs are read, and NVML may be down at start. A server-side apply of what is known
// then would carry nvidia.com/mig.strategy alone and remove every other label our field
// manager owns. Nothing is applied before every input is known; then one apply.
TEST_F(NodeLabelsModuleTest, NothingIsAppliedBeforeEveryInputIsKnownSoOurLabelsNeverVanish) {
  // An earlier run of ours labelled the node.
  const nlohmann::json earlier = {{"apiVersion", "v1"}, {"kind", "Node"},
                                  {"metadata", {{"name", "node1"}, {"labels", {{"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},
                                                                                {"nvidia.com/gpu.count", "14"},
                                                                                {"nvidia.com/cuda.driver.major", "550"},
                                                                                {"nvidia.com/mig.strategy", "single"}}}}}};
  ASSERT_EQ(server_->Call("PATCH", "/api/v1/nodes/node1?fieldManager=gpu-node-supervisor-labels&force=true",
                          earlier.dump(), "application/apply-patch+yaml").status, 200);
  ModuleStates enabled;
  for (const char* name : {"kube", "gpu-inventory", "device-plugin", "node-labels"}) {
    ModuleStatus m;
    m.name = name;
    enabled.modules.push_back(m);
  }
  h_.bus.Publish(enabled);
  // What the other modules have published when node-labels starts: the plugin's state before
  // it read the GPUs, NVML down, the clique not read.
  auto before = Plugin("single", 1, false);
  before.inventory_read = false;
  h_.bus.Publish(before);
  gpu_inventory::GpuInventory down;
  down.available = false;
  down.error = "NVML: Driver Not Loaded";
  h_.bus.Publish(down);
  h_.bus.Publish(gpu_inventory::NodeClique{"", "NVML unavailable", false});
  server_->ResetRequestCounts();
  module_.Start({});
  ASSERT_TRUE(h_.RunUntil([&] { return state_ && !state_->waiting_for.empty(); }));
  h_.Drain();
  EXPECT_NE(state_->waiting_for.find("GPU inventory"), std::string::npos) << state_->waiting_for;
  EXPECT_EQ(NodeLabels()["nvidia.com/gpu.count"], "14") << "an earlier run's labels stay while NVML is down";

  // NVML comes up: the inventory, the clique, then the plugin's state from those GPUs.
  h_.bus.Publish(MigInventory(true));
  h_.bus.Publish(gpu_inventory::NodeClique{"", "no fabric", true});
  h_.Drain();
  h_.bus.Publish(Plugin("single", 1, false));
  ASSERT_TRUE(h_.RunUntil([&] { return state_->applies >= 1; }));
  h_.Drain();
  EXPECT_EQ(server_->RequestCount("patch"), 1u) << "one apply, once everything was known";
  auto labels = NodeLabels();
  EXPECT_EQ(labels["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb");
  EXPECT_EQ(labels["nvidia.com/gpu.count"], "14");
  EXPECT_EQ(labels["nvidia.com/cuda.driver.major"], "550");
  EXPECT_EQ(labels["nvidia.com/mig.strategy"], "single");
  EXPECT_TRUE(state_->waiting_for.empty());
}

// Under mixed, a time-sliced profile's labels come from the plugin's resources, which it knows
// only once it has read the GPUs: its state from before that must not relabel the profile.
TEST_F(NodeLabelsModuleTest, APluginStateFromBeforeItReadTheGpusChangesNoLabel) {
  auto shared = Plugin("mixed", 1, false);
  shared.sharing_strategy = "time-slicing";
  device_plugin::DevicePluginState::Resource r;
  r.name = "nvidia.com/mig-1g.10gb";
  r.replicas = 2;
  for (const char* id : {"MIG-0-0::0", "MIG-0-0::1"}) r.device_ids.push_back(id);
  shared.resources.push_back(r);
  h_.bus.Publish(MigInventory(true));
  h_.bus.Publish(gpu_inventory::NodeClique{"", "no fabric", true});
  h_.bus.Publish(shared);
  module_.Start({});
  ASSERT_TRUE(h_.RunUntil([&] { return state_ && state_->applies >= 1; }));
  h_.Drain();
  EXPECT_EQ(NodeLabels()["nvidia.com/mig-1g.10gb.replicas"], "2");
  server_->ResetRequestCounts();
  auto restarted = shared;  // the same config, no resources read yet
  restarted.resources.clear();
  restarted.inventory_read = false;
  h_.bus.Publish(restarted);
  h_.Drain();
  h_.bus.Publish(shared);
  h_.Drain();
  // A real change after them: its apply is the only one.
  h_.bus.Publish(gpu_inventory::NodeClique{"c1.7", "", true});
  ASSERT_TRUE(h_.RunUntil([&] { return state_->applied.count("nvidia.com/gpu.clique") != 0; }));
  h_.Drain();
  EXPECT_EQ(server_->RequestCount("patch"), 1u);
  EXPECT_EQ(NodeLabels()["nvidia.com/mig-1g.10gb.product"], "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED");
}

TEST_F(NodeLabelsModuleTest, AFailedApplyIsRetriedWithBackoff) {
  h_.bus.Publish(Inventory());
  // A 500 on a write: the kube client hands it back (it may have been applied), so the module's
  // own retry is what recovers. (A 503 or 429 the client retries itself.)
  server_->FailNextRequests(500, 1, "/nodes/node1");
  NodeLabelsModule::Config config;
  config.retry.initial = std::chrono::milliseconds(20);
  module_.Start(config);
  ASSERT_TRUE(h_.RunUntil([&] { return state_ && state_->applies == 1; }));
  EXPECT_EQ(NodeLabels()["nvidia.com/gpu.count"], "8");
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_node_labels_apply_failures_total", "").Value(), 1);
}
#endif

}  // namespace
}  // namespace gns::node_labels
