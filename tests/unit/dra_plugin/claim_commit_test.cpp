// The pool side of a DRA driver's commits, with a driver's spec hooks that can fail: a claim
// whose spec cannot be written gets no record (it is not prepared), the others' records reach the
// log in one append and replay in order; an unprepare records only the claims the state holds;
// a log that cannot be appended to makes nothing durable; a compaction folds the log into the
// checkpoint and rewinds it.
#include "dra_plugin/claim_commit.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

namespace gns::dra {
namespace {

PreparedClaim GpuEntry(const std::string& uid) {
  PreparedClaim claim;
  claim.uid = uid;
  claim.namespace_name = "team-a";
  claim.name = "claim-" + uid;
  claim.state = ClaimState::kPrepareCompleted;
  claim.device = "gpu-0";
  claim.pool_name = "node-a";
  claim.cdi_spec_file = "k8s.gpu.nvidia.com-claim_" + uid + ".json";
  claim.cdi_device_id = "k8s.gpu.nvidia.com/claim=" + uid + "-gpu-0";
  return claim;
}

// A driver's spec hooks that remember what they did and fail for the UIDs in `refuse`.
struct FakeSpecs {
  std::set<std::string> refuse;
  std::vector<std::string> written;
  std::vector<std::string> removed;
  std::vector<SpecDurability> durabilities;

  ClaimSpecIo Io() {
    ClaimSpecIo io;
    io.write = [this](const PreparedClaim& entry, SpecDurability durability) {
      if (refuse.count(entry.uid) != 0) return FileWriteResult{false, "disk full"};
      written.push_back(entry.uid);
      durabilities.push_back(durability);
      return FileWriteResult{};
    };
    io.remove = [this](std::string_view uid) {
      if (refuse.count(std::string(uid)) != 0) return FileWriteResult{false, "read-only"};
      removed.emplace_back(uid);
      return FileWriteResult{};
    };
    return io;
  }
};

std::string ReadLog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(ClaimCommitTest, APrepareRecordsOnlyTheClaimsWhoseSpecWasWritten) {
  gns::test::TempDir dir;
  const std::string path = dir / "state/claims.log";
  ClaimLog log(path);
  ASSERT_TRUE(log.Reset());
  FakeSpecs specs;
  specs.refuse = {"uid-2"};
  const CommitOutcome out = AppendPrepares(log, specs.Io(), {GpuEntry("uid-1"), GpuEntry("uid-2"), GpuEntry("uid-3")}, 7);
  EXPECT_TRUE(out.log_error.empty()) << out.log_error;
  EXPECT_EQ(out.committed, (std::vector<std::string>{"uid-1", "uid-3"}));
  ASSERT_EQ(out.failed.count("uid-2"), 1u);
  EXPECT_EQ(out.failed.at("uid-2"), "cannot write the CDI spec: disk full");
  EXPECT_EQ(out.last_seq, 8u);
  EXPECT_EQ(out.log_used, log.Used());
  EXPECT_GT(out.log_used, 0u);
  EXPECT_EQ(specs.durabilities, (std::vector<SpecDurability>{SpecDurability::kVisibleOnly, SpecDurability::kVisibleOnly}))
      << "the hot path writes specs without fsync: the record is the durable part";

  const ClaimLogReplay replay = ParseClaimLog(ReadLog(path), 6);
  ASSERT_EQ(replay.records.size(), 2u);
  EXPECT_EQ(replay.records[0].seq, 7u);
  EXPECT_EQ(replay.records[0].claim, GpuEntry("uid-1"));
  EXPECT_EQ(replay.records[1].seq, 8u);
  EXPECT_EQ(replay.records[1].claim.uid, "uid-3");
  EXPECT_TRUE(replay.torn_tail.empty()) << replay.torn_tail;
}

TEST(ClaimCommitTest, AnUnprepareDeletesEverySpecAndRecordsOnlyKnownClaims) {
  gns::test::TempDir dir;
  const std::string path = dir / "claims.log";
  ClaimLog log(path);
  ASSERT_TRUE(log.Reset());
  FakeSpecs specs;
  specs.refuse = {"uid-3"};
  const CommitOutcome out =
      AppendUnprepares(log, specs.Io(), {"uid-1", "uid-2", "uid-3"}, {true, false, true}, 1);
  EXPECT_EQ(specs.removed, (std::vector<std::string>{"uid-1", "uid-2"}));
  EXPECT_EQ(out.committed, std::vector<std::string>{"uid-1"}) << "uid-2 is unknown: its spec goes, no record";
  EXPECT_EQ(out.failed.at("uid-3"), "cannot delete the CDI spec: read-only");
  EXPECT_EQ(out.last_seq, 1u);
  const ClaimLogReplay replay = ParseClaimLog(ReadLog(path), 0);
  ASSERT_EQ(replay.records.size(), 1u);
  EXPECT_EQ(replay.records[0].op, ClaimLogRecord::Op::kUnprepared);
  EXPECT_EQ(replay.records[0].claim.uid, "uid-1");
}

TEST(ClaimCommitTest, ALogThatCannotBeWrittenMakesNothingDurable) {
  gns::test::TempDir dir;
  ClaimLog log(dir / "never-opened.log");  // no Reset: no file descriptor
  FakeSpecs specs;
  const CommitOutcome out = AppendPrepares(log, specs.Io(), {GpuEntry("uid-1")}, 1);
  EXPECT_NE(out.log_error.find("cannot append to the claim log"), std::string::npos) << out.log_error;
  EXPECT_EQ(log.Used(), 0u);
}

TEST(ClaimCommitTest, ACompactionSavesTheCheckpointAndRewindsTheLog) {
  gns::test::TempDir dir;
  ClaimLog log(dir / "claims.log");
  ASSERT_TRUE(log.Reset());
  FakeSpecs specs;
  ASSERT_TRUE(AppendPrepares(log, specs.Io(), {GpuEntry("uid-1")}, 1).log_error.empty());
  ASSERT_GT(log.Used(), 0u);
  Checkpoint snapshot;
  snapshot.claims["uid-1"] = GpuEntry("uid-1");
  snapshot.log_seq = 1;
  const std::string checkpoint = dir / "state/checkpoint.json";
  EXPECT_EQ(CompactClaimLog(log, checkpoint, snapshot), "");
  EXPECT_EQ(log.Used(), 0u);
  const CheckpointLoadResult loaded = LoadCheckpoint(checkpoint);
  ASSERT_EQ(loaded.status, CheckpointStatus::kLoaded) << loaded.error;
  EXPECT_EQ(loaded.checkpoint, snapshot);

  // A checkpoint that cannot be written leaves the log as it was (the records are still needed).
  ASSERT_TRUE(AppendPrepares(log, specs.Io(), {GpuEntry("uid-2")}, 2).log_error.empty());
  const std::size_t used = log.Used();
  std::ofstream(dir / "file") << "x";
  EXPECT_FALSE(CompactClaimLog(log, dir / "file/checkpoint.json", snapshot).empty());
  EXPECT_EQ(log.Used(), used);
}

}  // namespace
}  // namespace gns::dra
