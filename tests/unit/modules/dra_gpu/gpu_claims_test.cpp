// The gpu.nvidia.com driver's pure parts: the slice's devices and attributes, GpuConfig's schema
// and errors, the decision for a claim, the record's own members, the per-claim CDI spec, and
// the GPU split between DRA and the device plugin.
#include "loop/gpu_split.hpp"
#include "modules/dra_gpu/gpu_claims.hpp"

#include <gtest/gtest.h>

namespace gns::dra_gpu {
namespace {

using nlohmann::json;

constexpr const char* kNode = "h200-node-01";
constexpr const char* kUid = "c1a1m000-0000-4000-8000-000000000001";

gpu_inventory::GpuInventory TwoGpus() {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  inventory.driver_version = "550.54.15";
  inventory.cuda_driver_version = 12040;
  for (uint32_t i = 0; i < 2; ++i) {
    gpu_inventory::GpuInfo gpu;
    gpu.index = i;
    gpu.minor = i + 4;  // minors need not be indices: the device name follows the minor
    gpu.uuid = "GPU-0000000" + std::to_string(i) + "-aaaa-bbbb-cccc-dddddddddddd";
    gpu.name = "NVIDIA H200";
    gpu.pci_bus_id = i == 0 ? "00000000:3B:00.0" : "00000000:5C:00.0";
    gpu.memory_total_bytes = uint64_t{143771} << 20;  // 143771 MiB
    gpu.cc_major = 9;
    gpu.cc_minor = 0;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

json Claim(const std::vector<std::string>& devices, json configs = json::array(), std::string pool = kNode) {
  json results = json::array();
  for (const auto& d : devices) {
    results.push_back({{"request", "gpus"}, {"driver", "gpu.nvidia.com"}, {"pool", pool}, {"device", d}});
  }
  return json{{"metadata", {{"namespace", "team-a"}, {"name", "train"}, {"uid", kUid}}},
              {"status", {{"allocation", {{"devices", {{"results", results}, {"config", configs}}}}}}}};
}

json GpuConfig(json sharing, std::string source = "FromClaim") {
  json params{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "GpuConfig"}};
  if (!sharing.is_null()) params["sharing"] = std::move(sharing);
  return json::array({{{"source", source}, {"opaque", {{"driver", "gpu.nvidia.com"}, {"parameters", params}}}}});
}

// ------------------------------------------------------------------------------ slice

TEST(GpuSliceTest, TwoGpusWithUpstreamsNamesAttributesAndCapacity) {
  const auto inventory = TwoGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const json devices = GpuSliceDevices(inventory, served, dra::ResourceApiVersion::kV1);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0]["name"], "gpu-4");
  EXPECT_EQ(devices[1]["name"], "gpu-5");
  const json& a = devices[0]["attributes"];
  EXPECT_EQ(a["type"], (json{{"string", "gpu"}}));
  EXPECT_EQ(a["uuid"], (json{{"string", inventory.gpus[0].uuid}}));
  EXPECT_EQ(a["productName"], (json{{"string", "NVIDIA H200"}}));
  EXPECT_EQ(a["architecture"], (json{{"string", "Hopper"}}));
  EXPECT_EQ(a["cudaComputeCapability"], (json{{"version", "9.0.0"}}));
  EXPECT_EQ(a["driverVersion"], (json{{"version", "550.54.15"}}));
  EXPECT_EQ(a["cudaDriverVersion"], (json{{"version", "12.4.0"}}));
  EXPECT_EQ(a["pcieBusID"], (json{{"string", "00000000:3B:00.0"}}));
  EXPECT_EQ(a["resource.kubernetes.io/pciBusID"], (json{{"string", "0000:3b:00.0"}}));
  EXPECT_EQ(a["index"], (json{{"int", 0}}));
  EXPECT_EQ(a["minor"], (json{{"int", 4}}));
  EXPECT_EQ(devices[0]["capacity"]["memory"], (json{{"value", "143771Mi"}}));
  // v1beta1 wraps the same fields in `basic`.
  const json beta = GpuSliceDevices(inventory, served, dra::ResourceApiVersion::kV1beta1);
  EXPECT_EQ(beta[1]["basic"]["attributes"]["minor"], (json{{"int", 5}}));
}

TEST(GpuSliceTest, TheSelectionAndMigDecideWhatIsServed) {
  auto inventory = TwoGpus();
  EXPECT_EQ(ServedGpus(inventory, GpuSelection{false, {"1"}}).size(), 1u);
  EXPECT_EQ(ServedGpus(inventory, GpuSelection{false, {inventory.gpus[0].uuid}}).front().minor, 4u);
  inventory.gpus[1].mig_enabled = true;  // MIG devices are not served yet: the GPU is left out
  EXPECT_EQ(ServedGpus(inventory, GpuSelection{true, {}}).size(), 1u);
}

TEST(GpuSliceTest, QuantitiesAndDeviceNames) {
  EXPECT_EQ(BinaryQuantity(uint64_t{80} << 30), "80Gi");
  EXPECT_EQ(BinaryQuantity(1000), "1000");
  EXPECT_EQ(MinorOfDeviceName("gpu-12"), 12u);
  EXPECT_FALSE(MinorOfDeviceName("gpu-"));
  EXPECT_FALSE(MinorOfDeviceName("gpu-01"));
  EXPECT_FALSE(MinorOfDeviceName("gpu-1-mig-1-0"));
  EXPECT_FALSE(MinorOfDeviceName("channel-0"));
}

// ------------------------------------------------------------------------------ GpuConfig

TEST(GpuConfigTest, ValidConfigs) {
  const auto parse = [](json sharing) {
    json params{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "GpuConfig"}};
    if (!sharing.is_null()) params["sharing"] = sharing;
    return ParseGpuConfig(params, "p");
  };
  EXPECT_EQ(parse(json()).sharing, GpuSharing{});
  EXPECT_EQ(parse({{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Long"}}}}).sharing,
            (GpuSharing{"TimeSlicing", "Long"}));
  EXPECT_EQ(parse({{"strategy", "MPS"}, {"mpsConfig", {{"defaultActiveThreadPercentage", 50}}}}).sharing,
            (GpuSharing{"MPS", ""}));
}

TEST(GpuConfigTest, ErrorsNameThePathAndWhy) {
  const auto error = [](json params) { return ParseGpuConfig(params, "cfg").error; };
  const json base{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "GpuConfig"}};
  auto with = [&](json sharing) {
    json p = base;
    p["sharing"] = std::move(sharing);
    return p;
  };
  EXPECT_EQ(error(json::array()), "cfg: expected an object, got array");
  EXPECT_EQ(error({{"apiVersion", "v1"}, {"kind", "GpuConfig"}}), "cfg.apiVersion: expected \"resource.nvidia.com/v1beta1\"");
  EXPECT_EQ(error(json{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "GpuConfig"}, {"shar", 1}}),
            "cfg.shar: unknown field (GpuConfig has apiVersion, kind, sharing)");
  EXPECT_EQ(error(with({{"strategy", "Spatial"}})), "cfg.sharing.strategy: \"Spatial\" is not TimeSlicing or MPS");
  EXPECT_EQ(error(with(json::object())), "cfg.sharing.strategy: required, TimeSlicing or MPS");
  EXPECT_EQ(error(with({{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Forever"}}}})),
            "cfg.sharing.timeSlicingConfig.interval: \"Forever\" is not Default, Short, Medium or Long");
  EXPECT_EQ(error(with({{"strategy", "MPS"}, {"timeSlicingConfig", {{"interval", "Short"}}}})),
            "cfg.sharing.timeSlicingConfig: set, but the strategy is MPS");
  EXPECT_EQ(error(with({{"strategy", "TimeSlicing"}, {"mpsConfig", json::object()}})),
            "cfg.sharing.mpsConfig: set, but the strategy is TimeSlicing");
}

// ------------------------------------------------------------------------------ claims

TEST(GpuClaimTest, TwoGpusOfAClaimBecomeOneRecordAndOneSpec) {
  const auto inventory = TwoGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const auto plan = PlanGpuClaim(Claim({"gpu-4", "gpu-5"}), kUid, kNode, served, {});
  ASSERT_EQ(plan.error, "");
  ASSERT_EQ(plan.gpus.size(), 2u);
  const auto entry = RecordFor(kUid, kNode, plan);
  EXPECT_EQ(entry.device, "gpu-4");
  EXPECT_EQ(entry.cdi_device_id, std::string("k8s.gpu.nvidia.com/claim=") + kUid + "-gpu-4");
  ASSERT_EQ(entry.more_devices.size(), 1u);
  EXPECT_EQ(entry.more_devices[0].device, "gpu-5");
  EXPECT_EQ(entry.cdi_spec_file, std::string("k8s.gpu.nvidia.com-claim_") + kUid + ".json");
  EXPECT_EQ(GpusOf(entry), plan.gpus);

  device_plugin::CdiHostFacts facts;
  facts.control_nodes = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
  facts.driver_files = {"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"};
  const json spec = BuildGpuClaimSpec(kUid, GpusOf(entry), device_plugin::CdiSettings{}, facts);
  EXPECT_EQ(device_plugin::ValidateCdiSpec(spec), "");
  EXPECT_EQ(spec["kind"], "k8s.gpu.nvidia.com/claim");
  ASSERT_EQ(spec["devices"].size(), 2u) << spec.dump();  // no "all": a claim has only its own GPUs
  EXPECT_EQ(spec["devices"][0]["name"], std::string(kUid) + "-gpu-4");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia4");
  EXPECT_EQ(spec["devices"][1]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia5");
  EXPECT_EQ(spec["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidiactl");
  EXPECT_EQ(spec["containerEdits"]["mounts"][0]["containerPath"], facts.driver_files[0]);
}

TEST(GpuClaimTest, RefusalsSayWhyAndWhetherARetryHelps) {
  auto inventory = TwoGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const auto refused = [&](const json& claim, const dra::Checkpoint& state = {}) {
    return PlanGpuClaim(claim, kUid, kNode, served, state);
  };
  EXPECT_EQ(refused(Claim({"gpu-4"}, json::array(), "other-node")).error,
            "ResourceClaim team-a/train: status.allocation.devices.results[0].pool: \"other-node\" is not this node's "
            "pool (h200-node-01)");
  EXPECT_EQ(refused(Claim({"gpu-9"})).error,
            "ResourceClaim team-a/train: status.allocation.devices.results[0].device: gpu-9 is not a GPU this node "
            "serves through gpu.nvidia.com");
  EXPECT_EQ(refused(Claim({})).error, "ResourceClaim team-a/train: no allocation result for driver gpu.nvidia.com");
  json unallocated = Claim({"gpu-4"});
  unallocated["status"].erase("allocation");
  EXPECT_EQ(refused(unallocated).error,
            "ResourceClaim team-a/train: status.allocation is not set (the claim is not allocated)");
  EXPECT_TRUE(refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "MPS"}}))).permanent);
  EXPECT_NE(refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "MPS"}}))).error.find("MPS is not supported"),
            std::string::npos);
  EXPECT_NE(refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Short"}}}})))
                .error.find("interval Short is not supported by this driver yet (only Default)"),
            std::string::npos);
  EXPECT_NE(refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "Bogus"}}))).error.find("invalid opaque config: "),
            std::string::npos);
  // A Default time-slicing config is what the GPU does anyway: accepted and kept in the record.
  const auto ts = refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "TimeSlicing"}})));
  ASSERT_EQ(ts.error, "");
  EXPECT_EQ(RecordFor(kUid, kNode, ts).driver_data["sharing"]["strategy"], "TimeSlicing");
  json wrong_uid = Claim({"gpu-4"});
  wrong_uid["metadata"]["uid"] = "someone-else";
  EXPECT_TRUE(refused(wrong_uid).permanent);

  // Retryable: another prepared claim holds the GPU; the GPU is out for a reset.
  dra::Checkpoint state;
  dra::PreparedClaim other;
  other.uid = "other";
  other.namespace_name = "team-b";
  other.name = "infer";
  other.state = dra::ClaimState::kPrepareCompleted;
  other.device = "gpu-4";
  state.claims["other"] = other;
  const auto held = refused(Claim({"gpu-4"}), state);
  EXPECT_FALSE(held.permanent);
  EXPECT_NE(held.error.find("gpu-4 is held by prepared claim team-b/infer"), std::string::npos) << held.error;
  inventory.gpus[0].released = true;
  inventory.gpus[0].release_reason = "gpu-reset";
  const auto released = PlanGpuClaim(Claim({"gpu-4"}), kUid, kNode, ServedGpus(inventory, GpuSelection{true, {}}), {});
  EXPECT_FALSE(released.permanent);
  EXPECT_NE(released.error.find("taken out for a reset"), std::string::npos) << released.error;
}

// ------------------------------------------------------------------------------ the split

TEST(GpuSplitTest, AnOverlapNamesBothKeysAndTheGpus) {
  GpuSplit split;
  split.dra_set = true;
  split.dra = GpuSelection{false, {"0", "GPU-a"}};
  split.dra_where = "modules.dra-gpu.gpus";
  EXPECT_EQ(split.Overlap(), "");  // the device plugin takes what DRA leaves
  split.plugin_set = true;
  split.plugin_where = "modules.device-plugin.gpus";
  split.plugin = GpuSelection{false, {"1", "GPU-b"}};
  EXPECT_EQ(split.Overlap(), "");
  split.plugin = GpuSelection{false, {"1", "GPU-a"}};
  EXPECT_EQ(split.Overlap(),
            "a GPU is served by the device plugin or by DRA, never both: modules.dra-gpu.gpus ([0, GPU-a]) and "
            "modules.device-plugin.gpus ([1, GPU-a]) both select GPU-a");
  split.plugin = GpuSelection{true, {}};
  EXPECT_NE(split.Overlap().find("([0, GPU-a]) and modules.device-plugin.gpus (all) both select every GPU of "
                                 "modules.dra-gpu.gpus"),
            std::string::npos)
      << split.Overlap();
}

}  // namespace
}  // namespace gns::dra_gpu
