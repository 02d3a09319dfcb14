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
