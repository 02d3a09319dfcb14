// Which NVSwitch port each NVLink of a GPU ends in (GpuInfo::nvswitch_links, issue 26's SXid →
// GPU map), read through the production session code against the fake libnvidia-ml.so.1 with a
// topology of its own: two GPUs behind one switch (ports 10-13 and 14-17), a GPU with an NVLink
// bridge to a peer, a PCIe GPU. The map is read when the session opens, not on a refresh.
#include "modules/gpu_inventory/api/nvml_session.hpp"
#include "modules/gpu_inventory/nvml_library.hpp"
#include "support/temp_dir.hpp"

#include "fake_nvml_control.h"

#include <dlfcn.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

// A namespace of its own: the unity build compiles this file with the module test.
namespace gns::gpu_inventory::switch_ports_test {
namespace {

using ::testing::Contains;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr const char* kLibraryPath = GNS_FAKE_NVML_LIBRARY;
constexpr const char* kGpu0 = "GPU-5c0e2a11-0000-4b9d-9c1e-5a7d2e8f6b00";
constexpr const char* kGpu1 = "GPU-5c0e2a11-0001-4b9d-9c1e-5a7d2e8f6b01";
constexpr const char* kBridged = "GPU-5c0e2a11-0002-4b9d-9c1e-5a7d2e8f6b02";
constexpr const char* kPcie = "GPU-5c0e2a11-0003-4b9d-9c1e-5a7d2e8f6b03";

template <typename Fn>
Fn Control(const char* name) {
  void* library = dlopen(kLibraryPath, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  EXPECT_NE(library, nullptr);
  return reinterpret_cast<Fn>(dlsym(library, name));
}

std::vector<NvSwitchLink> Ports(const PciAddress& nvswitch, uint32_t first_port) {
  std::vector<NvSwitchLink> out;
  for (uint32_t link = 0; link < 4; ++link) out.push_back({link, nvswitch, first_port + link});
  return out;
}

class SwitchPortsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(config_ / "gpus.json") << R"({"gpus": [
      {"uuid": ")" << kGpu0 << R"(", "pciBusId": "00000000:18:00.0", "minor": 0, "memoryTotalBytes": 1,
       "nvswitchLinks": [{"switch": "0000:c3:00.0", "links": [0, 1, 2, 3], "ports": [10, 11, 12, 13]}]},
      {"uuid": ")" << kGpu1 << R"(", "pciBusId": "00000000:2A:00.0", "minor": 1, "memoryTotalBytes": 1,
       "nvswitchLinks": [{"switch": "0000:c3:00.0", "links": [0, 1, 2, 3], "ports": [14, 15, 16, 17]}]},
      {"uuid": ")" << kBridged << R"(", "pciBusId": "00000000:3A:00.0", "minor": 2, "memoryTotalBytes": 1,
       "nvlinkPeers": ["00000000:18:00.0"]},
      {"uuid": ")" << kPcie << R"(", "pciBusId": "00000000:4A:00.0", "minor": 3, "memoryTotalBytes": 1}]})";
    setenv("FAKE_NVML_CONFIG", (config_ / "gpus.json").c_str(), 1);
    unsetenv("FAKE_NVML_CONTROL");
    std::string error;
    library_ = NvmlLibrary::Open(kLibraryPath, error);  // loaded, so that the control functions resolve
    ASSERT_NE(library_, nullptr) << error;
    set_health_ = Control<fakeNvmlSetHealth_t>("fakeNvmlSetHealth");
    clear_health_ = Control<fakeNvmlClearHealth_t>("fakeNvmlClearHealth");
    set_failure_ = Control<fakeNvmlSetFailure_t>("fakeNvmlSetFailure");
    clear_failures_ = Control<fakeNvmlClearFailures_t>("fakeNvmlClearFailures");
  }
  void TearDown() override {
    if (clear_failures_ != nullptr) clear_failures_();
    if (clear_health_ != nullptr) clear_health_();
  }

  NvmlSession::Opened Open() { return NvmlSession::Open(SessionOptions{kLibraryPath, config_.Path().string(), {}}); }

  test::TempDir config_{"switch_ports_test"};
  std::shared_ptr<const NvmlLibrary> library_;
  const PciAddress switch_ = *PciAddress::Parse("0000:c3:00.0");
  fakeNvmlSetHealth_t set_health_ = nullptr;
  fakeNvmlClearHealth_t clear_health_ = nullptr;
  fakeNvmlSetFailure_t set_failure_ = nullptr;
  fakeNvmlClearFailures_t clear_failures_ = nullptr;
};

TEST_F(SwitchPortsTest, EachGpuLearnsTheSwitchPortsItsLinksEndIn) {
  auto opened = Open();
  ASSERT_TRUE(opened.session) << opened.read.error;
  const GpuInventory& inv = opened.read.inventory;
  ASSERT_EQ(inv.gpus.size(), 4u);
  EXPECT_EQ(inv.FindByUuid(kGpu0)->nvswitch_links, Ports(switch_, 10));
  EXPECT_EQ(inv.FindByUuid(kGpu1)->nvswitch_links, Ports(switch_, 14));
  // A switch is no peer; a bridge to another GPU is no switch port; a PCIe GPU has neither.
  EXPECT_THAT(inv.FindByUuid(kGpu0)->nvlink_peers, IsEmpty());
  EXPECT_THAT(inv.FindByUuid(kBridged)->nvswitch_links, IsEmpty());
  EXPECT_EQ(inv.FindByUuid(kBridged)->nvlink_peers, std::vector<std::string>{kGpu0});
  EXPECT_THAT(inv.FindByUuid(kPcie)->nvswitch_links, IsEmpty());
  EXPECT_THAT(opened.read.warnings, IsEmpty());
  EXPECT_THAT(opened.read.failed_functions, IsEmpty());
  (void)opened.session->Close();
}

TEST_F(SwitchPortsTest, ARefreshKeepsThePortsOfTheOpenAndReadsNoPortAgain) {
  auto opened = Open();
  ASSERT_TRUE(opened.session) << opened.read.error;
  // The link behind port 11 falls, GPU 1 is rewired, and the port field would fail: a refresh
  // does not ask, so none of it shows, and link 1 still names its port.
  ASSERT_EQ(set_health_(kGpu0, R"({"nvlinkDown": [1]})"), 0);
  ASSERT_EQ(set_health_(kGpu1, R"({"nvswitchLinks": [{"switch": "0000:c3:00.0", "links": [0, 1, 2, 3],
                                                      "ports": [30, 31, 32, 33]}]})"),
            0);
  ASSERT_EQ(set_failure_("nvmlDeviceGetFieldValues", nvml::kErrorUnknown), 0);
  const ReadResult read = opened.session->Read();
  ASSERT_TRUE(read.ok) << read.error;
  EXPECT_EQ(read.inventory.FindByUuid(kGpu0)->nvswitch_links, Ports(switch_, 10));
  EXPECT_EQ(read.inventory.FindByUuid(kGpu1)->nvswitch_links, Ports(switch_, 14));
  EXPECT_THAT(read.failed_functions, Not(Contains("nvmlDeviceGetFieldValues")));
  (void)opened.session->Close();

  // The next open reads the wiring again (the fallen link is inactive: NVML names no far end).
  clear_failures_();
  auto reopened = Open();
  ASSERT_TRUE(reopened.session) << reopened.read.error;
  EXPECT_EQ(reopened.read.inventory.FindByUuid(kGpu1)->nvswitch_links, Ports(switch_, 30));
  std::vector<NvSwitchLink> without_link_1 = Ports(switch_, 10);
  without_link_1.erase(without_link_1.begin() + 1);
  EXPECT_EQ(reopened.read.inventory.FindByUuid(kGpu0)->nvswitch_links, without_link_1);
  (void)reopened.session->Close();
}

TEST_F(SwitchPortsTest, APortFieldNvmlCannotReadLeavesThePortsOutAndWarns) {
  ASSERT_EQ(set_failure_("nvmlDeviceGetFieldValues", nvml::kErrorUnknown), 0);
  auto opened = Open();
  ASSERT_TRUE(opened.session) << opened.read.error << ": the inventory is still read";
  EXPECT_THAT(opened.read.inventory.FindByUuid(kGpu0)->nvswitch_links, IsEmpty());
  EXPECT_THAT(opened.read.failed_functions, Contains("nvmlDeviceGetFieldValues"));
  EXPECT_THAT(opened.read.warnings, Not(IsEmpty()));
  (void)opened.session->Close();
}

}  // namespace
}  // namespace gns::gpu_inventory::switch_ports_test
