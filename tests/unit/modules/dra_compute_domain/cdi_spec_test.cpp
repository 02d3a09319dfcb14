// The per-claim CDI spec: every field as the container runtime reads it (WIRE-FACTS §6, §9.1),
// the file's name and mode, deletion and listing for the reconcile.
#include "modules/dra_compute_domain/cdi_spec.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

namespace gns::dra {
namespace {

using nlohmann::json;

constexpr const char* kUid = "3f2a9c1e-7b4d-4e8f-a1c2-5d6e7f8091ab";

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str());
}

TEST(CdiSpecTest, NamesFollowTheUpstreamClaimSpecs) {
  EXPECT_EQ(CdiSpecFileName(kUid), std::string("k8s.compute-domain.nvidia.com-claim_") + kUid + ".json");
  EXPECT_EQ(CdiDeviceName(kUid), std::string(kUid) + "-channel-0");
  EXPECT_EQ(CdiQualifiedDeviceId(kUid), std::string("k8s.compute-domain.nvidia.com/claim=") + kUid + "-channel-0");
}

TEST(CdiSpecTest, SpecCarriesTheChannelNodeFromTheMajor) {
  const json spec = BuildChannelCdiSpec(kUid, 234);
  // The UID starts with a digit: a device name that does not start with a letter needs 0.5.0.
  EXPECT_EQ(spec["cdiVersion"], "0.5.0");
  EXPECT_EQ(spec["kind"], "k8s.compute-domain.nvidia.com/claim");
  ASSERT_EQ(spec["devices"].size(), 1u);
  const json& device = spec["devices"][0];
  EXPECT_EQ(device["name"], std::string(kUid) + "-channel-0");
  ASSERT_EQ(device["containerEdits"]["deviceNodes"].size(), 1u);
  const json& node = device["containerEdits"]["deviceNodes"][0];
  EXPECT_EQ(node["path"], "/dev/nvidia-caps-imex-channels/channel0");
  EXPECT_FALSE(node.contains("hostPath")) << "the runtime makes the node from major/minor";
  EXPECT_EQ(node["type"], "c");
  EXPECT_EQ(node["major"], 234);
  EXPECT_EQ(node["minor"], 0);
  EXPECT_EQ(node["fileMode"], 0666);  // 438: any container user may open the channel
  EXPECT_FALSE(spec.contains("containerEdits")) << "no spec-wide edits";
  // A name that starts with a letter fits the oldest supported version.
  EXPECT_EQ(BuildChannelCdiSpec("abc-1", 1)["cdiVersion"], "0.3.0");
}

TEST(CdiSpecTest, WritesAtomicallyWithMode0644AndCreatesTheDirectory) {
  gns::test::TempDir dir;
  const std::string cdi_dir = dir / "run/cdi";
  const auto written = WriteChannelCdiSpec(cdi_dir, kUid, 511);
  ASSERT_TRUE(written) << written.error;
  const std::string path = cdi_dir + "/" + CdiSpecFileName(kUid);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::stat(cdi_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  const json back = ReadJson(path);
  EXPECT_EQ(back, BuildChannelCdiSpec(kUid, 511));

  // Rewriting (a retried prepare) replaces it in place.
  ASSERT_TRUE(WriteChannelCdiSpec(cdi_dir, kUid, 510));
  EXPECT_EQ(ReadJson(path)["devices"][0]["containerEdits"]["deviceNodes"][0]["major"], 510);
}

TEST(CdiSpecTest, RejectsUidsThatAreNotSafeFileNames) {
  gns::test::TempDir dir;
  for (const char* bad : {"", "../etc/passwd", "a/b", "-leading", "trailing-", "with space", "x.json"}) {
    EXPECT_FALSE(IsValidClaimUid(bad)) << bad;
    EXPECT_FALSE(WriteChannelCdiSpec(dir.Path(), bad, 1)) << bad;
    EXPECT_FALSE(DeleteCdiSpec(dir.Path(), bad)) << bad;
  }
  EXPECT_TRUE(IsValidClaimUid(kUid));
  EXPECT_FALSE(IsValidClaimUid(std::string(65, 'a')));
}

TEST(CdiSpecTest, DeleteIsIdempotent) {
  gns::test::TempDir dir;
  ASSERT_TRUE(WriteChannelCdiSpec(dir.Path(), kUid, 1));
  EXPECT_TRUE(DeleteCdiSpec(dir.Path(), kUid));
  EXPECT_FALSE(std::filesystem::exists(dir / CdiSpecFileName(kUid)));
  const auto again = DeleteCdiSpec(dir.Path(), kUid);
  EXPECT_TRUE(again) << again.error;
}

TEST(CdiSpecTest, ListsOnlyOurSpecFiles) {
  gns::test::TempDir dir;
  ASSERT_TRUE(WriteChannelCdiSpec(dir.Path(), "bbbb-2", 1));
  ASSERT_TRUE(WriteChannelCdiSpec(dir.Path(), "aaaa-1", 1));
  // Someone else's specs, a leftover temp file and a YAML twin are not ours.
  std::ofstream(dir / "nvidia.com-gpu.json") << "{}";
  std::ofstream(dir / "k8s.gpu.nvidia.com-claim_cccc-3.json") << "{}";
  std::ofstream(dir / (CdiSpecFileName("dddd-4") + ".tmp.1.2")) << "{}";
  std::ofstream(dir / "k8s.compute-domain.nvidia.com-claim_eeee-5.yaml") << "{}";
  const auto listing = ListCdiSpecClaimUids(dir.Path());
  ASSERT_TRUE(listing.ok) << listing.error;
  EXPECT_EQ(listing.claim_uids, (std::vector<std::string>{"aaaa-1", "bbbb-2"}));
  EXPECT_TRUE(ListCdiSpecClaimUids(dir / "missing").claim_uids.empty());
  EXPECT_TRUE(ListCdiSpecClaimUids(dir / "missing").ok);
}

}  // namespace
}  // namespace gns::dra
