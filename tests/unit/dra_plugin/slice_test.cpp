// The DRA plugin core's ResourceSlice and plugin paths for a driver other than compute domains:
// every name comes from the driver, devices carry capacity, and the drift check sees it.
#include "dra_plugin/plugin_paths.hpp"
#include "dra_plugin/slice.hpp"

#include <gtest/gtest.h>

namespace gns::dra {
namespace {

using nlohmann::json;

SliceSpec GpuSlice(ResourceApiVersion version) {
  SliceSpec spec;
  spec.driver_name = "gpu.nvidia.com";
  spec.node_name = "node-a";
  spec.node_uid = "0a1b2c3d";
  spec.generation = 3;
  spec.api_version = version;
  spec.devices.push_back(SliceDevice("gpu-0", {{"type", {{"string", "gpu"}}}, {"index", {{"int", 0}}}},
                                     {{"memory", {{"value", "80Gi"}}}}, version));
  spec.devices.push_back(SliceDevice("gpu-1", {{"type", {{"string", "gpu"}}}, {"index", {{"int", 1}}}}, json(), version));
  return spec;
}

TEST(DraSliceTest, TheDriverNamesTheSliceAndItsSpec) {
  const json slice = BuildSlice(GpuSlice(ResourceApiVersion::kV1));
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["metadata"]["name"], "node-a-gpu.nvidia.com");
  EXPECT_EQ(SliceName("node-a", "gpu.nvidia.com"), "node-a-gpu.nvidia.com");
  EXPECT_EQ(slice["spec"]["driver"], "gpu.nvidia.com");
  EXPECT_EQ(slice["spec"]["nodeName"], "node-a");
  EXPECT_EQ(slice["spec"]["pool"], (json{{"name", "node-a"}, {"generation", 3}, {"resourceSliceCount", 1}}));
  ASSERT_EQ(slice["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], "0a1b2c3d");
  const json& devices = slice["spec"]["devices"];
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0]["name"], "gpu-0");
  EXPECT_EQ(devices[0]["attributes"]["index"]["int"], 0);
  EXPECT_EQ(devices[0]["capacity"]["memory"]["value"], "80Gi");
  EXPECT_FALSE(devices[1].contains("capacity")) << "no capacity: left out";
  EXPECT_EQ(ApiVersionOnly(ResourceApiVersion::kV1beta2), "v1beta2");
}

TEST(DraSliceTest, V1beta1WrapsEachDeviceInBasic) {
  const json slice = BuildSlice(GpuSlice(ResourceApiVersion::kV1beta1));
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1beta1");
  const json& device = slice["spec"]["devices"][0];
  EXPECT_EQ(device["name"], "gpu-0");
  EXPECT_FALSE(device.contains("attributes"));
  EXPECT_EQ(device["basic"]["attributes"]["type"]["string"], "gpu");
  EXPECT_EQ(device["basic"]["capacity"]["memory"]["value"], "80Gi");
}

TEST(DraSliceTest, ACapacityChangeIsDrift) {
  const json desired = BuildSlice(GpuSlice(ResourceApiVersion::kV1));
  EXPECT_FALSE(SliceNeedsUpdate(desired, desired));
  json stored = desired;
  stored["spec"]["pool"]["generation"] = 9;  // the generation is the publisher's, not drift
  EXPECT_FALSE(SliceNeedsUpdate(stored, desired));
  stored["spec"]["devices"][0]["capacity"]["memory"]["value"] = "40Gi";
  EXPECT_TRUE(SliceNeedsUpdate(stored, desired));
  json other_driver = desired;
  other_driver["spec"]["driver"] = "compute-domain.nvidia.com";
  EXPECT_TRUE(SliceNeedsUpdate(other_driver, desired));
}

// A taint coming or going is drift (the publisher writes it), in either device shape; the same
// taint read back is not.
TEST(DraSliceTest, ATaintComingOrGoingIsDriftInEachShape) {
  const json taint{{"key", "gpu.nvidia.com/xid"}, {"value", "79"}, {"effect", "NoSchedule"},
                   {"timeAdded", "2026-11-28T09:40:00Z"}};
  for (const auto version : {ResourceApiVersion::kV1, ResourceApiVersion::kV1beta1}) {
    const json clean = BuildSlice(GpuSlice(version));
    SliceSpec spec = GpuSlice(version);
    spec.devices[1] = SliceDevice("gpu-1", {{"type", {{"string", "gpu"}}}, {"index", {{"int", 1}}}}, json(), version,
                                  json::array({taint}));
    const json tainted = BuildSlice(spec);
    const json& device = tainted["spec"]["devices"][1];
    EXPECT_EQ(version == ResourceApiVersion::kV1beta1 ? device["basic"]["taints"][0] : device["taints"][0], taint);
    EXPECT_FALSE(clean["spec"]["devices"][1].contains("taints")) << "no taints: left out";
    EXPECT_TRUE(SliceNeedsUpdate(clean, tainted)) << "a taint appears";
    EXPECT_TRUE(SliceNeedsUpdate(tainted, clean)) << "a taint is removed";
    EXPECT_FALSE(SliceNeedsUpdate(tainted, tainted));
    json changed = tainted;
    (version == ResourceApiVersion::kV1beta1 ? changed["spec"]["devices"][1]["basic"] : changed["spec"]["devices"][1])
        ["taints"][0]["effect"] = "NoExecute";
    EXPECT_TRUE(SliceNeedsUpdate(changed, tainted)) << "another effect";
  }
}

TEST(DraPluginPathsTest, EachDriverHasItsOwnSocketsAndState) {
  SitePaths site;
  site.kubelet_dir = "/var/lib/kubelet";
  site.state_dir = "/var/lib/gns";
  site.cdi_dir = "/var/run/cdi";
  const PluginPaths gpu = MakePluginPaths(site, "gpu.nvidia.com", "dra-gpu");
  const PluginPaths cd = MakePluginPaths(site, "compute-domain.nvidia.com", "dra-compute-domain");
  EXPECT_EQ(gpu.registration_socket, "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock");
  EXPECT_EQ(gpu.dra_socket, "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock");
  EXPECT_EQ(gpu.checkpoint_file, "/var/lib/gns/dra-gpu/checkpoint.json");
  EXPECT_EQ(gpu.claim_log_file, "/var/lib/gns/dra-gpu/claims.log");
  EXPECT_EQ(cd.claim_log_file, "/var/lib/gns/dra-compute-domain/claims.log");
  EXPECT_EQ(gpu.plugins_registry_dir, cd.plugins_registry_dir) << "the kubelet's one watcher directory";
  EXPECT_EQ(gpu.cdi_dir, "/var/run/cdi");
}

}  // namespace
}  // namespace gns::dra
