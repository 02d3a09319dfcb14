// The pod-resources module end to end: the kubelet simulator's PodResourcesLister over real gRPC
// on its unix socket, and the API simulator serving the node's pods (list/watch with the
// spec.nodeName field selector, merge patches). Covers the annotation written once and only on
// change, its removal, a deleted pod, the socket absent then appearing, a kubelet restart,
// unknown device IDs, and no API request at steady state.
#include "support/api_sim.hpp"
#include "kubelet_sim.h"
#include "loop/config.hpp"
#include "modules/dra_gpu/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/pod_resources/messages.hpp"
#include "modules/pod_resources/pod_resources_module.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/prometheus.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace gns::pod_resources {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kNode = "gpu-node-3";
constexpr const char* kNs = "ml";
const std::string kPods = "/api/v1/namespaces/ml/pods";

std::string Devices(std::vector<std::string> ids) {
  json list = ids;
  return json{{"devices", {{"nvidia.com/gpu", list}}}}.dump();
}

class PodResourcesModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unix socket paths must stay short: a directory of our own under /tmp.
    char tmpl[] = "/tmp/gnspr-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    h_.site.node_name = kNode;
    h_.site.paths.kubelet_dir = (dir_ / "k").string();

    sim::ApiServerOptions api_options;
    api_options.bookmark_interval = std::chrono::milliseconds(200);
    api_ = std::make_unique<gns::test::ApiSim>(dir_ / "api", api_options);
    kube::ClientConfig config = api_->ClientConfig();
    config.request_timeout = std::chrono::milliseconds(5000);
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, test::QuietLogger("pod-resources-test")},
                                                 config);
    informers_ = std::make_shared<kube::InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics, test::QuietLogger("pod-resources-test"));
    h_.services.Provide<kube::KubeClient>(client_);
    h_.services.Provide<kube::InformerRegistry>(informers_);

    sim_options_.kubelet_dir = dir_ / "k";
  }

  void TearDown() override {
    module_.Stop();
    sim_.reset();
    informers_->StopAll();
    client_->Shutdown();
    h_.Drain();
    api_->Stop();
    fs::remove_all(dir_);
  }

  void StartKubelet() {
    sim_ = std::make_unique<sim::KubeletSim>(sim_options_);
    sim_->Start();
  }

  PodResourcesModule::Config ModuleConfig() {
    PodResourcesModule::Config config;
    config.socket = (dir_ / "k/pod-resources/kubelet.sock").string();
    config.coalesce = std::chrono::milliseconds(10);
    config.retry_max = std::chrono::milliseconds(200);
    config.call_timeout = std::chrono::milliseconds(2000);
    return config;
  }

  void StartModule() { StartModule(ModuleConfig()); }
  void StartModule(const PodResourcesModule::Config& config) {
    module_.Start(config);
    h_.Drain();
  }

  std::string SeedPod(const std::string& name, const std::string& node = kNode) {
    api_->Seed(json{{"apiVersion", "v1"},
                    {"kind", "Pod"},
                    {"metadata", {{"name", name}, {"namespace", kNs}}},
                    {"spec", {{"nodeName", node}, {"containers", {{{"name", "main"}, {"image", "cuda"}}}}}},
                    {"status", {{"phase", "Running"}}}});
    return Pod(name)["metadata"]["uid"].get<std::string>();
  }

  json Pod(const std::string& name) { return api_->Call("GET", kPods + "/" + name).Json(); }

  // The pod's annotation as the API server holds it; "" when absent (or the pod is gone).
  std::string Annotation(const std::string& name) {
    const auto response = api_->Call("GET", kPods + "/" + name);
    if (response.status != 200) return "";
    const json pod = response.Json();
    const json::json_pointer ptr("/metadata/annotations/dgxc.nvidia.com~1devices");
    return pod.contains(ptr) ? pod.at(ptr).get<std::string>() : "";
  }

  bool WaitAnnotation(const std::string& name, const std::string& value) {
    return h_.RunUntil([&] { return Annotation(name) == value; });
  }

  const GpuPodMap* Map() { return h_.bus.Latest<GpuPodMap>(); }

  // The pod as the module's informer (the same one: one per spec) shows it; null if not cached.
  std::shared_ptr<const json> Cached(const std::string& name) {
    const kube::InformerSpec spec{kube::ResourcePath::Core("pods").Collection(), "",
                                  std::string("spec.nodeName=") + kNode};
    return informers_->Acquire(spec)->Get(std::string(kNs) + "/" + name);
  }
  // Waits until the watch has delivered the pod with this annotation value ("" = none).
  bool WaitCached(const std::string& name, const std::string& value) {
    return h_.RunUntil([&] {
      const auto pod = Cached(name);
      if (!pod) return false;
      const json::json_pointer ptr("/metadata/annotations/dgxc.nvidia.com~1devices");
      return (pod->contains(ptr) ? pod->at(ptr).get<std::string>() : "") == value;
    });
  }

  // What our device plugin publishes after it answered Allocate.
  void Allocated(std::vector<std::string> ids) {
    h_.bus.Publish(pod_resources::DevicesAllocated{"nvidia.com/gpu", std::move(ids)});
  }

  // A series' value ("name" or "name{labels}"), 0 when it was never written.
  double Metric(const std::string& name, const std::string& labels = "") {
    const auto scrape = test::ParsePrometheus(h_.metrics.Render());
    const auto it = scrape.samples.find(labels.empty() ? name : name + "{" + labels + "}");
    return it == scrape.samples.end() ? 0 : it->second;
  }

  test::LoopHarness h_;
  fs::path dir_;
  std::unique_ptr<gns::test::ApiSim> api_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  sim::KubeletSimOptions sim_options_;
  std::unique_ptr<sim::KubeletSim> sim_;
  test::ModuleUnderTest<PodResourcesModule> module_{h_};
};

TEST_F(PodResourcesModuleTest, AnnotatesThePodThatHoldsAGpuAndMapsTheGpuToIt) {
  const std::string uid = SeedPod("trainer");
  SeedPod("web");  // holds nothing: never touched
  SeedPod("elsewhere", "other-node");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "trainer", "main", "nvidia.com/gpu", {"GPU-1", "GPU-0"});
  StartModule();

  ASSERT_TRUE(WaitAnnotation("trainer", Devices({"GPU-0", "GPU-1"})));
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->Holders("GPU-0").size() == 1 && !Map()->Holders("GPU-0")[0].uid.empty(); }));
  const auto holder = Map()->Holders("GPU-1").at(0);
  EXPECT_EQ(holder, (PodContainerRef{kNs, "trainer", uid, "main", "nvidia.com/gpu"}));
  EXPECT_TRUE(Map()->fresh);
  EXPECT_EQ(Annotation("web"), "");
  EXPECT_EQ(api_->RequestCount("patch"), 1u);
  EXPECT_EQ(module_.health, ModuleHealth::kOk);
}

// Connected sockets whose address is `path` (the kubelet's ends of our connections to it), from
// /proc/net/unix: flags, type, state 03 (connected), then the path.
int ConnectionsTo(const std::string& path) {
  std::ifstream table("/proc/net/unix");
  std::string line;
  int count = 0;
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string num, refs, protocol, flags, type, state, inode, name;
    if (fields >> num >> refs >> protocol >> flags >> type >> state >> inode >> name && state == "03" &&
        name == path) {
      ++count;
    }
  }
  return count;
}

// Between Lists no connection to the kubelet is held: an idle gRPC channel costs wake-ups at
// rest (its backup poller's timer), and the next List dials anew (issue #23 item 8).
TEST_F(PodResourcesModuleTest, NoConnectionToTheKubeletIsHeldBetweenLists) {
  SeedPod("trainer");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "trainer", "main", "nvidia.com/gpu", {"GPU-0"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("trainer", Devices({"GPU-0"})));
  const std::string socket = ModuleConfig().socket;
  EXPECT_TRUE(h_.RunUntil([&] { return ConnectionsTo(socket) == 0; }, std::chrono::seconds(10)))
      << ConnectionsTo(socket) << " connection(s) still open to " << socket;

  // The next List dials again and is answered.
  Allocated({"GPU-0"});
  sim_->InjectPodDevices(kNs, "trainer", "main", "nvidia.com/gpu", {"GPU-0", "GPU-1"});
  ASSERT_TRUE(WaitAnnotation("trainer", Devices({"GPU-0", "GPU-1"})));
  EXPECT_TRUE(h_.RunUntil([&] { return ConnectionsTo(socket) == 0; }, std::chrono::seconds(10)));
}

TEST_F(PodResourcesModuleTest, AnAllocationForARunningPodIsAnnotatedAndSteadyStateMakesNoRequests) {
  SeedPod("a");
  SeedPod("b");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "a", "main", "nvidia.com/gpu", {"GPU-0"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("a", Devices({"GPU-0"})));

  // The kubelet admits b: our plugin's Allocate answer, then the kubelet records it.
  Allocated({"GPU-5"});
  sim_->InjectPodDevices(kNs, "b", "main", "nvidia.com/gpu", {"GPU-5"});
  ASSERT_TRUE(WaitAnnotation("b", Devices({"GPU-5"})));
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->Holders("GPU-5").size() == 1; }));

  // Steady state: Lists keep coming (triggers, resync) but nothing changes, so no API request
  // beyond the open watch.
  ASSERT_TRUE(h_.RunUntil([&] { return api_->RequestCount("patch") == 2; }));
  ASSERT_TRUE(WaitCached("a", Devices({"GPU-0"})));  // the watch echoes of both writes
  ASSERT_TRUE(WaitCached("b", Devices({"GPU-5"})));
  api_->ResetRequestCounts();
  const auto lists_before = sim_->State().pod_resources_lists;
  for (int i = 0; i < 5; ++i) {
    Allocated({"GPU-0"});  // already held: a List, no change
    const auto target = lists_before + static_cast<uint64_t>(i) + 1;
    ASSERT_TRUE(h_.RunUntil([&] { return sim_->State().pod_resources_lists >= target; }));
  }
  h_.Drain();
  EXPECT_EQ(api_->TotalRequests() - api_->RequestCount("watch"), 0u) << json(api_->RequestCounts()).dump();
}

// The List loop is a coroutine per Start, holding a ticket of the module's gate, which Stop
// renews. The run of an instance stopped while it waited for its next List must end there: if it
// went on beside the run of the instance's next Start, every trigger would List twice.
TEST_F(PodResourcesModuleTest, AnInstanceStoppedAndStartedAgainListsOncePerTrigger) {
  SeedPod("trainer");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "trainer", "main", "nvidia.com/gpu", {"GPU-0"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("trainer", Devices({"GPU-0"})));
  bool stopped = false;
  module_->Stop([&stopped] { stopped = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
  const auto before_start = sim_->State().pod_resources_lists;
  module_->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return sim_->State().pod_resources_lists > before_start; }));  // the start's List
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(300));  // whatever else the start asked for

  const auto lists_before = sim_->State().pod_resources_lists;
  for (uint64_t i = 1; i <= 3; ++i) {
    Allocated({"GPU-0"});  // already held: one List, no change
    ASSERT_TRUE(h_.RunUntil([&] { return sim_->State().pod_resources_lists >= lists_before + i; }));
    h_.RunUntil([] { return false; }, std::chrono::milliseconds(200));  // room for a second List (coalesce: 10 ms)
    EXPECT_EQ(sim_->State().pod_resources_lists, lists_before + i);
  }
}

TEST_F(PodResourcesModuleTest, APodThatNoLongerHoldsGpusLosesTheAnnotation) {
  SeedPod("job");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "job", "main", "nvidia.com/gpu", {"GPU-3"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("job", Devices({"GPU-3"})));

  // The pod's containers end: the kubelet no longer reports it, and its status changes.
  ASSERT_TRUE(sim_->ForgetPod(kNs, "job"));
  ASSERT_EQ(api_->Call("PATCH", kPods + "/job/status", R"({"status":{"phase":"Succeeded"}})",
                       "application/merge-patch+json")
                .status,
            200);
  ASSERT_TRUE(WaitAnnotation("job", ""));
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->Holders("GPU-3").empty(); }));
  EXPECT_TRUE(h_.RunUntil([&] {
    return Metric("gpu_node_supervisor_pod_resources_annotation_writes_total", "result=\"removed\"") == 1;
  }));
}

TEST_F(PodResourcesModuleTest, ADeletedPodLeavesTheMapWithoutAnyWrite) {
  SeedPod("gone");
  // Held by a finalizer, so the deletion goes as a kubelet sees it: deletionTimestamp first, the
  // containers end, then the object goes.
  ASSERT_EQ(api_->Call("PATCH", kPods + "/gone", R"({"metadata":{"finalizers":["test/hold"]}})",
                       "application/merge-patch+json")
                .status,
            200);
  StartKubelet();
  sim_->InjectPodDevices(kNs, "gone", "main", "nvidia.com/gpu", {"GPU-2"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("gone", Devices({"GPU-2"})));
  ASSERT_TRUE(h_.RunUntil([&] {
    return Metric("gpu_node_supervisor_pod_resources_annotation_writes_total", "result=\"set\"") == 1;
  }));
  api_->ResetRequestCounts();

  ASSERT_EQ(api_->Call("DELETE", kPods + "/gone").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] {  // the module's informer sees it terminating
    const auto pod = Cached("gone");
    return pod && pod->at("metadata").contains("deletionTimestamp");
  }));
  sim_->ForgetPod(kNs, "gone");
  ASSERT_EQ(api_->Call("PATCH", kPods + "/gone", R"({"metadata":{"finalizers":null}})", "application/merge-patch+json")
                .status,
            200);
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->gpus.empty(); }));
  h_.Drain();
  EXPECT_EQ(api_->RequestCount("patch"), 0u);
  EXPECT_EQ(Metric("gpu_node_supervisor_pod_resources_annotation_writes_total", "result=\"error\""), 0);
}

TEST_F(PodResourcesModuleTest, SomeoneElseRemovingTheAnnotationGetsItBack) {
  SeedPod("p");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "p", "main", "nvidia.com/gpu", {"GPU-4"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("p", Devices({"GPU-4"})));
  ASSERT_TRUE(WaitCached("p", Devices({"GPU-4"})));  // the echo of our write
  ASSERT_EQ(api_->Call("PATCH", kPods + "/p", R"({"metadata":{"annotations":{"dgxc.nvidia.com/devices":null}}})",
                       "application/merge-patch+json")
                .status,
            200);
  EXPECT_TRUE(WaitAnnotation("p", Devices({"GPU-4"})));
}

TEST_F(PodResourcesModuleTest, ASocketThatIsAbsentThenAppearsDegradesThenServes) {
  SeedPod("late");
  sim_options_.serve_pod_resources = false;
  StartKubelet();
  sim_->InjectPodDevices(kNs, "late", "main", "nvidia.com/gpu", {"GPU-6"});
  StartModule();

  ASSERT_TRUE(h_.RunUntil([&] { return Metric("gpu_node_supervisor_pod_resources_lists_total", "result=\"error\"") >= 2; }));
  EXPECT_EQ(module_.health, ModuleHealth::kDegraded);
  EXPECT_NE(module_.health_detail.find("pod-resources/kubelet.sock"), std::string::npos) << module_.health_detail;
  EXPECT_TRUE(module_.failures.empty());
  ASSERT_NE(Map(), nullptr);
  EXPECT_FALSE(Map()->fresh);
  EXPECT_EQ(Annotation("late"), "");

  sim_->StartPodResources();
  ASSERT_TRUE(WaitAnnotation("late", Devices({"GPU-6"})));
  ASSERT_TRUE(h_.RunUntil([&] { return module_.health == ModuleHealth::kOk; }));
  EXPECT_TRUE(Map()->fresh);
}

TEST_F(PodResourcesModuleTest, AKubeletRestartIsFollowed) {
  SeedPod("before");
  SeedPod("after");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "before", "main", "nvidia.com/gpu", {"GPU-0"});
  StartModule();
  ASSERT_TRUE(WaitAnnotation("before", Devices({"GPU-0"})));

  sim_->Restart();  // the socket goes away and comes back
  sim_->InjectPodDevices(kNs, "after", "main", "nvidia.com/gpu", {"GPU-1"});
  Allocated({"GPU-1"});
  ASSERT_TRUE(WaitAnnotation("after", Devices({"GPU-1"})));
  EXPECT_EQ(Annotation("before"), Devices({"GPU-0"}));
}

TEST_F(PodResourcesModuleTest, UnknownDeviceIdsAreLeftOutAndCounted) {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  inventory.gpus.emplace_back().uuid = "GPU-0";
  h_.bus.Publish(inventory);
  SeedPod("good");
  SeedPod("odd");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "good", "main", "nvidia.com/gpu", {"GPU-0"});
  sim_->InjectPodDevices(kNs, "odd", "main", "nvidia.com/gpu", {"GPU-not-here"});
  sim_->InjectPodDevices("", "", "main", "nvidia.com/gpu", {"GPU-0"});  // a nameless entry
  StartModule();
  ASSERT_TRUE(WaitAnnotation("good", Devices({"GPU-0"})));
  EXPECT_EQ(Annotation("odd"), "");
  EXPECT_EQ(Map()->gpus.count("GPU-not-here"), 0u);
  EXPECT_EQ(Metric("gpu_node_supervisor_pod_resources_list_problems_total"), 2);
  EXPECT_EQ(module_.health, ModuleHealth::kOk);
}

// The device plugin's MIG strategies hand out MIG UUIDs, time-slicing hands out "<uuid>::<n>":
// with the inventory known, both reach the map under the device they stand for (two pods on
// one GPU: two holders of that GPU), and leave it with their pods.
TEST_F(PodResourcesModuleTest, MigDevicesAndTimeSlicedReplicasMapToTheirDeviceAndLeaveWithTheirPods) {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  auto& gpu0 = inventory.gpus.emplace_back();
  gpu0.uuid = "GPU-0";
  gpu0.mig_enabled = true;
  gpu0.mig_devices.emplace_back().uuid = "MIG-0a";
  inventory.gpus.emplace_back().uuid = "GPU-1";
  h_.bus.Publish(inventory);
  SeedPod("notebook");
  SeedPod("share-a");
  SeedPod("share-b");
  StartKubelet();
  sim_->InjectPodDevices(kNs, "notebook", "main", "nvidia.com/gpu", {"MIG-0a"});
  sim_->InjectPodDevices(kNs, "share-a", "main", "nvidia.com/gpu", {"GPU-1::0"});
  sim_->InjectPodDevices(kNs, "share-b", "main", "nvidia.com/gpu", {"GPU-1::1", "GPU-1::3"});
  StartModule();

  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->Holders("GPU-1").size() == 2; }));
  EXPECT_EQ(Map()->Holders("GPU-1")[0].name, "share-a");
  EXPECT_EQ(Map()->Holders("GPU-1")[1].name, "share-b");  // once, though it holds two replicas
  ASSERT_EQ(Map()->Holders("MIG-0a").size(), 1u);
  EXPECT_EQ(Map()->Holders("MIG-0a")[0].name, "notebook");
  // A reset of GPU-0 resets its MIG devices: the pod on one holds the GPU.
  ASSERT_EQ(Map()->Holders("GPU-0").size(), 1u);
  EXPECT_EQ(Map()->Holders("GPU-0")[0].name, "notebook");
  EXPECT_EQ(Map()->Holders("GPU-0")[0].device, "MIG-0a");
  EXPECT_EQ(Map()->gpus.size(), 2u);
  EXPECT_EQ(Metric("gpu_node_supervisor_pod_resources_list_problems_total"), 0);
  EXPECT_TRUE(WaitAnnotation("share-b", Devices({"GPU-1"})));
  EXPECT_TRUE(WaitAnnotation("notebook", Devices({"MIG-0a"})));

  for (const char* gone : {"share-a", "notebook"}) {
    sim_->ForgetPod(kNs, gone);
    ASSERT_EQ(api_->Call("DELETE", kPods + "/" + gone).status, 200);
  }
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->Holders("MIG-0a").empty() && Map()->Holders("GPU-1").size() == 1; }));
  EXPECT_TRUE(Map()->Holders("GPU-0").empty());
  EXPECT_EQ(Map()->Holders("GPU-1")[0].name, "share-b");
  EXPECT_EQ(Map()->gpus.size(), 1u);
}

// dra-gpu prepares a claim; the kubelet lists its pod only later. In between the claim holds its
// GPU (found by /dev/nvidia minor, not NVML index) in the published map at once, and it leaves
// when dra-gpu unprepares it.
TEST_F(PodResourcesModuleTest, AClaimDraGpuPreparedHoldsItsGpuBeforeTheKubeletListsItsPod) {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  auto& gpu0 = inventory.gpus.emplace_back();
  gpu0.uuid = "GPU-0";
  gpu0.index = 0;
  gpu0.minor = 7;
  auto& gpu1 = inventory.gpus.emplace_back();
  gpu1.uuid = "GPU-1";
  gpu1.index = 1;
  gpu1.minor = 0;
  h_.bus.Publish(inventory);
  StartKubelet();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->fresh; }));
  EXPECT_TRUE(Map()->OtherHolders("GPU-0").empty());

  dra_gpu::DraGpuState state;
  auto& claim = state.prepared_claims.emplace_back();
  claim.uid = "uid-1";
  claim.namespace_name = kNs;
  claim.name = "train-gpus";
  claim.devices = {"gpu-7"};
  h_.bus.Publish(state);
  h_.Drain();
  ASSERT_TRUE(Map() != nullptr);
  ASSERT_EQ(Map()->OtherHolders("GPU-0").size(), 1u);
  EXPECT_EQ(Map()->OtherHolders("GPU-0")[0].claim, "ml/train-gpus");
  EXPECT_EQ(Map()->OtherHolders("GPU-0")[0].device, "gpu-7");
  EXPECT_TRUE(Map()->OtherHolders("GPU-1").empty());

  state.prepared_claims.clear();
  h_.bus.Publish(state);
  h_.Drain();
  EXPECT_TRUE(Map()->OtherHolders("GPU-0").empty());
}

// A claim dra-gpu prepared on a MIG device: the module matches its name's placement with the
// inventory's MIG devices, so it holds that MIG UUID (and the GPU), not the sibling's.
TEST_F(PodResourcesModuleTest, AClaimOnAMigDeviceHoldsThatMigUuidByItsPlacement) {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  auto& gpu = inventory.gpus.emplace_back();
  gpu.uuid = "GPU-0";
  gpu.minor = 4;
  gpu.mig_enabled = true;
  for (uint32_t start : {0u, 1u}) {
    auto& mig = gpu.mig_devices.emplace_back();
    mig.uuid = "MIG-0" + std::to_string(start);
    mig.placement_known = true;
    mig.gi_profile_id = 19;
    mig.placement_start = start;
    mig.placement_size = 1;
  }
  h_.bus.Publish(inventory);
  StartKubelet();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return Map() && Map()->fresh; }));

  dra_gpu::DraGpuState state;
  auto& claim = state.prepared_claims.emplace_back();
  claim.uid = "uid-1";
  claim.namespace_name = kNs;
  claim.name = "infer";
  claim.devices = {"gpu-4-mig-19-1-1"};
  h_.bus.Publish(state);
  h_.Drain();
  ASSERT_TRUE(Map() != nullptr);
  ASSERT_EQ(Map()->OtherHolders("MIG-01").size(), 1u);
  EXPECT_EQ(Map()->OtherHolders("MIG-01")[0].claim, "ml/infer");
  EXPECT_EQ(Map()->OtherHolders("GPU-0").size(), 1u);
  EXPECT_TRUE(Map()->OtherHolders("MIG-00").empty());
}

TEST(PodResourcesConfig, DefaultsFollowTheKubeletDirAndBadValuesAreRefused) {
  SiteConfig site;
  site.paths.kubelet_dir = "/var/lib/kubelet";
  ConfigValue empty;
  ConfigMap section(empty, "modules.pod-resources");
  const auto config = PodResourcesModule::ParseConfig(section, site);
  section.Finish();
  EXPECT_EQ(config.socket, "/var/lib/kubelet/pod-resources/kubelet.sock");
  EXPECT_EQ(config.resource_names, std::vector<std::string>{"nvidia.com/gpu"});
  EXPECT_EQ(config.resync, std::chrono::minutes(5));
  EXPECT_TRUE(config.annotate);

  {
    const auto value = ParseYaml("resourceNames: [nvidia.com/gpu, nvidia.com/mig-*]\n", "site.yaml");
    ConfigMap prefixed(value, "modules.pod-resources");
    const auto with_prefix = PodResourcesModule::ParseConfig(prefixed, site);
    prefixed.Finish();
    EXPECT_EQ(with_prefix.resource_names, (std::vector<std::string>{"nvidia.com/gpu", "nvidia.com/mig-*"}));
  }
  for (const char* bad : {"resourceNames: []\n", "resourceNames: [gpu]\n", "resourceNames: [\"mig-*\"]\n",
                          "resourceNames: [\"nvidia.com/mig*-*\"]\n", "coalesce: 1h\n", "bogus: 1\n",
                          "socket: /a/very/long/path/that/goes/on/and/on/and/on/and/on/and/on/and/on/and/on/and/on/"
                          "and/on/and/on/and/on/and/on/kubelet.sock\n"}) {
    const auto value = ParseYaml(bad, "site.yaml");
    ConfigMap bad_section(value, "modules.pod-resources");
    EXPECT_THROW(
        {
          PodResourcesModule::ParseConfig(bad_section, site);
          bad_section.Finish();
        },
        ConfigError)
        << bad;
  }
}

}  // namespace
}  // namespace gns::pod_resources
