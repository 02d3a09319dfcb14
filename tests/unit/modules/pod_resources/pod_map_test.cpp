// The pod-resources core: a List answer read into a checked view (bad entries named and left
// out), the GPU -> pods map, the dgxc.nvidia.com/devices annotation in NVSentinel's shape, and
// the writes planned against what the API shows.
#include "modules/pod_resources/pod_map.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gns::pod_resources {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::set<std::string> kGpu{"nvidia.com/gpu"};

v1::PodResources* AddPod(v1::ListPodResourcesResponse& response, const std::string& ns, const std::string& name) {
  auto* pod = response.add_pod_resources();
  pod->set_namespace_(ns);
  pod->set_name(name);
  return pod;
}

void AddDevices(v1::PodResources* pod, const std::string& container, const std::string& resource,
                std::vector<std::string> ids) {
  v1::ContainerResources* c = nullptr;
  for (auto& existing : *pod->mutable_containers()) {
    if (existing.name() == container) c = &existing;
  }
  if (c == nullptr) {
    c = pod->add_containers();
    c->set_name(container);
  }
  auto* d = c->add_devices();
  d->set_resource_name(resource);
  for (const auto& id : ids) d->add_device_ids(id);
}

TEST(ReadList, KeepsOurResourcesPerPodSortedAndIgnoresOthers) {
  v1::ListPodResourcesResponse response;
  auto* b = AddPod(response, "ml", "trainer-b");
  AddDevices(b, "main", "nvidia.com/gpu", {"GPU-2", "GPU-1"});
  AddDevices(b, "main", "rdma/hca", {"mlx5_0"});
  auto* a = AddPod(response, "ml", "trainer-a");
  AddDevices(a, "side", "nvidia.com/gpu", {"GPU-0"});
  AddPod(response, "kube-system", "coredns");  // no devices at all

  const auto view = ReadList(response, kGpu, {});
  EXPECT_THAT(view.problems, IsEmpty());
  ASSERT_EQ(view.pods.size(), 3u);
  EXPECT_EQ(view.pods[0].Key(), "kube-system/coredns");
  EXPECT_THAT(view.pods[0].devices, IsEmpty());
  EXPECT_EQ(view.pods[1].Key(), "ml/trainer-a");
  ASSERT_EQ(view.pods[2].devices.size(), 2u);  // the rdma device is not ours
  EXPECT_EQ(view.pods[2].devices[0].id, "GPU-1");
  EXPECT_EQ(view.pods[2].devices[1].id, "GPU-2");
}

TEST(ReadList, NamesEveryMalformedEntryAndLeavesItOut) {
  v1::ListPodResourcesResponse response;
  AddDevices(AddPod(response, "", "nameless-ns"), "main", "nvidia.com/gpu", {"GPU-0"});
  AddDevices(AddPod(response, "ml", ""), "main", "nvidia.com/gpu", {"GPU-0"});
  auto* p = AddPod(response, "ml", "p");
  AddDevices(p, "", "nvidia.com/gpu", {"GPU-1"});
  AddDevices(p, "main", "nvidia.com/gpu", {"", "GPU-2", "GPU-2", "GPU-bogus"});
  const auto view = ReadList(response, kGpu, [](std::string_view id) { return id != "GPU-bogus"; });

  ASSERT_EQ(view.pods.size(), 1u);
  EXPECT_EQ(view.pods[0].Key(), "ml/p");
  ASSERT_EQ(view.pods[0].devices.size(), 1u);  // duplicates collapse; empty and unknown IDs dropped
  EXPECT_EQ(view.pods[0].devices[0].id, "GPU-2");
  ASSERT_EQ(view.problems.size(), 5u);
  EXPECT_THAT(view.problems[0], HasSubstr("List entry #1 has an empty namespace"));
  EXPECT_THAT(view.problems[1], HasSubstr("List entry #2 has an empty name"));
  EXPECT_THAT(view.problems[2], HasSubstr("pod ml/p has a container without a name"));
  EXPECT_THAT(view.problems[3], HasSubstr("an empty nvidia.com/gpu device ID"));
  EXPECT_THAT(view.problems[4], HasSubstr("device \"GPU-bogus\" is not a GPU of this node"));
}

TEST(ReadList, DynamicResourcesBecomeClaims) {
  v1::ListPodResourcesResponse response;
  auto* pod = AddPod(response, "ml", "imex");
  auto* c = pod->add_containers();
  c->set_name("main");
  auto* dynamic = c->add_dynamic_resources();
  dynamic->set_claim_name("channel");
  dynamic->set_claim_namespace("ml");
  auto* resource = dynamic->add_claim_resources();
  resource->set_driver_name("compute-domain.nvidia.com");
  resource->set_pool_name("node-1");
  resource->set_device_name("channel-0");
  const auto view = ReadList(response, kGpu, {});
  const auto claims = AllClaims(view);
  ASSERT_EQ(claims.size(), 1u);
  EXPECT_EQ(claims[0].claim, "ml/channel");
  EXPECT_EQ(claims[0].driver, "compute-domain.nvidia.com");
  EXPECT_THAT(claims[0].devices, ElementsAre("node-1/channel-0"));
}

TEST(ReadList, AClaimWithDevicesOfTwoDriversKeepsEachDevicesDriver) {
  v1::ListPodResourcesResponse response;
  auto* pod = AddPod(response, "ml", "trainer");
  auto* c = pod->add_containers();
  c->set_name("main");
  auto* dynamic = c->add_dynamic_resources();
  dynamic->set_claim_name("both");
  dynamic->set_claim_namespace("ml");
  const auto add = [&](const char* driver, const char* device) {
    auto* resource = dynamic->add_claim_resources();
    resource->set_driver_name(driver);
    resource->set_pool_name("node-1");
    resource->set_device_name(device);
  };
  add("compute-domain.nvidia.com", "channel-0");
  add("gpu.nvidia.com", "gpu-3");
  add("gpu.nvidia.com", "gpu-5");
  const auto claims = AllClaims(ReadList(response, kGpu, {}));
  ASSERT_EQ(claims.size(), 2u);
  EXPECT_EQ(claims[0].claim, "ml/both");
  EXPECT_EQ(claims[0].driver, "compute-domain.nvidia.com");
  EXPECT_THAT(claims[0].devices, ElementsAre("node-1/channel-0"));
  EXPECT_EQ(claims[1].claim, "ml/both");
  EXPECT_EQ(claims[1].driver, "gpu.nvidia.com");  // not the first resource's driver
  EXPECT_THAT(claims[1].devices, ElementsAre("node-1/gpu-3", "node-1/gpu-5"));
}

TEST(ReadList, AResourceNameEndingInAStarTakesEveryResourceWithThatPrefix) {
  v1::ListPodResourcesResponse response;
  auto* pod = AddPod(response, "ml", "nb");
  AddDevices(pod, "main", "nvidia.com/mig-1g.10gb", {"MIG-1"});
  AddDevices(pod, "main", "nvidia.com/mig-3g.40gb", {"MIG-2"});
  AddDevices(pod, "main", "nvidia.com/migrated", {"X-1"});  // not "mig-"
  const std::set<std::string> resources{"nvidia.com/gpu", "nvidia.com/mig-*"};
  const auto view = ReadList(response, resources, {});
  ASSERT_EQ(view.pods.size(), 1u);
  ASSERT_EQ(view.pods[0].devices.size(), 2u);
  EXPECT_EQ(view.pods[0].devices[0].id, "MIG-1");
  EXPECT_EQ(view.pods[0].devices[1].id, "MIG-2");
  EXPECT_TRUE(IsOurResource(resources, "nvidia.com/gpu"));
  EXPECT_FALSE(IsOurResource(resources, "nvidia.com/gpu.shared"));  // no star, no prefix
  EXPECT_FALSE(IsOurResource(kGpu, "nvidia.com/mig-1g.10gb"));
}

TEST(ReplicaIds, StandForTheirDevice) {
  EXPECT_EQ(PhysicalDeviceId("GPU-0::3"), "GPU-0");
  EXPECT_EQ(PhysicalDeviceId("MIG-7::12"), "MIG-7");
  EXPECT_EQ(PhysicalDeviceId("GPU-0"), "GPU-0");
  EXPECT_EQ(PhysicalDeviceId("GPU-0::"), "GPU-0::");     // no replica number
  EXPECT_EQ(PhysicalDeviceId("GPU-0::a1"), "GPU-0::a1");  // not a number
  EXPECT_EQ(PhysicalDeviceId("::1"), "::1");
}

// Time-slicing: two pods on one GPU both hold that GPU (gpu-reset, gpu-health and the DCGM
// series ask by GPU UUID), the annotation names the GPU, and a MIG device is a device of this
// node like a GPU.
TEST(ReadList, TimeSlicedReplicasAndMigDevicesMapToTheirDevice) {
  v1::ListPodResourcesResponse response;
  AddDevices(AddPod(response, "ml", "a"), "main", "nvidia.com/gpu", {"GPU-0::0"});
  auto* b = AddPod(response, "ml", "b");
  AddDevices(b, "main", "nvidia.com/gpu", {"GPU-0::1", "GPU-0::2"});  // two replicas of one GPU
  AddDevices(AddPod(response, "ml", "c"), "nb", "nvidia.com/gpu", {"MIG-7", "GPU-0::x"});
  const std::set<std::string> known{"GPU-0", "MIG-7"};
  const auto view = ReadList(response, kGpu, [&](std::string_view id) { return known.contains(std::string(id)); });
  ASSERT_EQ(view.problems.size(), 1u);
  EXPECT_THAT(view.problems[0], HasSubstr("\"GPU-0::x\" is not a GPU of this node"));
  const auto map = BuildGpuMap(view, {});
  ASSERT_EQ(map.size(), 2u);
  EXPECT_THAT(map.at("GPU-0"), ElementsAre(PodContainerRef{"ml", "a", "", "main", "nvidia.com/gpu"},
                                           PodContainerRef{"ml", "b", "", "main", "nvidia.com/gpu"}));
  EXPECT_THAT(map.at("MIG-7"), ElementsAre(PodContainerRef{"ml", "c", "", "nb", "nvidia.com/gpu"}));
  const auto desired = DesiredAnnotations(view);
  EXPECT_EQ(desired.at("ml/b"), R"({"devices":{"nvidia.com/gpu":["GPU-0"]}})");
  EXPECT_EQ(desired.at("ml/c"), R"({"devices":{"nvidia.com/gpu":["MIG-7"]}})");
}

TEST(Annotation, HasNvSentinelsShape) {
  EXPECT_EQ(AnnotationValue({{"nvidia.com/gpu", {"GPU-b", "GPU-a"}}}),
            R"({"devices":{"nvidia.com/gpu":["GPU-a","GPU-b"]}})");
  EXPECT_TRUE(SameAnnotation(R"({"devices":{"nvidia.com/gpu":["GPU-a"]}})",
                             R"({ "devices" : { "nvidia.com/gpu" : [ "GPU-a" ] } })"));
  EXPECT_FALSE(SameAnnotation(R"({"devices":{"nvidia.com/gpu":["GPU-a"]}})", "not json"));
}

TEST(GpuMap, ListsEveryHolderWithItsUid) {
  v1::ListPodResourcesResponse response;
  AddDevices(AddPod(response, "ml", "a"), "main", "nvidia.com/gpu", {"GPU-0", "GPU-1"});
  AddDevices(AddPod(response, "ml", "b"), "main", "nvidia.com/gpu", {"GPU-1"});
  const auto view = ReadList(response, kGpu, {});
  const auto map = BuildGpuMap(view, [](const std::string& ns, const std::string& name) {
    return name == "a" ? ns + "-uid-a" : std::string();
  });
  ASSERT_EQ(map.size(), 2u);
  EXPECT_THAT(map.at("GPU-0"), ElementsAre(PodContainerRef{"ml", "a", "ml-uid-a", "main", "nvidia.com/gpu"}));
  EXPECT_THAT(map.at("GPU-1"), ElementsAre(PodContainerRef{"ml", "a", "ml-uid-a", "main", "nvidia.com/gpu"},
                                           PodContainerRef{"ml", "b", "", "main", "nvidia.com/gpu"}));
  GpuPodMap message;
  message.gpus = map;
  EXPECT_EQ(message.Holders("GPU-1").size(), 2u);
  EXPECT_THAT(message.Holders("GPU-7"), IsEmpty());
}

// ------------------------------------------------------- holders under other names (gpu-reset)

void AddClaim(v1::PodResources* pod, const std::string& container, const std::string& claim,
              std::vector<std::pair<std::string, std::string>> driver_devices) {
  auto* c = pod->add_containers();
  c->set_name(container);
  auto* dynamic = c->add_dynamic_resources();
  dynamic->set_claim_name(claim);
  dynamic->set_claim_namespace(pod->namespace_());
  for (const auto& [driver, device] : driver_devices) {
    auto* resource = dynamic->add_claim_resources();
    resource->set_driver_name(driver);
    resource->set_pool_name("node-1");
    resource->set_device_name(device);
  }
}

// Two GPUs: minor 3 (GPU-A, MIG-enabled, devices MIG-A1 and MIG-A2) and minor 5 (GPU-B); NVML
// indices the other way round, so a mapping by index would name the wrong GPU.
GpuTopology TwoGpus() {
  GpuTopology topology;
  topology.known = true;
  topology.uuid_by_minor = {{3, "GPU-A"}, {5, "GPU-B"}};
  topology.parent_of_mig = {{"MIG-A1", "GPU-A"}, {"MIG-A2", "GPU-A"}};
  return topology;
}

GpuPodMap MapOf(const ListView& view, const std::vector<PreparedGpuClaim>& prepared, const GpuTopology& topology) {
  GpuPodMap map;
  map.listed = map.fresh = true;
  const UidLookup uid = [](const std::string&, const std::string& name) { return "uid-" + name; };
  map.gpus = BuildGpuMap(view, uid);
  map.claims = AllClaims(view);
  auto indirect = BuildIndirectHolders(map.gpus, map.claims, prepared, topology, uid);
  map.via = std::move(indirect.via);
  map.pending = std::move(indirect.pending);
  map.unplaced = std::move(indirect.unplaced);
  return map;
}

// Device names are read with dra-gpu's parser (its messages.hpp; its own test has the cases):
// a whole GPU's or a MIG device's name places the claim on that minor's GPU, anything else (even
// with a minor at its head) is unplaced, so gpu-reset waits for it rather than guessing.
TEST(DraDeviceNames, OnlyDraGpusOwnNamesPlaceAClaimOnTheGpuOfTheirMinor) {
  const auto placed = [](const std::string& device) {
    v1::ListPodResourcesResponse response;
    AddClaim(AddPod(response, "ml", "p"), "main", "c", {{"gpu.nvidia.com", device}});
    const auto map = MapOf(ReadList(response, kGpu, {}), {}, TwoGpus());
    EXPECT_EQ(map.unplaced.empty(), !map.via.empty()) << device;
    return map.via.empty() ? std::string() : map.via.begin()->first;
  };
  EXPECT_EQ(placed("gpu-5"), "GPU-B");
  EXPECT_EQ(placed("gpu-3"), "GPU-A");
  EXPECT_EQ(placed("gpu-3-mig-9-4-2"), "GPU-A");  // a MIG device on minor 3
  for (const char* other : {"gpu-3-", "gpu-3x", "gpu-03", "gpu-3-mig-9-4", "gpu-3-vfio", "gpu-3-mig-9-4-2-1", "GPU-3"}) {
    EXPECT_EQ(placed(other), "") << other;
  }
}

TEST(IndirectHolders, ADraGpuClaimHoldsTheGpuOfItsMinorAndNamesTheClaim) {
  v1::ListPodResourcesResponse response;
  AddClaim(AddPod(response, "ml", "trainer"), "main", "gpus", {{"gpu.nvidia.com", "gpu-5"}});
  const auto map = MapOf(ReadList(response, kGpu, {}), {}, TwoGpus());
  const auto holders = map.Holders("GPU-B");
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0], (PodContainerRef{"ml", "trainer", "uid-trainer", "main", "gpu.nvidia.com", "ml/gpus", "node-1/gpu-5"}));
  EXPECT_THAT(map.Holders("GPU-A"), IsEmpty());
  EXPECT_THAT(map.OtherHolders("GPU-B"), IsEmpty());
  EXPECT_THAT(map.gpus, IsEmpty());  // the device-plugin map (metrics, annotations) is unchanged
}

TEST(IndirectHolders, AMigDeviceHoldsItsGpuWhetherFromTheDevicePluginOrADraClaim) {
  v1::ListPodResourcesResponse response;
  AddDevices(AddPod(response, "ml", "notebook"), "nb", "nvidia.com/gpu", {"MIG-A1"});
  AddDevices(AddPod(response, "ml", "notebook-2"), "nb", "nvidia.com/gpu", {"MIG-A2::1"});  // a replica of one
  AddClaim(AddPod(response, "ml", "infer"), "main", "slice", {{"gpu.nvidia.com", "gpu-3-mig-9-4-2"}});
  const std::set<std::string> known{"GPU-A", "GPU-B", "MIG-A1", "MIG-A2"};
  const auto view = ReadList(response, kGpu, [&](std::string_view id) { return known.contains(std::string(id)); });
  const auto map = MapOf(view, {}, TwoGpus());
  const auto holders = map.Holders("GPU-A");
  ASSERT_EQ(holders.size(), 3u);
  EXPECT_EQ(holders[0].name, "infer");
  EXPECT_EQ(holders[0].claim, "ml/slice");
  EXPECT_EQ(holders[0].device, "node-1/gpu-3-mig-9-4-2");
  EXPECT_EQ(holders[1], (PodContainerRef{"ml", "notebook", "uid-notebook", "nb", "nvidia.com/gpu", "", "MIG-A1"}));
  EXPECT_EQ(holders[2].name, "notebook-2");
  EXPECT_EQ(holders[2].device, "MIG-A2");
  // The MIG device's own holders stay where they were.
  ASSERT_EQ(map.Holders("MIG-A1").size(), 1u);
  EXPECT_EQ(map.Holders("MIG-A1")[0].device, "");
  EXPECT_THAT(map.Holders("GPU-B"), IsEmpty());
}

// GPU-A (minor 3) split into MIG devices as gpu-inventory reports them: MIG-A1 at 19/0/1, MIG-A2
// at 19/1/1, MIG-A3 a second compute instance of MIG-A2's GPU instance (same place: dra-gpu
// offers the first under that name); GPU-B (minor 5) whole.
GpuTopology MigPlaced() {
  gpu_inventory::GpuInfo a;
  a.uuid = "GPU-A";
  a.minor = 3;
  a.mig_enabled = true;
  for (const auto& [uuid, start] : {std::pair<const char*, uint32_t>{"MIG-A1", 0}, {"MIG-A2", 1}, {"MIG-A3", 1}}) {
    auto& mig = a.mig_devices.emplace_back();
    mig.uuid = uuid;
    mig.placement_known = true;
    mig.gi_profile_id = 19;
    mig.placement_start = start;
    mig.placement_size = 1;
  }
  gpu_inventory::GpuInfo b;
  b.uuid = "GPU-B";
  b.minor = 5;
  GpuTopology topology;
  topology.Add(a);
  topology.Add(b);
  return topology;
}

// A gpu.nvidia.com claim names a MIG device by its place, not its UUID: matched with the
// inventory's placement, it holds that MIG device and its GPU, and not a sibling.
TEST(IndirectHolders, AClaimOnAMigDeviceHoldsThatMigDeviceAndItsGpuButNotASibling) {
  const GpuTopology topology = MigPlaced();
  EXPECT_EQ(topology.mig_by_place.size(), 2u);  // MIG-A3 shares MIG-A2's place
  v1::ListPodResourcesResponse response;
  AddClaim(AddPod(response, "ml", "infer"), "main", "slice", {{"gpu.nvidia.com", "gpu-3-mig-19-1-1"}});
  AddDevices(AddPod(response, "ml", "notebook"), "nb", "nvidia.com/gpu", {"MIG-A1"});
  const auto map = MapOf(ReadList(response, kGpu, {}), {}, topology);
  const PodContainerRef infer{"ml", "infer", "uid-infer", "main", "gpu.nvidia.com", "ml/slice", "node-1/gpu-3-mig-19-1-1"};
  EXPECT_THAT(map.Holders("MIG-A2"), ElementsAre(infer));
  ASSERT_EQ(map.Holders("MIG-A1").size(), 1u);  // the sibling: only its own device-plugin pod
  EXPECT_EQ(map.Holders("MIG-A1")[0].name, "notebook");
  EXPECT_THAT(map.Holders("MIG-A3"), IsEmpty());
  ASSERT_EQ(map.Holders("GPU-A").size(), 2u);  // the parent: both
  EXPECT_EQ(map.Holders("GPU-A")[0], infer);
  EXPECT_EQ(map.Holders("GPU-A")[1].name, "notebook");
  EXPECT_THAT(map.Holders("GPU-B"), IsEmpty());
  for (const char* uuid : {"GPU-A", "GPU-B", "MIG-A1", "MIG-A2", "MIG-A3"}) EXPECT_THAT(map.OtherHolders(uuid), IsEmpty()) << uuid;

  // Prepared, its pod not listed yet: pending on the MIG device and its GPU, not on the sibling.
  const auto before = MapOf(ReadList(v1::ListPodResourcesResponse{}, kGpu, {}), {{"ml/new", {"gpu-3-mig-19-0-1"}}}, topology);
  ASSERT_EQ(before.OtherHolders("MIG-A1").size(), 1u);
  EXPECT_EQ(before.OtherHolders("MIG-A1")[0].claim, "ml/new");
  EXPECT_EQ(before.OtherHolders("GPU-A").size(), 1u);
  EXPECT_THAT(before.OtherHolders("MIG-A2"), IsEmpty());
  EXPECT_THAT(before.Holders("MIG-A1"), IsEmpty());

  // A place where the inventory has no MIG device (the layout changed under the claim): it holds
  // the GPU, and may be any of its MIG devices (fail safe), none of them by name.
  v1::ListPodResourcesResponse stale;
  AddClaim(AddPod(stale, "ml", "old"), "main", "old", {{"gpu.nvidia.com", "gpu-3-mig-14-4-2"}});
  const auto moved = MapOf(ReadList(stale, kGpu, {}), {}, topology);
  ASSERT_EQ(moved.Holders("GPU-A").size(), 1u);
  EXPECT_EQ(moved.Holders("GPU-A")[0].name, "old");
  for (const char* mig : {"MIG-A1", "MIG-A2", "MIG-A3"}) {
    EXPECT_THAT(moved.Holders(mig), IsEmpty()) << mig;
    ASSERT_EQ(moved.OtherHolders(mig).size(), 1u) << mig;
    EXPECT_EQ(moved.OtherHolders(mig)[0].pod, "ml/old");
    EXPECT_THAT(moved.OtherHolders(mig)[0].why, HasSubstr("no MIG device in the inventory"));
  }
  EXPECT_THAT(moved.OtherHolders("GPU-A"), IsEmpty());
  EXPECT_THAT(moved.OtherHolders("GPU-B"), IsEmpty());
}

TEST(IndirectHolders, AComputeDomainChannelClaimHoldsNoGpu) {
  v1::ListPodResourcesResponse response;
  AddClaim(AddPod(response, "ml", "imex"), "main", "channel",
           {{"compute-domain.nvidia.com", "channel-0"}, {"compute-domain.nvidia.com", "gpu-3"}});
  const auto map = MapOf(ReadList(response, kGpu, {}), {}, TwoGpus());
  ASSERT_EQ(map.claims.size(), 1u);  // still listed as the pod's claim
  EXPECT_THAT(map.Holders("GPU-A"), IsEmpty());
  EXPECT_THAT(map.Holders("GPU-B"), IsEmpty());
  EXPECT_THAT(map.via, IsEmpty());
  EXPECT_THAT(map.OtherHolders("GPU-A"), IsEmpty());
}

TEST(IndirectHolders, APreparedClaimHoldsItsGpuUntilAListedPodShowsIt) {
  const std::vector<PreparedGpuClaim> prepared{{"ml/gpus", {"gpu-5"}}, {"ml/other", {"gpu-3-mig-1-0-1"}}};
  // Prepared, the kubelet lists no pod with it yet: pending on its GPU, no pod to evict.
  const auto before = MapOf(ReadList(v1::ListPodResourcesResponse{}, kGpu, {}), prepared, TwoGpus());
  EXPECT_THAT(before.Holders("GPU-B"), IsEmpty());
  ASSERT_EQ(before.OtherHolders("GPU-B").size(), 1u);
  EXPECT_EQ(before.OtherHolders("GPU-B")[0].claim, "ml/gpus");
  EXPECT_EQ(before.OtherHolders("GPU-B")[0].pod, "");
  EXPECT_THAT(before.OtherHolders("GPU-B")[0].why, HasSubstr("lists no pod"));
  ASSERT_EQ(before.OtherHolders("GPU-A").size(), 1u);
  EXPECT_EQ(before.OtherHolders("GPU-A")[0].claim, "ml/other");
  // Listed: the pod holds it, once.
  v1::ListPodResourcesResponse response;
  AddClaim(AddPod(response, "ml", "trainer"), "main", "gpus", {{"gpu.nvidia.com", "gpu-5"}});
  const auto after = MapOf(ReadList(response, kGpu, {}), prepared, TwoGpus());
  ASSERT_EQ(after.Holders("GPU-B").size(), 1u);
  EXPECT_EQ(after.Holders("GPU-B")[0].name, "trainer");
  EXPECT_THAT(after.OtherHolders("GPU-B"), IsEmpty());
  EXPECT_EQ(after.OtherHolders("GPU-A").size(), 1u);
}

TEST(IndirectHolders, AHolderWhoseGpuCannotBeToldMayHoldAnyGpu) {
  v1::ListPodResourcesResponse response;
  AddClaim(AddPod(response, "ml", "odd"), "main", "odd", {{"gpu.nvidia.com", "gpu-whole"}});
  AddClaim(AddPod(response, "ml", "gone"), "main", "gone", {{"gpu.nvidia.com", "gpu-9"}});  // no minor 9 here
  const auto known = MapOf(ReadList(response, kGpu, {}), {}, TwoGpus());
  ASSERT_EQ(known.unplaced.size(), 2u);
  EXPECT_EQ(known.OtherHolders("GPU-A").size(), 2u);
  EXPECT_EQ(known.OtherHolders("GPU-B").size(), 2u);
  EXPECT_THAT(known.Holders("GPU-A"), IsEmpty());  // no pod is known to be on it: none to evict

  // No inventory yet: neither a DRA GPU claim nor a MIG device can be placed.
  v1::ListPodResourcesResponse plain;
  AddDevices(AddPod(plain, "ml", "notebook"), "nb", "nvidia.com/gpu", {"MIG-A1"});
  AddClaim(AddPod(plain, "ml", "trainer"), "main", "gpus", {{"gpu.nvidia.com", "gpu-5"}});
  const auto unknown = MapOf(ReadList(plain, kGpu, {}), {{"ml/new", {"gpu-3"}}}, GpuTopology{});
  ASSERT_EQ(unknown.unplaced.size(), 3u);
  EXPECT_EQ(unknown.OtherHolders("GPU-A").size(), 3u);
  EXPECT_THAT(unknown.via, IsEmpty());
}

TEST(Plan, WritesOnlyWhatDiffers) {
  const std::string a = R"({"devices":{"nvidia.com/gpu":["GPU-0"]}})";
  const std::map<std::string, std::string> desired{{"ml/a", a}, {"ml/not-in-api-yet", a}, {"ml/c", a}};
  std::map<std::string, PodAnnotationState> pods{
      {"ml/a", {"ml", "a", "uid-a", std::nullopt}},  // needs it
      {"ml/b", {"ml", "b", "uid-b", a}},             // holds nothing any more: remove
      {"ml/c", {"ml", "c", "uid-c", a}},             // already right
      {"ml/d", {"ml", "d", "uid-d", std::nullopt}},  // nothing, needs nothing
  };
  const auto writes = PlanAnnotationWrites(desired, pods);
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[0].Key(), "ml/a");
  EXPECT_EQ(writes[0].value, a);
  EXPECT_EQ(writes[1].Key(), "ml/b");
  EXPECT_FALSE(writes[1].value.has_value());
}

TEST(Plan, PatchSetsOrRemovesAndCarriesTheUid) {
  const auto set = AnnotationPatch({"ml", "a", "uid-a", std::string("v")});
  EXPECT_EQ(set.dump(), R"({"metadata":{"annotations":{"dgxc.nvidia.com/devices":"v"},"uid":"uid-a"}})");
  const auto remove = AnnotationPatch({"ml", "a", "", std::nullopt});
  EXPECT_EQ(remove.dump(), R"({"metadata":{"annotations":{"dgxc.nvidia.com/devices":null}}})");
}

TEST(Allocatable, CountsOurDevicesOnce) {
  v1::AllocatableResourcesResponse response;
  for (const char* id : {"GPU-0", "GPU-1", "GPU-1"}) {
    auto* d = response.add_devices();
    d->set_resource_name("nvidia.com/gpu");
    d->add_device_ids(id);
  }
  auto* other = response.add_devices();
  other->set_resource_name("rdma/hca");
  other->add_device_ids("mlx5_0");
  EXPECT_EQ(CountAllocatable(response, kGpu), 2u);
}

}  // namespace
}  // namespace gns::pod_resources
