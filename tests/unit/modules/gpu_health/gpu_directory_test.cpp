// GpuDirectory and XidSubject: which GPU a kernel line's PCI address names (the inventory
// first, then what the kernel log taught, compared numerically), and the name XidPolicy keys it
// by.
#include "modules/gpu_health/gpu_directory.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gns::gpu_health {
namespace {

constexpr const char* kDirA = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
constexpr const char* kDirB = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
constexpr const char* kDirC = "GPU-cccccccc-0000-0000-0000-000000000000";

PciAddress DirPci(std::string_view text) {
  auto pci = ParsePciAddress(text);
  EXPECT_TRUE(pci.has_value()) << text;
  return pci.value_or(PciAddress{});
}

gpu_inventory::GpuInfo DirGpu(const std::string& uuid, const std::string& bus_id) {
  gpu_inventory::GpuInfo info;
  info.uuid = uuid;
  info.pci_bus_id = bus_id;
  info.pci = gpu_inventory::PciAddress::Parse(bus_id).value();
  return info;
}

TEST(GpuDirectory, InventoryFirstThenWhatTheKernelLogTaught) {
  GpuDirectory directory;
  EXPECT_EQ(directory.UuidForPci(DirPci("0000:3b:00")), "");
  directory.SetInventory({DirGpu(kDirA, "00000000:3B:00.0"), DirGpu(kDirB, "00000000:86:00.0")});
  // NVML's 8-digit upper-case form and the Xid line's short form name the same GPU.
  EXPECT_EQ(directory.UuidForPci(DirPci("0000:3b:00")), kDirA);
  EXPECT_EQ(directory.UuidForPci(DirPci("0000:86:00")), kDirB);
  EXPECT_EQ(directory.UuidForPci(DirPci("0000:87:00")), "");

  EXPECT_EQ(directory.Learn(DirPci("0000:87:00"), kDirC), GpuDirectory::LearnResult::kLearned);
  EXPECT_EQ(directory.Learn(DirPci("0000:87:00"), kDirC), GpuDirectory::LearnResult::kKnown);
  EXPECT_EQ(directory.UuidForPci(DirPci("0000:87:00")), kDirC);
  // A learned line cannot override the inventory.
  EXPECT_EQ(directory.Learn(DirPci("0000:3b:00"), kDirC), GpuDirectory::LearnResult::kLearned);
  EXPECT_EQ(directory.UuidForPci(DirPci("0000:3b:00")), kDirA);

  EXPECT_EQ(directory.PciForUuid(kDirA), "0000:3b:00");
  EXPECT_EQ(directory.PciForUuid(kDirC), "0000:3b:00");  // by address: 3b before 87
  EXPECT_EQ(directory.PciForUuid("GPU-none"), "");
  const std::vector<std::pair<std::string, std::string>> learned = {{"0000:3b:00", kDirC}, {"0000:87:00", kDirC}};
  EXPECT_EQ(directory.Learned(), learned);
}

TEST(GpuDirectory, LearnsAtMostKMaxLearnedAddresses) {
  GpuDirectory directory;
  for (uint32_t i = 0; i < GpuDirectory::kMaxLearned; ++i) {
    PciAddress pci;
    pci.domain = i;
    ASSERT_EQ(directory.Learn(pci, kDirA), GpuDirectory::LearnResult::kLearned) << i;
  }
  PciAddress one_more;
  one_more.domain = GpuDirectory::kMaxLearned;
  EXPECT_EQ(directory.Learn(one_more, kDirB), GpuDirectory::LearnResult::kFull);
  EXPECT_EQ(directory.UuidForPci(one_more), "");
  // A known address may still change its UUID.
  EXPECT_EQ(directory.Learn(PciAddress{}, kDirB), GpuDirectory::LearnResult::kLearned);
  EXPECT_EQ(directory.UuidForPci(PciAddress{}), kDirB);
  EXPECT_EQ(directory.Learned().size(), GpuDirectory::kMaxLearned);
}

TEST(XidSubject, KeyedByUuidOrElseByPciAddress) {
  const XidSubject known(kDirA, DirPci("0000:3b:00"));
  EXPECT_EQ(known.uuid(), kDirA);
  EXPECT_EQ(known.policy_id(), kDirA);
  EXPECT_EQ(known.pci(), "0000:3b:00");

  const XidSubject unknown("", DirPci("00000001:3B:1f.0"));
  EXPECT_EQ(unknown.uuid(), "");
  EXPECT_EQ(unknown.policy_id(), "PCI:0001:3b:1f");
  EXPECT_EQ(unknown.pci(), "0001:3b:1f");
  EXPECT_EQ(PciPolicyId("0001:3b:1f"), "PCI:0001:3b:1f");

  const XidSubject nvml(kDirB, std::nullopt);
  EXPECT_EQ(nvml.policy_id(), kDirB);
  EXPECT_EQ(nvml.pci(), "");
  EXPECT_FALSE(nvml.address().has_value());

  const XidSubject nothing("", std::nullopt);
  EXPECT_EQ(nothing.policy_id(), "PCI:");
}

}  // namespace
}  // namespace gns::gpu_health
