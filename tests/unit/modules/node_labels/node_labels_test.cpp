// node-labels: the label rules (GFD's names and values), and the module applying them to its
// Node at the API simulator: one server-side apply per change, nothing at steady state, labels
// it stops computing removed, the clique label taken over from imex-peers' old apply.
#include "modules/node_labels/labels.hpp"
#include "modules/node_labels/node_labels_module.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"

#if GNS_HAVE_APISERVER_SIM
#include "apiserver.h"
#include "modules/kube/client.hpp"
#endif

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>

#include <filesystem>

namespace gns::node_labels {
namespace {

gpu_inventory::GpuInventory Inventory() {
  gpu_inventory::GpuInventory inv;
  inv.available = true;
  inv.driver_version = "550.90.07";
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

device_plugin::DevicePluginState Plugin(const std::string& mig, int replicas, bool renamed) {
  device_plugin::DevicePluginState s;
  s.mig_strategy = mig;
  s.gpu_replicas = replicas;
  s.gpu_shared_renamed = renamed;
  s.sharing_strategy = replicas > 1 ? "time-slicing" : "none";
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
      {"nvidia.com/cuda.driver.major", "550"},
      {"nvidia.com/cuda.driver.minor", "90"},
      {"nvidia.com/cuda.driver.rev", "07"},
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
}

#if GNS_HAVE_APISERVER_SIM
class NodeLabelsModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnslabels-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    sim::ApiServerOptions options;
    options.state_dir = dir_ + "/api";
    server_ = std::make_unique<sim::ApiServer>(options);
    server_->Start();
    server_->Seed(nlohmann::json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node1"}}}});
    // imex-peers' apply of an earlier version owned the clique label.
    const auto old = server_->Call(
        "PATCH", "/api/v1/nodes/node1?fieldManager=imex-peers",
        R"({"apiVersion":"v1","kind":"Node","metadata":{"name":"node1","labels":{"nvidia.com/gpu.clique":"old.1"}}})",
        "application/apply-patch+yaml");
    ASSERT_EQ(old.status, 200) << old.body;
    kube::ClientConfig config;
    config.server = server_->BaseUrl();
    config.ca_pem = server_->CaPem();
    config.token_file = dir_ + "/api/token";
    config.qps = 1000;
    config.burst = 1000;
    auto log = std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::null_sink_mt>());
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
  std::unique_ptr<sim::ApiServer> server_;
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
