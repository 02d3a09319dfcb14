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
    gpu.brand = 14;  // NVML_BRAND_NVIDIA
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

// TwoGpus with the second in MIG mode: a 3g.71gb at slices 4-7 (profile id 9) and a 1g.18gb at
// slice 0 (profile id 19), the latter with two compute instances (only the first is offered).
gpu_inventory::GpuInventory MixedGpus() {
  auto inventory = TwoGpus();
  auto& gpu = inventory.gpus[1];
  gpu.mig_enabled = true;
  gpu_inventory::MigDeviceInfo big;
  big.uuid = "MIG-00000000-0000-5000-8000-000000000001";
  big.gpu_instance = 2;
  big.profile = "3g.71gb";
  big.memory_bytes = uint64_t{71} << 30;
  big.multiprocessors = 60;
  big.copy_engines = 3;
  big.decoders = 3;
  big.jpeg_engines = 3;
  big.placement_known = true;
  big.gi_profile_id = 9;
  big.placement_start = 4;
  big.placement_size = 4;
  gpu_inventory::MigDeviceInfo small = big;
  small.uuid = "MIG-00000000-0000-5000-8000-000000000002";
  small.gpu_instance = 9;
  small.profile = "1g.18gb";
  small.memory_bytes = uint64_t{18} << 30;
  small.multiprocessors = 16;
  small.copy_engines = 1;
  small.decoders = 1;
  small.jpeg_engines = 1;
  small.ofa_engines = 0;
  small.gi_profile_id = 19;
  small.placement_start = 0;
  small.placement_size = 1;
  gpu_inventory::MigDeviceInfo second_ci = small;
  second_ci.uuid = "MIG-00000000-0000-5000-8000-000000000003";
  second_ci.compute_instance = 1;
  gpu_inventory::MigDeviceInfo unplaced = small;  // NVML did not say where: no upstream name
  unplaced.uuid = "MIG-00000000-0000-5000-8000-000000000004";
  unplaced.gpu_instance = 10;
  unplaced.placement_known = false;
  gpu.mig_devices = {big, small, second_ci, unplaced};
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

GpuSharing Sharing(std::string strategy, std::string interval = "") {
  GpuSharing out;
  out.strategy = std::move(strategy);
  out.interval = std::move(interval);
  return out;
}

json GpuConfig(json sharing, std::string source = "FromClaim", std::string kind = "GpuConfig") {
  json params{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", kind}};
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
  EXPECT_EQ(a["brand"], (json{{"string", "Nvidia"}}));
  EXPECT_EQ(a["architecture"], (json{{"string", "Hopper"}}));
  EXPECT_EQ(a["brand"], (json{{"string", "Nvidia"}}));
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
  // A brand NVML did not give, or one upstream has no name for: left out, not published wrong.
  auto unbranded = inventory;
  unbranded.gpus[0].brand.reset();
  unbranded.gpus[1].brand = 99;
  const auto slice = [](const gpu_inventory::GpuInventory& inv) {
    return GpuSliceDevices(inv, ServedGpus(inv, GpuSelection{true, {}}), dra::ResourceApiVersion::kV1);
  };
  for (const json& d : slice(unbranded)) EXPECT_FALSE(d["attributes"].contains("brand")) << d.dump();
  unbranded.gpus[1].brand = 2;
  EXPECT_EQ(slice(unbranded)[1]["attributes"]["brand"], (json{{"string", "Tesla"}}));
}

TEST(GpuSliceTest, TheSelectionAndMigDecideWhatIsServed) {
  auto inventory = TwoGpus();
  EXPECT_EQ(ServedGpus(inventory, GpuSelection{false, {"1"}}).size(), 1u);
  EXPECT_EQ(ServedGpus(inventory, GpuSelection{false, {inventory.gpus[0].uuid}}).front().minor, 4u);
  inventory.gpus[1].mig_enabled = true;  // served as its MIG devices (none here): nothing of it in the slice
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  EXPECT_EQ(served.size(), 2u);
  const json devices = GpuSliceDevices(inventory, served, dra::ResourceApiVersion::kV1);
  ASSERT_EQ(devices.size(), 1u) << devices.dump();
  EXPECT_EQ(devices[0]["name"], "gpu-4");
}

TEST(GpuSliceTest, AMigEnabledGpuIsOfferedAsItsMigDevicesWithUpstreamsNamesAttributesAndCapacity) {
  const auto inventory = MixedGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const json devices = GpuSliceDevices(inventory, served, dra::ResourceApiVersion::kV1);
  ASSERT_EQ(devices.size(), 3u) << devices.dump();
  EXPECT_EQ(devices[0]["name"], "gpu-4");
  EXPECT_EQ(devices[1]["name"], "gpu-5-mig-9-4-4");  // not gpu-5: a MIG-enabled GPU is not offered whole
  EXPECT_EQ(devices[2]["name"], "gpu-5-mig-19-0-1");
  const json& a = devices[1]["attributes"];
  EXPECT_EQ(a["type"], (json{{"string", "mig"}}));
  EXPECT_EQ(a["uuid"], (json{{"string", "MIG-00000000-0000-5000-8000-000000000001"}}));
  EXPECT_EQ(a["parentUUID"], (json{{"string", inventory.gpus[1].uuid}}));
  EXPECT_EQ(a["profile"], (json{{"string", "3g.71gb"}}));
  EXPECT_EQ(a["productName"], (json{{"string", "NVIDIA H200"}}));
  EXPECT_EQ(a["architecture"], (json{{"string", "Hopper"}}));
  EXPECT_EQ(a["cudaComputeCapability"], (json{{"version", "9.0.0"}}));
  EXPECT_EQ(a["driverVersion"], (json{{"version", "550.54.15"}}));
  EXPECT_EQ(a["cudaDriverVersion"], (json{{"version", "12.4.0"}}));
  EXPECT_EQ(a["pcieBusID"], (json{{"string", "00000000:5C:00.0"}}));
  EXPECT_EQ(a["resource.kubernetes.io/pciBusID"], (json{{"string", "0000:5c:00.0"}}));
  EXPECT_EQ(a["index"], (json{{"int", 1}}));
  EXPECT_EQ(a["minor"], (json{{"int", 5}}));
  const json& c = devices[1]["capacity"];
  EXPECT_EQ(c["memory"], (json{{"value", "71Gi"}}));
  EXPECT_EQ(c["multiprocessors"], (json{{"value", "60"}}));
  EXPECT_EQ(c["copyEngines"], (json{{"value", "3"}}));
  EXPECT_EQ(c["decoders"], (json{{"value", "3"}}));
  EXPECT_EQ(c["encoders"], (json{{"value", "0"}}));
  EXPECT_EQ(c["jpegEngines"], (json{{"value", "3"}}));
  EXPECT_EQ(c["ofaEngines"], (json{{"value", "0"}}));
  for (const char* slice : {"memorySlice4", "memorySlice5", "memorySlice6", "memorySlice7"}) {
    EXPECT_EQ(c[slice], (json{{"value", "1"}})) << slice;
  }
  EXPECT_FALSE(c.contains("memorySlice3"));
  EXPECT_FALSE(c.contains("memorySlice8"));
  EXPECT_EQ(devices[2]["capacity"]["memorySlice0"], (json{{"value", "1"}}));
  EXPECT_FALSE(devices[2]["capacity"].contains("memorySlice1"));
  // Taints go by device name: a MIG device's own.
  const json taint = json::array({{{"key", "gpu.nvidia.com/xid"}, {"value", "94"}, {"effect", "NoSchedule"}}});
  const json tainted =
      GpuSliceDevices(inventory, served, dra::ResourceApiVersion::kV1, {{"gpu-5-mig-19-0-1", taint}});
  EXPECT_EQ(tainted[2]["taints"], taint);
  EXPECT_FALSE(tainted[1].contains("taints") && !tainted[1]["taints"].empty());
}

TEST(GpuSliceTest, QuantitiesAndDeviceNames) {
  EXPECT_EQ(BinaryQuantity(uint64_t{80} << 30), "80Gi");
  EXPECT_EQ(BinaryQuantity(1000), "1000");
  gpu_inventory::MigDeviceInfo mig;
  mig.gi_profile_id = 14;
  mig.placement_start = 2;
  mig.placement_size = 2;
  EXPECT_EQ(MigDeviceName(3, mig), "gpu-3-mig-14-2-2");
}

// The one parser of the names (messages.hpp; pod-resources reads claims' devices with it): what
// GpuDeviceName and MigDeviceName write, and nothing else.
TEST(DeviceNameTest, ParsesWhatTheNamesWriteIntoTheirPartsAndNothingElse) {
  EXPECT_EQ(ParseDeviceName("gpu-0"), (DeviceNameParts{0, false, 0, 0, 0}));
  EXPECT_EQ(ParseDeviceName("gpu-12"), (DeviceNameParts{12, false, 0, 0, 0}));
  EXPECT_EQ(ParseDeviceName("gpu-3-mig-9-4-2"), (DeviceNameParts{3, true, 9, 4, 2}));
  EXPECT_EQ(ParseDeviceName("gpu-7-mig-19-0-1"), (DeviceNameParts{7, true, 19, 0, 1}));
  EXPECT_EQ(ParseDeviceName("gpu-4294967295"), (DeviceNameParts{4294967295u, false, 0, 0, 0}));
  // Round trips through the writers.
  for (const uint32_t minor : {0u, 5u, 127u}) {
    EXPECT_EQ(ParseDeviceName(GpuDeviceName(minor)), (DeviceNameParts{minor, false, 0, 0, 0}));
    gpu_inventory::MigDeviceInfo mig;
    mig.gi_profile_id = 14;
    mig.placement_start = 6;
    mig.placement_size = 2;
    EXPECT_EQ(ParseDeviceName(MigDeviceName(minor, mig)), (DeviceNameParts{minor, true, 14, 6, 2}));
  }
  for (const char* other :
       {"", "gpu", "gpu-", "gpu--1", "gpu-+1", "gpu-01", "gpu-3-", "gpu-3x", "gpu-x", "GPU-3", "channel-0", "mig-3",
        "gpu-4294967296", "gpu-12345678901", "gpu-3-mig", "gpu-3-mig-", "gpu-3-mig-9", "gpu-3-mig-9-4",
        "gpu-3-mig-9-4-", "gpu-3-mig-9-4-2-", "gpu-3-mig-9-4-2-1", "gpu-3-mig-09-4-2", "gpu-3-mig-9--4-2",
        "gpu-3-mig-9-4-2x", "gpu-3-MIG-9-4-2", "gpu-3-vfio", "gpu-3 ", " gpu-3"}) {
    EXPECT_EQ(ParseDeviceName(other), std::nullopt) << '"' << other << '"';
  }
}

TEST(GpuClaimTest, ARecordWhoseDeviceNameIsNotItsGpusIsRefused) {
  const auto inventory = MixedGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const auto plan = PlanGpuClaim(Claim({"gpu-4", "gpu-5-mig-19-0-1"}), kUid, kNode, served, {});
  ASSERT_EQ(plan.error, "");
  const auto entry = RecordFor(kUid, kNode, plan);
  ASSERT_EQ(GpusOf(entry), plan.gpus);
  const auto with = [&](const std::string& pointer, const json& value) {
    auto changed = entry;
    changed.driver_data[json::json_pointer(pointer)] = value;
    return GpusOf(changed);
  };
  EXPECT_TRUE(with("/gpus/0/device", "gpu-5").empty());             // another minor
  EXPECT_TRUE(with("/gpus/0/device", "gpu-4-mig-19-0-1").empty());  // a MIG name for a whole GPU
  EXPECT_TRUE(with("/gpus/1/device", "gpu-5").empty());             // a whole GPU's name for a MIG device
  EXPECT_TRUE(with("/gpus/1/device", "gpu-4-mig-19-0-1").empty());  // a MIG device of another minor
  EXPECT_TRUE(with("/gpus/1/mig/uuid", "").empty());                // a MIG device without its UUID
  EXPECT_TRUE(with("/gpus/0/device", "gpu-04").empty());
}

TEST(GpuConfigTest, MigDeviceConfigHasUpstreamsMigSharingSchema) {
  const auto parse = [](json sharing) {
    json params{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "MigDeviceConfig"}};
    if (!sharing.is_null()) params["sharing"] = std::move(sharing);
    return ParseMigDeviceConfig(params, "cfg");
  };
  EXPECT_EQ(parse(json()).sharing, GpuSharing{});
  EXPECT_EQ(parse({{"strategy", "TimeSlicing"}}).sharing, Sharing("TimeSlicing"));
  EXPECT_EQ(parse({{"strategy", "MPS"}, {"mpsConfig", json::object()}}).sharing, Sharing("MPS"));
  // A MIG device has no time-slice interval (upstream's MigDeviceSharing: strategy, mpsConfig).
  EXPECT_EQ(parse({{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Long"}}}}).error,
            "cfg.sharing.timeSlicingConfig: unknown field (MigDeviceConfig's sharing has strategy, mpsConfig)");
  EXPECT_EQ(ParseMigDeviceConfig({{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "GpuConfig"}}, "cfg").error,
            "cfg.kind: expected \"MigDeviceConfig\"");
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
            Sharing("TimeSlicing", "Long"));
  GpuSharing mps = Sharing("MPS");
  mps.active_thread_percentage = 50;
  EXPECT_EQ(parse({{"strategy", "MPS"}, {"mpsConfig", {{"defaultActiveThreadPercentage", 50}}}}).sharing, mps);
  mps.pinned_memory_bytes = 10ULL << 30;
  mps.pinned_memory_per_device = {{"0", 2ULL << 30}, {"GPU-abc", 1536ULL << 20}};
  EXPECT_EQ(parse({{"strategy", "MPS"},
                   {"mpsConfig",
                    {{"defaultActiveThreadPercentage", 50},
                     {"defaultPinnedDeviceMemoryLimit", "10Gi"},
                     {"defaultPerDevicePinnedMemoryLimit", {{"0", "2Gi"}, {"GPU-abc", "1.5Gi"}}},
                     {"multiUser", false}}}})
                .sharing,
            mps);
}

TEST(GpuConfigTest, MpsLimitsAreCheckedAsUpstreamChecksThem) {
  const auto error = [](json mps) {
    return ParseGpuConfig({{"apiVersion", "resource.nvidia.com/v1beta1"},
                           {"kind", "GpuConfig"},
                           {"sharing", {{"strategy", "MPS"}, {"mpsConfig", std::move(mps)}}}},
                          "cfg")
        .error;
  };
  EXPECT_EQ(error({{"defaultActiveThreadPercentage", 0}}),
            "cfg.sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer from 1 to 100, got 0");
  EXPECT_EQ(error({{"defaultActiveThreadPercentage", 101}}),
            "cfg.sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer from 1 to 100, got 101");
  EXPECT_EQ(error({{"defaultActiveThreadPercentage", "50"}}),
            "cfg.sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer from 1 to 100, got \"50\"");
  EXPECT_EQ(error({{"defaultPinnedDeviceMemoryLimit", "ten"}}),
            "cfg.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: \"ten\" is not a quantity (digits with Ki, Mi, "
            "Gi, Ti, Pi, Ei, k, M, G, T, P or E)");
  EXPECT_EQ(error({{"defaultPerDevicePinnedMemoryLimit", {{"1", "0"}}}}),
            "cfg.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.1: \"0\" is out of range (at least one byte, "
            "below 8Ei)");
  EXPECT_EQ(error({{"multiUser", "yes"}}), "cfg.sharing.mpsConfig.multiUser: expected true or false");
  EXPECT_EQ(error({{"pipeDirectory", "/x"}}),
            "cfg.sharing.mpsConfig.pipeDirectory: unknown field (mpsConfig has defaultActiveThreadPercentage, "
            "defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser)");
}

TEST(GpuConfigTest, QuantitiesAsTheApiWritesThem) {
  std::string why;
  EXPECT_EQ(QuantityBytes("10Gi", why), 10ULL << 30);
  EXPECT_EQ(why, "");
  EXPECT_EQ(QuantityBytes("1.5Gi", why), 1536ULL << 20);
  EXPECT_EQ(QuantityBytes("500M", why), 500000000ULL);
  EXPECT_EQ(QuantityBytes("4k", why), 4000ULL);
  EXPECT_EQ(QuantityBytes(json(1048576), why), 1048576ULL);
  EXPECT_EQ(why, "");
  for (const json& bad : {json("1e3"), json("-1Gi"), json("1.2.3Gi"), json("Gi"), json(""), json(-5), json(true)}) {
    EXPECT_EQ(QuantityBytes(bad, why), 0u) << bad;
    EXPECT_NE(why, "") << bad;
  }
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

TEST(GpuClaimTest, AnMpsClaimsSpecPointsItsContainersAtTheOperatorsControlDaemon) {
  const auto inventory = TwoGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const json config = GpuConfig({{"strategy", "MPS"},
                                 {"mpsConfig",
                                  {{"defaultActiveThreadPercentage", 25},
                                   {"defaultPinnedDeviceMemoryLimit", "4Gi"},
                                   {"defaultPerDevicePinnedMemoryLimit", {{"0", "2Gi"}}}}}});
  const auto plan = PlanGpuClaim(Claim({"gpu-4"}, config), kUid, kNode, served, {});
  ASSERT_EQ(plan.error, "");
  const auto mps = MpsFor(plan, "/run/nvidia/mps/");
  ASSERT_TRUE(mps.has_value());
  EXPECT_EQ(mps->pipe_dir, "/run/nvidia/mps/gpu.nvidia.com/gpu-4/pipe");
  EXPECT_EQ(mps->shm_dir, "/run/nvidia/mps/shm");
  EXPECT_EQ(mps->container_pipe_dir, "/mps/gpu.nvidia.com/gpu-4/pipe");
  EXPECT_EQ(mps->active_thread_percentage, 25);
  EXPECT_EQ(mps->pinned_memory_mib, 2048u) << "the per-device limit of device 0 wins over the default";
  // Named by the GPU's UUID instead.
  const auto by_uuid = PlanGpuClaim(
      Claim({"gpu-4"}, GpuConfig({{"strategy", "MPS"},
                                  {"mpsConfig",
                                   {{"defaultPinnedDeviceMemoryLimit", "4Gi"},
                                    {"defaultPerDevicePinnedMemoryLimit", {{plan.gpus[0].uuid, "3Gi"}, {"GPU-other", "1Gi"}}}}}})),
      kUid, kNode, served, {});
  EXPECT_EQ(MpsFor(by_uuid, "/run/nvidia/mps")->pinned_memory_mib, 3072u);

  const auto entry = RecordFor(kUid, kNode, plan, mps);
  EXPECT_EQ(MpsOf(entry), mps) << "the record keeps what the spec is built from";
  device_plugin::CdiHostFacts facts;
  facts.control_nodes = {"/dev/nvidiactl"};
  const json spec = BuildGpuClaimSpec(kUid, GpusOf(entry), device_plugin::CdiSettings{}, facts, MpsOf(entry));
  EXPECT_EQ(device_plugin::ValidateCdiSpec(spec), "");
  const json& edits = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(edits["env"], json::array({"CUDA_MPS_PIPE_DIRECTORY=/mps/gpu.nvidia.com/gpu-4/pipe",
                                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M"}));
  ASSERT_EQ(edits["mounts"].size(), 2u) << edits.dump();
  EXPECT_EQ(edits["mounts"][0]["hostPath"], "/run/nvidia/mps/gpu.nvidia.com/gpu-4/pipe");
  EXPECT_EQ(edits["mounts"][0]["containerPath"], "/mps/gpu.nvidia.com/gpu-4/pipe");
  EXPECT_EQ(edits["mounts"][0]["options"][0], "rw");
  EXPECT_EQ(edits["mounts"][1]["hostPath"], "/run/nvidia/mps/shm");
  EXPECT_EQ(edits["mounts"][1]["containerPath"], "/dev/shm");

  // Without MPS: no such edits, and the record has none.
  const auto plain = PlanGpuClaim(Claim({"gpu-4"}), kUid, kNode, served, {});
  EXPECT_FALSE(MpsFor(plain, "/run/nvidia/mps").has_value());
  EXPECT_FALSE(MpsOf(RecordFor(kUid, kNode, plain)).has_value());
  const json plain_spec = BuildGpuClaimSpec(kUid, GpusOf(RecordFor(kUid, kNode, plain)), device_plugin::CdiSettings{}, facts);
  EXPECT_FALSE(plain_spec["devices"][0]["containerEdits"].contains("env"));
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
            "ResourceClaim team-a/train: status.allocation.devices.results[0].device: gpu-9 is not a GPU or MIG "
            "device this node serves through gpu.nvidia.com");
  EXPECT_EQ(refused(Claim({})).error, "ResourceClaim team-a/train: no allocation result for driver gpu.nvidia.com");
  json unallocated = Claim({"gpu-4"});
  unallocated["status"].erase("allocation");
  EXPECT_EQ(refused(unallocated).error,
            "ResourceClaim team-a/train: status.allocation is not set (the claim is not allocated)");
  // MPS: one device per claim, and the control daemon's own settings are the operator's.
  EXPECT_EQ(refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "MPS"}}))).error, "");
  EXPECT_TRUE(refused(Claim({"gpu-4", "gpu-5"}, GpuConfig({{"strategy", "MPS"}}))).permanent);
  EXPECT_NE(refused(Claim({"gpu-4", "gpu-5"}, GpuConfig({{"strategy", "MPS"}}))).error.find("an MPS claim has one device"),
            std::string::npos);
  EXPECT_NE(refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "MPS"}, {"mpsConfig", {{"multiUser", true}}}})))
                .error.find("multiUser is the control daemon's setting"),
            std::string::npos);
  // A non-default interval is planned (the module sets the GPU before the claim is prepared)
  // and kept in the record, where time_slices.hpp reads what the GPU must keep.
  const auto short_slice =
      refused(Claim({"gpu-4"}, GpuConfig({{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Short"}}}})));
  ASSERT_EQ(short_slice.error, "");
  EXPECT_EQ(RecordFor(kUid, kNode, short_slice).driver_data["sharing"]["interval"], "Short");
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

TEST(GpuClaimTest, AMigDeviceWithEachConfigBecomesARecordAndASpecWithItsCapsNodes) {
  const auto inventory = MixedGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  device_plugin::CdiHostFacts facts;
  facts.control_nodes = {"/dev/nvidiactl"};
  facts.gi_caps[{5, 9}] = 120;     // /proc/driver/nvidia-caps/mig-minors: gpu5/gi9/access 120
  facts.ci_caps[{5, 9, 0}] = 121;  // gpu5/gi9/ci0/access 121
  const json mig_config_ts = GpuConfig({{"strategy", "TimeSlicing"}}, "FromClaim", "MigDeviceConfig");
  const json mig_config_none = GpuConfig(json(), "FromClass", "MigDeviceConfig");
  for (const json& configs : {json::array(), mig_config_none, mig_config_ts}) {
    SCOPED_TRACE(configs.dump());
    const auto plan = PlanGpuClaim(Claim({"gpu-5-mig-19-0-1"}, configs), kUid, kNode, served, {});
    ASSERT_EQ(plan.error, "");
    ASSERT_EQ(plan.gpus.size(), 1u);
    const ClaimGpu& gpu = plan.gpus[0];
    EXPECT_EQ(gpu.device, "gpu-5-mig-19-0-1");
    EXPECT_EQ(gpu.uuid, inventory.gpus[1].uuid);
    EXPECT_EQ(gpu.mig_uuid, "MIG-00000000-0000-5000-8000-000000000002");
    EXPECT_EQ(gpu.gpu_instance, 9u);
    EXPECT_EQ(gpu.compute_instance, 0u);
    EXPECT_EQ(gpu.minor, 5u);
    const auto entry = RecordFor(kUid, kNode, plan);
    EXPECT_EQ(entry.device, "gpu-5-mig-19-0-1");
    EXPECT_EQ(GpusOf(entry), plan.gpus) << "the record gives the MIG device back";
    const json spec = BuildGpuClaimSpec(kUid, GpusOf(entry), device_plugin::CdiSettings{}, facts);
    EXPECT_EQ(device_plugin::ValidateCdiSpec(spec), "");
    ASSERT_EQ(spec["devices"].size(), 1u) << spec.dump();
    EXPECT_EQ(spec["devices"][0]["name"], std::string(kUid) + "-gpu-5-mig-19-0-1");
    const json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
    ASSERT_EQ(nodes.size(), 3u) << nodes.dump();
    EXPECT_EQ(nodes[0]["path"], "/dev/nvidia5");
    EXPECT_EQ(nodes[1]["path"], "/dev/nvidia-caps/nvidia-cap120");
    EXPECT_EQ(nodes[2]["path"], "/dev/nvidia-caps/nvidia-cap121");
  }
  const auto ts = PlanGpuClaim(Claim({"gpu-5-mig-19-0-1"}, mig_config_ts), kUid, kNode, served, {});
  EXPECT_EQ(RecordFor(kUid, kNode, ts).driver_data["sharing"]["strategy"], "TimeSlicing");
  // A whole GPU and a MIG device in one claim.
  const auto mixed = PlanGpuClaim(Claim({"gpu-4", "gpu-5-mig-9-4-4"}), kUid, kNode, served, {});
  ASSERT_EQ(mixed.error, "");
  EXPECT_FALSE(mixed.gpus[0].Mig());
  EXPECT_TRUE(mixed.gpus[1].Mig());
  EXPECT_EQ(GpusOf(RecordFor(kUid, kNode, mixed)), mixed.gpus);
}

TEST(GpuClaimTest, TheWrongConfigKindForTheDeviceIsRefusedByName) {
  const auto inventory = MixedGpus();
  const auto served = ServedGpus(inventory, GpuSelection{true, {}});
  const auto plan = [&](const json& claim) { return PlanGpuClaim(claim, kUid, kNode, served, {}); };
  const auto gpu_on_mig = plan(Claim({"gpu-5-mig-9-4-4"}, GpuConfig({{"strategy", "TimeSlicing"}})));
  EXPECT_TRUE(gpu_on_mig.permanent);
  EXPECT_EQ(gpu_on_mig.error,
            "ResourceClaim team-a/train: status.allocation.devices.config[0]: a GpuConfig applies to request "
            "\"gpus\", but gpu-5-mig-9-4-4 is a MIG device (use MigDeviceConfig)");
  const auto mig_on_gpu = plan(Claim({"gpu-4"}, GpuConfig(json(), "FromClaim", "MigDeviceConfig")));
  EXPECT_TRUE(mig_on_gpu.permanent);
  EXPECT_EQ(mig_on_gpu.error,
            "ResourceClaim team-a/train: status.allocation.devices.config[0]: a MigDeviceConfig applies to request "
            "\"gpus\", but gpu-4 is a whole GPU (use GpuConfig)");
  // MPS on a MIG device: the operator's control daemon for that MIG device serves it.
  const auto mig_mps = plan(Claim({"gpu-5-mig-9-4-4"}, GpuConfig({{"strategy", "MPS"}}, "FromClaim", "MigDeviceConfig")));
  ASSERT_EQ(mig_mps.error, "");
  EXPECT_EQ(MpsFor(mig_mps, "/run/nvidia/mps")->pipe_dir, "/run/nvidia/mps/gpu.nvidia.com/gpu-5-mig-9-4-4/pipe");
  // The MIG-enabled parent is not offered whole, nor a MIG device NVML gave no placement for.
  EXPECT_NE(plan(Claim({"gpu-5"})).error.find("gpu-5 is not a GPU or MIG device this node serves"), std::string::npos);
  // A released parent: its MIG devices are out for the reset too (retryable).
  auto released = inventory;
  released.gpus[1].released = true;
  released.gpus[1].release_reason = "gpu-reset";
  const auto out = PlanGpuClaim(Claim({"gpu-5-mig-9-4-4"}), kUid, kNode, ServedGpus(released, GpuSelection{true, {}}), {});
  EXPECT_FALSE(out.permanent);
  EXPECT_NE(out.error.find("taken out for a reset"), std::string::npos) << out.error;
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
