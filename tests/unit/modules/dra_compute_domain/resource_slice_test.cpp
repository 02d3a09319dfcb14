// The node's ResourceSlice: gate on and off, with and without a clique, each API version's
// device shape, and when an existing slice needs an update.
#include "modules/dra_compute_domain/resource_slice.hpp"

#include <gtest/gtest.h>

namespace gns::dra {
namespace {

using nlohmann::json;

SliceInputs Inputs() {
  SliceInputs in;
  in.node_name = "gb200-node-07";
  in.node_uid = "6b1f0c2e-1111-4222-8333-944455556666";
  in.clique_id = "7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.32766";
  in.host_managed = true;
  in.generation = 3;
  return in;
}

TEST(ResourceSliceTest, HostManagedPublishesOnlyChannelZero) {
  const json slice = BuildResourceSlice(Inputs());
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["kind"], "ResourceSlice");
  EXPECT_EQ(slice["metadata"]["name"], "gb200-node-07-compute-domain.nvidia.com");
  const json& owner = slice["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner, (json{{"apiVersion", "v1"},
                         {"kind", "Node"},
                         {"name", "gb200-node-07"},
                         {"uid", "6b1f0c2e-1111-4222-8333-944455556666"},
                         {"controller", true}}));
  const json& spec = slice["spec"];
  EXPECT_EQ(spec["driver"], "compute-domain.nvidia.com");
  EXPECT_EQ(spec["nodeName"], "gb200-node-07");
  EXPECT_EQ(spec["pool"], (json{{"name", "gb200-node-07"}, {"generation", 3}, {"resourceSliceCount", 1}}));
  // §14.1 "kubelet ResourceSlice omits daemon device under the gate".
  ASSERT_EQ(spec["devices"].size(), 1u);
  const json& device = spec["devices"][0];
  EXPECT_EQ(device["name"], "channel-0");
  EXPECT_FALSE(device.contains("basic"));
  EXPECT_EQ(device["attributes"], (json{{"type", {{"string", "channel"}}},
                                        {"id", {{"int", 0}}},
                                        {"cliqueID", {{"string", "7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.32766"}}}}));
}

TEST(ResourceSliceTest, NoCliqueNoCliqueAttribute) {
  SliceInputs in = Inputs();
  in.clique_id.clear();
  const json attributes = BuildResourceSlice(in)["spec"]["devices"][0]["attributes"];
  EXPECT_EQ(attributes, (json{{"type", {{"string", "channel"}}}, {"id", {{"int", 0}}}}));
}

TEST(ResourceSliceTest, WithoutTheGateTheDaemonDeviceIsListedToo) {
  SliceInputs in = Inputs();
  in.host_managed = false;
  const json devices = BuildResourceSlice(in)["spec"]["devices"];
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1]["name"], "daemon-0");
  EXPECT_EQ(devices[1]["attributes"], (json{{"type", {{"string", "daemon"}}}, {"id", {{"int", 0}}}}));
}

TEST(ResourceSliceTest, OlderApiVersionsUseTheirShape) {
  SliceInputs in = Inputs();
  in.api_version = ResourceApiVersion::kV1beta1;
  const json beta1 = BuildResourceSlice(in);
  EXPECT_EQ(beta1["apiVersion"], "resource.k8s.io/v1beta1");
  EXPECT_EQ(beta1["spec"]["devices"][0]["basic"]["attributes"]["type"], (json{{"string", "channel"}}));
  EXPECT_FALSE(beta1["spec"]["devices"][0].contains("attributes"));
  in.api_version = ResourceApiVersion::kV1beta2;
  const json beta2 = BuildResourceSlice(in);
  EXPECT_EQ(beta2["apiVersion"], "resource.k8s.io/v1beta2");
  EXPECT_EQ(beta2["spec"]["devices"][0]["attributes"]["id"], (json{{"int", 0}}));
}

TEST(ResourceSliceTest, NoNodeUidNoOwnerReference) {
  SliceInputs in = Inputs();
  in.node_uid.clear();
  EXPECT_FALSE(BuildResourceSlice(in)["metadata"].contains("ownerReferences"));
}

// What the API server hands back: server fields, an older generation, a non-controller extra
// owner reference.
json AsStored(json slice) {
  slice["metadata"]["uid"] = "slice-uid";
  slice["metadata"]["resourceVersion"] = "12345";
  slice["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z";
  slice["metadata"]["ownerReferences"].push_back({{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"name", "x"}, {"uid", "y"}});
  slice["spec"]["pool"]["generation"] = 1;
  return slice;
}

TEST(ResourceSliceTest, NeedsUpdateOnlyWhenSomethingWeSetDiffers) {
  const json desired = BuildResourceSlice(Inputs());
  EXPECT_FALSE(SliceNeedsUpdate(AsStored(desired), desired)) << "server fields and generation do not count";

  SliceInputs in = Inputs();
  in.clique_id = "other.1";
  EXPECT_TRUE(SliceNeedsUpdate(AsStored(desired), BuildResourceSlice(in))) << "the clique changed";

  in = Inputs();
  in.host_managed = false;
  EXPECT_TRUE(SliceNeedsUpdate(AsStored(desired), BuildResourceSlice(in))) << "a device appears";
  EXPECT_TRUE(SliceNeedsUpdate(AsStored(BuildResourceSlice(in)), desired)) << "a device goes";

  json renamed = AsStored(desired);
  renamed["spec"]["devices"][0]["name"] = "channel-1";
  EXPECT_TRUE(SliceNeedsUpdate(renamed, desired));

  json extra_attribute = AsStored(desired);
  extra_attribute["spec"]["devices"][0]["attributes"]["stale"] = {{"bool", true}};
  EXPECT_TRUE(SliceNeedsUpdate(extra_attribute, desired));

  json other_node = AsStored(desired);
  other_node["spec"]["nodeName"] = "elsewhere";
  EXPECT_TRUE(SliceNeedsUpdate(other_node, desired));

  json count = AsStored(desired);
  count["spec"]["pool"]["resourceSliceCount"] = 2;
  EXPECT_TRUE(SliceNeedsUpdate(count, desired));

  json no_owner = AsStored(desired);
  no_owner["metadata"].erase("ownerReferences");
  EXPECT_TRUE(SliceNeedsUpdate(no_owner, desired));

  EXPECT_TRUE(SliceNeedsUpdate(json(nullptr), desired));
}

TEST(ResourceSliceTest, ComparesV1beta1SlicesThroughBasic) {
  SliceInputs in = Inputs();
  in.api_version = ResourceApiVersion::kV1beta1;
  const json desired = BuildResourceSlice(in);
  EXPECT_FALSE(SliceNeedsUpdate(AsStored(desired), desired));
  json changed = AsStored(desired);
  changed["spec"]["devices"][0]["basic"]["attributes"]["id"] = {{"int", 1}};
  EXPECT_TRUE(SliceNeedsUpdate(changed, desired));
}

}  // namespace
}  // namespace gns::dra
