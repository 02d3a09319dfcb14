// The dcgm-exporter compatible GPU series (dcgm_series.hpp): names, types, units and labels for
// whole GPUs, MIG devices, a GPU shared by two pods and a DRA claim; values NVML did not give
// are absent; a pod that ended takes its series with it; promtool accepts the text but for the
// lint dcgm-exporter's own names draw.
#include "modules/metrics/dcgm_series.hpp"

#include "support/prometheus.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace gns::metrics {
namespace {

namespace inv = gns::gpu_inventory;
namespace pr = gns::pod_resources;

constexpr const char* kGpu0 = "GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10";
constexpr const char* kGpu1 = "GPU-3f8a1c52-7e01-4b9d-9c1e-5a7d2e8f6b11";
constexpr const char* kMig = "MIG-0c4e1a9b-5d3f-5e2a-8b7c-1f2e3d4c5b6a";
constexpr uint64_t kMiB = 1024ULL * 1024ULL;

inv::GpuHealthReading Gpu(const char* uuid, uint32_t index, const char* pci) {
  inv::GpuHealthReading gpu;
  gpu.uuid = uuid;
  gpu.index = index;
  gpu.pci_bus_id = pci;
  gpu.usage.gpu_util_percent = 87;
  gpu.usage.memory_util_percent = 41;
  gpu.usage.encoder_util_percent = 0;
  gpu.usage.decoder_util_percent = 3;
  gpu.usage.fb_used_bytes = 1000 * kMiB + 5;  // floored to MiB
  gpu.usage.fb_free_bytes = 80000 * kMiB;
  gpu.usage.power_mw = 312'456;
  gpu.usage.energy_mj = 9'876'543'210ULL;
  gpu.usage.sm_clock_mhz = 1980;
  gpu.usage.mem_clock_mhz = 2619;
  gpu.thermal.gpu_temperature_c = 51;
  gpu.thermal.memory_temperature_c = 60;
  gpu.pcie.replay_counter = 2;
  gpu.ecc.corrected_volatile = 4;
  gpu.ecc.uncorrected_volatile = 0;
  gpu.ecc.corrected_aggregate = 14;
  gpu.ecc.uncorrected_aggregate = 1;
  gpu.remapped_rows = inv::RemappedRows{3, 1, false, false};
  inv::NvLinkReading link0;
  link0.link = 0;
  link0.active = true;
  link0.crc_flit = 5;
  link0.crc_data = 1;
  link0.replay = 2;
  link0.recovery = 0;
  inv::NvLinkReading link1 = link0;
  link1.link = 1;
  link1.crc_flit = 7;
  gpu.nvlinks = {link0, link1};
  return gpu;
}

inv::GpuInfo Info(const char* uuid, uint32_t index, uint32_t minor) {
  inv::GpuInfo info;
  info.uuid = uuid;
  info.index = index;
  info.minor = minor;
  info.name = "NVIDIA H100 80GB HBM3";
  return info;
}

class DcgmSeriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sample_.ok = true;
    sample_.gpus = {Gpu(kGpu0, 0, "00000000:3B:00.0"), Gpu(kGpu1, 1, "00000000:86:00.0")};
    inventory_.available = true;
    inventory_.gpus = {Info(kGpu0, 0, 0), Info(kGpu1, 1, 3)};
    pods_.listed = true;
    pods_.fresh = true;
  }
  test::PrometheusScrape Render() {
    DcgmInputs in;
    in.hostname = "node-a";
    in.sample = &sample_;
    in.inventory = &inventory_;
    in.pods = &pods_;
    in.last_xid = &xids_;
    text_ = RenderDcgmFamilies(in);
    return test::ParsePrometheus(text_);
  }
  static std::string Base0() {
    return "gpu=\"0\",UUID=\"" + std::string(kGpu0) +
           "\",pci_bus_id=\"00000000:3B:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-a\"";
  }
  static std::string Base1() {
    return "gpu=\"1\",UUID=\"" + std::string(kGpu1) +
           "\",pci_bus_id=\"00000000:86:00.0\",device=\"nvidia3\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-a\"";
  }

  inv::HealthSample sample_;
  inv::GpuInventory inventory_;
  pr::GpuPodMap pods_;
  std::map<std::string, uint64_t> xids_;
  std::string text_;
};

TEST_F(DcgmSeriesTest, WholeGpuWithoutPodHasDcgmExporterNamesTypesUnitsAndLabels) {
  const auto scrape = Render();
  const std::string labels = "{" + Base0() + "}";
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL" + labels), 87);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_MEM_COPY_UTIL" + labels), 41);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_ENC_UTIL" + labels), 0);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_DEC_UTIL" + labels), 3);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_USED" + labels), 1000);  // MiB
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_FREE" + labels), 80000);
  EXPECT_DOUBLE_EQ(scrape.Value("DCGM_FI_DEV_POWER_USAGE" + labels), 312.456);  // W
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" + labels), 9876543210.0);  // mJ
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_SM_CLOCK" + labels), 1980);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_MEM_CLOCK" + labels), 2619);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_TEMP" + labels), 51);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_MEMORY_TEMP" + labels), 60);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_PCIE_REPLAY_COUNTER" + labels), 2);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_XID_ERRORS" + labels), 0);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" + labels), 3);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" + labels), 1);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_ROW_REMAP_FAILURE" + labels), 0);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" + labels), 4);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL" + labels), 1);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" + labels), 12);  // summed over links
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL" + labels), 2);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL" + labels), 4);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL" + labels), 0);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base1() + "}"), 87);
  // dcgm-exporter's types: counters keep their names without _total.
  EXPECT_EQ(scrape.types.at("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), "counter");
  EXPECT_EQ(scrape.types.at("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), "counter");
  EXPECT_EQ(scrape.types.at("DCGM_FI_DEV_XID_ERRORS"), "gauge");
  EXPECT_EQ(scrape.types.at("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "gauge");
  EXPECT_EQ(scrape.types.size(), 25u);
  EXPECT_EQ(CountSeries(text_), 50u);
}

TEST_F(DcgmSeriesTest, NvLinkBandwidthIsDataSentPlusReceivedAndAbsentWithoutIt) {
  sample_.gpus[0].usage.nvlink_data_tx_kib = 6'000'000'000ULL;
  sample_.gpus[0].usage.nvlink_data_rx_kib = 1'044;
  sample_.gpus[1].usage.nvlink_data_tx_kib = 7;  // half an answer is no answer: no series
  auto scrape = Render();
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{" + Base0() + "}"), 6'000'001'044.0);
  EXPECT_EQ(scrape.types.at("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), "counter");
  EXPECT_EQ(scrape.samples.count("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{" + Base1() + "}"), 0u);
  // A GPU without NVLink (PCIe): NVML gave nothing, so no family at all.
  sample_.gpus[0].usage.nvlink_data_tx_kib.reset();
  sample_.gpus[0].usage.nvlink_data_rx_kib.reset();
  scrape = Render();
  EXPECT_EQ(scrape.types.count("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), 0u);
  EXPECT_EQ(text_.find("NVLINK_BANDWIDTH"), std::string::npos);
}

TEST_F(DcgmSeriesTest, TheLastXidOfAGpuIsItsXidErrorsValue) {
  xids_[kGpu1] = 79;
  const auto scrape = Render();
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_XID_ERRORS{" + Base0() + "}"), 0);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_XID_ERRORS{" + Base1() + "}"), 79);
}

TEST_F(DcgmSeriesTest, AReadingNvmlDidNotGiveIsNoSeriesNeverAZero) {
  for (auto& gpu : sample_.gpus) {
    gpu.usage.power_mw.reset();
    gpu.thermal.memory_temperature_c.reset();
    gpu.nvlinks.clear();
    gpu.remapped_rows.reset();
  }
  const auto scrape = Render();
  EXPECT_EQ(scrape.types.count("DCGM_FI_DEV_POWER_USAGE"), 0u);
  EXPECT_EQ(scrape.types.count("DCGM_FI_DEV_MEMORY_TEMP"), 0u);
  EXPECT_EQ(scrape.types.count("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"), 0u);
  EXPECT_EQ(scrape.types.count("DCGM_FI_DEV_ROW_REMAP_FAILURE"), 0u);
  EXPECT_EQ(text_.find("POWER_USAGE"), std::string::npos);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 87);
}

TEST_F(DcgmSeriesTest, AFailedOrLostPassRendersNothingOfThatGpu) {
  sample_.gpus[1].lost = true;
  auto scrape = Render();
  EXPECT_EQ(text_.find(kGpu1), std::string::npos);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 87);
  sample_.ok = false;
  Render();
  EXPECT_TRUE(text_.empty());
}

TEST_F(DcgmSeriesTest, AGpuSharedByTwoPodsHasOneSeriesPerContainerWithTheSameGpuLabels) {
  // Time-slicing: the device plugin hands out replicas "<uuid>::<n>".
  pods_.gpus[std::string(kGpu0) + "::0"] = {pr::PodContainerRef{"team-a", "train-0", "uid-1", "main", "nvidia.com/gpu"}};
  pods_.gpus[std::string(kGpu0) + "::1"] = {pr::PodContainerRef{"team-b", "infer-7", "uid-2", "server", "nvidia.com/gpu"}};
  const auto scrape = Render();
  const std::string a = "{" + Base0() + ",container=\"main\",namespace=\"team-a\",pod=\"train-0\"}";
  const std::string b = "{" + Base0() + ",container=\"server\",namespace=\"team-b\",pod=\"infer-7\"}";
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL" + a), 87);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL" + b), 87);
  EXPECT_EQ(scrape.samples.count("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 0u);  // no pod-less series beside them
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base1() + "}"), 87);        // GPU 1 is idle: no pod labels
}

TEST_F(DcgmSeriesTest, APodThatEndedTakesItsSeriesWithIt) {
  pods_.gpus[kGpu1] = {pr::PodContainerRef{"team-a", "train-0", "uid-1", "main", "nvidia.com/gpu"}};
  auto scrape = Render();
  const std::string held = "DCGM_FI_DEV_FB_USED{" + Base1() + ",container=\"main\",namespace=\"team-a\",pod=\"train-0\"}";
  EXPECT_EQ(scrape.Value(held), 1000);
  pods_.gpus.clear();
  scrape = Render();
  EXPECT_EQ(scrape.samples.count(held), 0u);
  EXPECT_EQ(text_.find("train-0"), std::string::npos);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_USED{" + Base1() + "}"), 1000);
}

TEST_F(DcgmSeriesTest, MigDevicesHaveGpuInstanceLabelsTheirOwnFrameBufferAndTheirPods) {
  inv::MigUsageReading mig;
  mig.uuid = kMig;
  mig.gpu_instance = 9;
  mig.compute_instance = 0;
  mig.fb_used_bytes = 2048 * kMiB;
  mig.fb_free_bytes = 7808 * kMiB;
  sample_.gpus[0].mig_devices = {mig};
  inv::MigDeviceInfo info;
  info.uuid = kMig;
  info.gpu_instance = 9;
  info.profile = "1g.10gb";
  inventory_.gpus[0].mig_enabled = true;
  inventory_.gpus[0].mig_devices = {info};
  pods_.gpus[kMig] = {pr::PodContainerRef{"team-c", "notebook", "uid-3", "jupyter", "nvidia.com/mig-1g.10gb"}};
  const auto scrape = Render();
  const std::string labels = "{" + Base0().substr(0, Base0().find(",Hostname")) +
                             ",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"9\",Hostname=\"node-a\",container=\"jupyter\","
                             "namespace=\"team-c\",pod=\"notebook\"}";
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_USED" + labels), 2048);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_FREE" + labels), 7808);
  // Utilization, power and clocks are the GPU's: on the whole-GPU series, not the MIG one.
  EXPECT_EQ(scrape.samples.count("DCGM_FI_DEV_GPU_UTIL" + labels), 0u);
  EXPECT_EQ(scrape.samples.count("DCGM_FI_DEV_POWER_USAGE" + labels), 0u);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_USED{" + Base0() + "}"), 1000);
  EXPECT_DOUBLE_EQ(scrape.Value("DCGM_FI_DEV_POWER_USAGE{" + Base0() + "}"), 312.456);
}

TEST_F(DcgmSeriesTest, ADraClaimAddsTheClaimLabels) {
  // gpu.nvidia.com names a GPU by its device node: GPU 1 is /dev/nvidia3, so "gpu-3".
  pr::PodClaimRef claim;
  claim.namespace_name = "ml";
  claim.name = "trainer-5";
  claim.container = "worker";
  claim.claim = "ml/trainer-5-gpu-x7k2";
  claim.driver = "gpu.nvidia.com";
  claim.devices = {"node-a/gpu-3"};
  pods_.claims = {claim};
  // A compute-domain channel of the same pod is no GPU.
  pr::PodClaimRef channel = claim;
  channel.claim = "ml/trainer-5-channel";
  channel.driver = "compute-domain.nvidia.com";
  channel.devices = {"node-a/channel-0"};
  pods_.claims.push_back(channel);
  const auto scrape = Render();
  const std::string labels = "{" + Base1() +
                             ",container=\"worker\",namespace=\"ml\",pod=\"trainer-5\",dra_claim_name=\"trainer-5-gpu-x7k2\","
                             "dra_claim_namespace=\"ml\",dra_driver_name=\"gpu.nvidia.com\",dra_pool_name=\"node-a\","
                             "dra_device_name=\"gpu-3\"}";
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL" + labels), 87);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 87);
  EXPECT_EQ(text_.find("channel"), std::string::npos);
}

TEST_F(DcgmSeriesTest, ADraGpuDeviceNamesTheGpuByItsMinorNotItsIndex) {
  pr::PodClaimRef claim;
  claim.namespace_name = "ml";
  claim.name = "trainer-6";
  claim.container = "worker";
  claim.claim = "ml/trainer-6-gpu";
  claim.driver = "gpu.nvidia.com";
  claim.devices = {"node-a/gpu-1"};  // minor 1: no GPU of this node (GPU 1's minor is 3)
  pods_.claims = {claim};
  auto scrape = Render();
  EXPECT_EQ(text_.find("trainer-6"), std::string::npos) << text_;
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base1() + "}"), 87);
  pods_.claims[0].devices = {"node-a/gpu-0"};  // GPU 0: index 0, minor 0
  scrape = Render();
  EXPECT_EQ(scrape.samples.count("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 0u);
  EXPECT_NE(text_.find("pod=\"trainer-6\",dra_claim_name=\"trainer-6-gpu\""), std::string::npos) << text_;
  // The pod ended: its claim left the map, and its series with it.
  pods_.claims.clear();
  scrape = Render();
  EXPECT_EQ(text_.find("trainer-6"), std::string::npos);
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 87);
}

TEST_F(DcgmSeriesTest, ADraClaimOnAMigDeviceLabelsThatMigDevicesSeriesOnly) {
  // dra-gpu names a MIG device by its parent's minor and its GPU instance's profile and placement:
  // GPU 1 is /dev/nvidia3, its instance of profile 19 at slices 4-5 is "gpu-3-mig-19-4-2".
  inv::MigUsageReading mig;
  mig.uuid = kMig;
  mig.gpu_instance = 5;
  mig.fb_used_bytes = 512 * kMiB;
  mig.fb_free_bytes = 9000 * kMiB;
  sample_.gpus[1].mig_devices = {mig};
  inv::MigDeviceInfo info;
  info.uuid = kMig;
  info.gpu_instance = 5;
  info.profile = "2g.20gb";
  info.placement_known = true;
  info.gi_profile_id = 19;
  info.placement_start = 4;
  info.placement_size = 2;
  inventory_.gpus[1].mig_enabled = true;
  inventory_.gpus[1].mig_devices = {info};
  pr::PodClaimRef claim;
  claim.namespace_name = "ml";
  claim.name = "infer-1";
  claim.container = "server";
  claim.claim = "ml/infer-1-mig";
  claim.driver = "gpu.nvidia.com";
  claim.devices = {"node-a/gpu-3-mig-19-4-2"};
  pods_.claims = {claim};
  auto scrape = Render();
  const std::string mig_base = Base1().substr(0, Base1().find(",Hostname")) +
                               ",GPU_I_PROFILE=\"2g.20gb\",GPU_I_ID=\"5\",Hostname=\"node-a\"";
  const std::string labels = "{" + mig_base +
                             ",container=\"server\",namespace=\"ml\",pod=\"infer-1\",dra_claim_name=\"infer-1-mig\","
                             "dra_claim_namespace=\"ml\",dra_driver_name=\"gpu.nvidia.com\",dra_pool_name=\"node-a\","
                             "dra_device_name=\"gpu-3-mig-19-4-2\"}";
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_USED" + labels), 512) << text_;
  // The parent's whole-GPU series carry no pod of the MIG claim.
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base1() + "}"), 87);
  EXPECT_EQ(text_.find("{" + Base1() + ",container=\"server\""), std::string::npos) << text_;
  // A driver that has not said the placement: the name cannot be told, so no pod labels.
  inventory_.gpus[1].mig_devices[0].placement_known = false;
  scrape = Render();
  EXPECT_EQ(text_.find("infer-1"), std::string::npos) << text_;
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_FB_USED{" + mig_base + "}"), 512);
}

TEST_F(DcgmSeriesTest, AMapNeverListedGivesNoPodLabels) {
  pods_.gpus[kGpu0] = {pr::PodContainerRef{"team-a", "train-0", "uid-1", "main", "nvidia.com/gpu"}};
  pods_.listed = false;
  const auto scrape = Render();
  EXPECT_EQ(scrape.Value("DCGM_FI_DEV_GPU_UTIL{" + Base0() + "}"), 87);
  EXPECT_EQ(text_.find("pod="), std::string::npos);
}

TEST_F(DcgmSeriesTest, LabelValuesAreEscaped) {
  inventory_.gpus[0].name = "odd \"name\"\\x";
  Render();
  EXPECT_NE(text_.find("modelName=\"odd \\\"name\\\"\\\\x\""), std::string::npos) << text_;
}

// promtool: the text parses, and the only complaints are the lint that dcgm-exporter's own
// names draw. Fails without promtool unless GNS_ALLOW_NO_PROMTOOL=1 (support/prometheus.hpp).
TEST_F(DcgmSeriesTest, PromtoolAcceptsTheSeriesButForDcgmExportersOwnNames) {
  GNS_REQUIRE_PROMTOOL(promtool);
  pods_.gpus[kGpu0] = {pr::PodContainerRef{"team-a", "train-0", "uid-1", "main", "nvidia.com/gpu"}};
  Render();
  const auto result = test::PromtoolCheckMetrics(promtool, text_);
  const std::string& output = result.output;
  // The lint dcgm-exporter's own names draw (promtool 2.42 says the first two): label names
  // modelName, UUID, Hostname, GPU_I_ID…; DCGM_FI_DEV_PCIE_REPLAY_COUNTER naming its type; counters
  // without _total. Anything else (a parse error, another lint) fails.
  std::stringstream lines(output);
  int lint = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const bool tolerated = line.find("label names should be written in 'snake_case' not 'camelCase'") != std::string::npos ||
                           line.find("DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'") !=
                               std::string::npos ||
                           line.find("counter metrics should have \"_total\" suffix") != std::string::npos;
    EXPECT_TRUE(tolerated) << "promtool: " << line;
    ++lint;
  }
  EXPECT_GT(lint, 0) << "promtool found nothing to say about modelName: is it promtool?";
  EXPECT_EQ(result.exit_code, 3) << "3: lint problems only (1 would be a parse error)\n" << output;
}

}  // namespace
}  // namespace gns::metrics
