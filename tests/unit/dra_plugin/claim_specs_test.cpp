// The per-claim CDI spec files of the DRA plugin core, with two drivers' names in one CDI
// directory (a node runs the compute-domain driver and a GPU driver side by side, beside other
// producers): each driver writes, checks, lists, sweeps and deletes only its own files.
#include "dra_plugin/claim_specs.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace gns::dra {
namespace {

constexpr const char* kUid = "3f2a9c1e-7b4d-4e8f-a1c2-5d6e7f8091ab";

const ClaimSpecNames kChannels{"k8s.compute-domain.nvidia.com", "claim"};
const ClaimSpecNames kGpus{"k8s.gpu.nvidia.com", "claim"};

void Touch(const std::string& path, const std::string& content = "{}") { std::ofstream(path) << content; }

TEST(ClaimSpecNamesTest, NamesComeFromVendorAndClass) {
  EXPECT_EQ(kGpus.Kind(), "k8s.gpu.nvidia.com/claim");
  EXPECT_EQ(kGpus.FileName(kUid), std::string("k8s.gpu.nvidia.com-claim_") + kUid + ".json");
  EXPECT_EQ(kGpus.QualifiedDeviceId("gpu-0"), "k8s.gpu.nvidia.com/claim=gpu-0");
  EXPECT_EQ(kGpus.ClaimUidOf(kGpus.FileName(kUid)), std::string_view(kUid));
  EXPECT_FALSE(kGpus.ClaimUidOf(kChannels.FileName(kUid))) << "another driver's file";
  EXPECT_FALSE(kChannels.ClaimUidOf(kGpus.FileName(kUid))) << "another driver's file";
  EXPECT_FALSE(kGpus.ClaimUidOf("k8s.gpu.nvidia.com-claim_bad/uid.json"));
  EXPECT_FALSE(kGpus.ClaimUidOf("k8s.gpu.nvidia.com-claim_.json"));
}

TEST(ClaimSpecNamesTest, WriteCheckAndDeleteTouchOnlyTheDriversFile) {
  gns::test::TempDir dir;
  const std::string cdi = dir / "run/cdi";
  ASSERT_TRUE(WriteClaimSpec(cdi, kGpus, kUid, "gpu spec\n"));
  ASSERT_TRUE(WriteClaimSpec(cdi, kChannels, kUid, "channel spec\n", SpecDurability::kVisibleOnly));
  struct stat st {};
  ASSERT_EQ(::stat((cdi + "/" + kGpus.FileName(kUid)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::stat((cdi + "/" + kChannels.FileName(kUid)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u) << "the visible-only write gives the same mode";

  EXPECT_TRUE(ClaimSpecIsCurrent(cdi, kGpus, kUid, "gpu spec\n"));
  EXPECT_FALSE(ClaimSpecIsCurrent(cdi, kGpus, kUid, "channel spec\n")) << "the content counts";
  EXPECT_TRUE(ClaimSpecIsCurrent(cdi, kChannels, kUid, "channel spec\n"));

  ASSERT_TRUE(DeleteClaimSpec(cdi, kGpus, kUid));
  EXPECT_FALSE(std::filesystem::exists(cdi + "/" + kGpus.FileName(kUid)));
  EXPECT_TRUE(std::filesystem::exists(cdi + "/" + kChannels.FileName(kUid))) << "the other driver's claim stays";
  EXPECT_TRUE(DeleteClaimSpec(cdi, kGpus, kUid)) << "a missing file is success";
  EXPECT_FALSE(DeleteClaimSpec(cdi, kGpus, "../escape")) << "an invalid UID names no file";
  EXPECT_FALSE(WriteClaimSpec(cdi, kGpus, "a/b", "x"));
}

TEST(ClaimSpecNamesTest, ListingAndSweepSeeOnlyTheDriversFiles) {
  gns::test::TempDir dir;
  const std::string cdi = dir.Path().string();
  const std::string other_uid = "0a1b2c3d-0000-4000-8000-000000000001";
  Touch(cdi + "/" + kGpus.FileName(kUid));
  Touch(cdi + "/" + kGpus.FileName(other_uid));
  Touch(cdi + "/" + kChannels.FileName(kUid));
  Touch(cdi + "/nvidia.yaml");
  // Temp files left by interrupted writes: one of each driver's, one of another producer's.
  const std::string gpu_temp = AtomicWriteTempName(cdi + "/" + kGpus.FileName(kUid), 12, 345);
  const std::string channel_temp = AtomicWriteTempName(cdi + "/" + kChannels.FileName(kUid), 12, 346);
  const std::string other_temp = AtomicWriteTempName(cdi + "/nvidia.yaml", 12, 347);
  Touch(gpu_temp);
  Touch(channel_temp);
  Touch(other_temp);

  const CdiListing gpus = ListClaimSpecs(cdi, kGpus);
  ASSERT_TRUE(gpus.ok) << gpus.error;
  EXPECT_EQ(gpus.claim_uids, (std::vector<std::string>{other_uid, kUid}));
  const CdiListing channels = ListClaimSpecs(cdi, kChannels);
  EXPECT_EQ(channels.claim_uids, std::vector<std::string>{kUid});

  const TempSweep sweep = RemoveInterruptedClaimSpecWrites(cdi, kGpus);
  EXPECT_TRUE(sweep.errors.empty());
  ASSERT_EQ(sweep.removed.size(), 1u);
  EXPECT_EQ(sweep.removed.front(), gpu_temp);
  EXPECT_FALSE(std::filesystem::exists(gpu_temp));
  EXPECT_TRUE(std::filesystem::exists(channel_temp)) << "the other driver's temp file is its own to sweep";
  EXPECT_TRUE(std::filesystem::exists(other_temp));

  EXPECT_TRUE(ListClaimSpecs(dir / "missing", kGpus).ok) << "a missing directory lists as empty";
}

}  // namespace
}  // namespace gns::dra
