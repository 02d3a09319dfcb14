// ReadHealth (the health readings of issue 26) against the fake libnvidia-ml.so.1, loaded
// through NvmlLibrary exactly as the module loads it, and the count of NVIDIA GPUs on the PCI
// bus over a fake sysfs tree. Faults are set through the fake's in-process control functions.
#include "modules/gpu_inventory/api/nvml_session.hpp"
#include "modules/gpu_inventory/nvml_library.hpp"
#include "support/temp_dir.hpp"

#include "fake_nvml_control.h"

#include <dlfcn.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

// A namespace of its own: the unity build compiles this file with the module test.
namespace gns::gpu_inventory::read_health_test {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr const char* kLibraryPath = GNS_FAKE_NVML_LIBRARY;
constexpr const char* kGpus8Path = GNS_FAKE_NVML_GPUS8;

template <typename Fn>
Fn Control(const char* name) {
  void* library = dlopen(kLibraryPath, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  EXPECT_NE(library, nullptr);
  return reinterpret_cast<Fn>(dlsym(library, name));
}

class ReadHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("FAKE_NVML_CONFIG", kGpus8Path, 1);
    unsetenv("FAKE_NVML_CONTROL");
    std::string error;
    library_ = NvmlLibrary::Open(kLibraryPath, error);
    ASSERT_NE(library_, nullptr) << error;
    set_health_ = Control<fakeNvmlSetHealth_t>("fakeNvmlSetHealth");
    clear_health_ = Control<fakeNvmlClearHealth_t>("fakeNvmlClearHealth");
    set_failure_ = Control<fakeNvmlSetFailure_t>("fakeNvmlSetFailure");
    clear_failures_ = Control<fakeNvmlClearFailures_t>("fakeNvmlClearFailures");
    ASSERT_NE(set_health_, nullptr);
    ASSERT_EQ(library_->Api().nvmlInit_v2(), nvml::kSuccess);
  }

  void TearDown() override {
    if (!library_) return;
    clear_failures_();
    clear_health_();
    EXPECT_EQ(library_->Api().nvmlShutdown(), nvml::kSuccess);
  }

  std::string UuidOf(unsigned int index) {
    nvml::Device device = nullptr;
    EXPECT_EQ(library_->Api().nvmlDeviceGetHandleByIndex_v2(index, &device), nvml::kSuccess);
    char uuid[nvml::kDeviceUuidV2BufferSize] = {};
    EXPECT_EQ(library_->Api().nvmlDeviceGetUUID(device, uuid, sizeof(uuid)), nvml::kSuccess);
    return uuid;
  }

  std::shared_ptr<const NvmlLibrary> library_;
  fakeNvmlSetHealth_t set_health_ = nullptr;
  fakeNvmlClearHealth_t clear_health_ = nullptr;
  fakeNvmlSetFailure_t set_failure_ = nullptr;
  fakeNvmlClearFailures_t clear_failures_ = nullptr;
  test::TempDir root_{"read_health_test"};
};

TEST_F(ReadHealthTest, EveryGroupOfEveryGpuInOnePass) {
  const HealthSample sample = ReadHealth(*library_, kHealthAll, root_.Path().string());
  ASSERT_TRUE(sample.ok) << sample.error;
  EXPECT_EQ(sample.groups, static_cast<uint32_t>(kHealthAll));
  EXPECT_GE(sample.pass_micros, 0);
  EXPECT_GT(sample.taken_unix_ms, 0);
  EXPECT_EQ(sample.pci_gpu_count, std::nullopt) << "no sys/bus/pci under this host root";
  ASSERT_EQ(sample.gpus.size(), 8u);
  for (unsigned int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    const GpuHealthReading& gpu = sample.gpus[i];
    EXPECT_EQ(gpu.index, i);
    EXPECT_EQ(gpu.uuid, UuidOf(i));
    EXPECT_EQ(gpu.pci_bus_id.size(), 16u);
    EXPECT_FALSE(gpu.lost);
    EXPECT_THAT(gpu.failed_functions, IsEmpty());
    EXPECT_EQ(gpu.ecc_enabled, true);
    EXPECT_EQ(gpu.ecc.corrected_volatile, 0u);
    EXPECT_EQ(gpu.ecc.uncorrected_aggregate, 0u);
    ASSERT_TRUE(gpu.remapped_rows.has_value());
    EXPECT_FALSE(gpu.remapped_rows->pending);
    ASSERT_TRUE(gpu.remap_histogram.has_value());
    EXPECT_EQ(gpu.remap_histogram->max, 640u);
    ASSERT_TRUE(gpu.retired_pages.has_value());
    EXPECT_EQ(gpu.retired_pages->double_bit, 0u);
    ASSERT_EQ(gpu.nvlinks.size(), 2u) << "the links the GPU has, no more";
    EXPECT_TRUE(gpu.nvlinks[0].active && gpu.nvlinks[1].active);
    EXPECT_EQ(gpu.nvlinks[1].link, 1u);
    EXPECT_EQ(gpu.nvlinks[1].crc_flit, 0u);
    ASSERT_TRUE(gpu.fabric.has_value());
    EXPECT_EQ(gpu.fabric->state, nvml::kGpuFabricStateCompleted);
    EXPECT_EQ(gpu.fabric->clique_id, 32766u);
    EXPECT_EQ(gpu.fabric->cluster_uuid, "c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64");
    EXPECT_EQ(gpu.pcie.generation, 5u);
    EXPECT_EQ(gpu.pcie.width, 16u);
    EXPECT_EQ(gpu.pcie.max_width, 16u);
    EXPECT_EQ(gpu.pcie.replay_counter, 0u);
    EXPECT_EQ(gpu.thermal.clock_event_reasons, 0u);
    ASSERT_TRUE(gpu.thermal.gpu_temperature_c && gpu.thermal.slowdown_threshold_c);
    EXPECT_LT(*gpu.thermal.gpu_temperature_c, *gpu.thermal.slowdown_threshold_c);
    EXPECT_EQ(gpu.thermal.shutdown_threshold_c, 92u);
    EXPECT_EQ(gpu.thermal.memory_temperature_c, 45u);
    EXPECT_EQ(gpu.thermal.memory_max_c, 95u);
    EXPECT_EQ(gpu.thermal.power_violation_ns, 0u);
    EXPECT_EQ(gpu.thermal.thermal_violation_ns, 0u);
    EXPECT_EQ(gpu.persistence_mode, false) << "the fake's maintenance default";
  }
}

TEST_F(ReadHealthTest, FaultsShowInTheReadingsOfTheirGpu) {
  ASSERT_EQ(set_health_(UuidOf(2).c_str(),
                        R"({"remapPending":true,"remappedRowsUncorrected":1,"nvlinkDown":[1],"fabricHealthMask":1,)"
                        R"("pcieWidth":8,"eccUncorrectedVolatile":3,"clocksEventReasons":64,"retiredPagesDbe":2,)"
                        R"("nvlinkErrors":{"0":{"crcData":5}},"powerViolationNs":1000,"memoryTemperature":97})"),
            0);
  const HealthSample sample = ReadHealth(*library_, kHealthAll, "");
  ASSERT_TRUE(sample.ok) << sample.error;
  ASSERT_EQ(sample.gpus.size(), 8u);
  const GpuHealthReading& gpu = sample.gpus[2];
  EXPECT_TRUE(gpu.remapped_rows->pending);
  EXPECT_EQ(gpu.remapped_rows->uncorrected, 1u);
  EXPECT_FALSE(gpu.nvlinks[1].active);
  EXPECT_TRUE(gpu.nvlinks[0].active);
  EXPECT_EQ(gpu.nvlinks[0].crc_data, 5u);
  EXPECT_EQ(gpu.fabric->health_mask, 1u);
  EXPECT_EQ(gpu.pcie.width, 8u);
  EXPECT_EQ(gpu.ecc.uncorrected_volatile, 3u);
  EXPECT_EQ(gpu.thermal.clock_event_reasons, nvml::kClocksEventReasonHwThermalSlowdown);
  EXPECT_EQ(gpu.retired_pages->double_bit, 2u) << "the count query answers INSUFFICIENT_SIZE with the count";
  EXPECT_EQ(gpu.thermal.power_violation_ns, 1000u);
  EXPECT_EQ(gpu.thermal.memory_temperature_c, 97u);
  EXPECT_EQ(sample.gpus[3].pcie.width, 16u) << "the other GPUs are untouched";
  ASSERT_EQ(set_health_(UuidOf(2).c_str(), R"({"remapPending":false})"), 0);
}

TEST_F(ReadHealthTest, OnlyTheGroupsAskedForAreRead) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetTemperature", 999), 0);  // would be a failed function if read
  const HealthSample sample = ReadHealth(*library_, kHealthPcie | kHealthHost, "");
  ASSERT_TRUE(sample.ok);
  EXPECT_EQ(sample.groups, static_cast<uint32_t>(kHealthPcie | kHealthHost));
  const GpuHealthReading& gpu = sample.gpus[0];
  EXPECT_EQ(gpu.pcie.width, 16u);
  EXPECT_TRUE(gpu.persistence_mode.has_value());
  EXPECT_FALSE(gpu.ecc_enabled.has_value());
  EXPECT_FALSE(gpu.remapped_rows.has_value());
  EXPECT_THAT(gpu.nvlinks, IsEmpty());
  EXPECT_FALSE(gpu.fabric.has_value());
  EXPECT_FALSE(gpu.thermal.gpu_temperature_c.has_value());
  EXPECT_THAT(gpu.failed_functions, IsEmpty());
}

TEST_F(ReadHealthTest, NotSupportedIsEmptyAndOtherErrorsNameTheFunction) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetRowRemapperHistogram", nvml::kErrorNotSupported), 0);
  ASSERT_EQ(set_failure_("nvmlDeviceGetCurrentClocksEventReasons", nvml::kErrorFunctionNotFound), 0);
  ASSERT_EQ(set_failure_("nvmlDeviceGetPcieReplayCounter", nvml::kErrorUnknown), 0);
  ASSERT_EQ(set_failure_("nvmlDeviceGetNvLinkState", nvml::kErrorNotSupported), 0);
  ASSERT_EQ(set_health_(UuidOf(0).c_str(), R"({"clocksEventReasons":8})"), 0);
  const HealthSample sample = ReadHealth(*library_, kHealthAll, "");
  ASSERT_TRUE(sample.ok);
  const GpuHealthReading& gpu = sample.gpus[0];
  EXPECT_FALSE(gpu.remap_histogram.has_value());
  EXPECT_TRUE(gpu.remapped_rows.has_value());
  EXPECT_THAT(gpu.nvlinks, IsEmpty()) << "NVLink NOT_SUPPORTED: a GPU without NVLink";
  EXPECT_EQ(gpu.thermal.clock_event_reasons, nvml::kClocksEventReasonHwSlowdown)
      << "FUNCTION_NOT_FOUND of the new name falls back to the old one";
  EXPECT_FALSE(gpu.pcie.replay_counter.has_value());
  EXPECT_EQ(gpu.pcie.width, 16u);
  EXPECT_THAT(gpu.failed_functions, ElementsAre("nvmlDeviceGetPcieReplayCounter"));
  EXPECT_FALSE(gpu.lost);
  // ECC off: no counters to read, and no error for them.
  ASSERT_EQ(set_health_(UuidOf(1).c_str(), R"({"eccEnabled":false})"), 0);
  const HealthSample again = ReadHealth(*library_, kHealthMemory, "");
  EXPECT_EQ(again.gpus[1].ecc_enabled, false);
  EXPECT_FALSE(again.gpus[1].ecc.uncorrected_volatile.has_value());
  EXPECT_THAT(again.gpus[1].failed_functions, IsEmpty());
}

TEST_F(ReadHealthTest, ALostGpuIsMarkedLostAndNamedFromTheLastInventory) {
  const std::string uuid = UuidOf(4);
  std::vector<GpuInfo> known(1);
  known[0].index = 4;
  known[0].uuid = uuid;
  known[0].pci_bus_id = "00000000:9A:00.0";
  ASSERT_EQ(set_health_(uuid.c_str(), R"({"lost":true})"), 0);
  const HealthSample sample = ReadHealth(*library_, kHealthAll, "", {}, known);
  ASSERT_TRUE(sample.ok) << "one GPU lost does not fail the pass";
  ASSERT_EQ(sample.gpus.size(), 8u);
  const GpuHealthReading& gpu = sample.gpus[4];
  EXPECT_TRUE(gpu.lost);
  EXPECT_EQ(gpu.uuid, uuid);
  EXPECT_EQ(gpu.pci_bus_id, "00000000:9A:00.0");
  EXPECT_THAT(gpu.failed_functions, IsEmpty()) << "GPU_IS_LOST is the lost flag, not a failed function";
  EXPECT_FALSE(sample.gpus[3].lost);
  EXPECT_EQ(sample.gpus[3].pcie.width, 16u);
}

TEST_F(ReadHealthTest, GpusOutForAResetAreLeftAlone) {
  ExcludedGpus excluded{{1, UuidOf(1)}, {0xFFFFFFFF, UuidOf(6)}};  // by index, and by UUID alone
  // A call naming GPU 1 would fail; it must not be made.
  ASSERT_EQ(set_health_(UuidOf(1).c_str(), R"({"lost":true})"), 0);
  const HealthSample sample = ReadHealth(*library_, kHealthAll, "", excluded);
  ASSERT_TRUE(sample.ok);
  ASSERT_EQ(sample.gpus.size(), 6u);
  for (const auto& gpu : sample.gpus) {
    EXPECT_NE(gpu.index, 1u);
    EXPECT_NE(gpu.index, 6u);
    EXPECT_FALSE(gpu.lost);
  }
}

TEST_F(ReadHealthTest, AnNvmlThatCannotCountItsGpusFailsThePass) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetCount_v2", nvml::kErrorUnknown), 0);
  const HealthSample sample = ReadHealth(*library_, kHealthAll, "");
  EXPECT_FALSE(sample.ok);
  EXPECT_THAT(sample.error, ::testing::HasSubstr("nvmlDeviceGetCount_v2"));
  EXPECT_THAT(sample.gpus, IsEmpty());
}

// ---- PCI bus count -------------------------------------------------------------------------------

void AddPciDevice(const std::filesystem::path& root, const std::string& address, const std::string& vendor,
                  const std::string& pci_class) {
  const auto dir = root / "sys/bus/pci/devices" / address;
  std::filesystem::create_directories(dir);
  if (!vendor.empty()) std::ofstream(dir / "vendor") << vendor << "\n";
  if (!pci_class.empty()) std::ofstream(dir / "class") << pci_class << "\n";
}

TEST(CountPciGpus, CountsNvidiaDisplayAnd3dControllersOnly) {
  test::TempDir root("pci_count_test");
  EXPECT_EQ(CountPciGpus(root.Path().string()), std::nullopt) << "no sysfs: unknown, not zero";
  AddPciDevice(root.Path(), "0000:18:00.0", "0x10de", "0x030200");  // H100 SXM: 3D controller
  AddPciDevice(root.Path(), "0000:2a:00.0", "0x10de", "0x030000");  // a VGA-class NVIDIA GPU
  AddPciDevice(root.Path(), "0000:18:00.1", "0x10de", "0x040300");  // its HD audio function
  AddPciDevice(root.Path(), "0000:3a:00.0", "0x10de", "0x068000");  // an NVSwitch (bridge)
  AddPciDevice(root.Path(), "0000:00:01.0", "0x8086", "0x030000");  // another vendor's VGA
  AddPciDevice(root.Path(), "0000:5a:00.0", "", "0x030200");        // vendor unreadable
  AddPciDevice(root.Path(), "0000:6a:00.0", "0x10de", "garbage");
  EXPECT_EQ(CountPciGpus(root.Path().string()), 2u);
  EXPECT_EQ(ListPciGpus(root.Path().string()), (std::vector<std::string>{"0000:18:00.0", "0000:2a:00.0"}))
      << "the GPUs' addresses, sorted";
}

TEST_F(ReadHealthTest, ThePassCountsGpusOnThePciBusUnderTheHostRoot) {
  AddPciDevice(root_.Path(), "0000:18:00.0", "0x10de", "0x030200");
  const HealthSample sample = ReadHealth(*library_, kHealthHost, root_.Path().string());
  EXPECT_EQ(sample.pci_gpu_count, 1u);
  EXPECT_EQ(sample.pci_gpu_addresses, std::vector<std::string>{"0000:18:00.0"});
}

// kHealthUsage (issue 27): what the DCGM_FI_* series show, for every GPU and MIG device.
TEST_F(ReadHealthTest, UsageOfEveryGpuAndEveryMigDevice) {
  ASSERT_EQ(library_->Api().nvmlShutdown(), nvml::kSuccess);
  setenv("FAKE_NVML_CONFIG", GNS_FAKE_NVML_GPUS_MIG, 1);
  ASSERT_EQ(library_->Api().nvmlInit_v2(), nvml::kSuccess);
  const std::string gpu0 = UuidOf(0);
  ASSERT_EQ(set_health_(gpu0.c_str(), R"({"gpuUtil":87,"memoryUtil":41,"encoderUtil":5,"decoderUtil":6,
      "powerMilliwatts":312456,"energyMillijoules":9876543210,"smClockMhz":1755,"memClockMhz":2619,
      "memoryUsedBytes":1048576000,"migMemoryUsedMiB":{"0":2048}})"),
            nvml::kSuccess);
  const HealthSample sample = ReadHealth(*library_, kHealthUsage, "");
  ASSERT_TRUE(sample.ok) << sample.error;
  ASSERT_EQ(sample.gpus.size(), 4u);
  const GpuHealthReading& g = sample.gpus[0];
  EXPECT_THAT(g.failed_functions, IsEmpty());
  EXPECT_EQ(g.usage.gpu_util_percent, 87u);
  EXPECT_EQ(g.usage.memory_util_percent, 41u);
  EXPECT_EQ(g.usage.encoder_util_percent, 5u);
  EXPECT_EQ(g.usage.decoder_util_percent, 6u);
  EXPECT_EQ(g.usage.power_mw, 312456u);
  EXPECT_EQ(g.usage.energy_mj, 9876543210ULL);
  EXPECT_EQ(g.usage.sm_clock_mhz, 1755u);
  EXPECT_EQ(g.usage.mem_clock_mhz, 2619u);
  EXPECT_EQ(g.usage.fb_used_bytes, 1048576000ULL);
  EXPECT_EQ(g.usage.fb_free_bytes, 85520809984ULL - 1048576000ULL);
  ASSERT_EQ(g.mig_devices.size(), 4u);
  EXPECT_EQ(g.mig_devices[0].uuid, "MIG-5eed0000-0000-5000-8000-000000000001");
  EXPECT_EQ(g.mig_devices[0].gpu_instance, 1u);
  EXPECT_EQ(g.mig_devices[0].fb_used_bytes, 2048ULL * 1024 * 1024);
  EXPECT_EQ(g.mig_devices[0].fb_free_bytes, (40192ULL - 2048) * 1024 * 1024);
  EXPECT_EQ(g.mig_devices[3].gpu_instance, 8u);
  EXPECT_EQ(g.mig_devices[3].fb_used_bytes, 0u);
  EXPECT_EQ(sample.gpus[1].mig_devices.size(), 7u);
  EXPECT_THAT(sample.gpus[3].mig_devices, IsEmpty());  // MIG off
  // Health groups not asked for are not read.
  EXPECT_FALSE(g.thermal.gpu_temperature_c.has_value());
}

TEST_F(ReadHealthTest, AUsageFunctionTheDriverLacksLeavesItsReadingEmptyAndIsNoFailure) {
  constexpr int kFunctionNotFound = 13;
  constexpr int kUnknown = 999;
  ASSERT_EQ(set_failure_("nvmlDeviceGetPowerUsage", kFunctionNotFound), nvml::kSuccess);
  ASSERT_EQ(set_failure_("nvmlDeviceGetTotalEnergyConsumption", nvml::kErrorNotSupported), nvml::kSuccess);
  ASSERT_EQ(set_failure_("nvmlDeviceGetClockInfo", kUnknown), nvml::kSuccess);
  // An old driver's v2 memory entry point that refuses the version: v1 answers instead.
  ASSERT_EQ(set_failure_("nvmlDeviceGetMemoryInfo_v2", nvml::kErrorArgumentVersionMismatch), nvml::kSuccess);
  const HealthSample sample = ReadHealth(*library_, kHealthUsage, "");
  ASSERT_TRUE(sample.ok) << sample.error;
  const GpuHealthReading& g = sample.gpus[0];
  EXPECT_FALSE(g.usage.power_mw.has_value());
  EXPECT_FALSE(g.usage.energy_mj.has_value());
  EXPECT_FALSE(g.usage.sm_clock_mhz.has_value());
  EXPECT_TRUE(g.usage.gpu_util_percent.has_value());
  EXPECT_TRUE(g.usage.fb_free_bytes.has_value());
  EXPECT_THAT(g.failed_functions, ElementsAre("nvmlDeviceGetClockInfo", "nvmlDeviceGetClockInfo"));
}

// NVLink throughput (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL): NVML's all-links sum of data sent and
// received; a GPU without NVLink has no value, and that is no failure.
TEST_F(ReadHealthTest, NvLinkDataThroughputIsTheSumOverTheLinksAndAbsentWithoutNvLink) {
  ASSERT_EQ(set_health_(UuidOf(0).c_str(), R"({"nvlinkThroughput":{"0":{"dataTxKiB":6000000000,"dataRxKiB":1024},
      "1":{"dataTxKiB":10,"dataRxKiB":20}}})"),
            nvml::kSuccess);
  HealthSample sample = ReadHealth(*library_, kHealthNvLink | kHealthUsage, "");
  ASSERT_TRUE(sample.ok) << sample.error;
  EXPECT_EQ(sample.gpus[0].usage.nvlink_data_tx_kib, 6000000010ULL);  // past 32 bits: kept whole
  EXPECT_EQ(sample.gpus[0].usage.nvlink_data_rx_kib, 1044ULL);
  EXPECT_EQ(sample.gpus[1].usage.nvlink_data_tx_kib, 0ULL);  // links, no traffic yet: a zero, not nothing
  EXPECT_THAT(sample.gpus[0].failed_functions, IsEmpty());

  ASSERT_EQ(library_->Api().nvmlShutdown(), nvml::kSuccess);
  setenv("FAKE_NVML_CONFIG", GNS_FAKE_NVML_GPUS_MIG, 1);  // PCIe GPUs: no NVLink
  ASSERT_EQ(library_->Api().nvmlInit_v2(), nvml::kSuccess);
  for (const uint32_t groups : {kHealthNvLink | kHealthUsage, static_cast<uint32_t>(kHealthUsage)}) {
    sample = ReadHealth(*library_, groups, "");
    ASSERT_TRUE(sample.ok) << sample.error;
    for (const auto& gpu : sample.gpus) {
      EXPECT_TRUE(gpu.nvlinks.empty());
      EXPECT_FALSE(gpu.usage.nvlink_data_tx_kib.has_value());
      EXPECT_FALSE(gpu.usage.nvlink_data_rx_kib.has_value());
      EXPECT_THAT(gpu.failed_functions, IsEmpty());
    }
  }
}

}  // namespace
}  // namespace gns::gpu_inventory::read_health_test
