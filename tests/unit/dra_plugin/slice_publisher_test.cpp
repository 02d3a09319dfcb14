// The DRA plugin core's ResourceSlice publisher for a driver other than compute domains, against
// the API simulator: the slice is created under the driver's name, owned by the Node; a device
// change is written with a higher pool generation; a deleted slice (a kubelet start) comes back
// at once through the informer, above every generation written before; a failing API is retried.
#include "dra_plugin/slice_publisher.hpp"
#include "support/api_sim.hpp"
#include "support/loop_harness.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>

#include <cstdlib>

namespace gns::dra {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

const std::string kPath = "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu.nvidia.com";

std::shared_ptr<spdlog::logger> Quiet() {
  if (std::getenv("GNS_TEST_LOG")) return spdlog::default_logger()->clone("slice-publisher-test");
  return std::make_shared<spdlog::logger>("slice-publisher-test", std::make_shared<spdlog::sinks::null_sink_mt>());
}

json Gpu(int index) {
  return SliceDevice("gpu-" + std::to_string(index), {{"type", {{"string", "gpu"}}}, {"index", {{"int", index}}}},
                     {{"memory", {{"value", "80Gi"}}}}, ResourceApiVersion::kV1);
}

class SlicePublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::ApiServerOptions options;
    options.bookmark_interval = milliseconds(200);
    api_ = std::make_unique<gns::test::ApiSim>(dir_ / "api", options);
    api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-a"}}}});
    node_uid_ = api_->Call("GET", "/api/v1/nodes/node-a").Json()["metadata"]["uid"].get<std::string>();
    node_ = std::make_unique<gns::test::SimNode>(h_.loop, h_.pool, h_.clock, *api_, "node-a", "dra-gpu", Quiet());
    auto& m = node_->metrics;
    counters_ = {&m.Counter("gpu_node_supervisor_test_slice_total", "", {{"result", "created"}}),
                 &m.Counter("gpu_node_supervisor_test_slice_total", "", {{"result", "updated"}}),
                 &m.Counter("gpu_node_supervisor_test_slice_total", "", {{"result", "error"}})};
    SlicePublisher::Hooks hooks;
    hooks.devices = [this] { return devices_; };
    hooks.note = [] { return std::string("2 GPUs"); };
    hooks.on_error = [this](const std::string& error) { errors_.push_back(error); };
    hooks.on_attempt = [this] { ++attempts_; };
    publisher_ = std::make_unique<SlicePublisher>(
        *node_->context, SlicePublisher::Options{"gpu.nvidia.com", "node-a", ResourceApiVersion::kV1, std::chrono::hours(1)},
        counters_, std::move(hooks));
  }
  void TearDown() override {
    publisher_->Stop();
    publisher_.reset();
    node_->Shutdown();
    h_.Drain();
    api_->Stop();
  }
  json Slice() { return api_->Call("GET", kPath).Json(); }
  int64_t Generation() { return Slice().value(json::json_pointer("/spec/pool/generation"), int64_t{0}); }

  gns::test::LoopHarness h_;
  gns::test::TempDir dir_;
  std::unique_ptr<gns::test::ApiSim> api_;
  std::string node_uid_;
  std::unique_ptr<gns::test::SimNode> node_;
  SlicePublisher::Counters counters_;
  json devices_ = json::array({Gpu(0)});
  std::vector<std::string> errors_;
  int attempts_ = 0;
  std::unique_ptr<SlicePublisher> publisher_;
};

TEST_F(SlicePublisherTest, CreatesUpdatesAndRecreatesTheDriversSlice) {
  publisher_->Start(node_->client, node_->informers);
  ASSERT_TRUE(h_.RunUntil([&] { return publisher_->Publishes() >= 1; }));
  json slice = Slice();
  EXPECT_EQ(slice["spec"]["driver"], "gpu.nvidia.com");
  EXPECT_EQ(slice["spec"]["nodeName"], "node-a");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], node_uid_);
  EXPECT_EQ(publisher_->NodeUid(), node_uid_);
  ASSERT_EQ(slice["spec"]["devices"].size(), 1u) << slice.dump();
  EXPECT_EQ(slice["spec"]["devices"][0]["capacity"]["memory"]["value"], "80Gi");
  EXPECT_EQ(Generation(), 1);
  EXPECT_EQ(counters_.created->Value(), 1);

  // A second GPU: written over the same slice, one generation up.
  devices_.push_back(Gpu(1));
  publisher_->Publish();
  // Counted once the API has answered the write (the slice may show it a moment earlier).
  ASSERT_TRUE(h_.RunUntil([&] { return publisher_->Publishes() >= 2; }));
  EXPECT_EQ(Slice()["spec"]["devices"].size(), 2u) << Slice().dump();
  EXPECT_EQ(Generation(), 2);
  EXPECT_EQ(counters_.updated->Value(), 1);

  // A kubelet start wipes the node's slices: the informer sees it and the slice comes back,
  // above every generation written before.
  ASSERT_EQ(api_->Call("DELETE", kPath).status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return counters_.created->Value() >= 2; }));
  ASSERT_TRUE(h_.RunUntil([&] { return api_->Call("GET", kPath).status == 200; }));
  EXPECT_EQ(Generation(), 3);
  EXPECT_EQ(Slice()["spec"]["devices"].size(), 2u);
  EXPECT_TRUE(errors_.empty()) << errors_.front();
  EXPECT_EQ(counters_.errors->Value(), 0);
}

TEST_F(SlicePublisherTest, AFailedWriteIsReportedAndRetried) {
  api_->Call("DELETE", "/api/v1/nodes/node-a");  // no Node: no owner UID to write with
  publisher_->Start(node_->client, node_->informers);
  ASSERT_TRUE(h_.RunUntil([&] { return !errors_.empty(); }));
  EXPECT_NE(errors_.front().find("cannot read Node node-a"), std::string::npos) << errors_.front();
  EXPECT_GE(counters_.errors->Value(), 1);
  EXPECT_EQ(api_->Call("GET", kPath).status, 404);
  // The Node appears: the retry (500 ms) publishes without being asked again.
  api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-a"}}}});
  ASSERT_TRUE(h_.RunUntil([&] { return publisher_->Publishes() >= 1; }, std::chrono::seconds(10)));
  EXPECT_EQ(Slice()["spec"]["driver"], "gpu.nvidia.com");
  EXPECT_GE(attempts_, 2);
}

}  // namespace
}  // namespace gns::dra
