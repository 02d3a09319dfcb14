// The checkpoint: round trip through the file, modes, and every kind of file we must not trust
// (truncated, bad checksum, unknown version, wrong shapes) read as "corrupt: move aside".
#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/plugin_paths.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <functional>

namespace gns::dra {
namespace {

using nlohmann::json;

PreparedClaim Completed(const std::string& uid) {
  PreparedClaim claim;
  claim.uid = uid;
  claim.namespace_name = "default";
  claim.name = "train-a-imex-channel-x7k2p";
  claim.state = ClaimState::kPrepareCompleted;
  claim.driver_data["domainUID"] = "5f0e7f6a-0c8e-4d1c-9a3e-1b2c3d4e5f60";
  claim.device = "channel-0";
  claim.pool_name = "node-a";
  claim.request_names = {"channel"};
  claim.cdi_spec_file = "k8s.compute-domain.nvidia.com-claim_" + uid + ".json";
  claim.cdi_device_id = "k8s.compute-domain.nvidia.com/claim=" + uid + "-channel-0";
  claim.started_unix_ms = 1767225600000;
  claim.completed_unix_ms = 1767225600123;
  return claim;
}

Checkpoint TwoClaims() {
  Checkpoint checkpoint;
  checkpoint.claims["a1b2c3d4-0000-4000-8000-000000000001"] = Completed("a1b2c3d4-0000-4000-8000-000000000001");
  PreparedClaim started = Completed("a1b2c3d4-0000-4000-8000-000000000002");
  started.state = ClaimState::kPrepareStarted;
  started.completed_unix_ms = 0;
  started.name = "ünïcode-is-kept";  // names are DNS labels, but the file must not care
  checkpoint.claims[started.uid] = started;
  return checkpoint;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

void WriteRaw(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Recomputes the checksum after editing `data`, so a test reaches the check behind it.
std::string Resealed(json file) {
  file["checksum"] = Crc32(file["data"].dump());
  return file.dump();
}

TEST(CheckpointTest, Crc32MatchesTheIeeeCheckValue) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(""), 0u);
}

TEST(CheckpointTest, RoundTripsThroughTheFileWithPrivateModes) {
  gns::test::TempDir dir;
  const PluginPaths paths =
      MakePluginPaths(SitePaths{"", "", dir / "state", "/"}, "compute-domain.nvidia.com", "dra-compute-domain");
  const Checkpoint original = TwoClaims();
  const auto saved = SaveCheckpoint(paths.checkpoint_file, original);
  ASSERT_TRUE(saved) << saved.error;
  EXPECT_EQ(paths.checkpoint_file, dir / "state/dra-compute-domain/checkpoint.json");
  EXPECT_EQ(ModeOf(paths.checkpoint_file), 0600u);
  EXPECT_EQ(ModeOf(paths.state_dir), 0700u);

  const auto loaded = LoadCheckpoint(paths.checkpoint_file);
  ASSERT_EQ(loaded.status, CheckpointStatus::kLoaded) << loaded.error;
  EXPECT_EQ(loaded.checkpoint, original);

  // Saving again replaces the file atomically and leaves no temp file behind.
  Checkpoint smaller = original;
  smaller.claims.erase(smaller.claims.begin());
  ASSERT_TRUE(SaveCheckpoint(paths.checkpoint_file, smaller));
  EXPECT_EQ(LoadCheckpoint(paths.checkpoint_file).checkpoint, smaller);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(paths.state_dir)) ++files;
  EXPECT_EQ(files, 1);
}

TEST(CheckpointTest, SerializationIsDeterministicAndVersioned) {
  const std::string text = SerializeCheckpoint(TwoClaims());
  EXPECT_EQ(text, SerializeCheckpoint(TwoClaims()));
  const json file = json::parse(text);
  EXPECT_EQ(file["version"], kCheckpointVersion);
  EXPECT_EQ(file["kind"], "gns-dra-compute-domain-checkpoint");
  const json& entry = file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"];
  EXPECT_EQ(entry["state"], "PrepareCompleted");
  EXPECT_EQ(entry["device"], "channel-0");
  EXPECT_EQ(entry["domainUID"], "5f0e7f6a-0c8e-4d1c-9a3e-1b2c3d4e5f60");
  EXPECT_EQ(entry["cdiDeviceID"], "k8s.compute-domain.nvidia.com/claim=a1b2c3d4-0000-4000-8000-000000000001-channel-0");
  EXPECT_EQ(ParseCheckpoint(SerializeCheckpoint(Checkpoint{})).status, CheckpointStatus::kLoaded);
}

TEST(CheckpointTest, MissingFileIsAnEmptyStart) {
  gns::test::TempDir dir;
  const auto loaded = LoadCheckpoint(dir / "nope/checkpoint.json");
  EXPECT_EQ(loaded.status, CheckpointStatus::kMissing);
  EXPECT_TRUE(loaded.checkpoint.claims.empty());
}

TEST(CheckpointTest, ADirectoryInItsPlaceIsCorrupt) {
  gns::test::TempDir dir;
  std::filesystem::create_directories(dir / "checkpoint.json");
  const auto loaded = LoadCheckpoint(dir / "checkpoint.json");
  // Never usable as it is: moved aside like any corrupt checkpoint (a retry would not help).
  EXPECT_EQ(loaded.status, CheckpointStatus::kCorrupt);
  EXPECT_NE(loaded.error.find("is a directory, expected a regular file"), std::string::npos) << loaded.error;
}

TEST(CheckpointTest, AFifoOrALinkToADeviceIsCorruptAndNeverRead) {
  gns::test::TempDir dir;
  const std::string fifo = dir / "checkpoint.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto loaded = LoadCheckpoint(fifo);  // no writer: a plain read would wait for ever
  EXPECT_EQ(loaded.status, CheckpointStatus::kCorrupt);
  EXPECT_NE(loaded.error.find("is a FIFO"), std::string::npos) << loaded.error;
  const auto moved = MoveCorruptCheckpointAside(fifo, 1767225600);
  ASSERT_TRUE(moved.ok) << moved.error;
  std::filesystem::create_symlink("/dev/zero", fifo);
  EXPECT_EQ(LoadCheckpoint(fifo).status, CheckpointStatus::kCorrupt);
  const auto again = MoveCorruptCheckpointAside(fifo, 1767225600);  // the same second: a name of its own
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_EQ(again.moved_to, fifo + ".corrupt-1767225600-1");
}

struct CorruptCase {
  const char* name;
  std::function<std::string(const std::string& good)> make;
  const char* mentions;
};

class CorruptCheckpointTest : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(CorruptCheckpointTest, ReadsAsCorruptAndCanBeMovedAside) {
  const CorruptCase& c = GetParam();
  gns::test::TempDir dir;
  const std::string path = dir / "checkpoint.json";
  WriteRaw(path, c.make(SerializeCheckpoint(TwoClaims())));

  const auto loaded = LoadCheckpoint(path);
  EXPECT_EQ(loaded.status, CheckpointStatus::kCorrupt) << c.name;
  EXPECT_TRUE(loaded.checkpoint.claims.empty());
  EXPECT_NE(loaded.error.find(c.mentions), std::string::npos) << loaded.error;
  EXPECT_NE(loaded.error.find(path), std::string::npos) << "names the file: " << loaded.error;

  const auto moved = MoveCorruptCheckpointAside(path, 1767225600);
  ASSERT_TRUE(moved.ok) << moved.error;
  EXPECT_EQ(moved.moved_to, path + ".corrupt-1767225600");
  EXPECT_TRUE(std::filesystem::exists(moved.moved_to));
  EXPECT_EQ(LoadCheckpoint(path).status, CheckpointStatus::kMissing);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CorruptCheckpointTest,
    ::testing::Values(
        CorruptCase{"Empty", [](const std::string&) { return std::string(); }, "not valid JSON"},
        CorruptCase{"Truncated", [](const std::string& good) { return good.substr(0, good.size() / 2); },
                    "not valid JSON"},
        CorruptCase{"Garbage", [](const std::string&) { return std::string("\x7f" "ELF\x02\x01\x01", 7); },
                    "not valid JSON"},
        CorruptCase{"TopLevelArray", [](const std::string&) { return std::string("[]"); }, "top level is array"},
        CorruptCase{"BadChecksum",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"]["device"] = "channel-1";
                      return file.dump();  // content changed, checksum not
                    },
                    "checksum mismatch"},
        CorruptCase{"ChecksumNotANumber",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["checksum"] = "abc";
                      return file.dump();
                    },
                    "checksum"},
        CorruptCase{"UnknownVersion",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["version"] = 2;
                      return file.dump();
                    },
                    "unknown version 2"},
        CorruptCase{"ForeignKind",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["kind"] = "something-else";
                      return file.dump();
                    },
                    "kind is"},
        CorruptCase{"StateNotAString",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"]["state"] = 3;
                      return Resealed(file);
                    },
                    ".state: expected a string"},
        CorruptCase{"UnknownState",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"]["state"] = "Prepared";
                      return Resealed(file);
                    },
                    "unknown state \"Prepared\""},
        CorruptCase{"MissingDevice",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"].erase("device");
                      return Resealed(file);
                    },
                    ".device: missing"},
        CorruptCase{"TimestampAString",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"]["startedAtUnixMs"] = "now";
                      return Resealed(file);
                    },
                    ".startedAtUnixMs: expected an integer"},
        CorruptCase{"RequestNamesNotStrings",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"]["requestNames"] =
                          json::array({1});
                      return Resealed(file);
                    },
                    "requestNames[]"},
        CorruptCase{"EntryNotAnObject",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"] = "x";
                      return Resealed(file);
                    },
                    "expected an object"},
        CorruptCase{"ClaimsNotAnObject",
                    [](const std::string& good) {
                      json file = json::parse(good);
                      file["data"]["preparedClaims"] = json::array();
                      return Resealed(file);
                    },
                    "data.preparedClaims: expected an object"}),
    [](const ::testing::TestParamInfo<CorruptCase>& info) { return std::string(info.param.name); });

TEST(CheckpointTest, FindsTheCompletedHolderOfADeviceOtherThanTheAsker) {
  const Checkpoint checkpoint = TwoClaims();
  const PreparedClaim* holder = checkpoint.CompletedHolderOf("channel-0", "someone-else");
  ASSERT_NE(holder, nullptr);
  EXPECT_EQ(holder->uid, "a1b2c3d4-0000-4000-8000-000000000001");
  // The holder itself is not in conflict with itself, and a started entry holds nothing.
  EXPECT_EQ(checkpoint.CompletedHolderOf("channel-0", "a1b2c3d4-0000-4000-8000-000000000001"), nullptr);
  EXPECT_EQ(checkpoint.CompletedHolderOf("channel-1", ""), nullptr);
}

TEST(CheckpointTest, MoveAsideOfAMissingFileReportsWhy) {
  gns::test::TempDir dir;
  const auto moved = MoveCorruptCheckpointAside(dir / "checkpoint.json", 1);
  EXPECT_FALSE(moved.ok);
  EXPECT_NE(moved.error.find("No such file"), std::string::npos) << moved.error;
}

TEST(CheckpointTest, SaveFailsCleanlyWhenTheDirectoryCannotBeMade) {
  gns::test::TempDir dir;
  WriteRaw(dir / "file", "x");
  const auto saved = SaveCheckpoint(dir / "file/sub/checkpoint.json", TwoClaims());
  EXPECT_FALSE(saved);
  EXPECT_NE(saved.error.find("not a directory"), std::string::npos) << saved.error;
}

// A checkpoint exactly as the first releases wrote it (compute-domain.nvidia.com, records with
// "domainUID" and "channels" at the top level; checksum made by zlib's crc32, not ours): an
// existing node upgrades in place. It loads, the driver's members are the driver's, and saving
// it again writes the very same bytes.
constexpr const char* kFirstReleaseCheckpoint = R"({
  "checksum": 1975078375,
  "data": {
    "logSeq": 7,
    "preparedClaims": {
      "a1b2c3d4-0000-4000-8000-000000000001": {
        "cdiDeviceID": "k8s.compute-domain.nvidia.com/claim=a1b2c3d4-0000-4000-8000-000000000001-channel-0",
        "cdiSpecFile": "k8s.compute-domain.nvidia.com-claim_a1b2c3d4-0000-4000-8000-000000000001.json",
        "channels": 2048,
        "completedAtUnixMs": 1767225600123,
        "device": "channel-0",
        "domainUID": "5f0e7f6a-0c8e-4d1c-9a3e-1b2c3d4e5f60",
        "name": "train-a-imex-channel-x7k2p",
        "namespace": "default",
        "poolName": "node-a",
        "requestNames": [
          "channel"
        ],
        "startedAtUnixMs": 1767225600000,
        "state": "PrepareCompleted"
      },
      "a1b2c3d4-0000-4000-8000-000000000002": {
        "cdiDeviceID": "",
        "cdiSpecFile": "",
        "completedAtUnixMs": 0,
        "device": "channel-0",
        "domainUID": "",
        "name": "b",
        "namespace": "default",
        "poolName": "node-a",
        "requestNames": [],
        "startedAtUnixMs": 1767225600000,
        "state": "PrepareStarted"
      }
    }
  },
  "kind": "gns-dra-compute-domain-checkpoint",
  "version": 1
}
)";

TEST(CheckpointTest, AFirstReleaseFileLoadsAndSavesByteForByte) {
  const auto loaded = ParseCheckpoint(kFirstReleaseCheckpoint);
  ASSERT_EQ(loaded.status, CheckpointStatus::kLoaded) << loaded.error;
  ASSERT_EQ(loaded.checkpoint.claims.size(), 2u);
  EXPECT_EQ(loaded.checkpoint.log_seq, 7u);
  const PreparedClaim* all = loaded.checkpoint.Find("a1b2c3d4-0000-4000-8000-000000000001");
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->state, ClaimState::kPrepareCompleted);
  EXPECT_EQ(all->device, "channel-0");
  EXPECT_EQ(all->request_names, std::vector<std::string>{"channel"});
  EXPECT_TRUE(all->more_devices.empty());
  EXPECT_EQ(all->driver_data, (json{{"channels", 2048}, {"domainUID", "5f0e7f6a-0c8e-4d1c-9a3e-1b2c3d4e5f60"}}));
  EXPECT_EQ(loaded.checkpoint.Find("a1b2c3d4-0000-4000-8000-000000000002")->driver_data, (json{{"domainUID", ""}}));
  EXPECT_EQ(SerializeCheckpoint(loaded.checkpoint), kFirstReleaseCheckpoint);
}

TEST(CheckpointTest, AClaimOfSeveralDevicesAndItsDriversMembersRoundTrip) {
  Checkpoint checkpoint;
  PreparedClaim claim = Completed("a1b2c3d4-0000-4000-8000-000000000009");
  claim.driver_data = json{{"gpus", json::array({"GPU-1", "GPU-2"})}, {"sharing", "TimeSlicing"}};
  claim.device = "gpu-0";
  claim.more_devices = {{"gpu-1", {"gpus"}, "k8s.gpu.nvidia.com/claim=x-gpu-1"}};
  checkpoint.claims[claim.uid] = claim;
  const auto text = SerializeCheckpoint(checkpoint);
  const auto loaded = ParseCheckpoint(text);
  ASSERT_EQ(loaded.status, CheckpointStatus::kLoaded) << loaded.error;
  EXPECT_EQ(loaded.checkpoint, checkpoint);
  const auto devices = loaded.checkpoint.Find(claim.uid)->Devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].device, "gpu-0");
  EXPECT_EQ(devices[1].device, "gpu-1");
  EXPECT_EQ(loaded.checkpoint.CompletedHolderOf("gpu-1", "someone-else"), loaded.checkpoint.Find(claim.uid));
}

TEST(CheckpointTest, AMalformedExtraDeviceIsCorrupt) {
  json file = json::parse(kFirstReleaseCheckpoint);
  file["data"]["preparedClaims"]["a1b2c3d4-0000-4000-8000-000000000001"]["moreDevices"] = json::array({"gpu-1"});
  const auto loaded = ParseCheckpoint(Resealed(file));
  EXPECT_EQ(loaded.status, CheckpointStatus::kCorrupt);
  EXPECT_NE(loaded.error.find("moreDevices"), std::string::npos) << loaded.error;
}

}  // namespace
}  // namespace gns::dra
