// GpuDirectory and XidSubject: which GPU a kernel line's PCI address names (the inventory
// first, then what the kernel log taught, compared numerically), and the name XidPolicy keys it
// by.
#include "modules/gpu_health/gpu_directory.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gns::gpu_health {
namespace {

constexpr const char* kA = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
constexpr const char* kB = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
constexpr const char* kC = "GPU-cccccccc-0000-0000-0000-000000000000";

PciAddress Pci(std::string_view text) {
  auto pci = ParsePciAddress(text);
  EXPECT_TRUE(pci.has_value()) << text;
  return pci.value_or(PciAddress{});
}

gpu_inventory::GpuInfo Gpu(const std::string& uuid, const std::string& bus_id) {
  gpu_inventory::GpuInfo info;
  info.uuid = uuid;
  info.pci_bus_id = bus_id;
  info.pci = gpu_inventory::PciAddress::Parse(bus_id).value();
  return info;
}

TEST(GpuDirectory, InventoryFirstThenWhatTheKernelLogTaught) {
  GpuDirectory directory;
  EXPECT_EQ(directory.UuidForPci(Pci("0000:3b:00")), "");
  directory.SetInventory({Gpu(kA, "00000000:3B:00.0"), Gpu(kB, "00000000:86:00.0")});
  // NVML's 8-digit upper-case form and the Xid line's short form name the same GPU.
  EXPECT_EQ(directory.UuidForPci(Pci("0000:3b:00")), kA);
  EXPECT_EQ(directory.UuidForPci(Pci("0000:86:00")), kB);
  EXPECT_EQ(directory.UuidForPci(Pci("0000:87:00")), "");

  EXPECT_EQ(directory.Learn(Pci("0000:87:00"), kC), GpuDirectory::LearnResult::kLearned);
  EXPECT_EQ(directory.Learn(Pci("0000:87:00"), kC), GpuDirectory::LearnResult::kKnown);
  EXPECT_EQ(directory.UuidForPci(Pci("0000:87:00")), kC);
  // A learned line cannot override the inventory.
  EXPECT_EQ(directory.Learn(Pci("0000:3b:00"), kC), GpuDirectory::LearnResult::kLearned);
  EXPECT_EQ(directory.UuidForPci(Pci("0000:3b:00")), kA);

  EXPECT_EQ(directory.PciForUuid(kA), "0000:3b:00");
  EXPECT_EQ(directory.PciForUuid(kC), "0000:3b:00");  // by address: 3b before 87
  EXPECT_EQ(directory.PciForUuid("GPU-none"), "");
  const std::vector<std::pair<std::string, std::string>> learned = {{"0000:3b:00", kC}, {"0000:87:00", kC}};
  EXPECT_EQ(directory.Learned(), learned);
}

TEST(GpuDirectory, LearnsAtMostKMaxLearnedAddresses) {
  GpuDirectory directory;
  for (uint32_t i = 0; i < GpuDirectory::kMaxLearned; ++i) {
    PciAddress pci;
    pci.domain = i;
    ASSERT_EQ(directory.Learn(pci, kA), GpuDirectory::LearnResult::kLearned) << i;
  }
  PciAddress one_more;
  one_more.domain = GpuDirectory::kMaxLearned;
  EXPECT_EQ(directory.Learn(one_more, kB), GpuDirectory::LearnResult::kFull);
  EXPECT_EQ(directory.UuidForPci(one_more), "");
  // A known address may still change its UUID.
  EXPECT_EQ(directory.Learn(PciAddress{}, kB), GpuDirectory::LearnResult::kLearned);
  EXPECT_EQ(directory.UuidForPci(PciAddress{}), kB);
  EXPECT_EQ(directory.Learned().size(), GpuDirectory::kMaxLearned);
}

TEST(XidSubject, KeyedByUuidOrElseByPciAddress) {
  const XidSubject known(kA, Pci("0000:3b:00"));
  EXPECT_EQ(known.uuid(), kA);
  EXPECT_EQ(known.policy_id(), kA);
  EXPECT_EQ(known.pci(), "0000:3b:00");

  const XidSubject unknown("", Pci("00000001:3B:1f.0"));
  EXPECT_EQ(unknown.uuid(), "");
  EXPECT_EQ(unknown.policy_id(), "PCI:0001:3b:1f");
  EXPECT_EQ(unknown.pci(), "0001:3b:1f");
  EXPECT_EQ(PciPolicyId("0001:3b:1f"), "PCI:0001:3b:1f");

  const XidSubject nvml(kB, std::nullopt);
  EXPECT_EQ(nvml.policy_id(), kB);
  EXPECT_EQ(nvml.pci(), "");
  EXPECT_FALSE(nvml.address().has_value());

  const XidSubject nothing("", std::nullopt);
  EXPECT_EQ(nothing.policy_id(), "PCI:");
}

}  // namespace
}  // namespace gns::gpu_health
