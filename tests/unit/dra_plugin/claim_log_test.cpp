// The claim log (the DRA driver's write-ahead log): records round-trip; a cut last append is a
// torn tail (logged, nothing acknowledged is lost); damage between valid records is corruption
// that names the bytes and the lost seqs while the records after it still apply; a log rewound
// after a compaction ends at its older generation; the file is pre-zeroed, 0600, and what it
// holds is read back over the checkpoint.
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/checkpoint.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

namespace gns::dra {
namespace {

PreparedClaim Entry(const std::string& uid) {
  PreparedClaim claim;
  claim.uid = uid;
  claim.namespace_name = "team-a";
  claim.name = "claim-" + uid.substr(0, 4);
  claim.state = ClaimState::kPrepareCompleted;
  claim.driver_data["domainUID"] = "5f0e7f6a-0c8e-4d1c-9a3e-1b2c3d4e5f60";
  claim.device = "channel-0";
  claim.pool_name = "node-a";
  claim.request_names = {"channel"};
  claim.cdi_spec_file = "k8s.compute-domain.nvidia.com-claim_" + uid + ".json";
  claim.cdi_device_id = "k8s.compute-domain.nvidia.com/claim=" + uid + "-channel-0";
  claim.started_unix_ms = 1767225600000;
  claim.completed_unix_ms = 1767225600000;
  return claim;
}

ClaimLogRecord Prepared(uint64_t seq, const std::string& uid) { return {seq, ClaimLogRecord::Op::kPrepared, Entry(uid)}; }
ClaimLogRecord Unprepared(uint64_t seq, const std::string& uid) {
  ClaimLogRecord record{seq, ClaimLogRecord::Op::kUnprepared, {}};
  record.claim.uid = uid;
  return record;
}

// A pre-zeroed log image with `records` from offset 0, each append ending in the marker.
std::string Image(const std::vector<ClaimLogRecord>& records, std::size_t size = 8192) {
  std::string image(size, '\0');
  std::size_t at = 0;
  for (const auto& r : records) {
    const std::string bytes = EncodeClaimLogRecord(r);
    image.replace(at, bytes.size(), bytes);
    at += bytes.size();
  }
  return image;
}

std::vector<uint64_t> Seqs(const ClaimLogReplay& replay) {
  std::vector<uint64_t> seqs;
  for (const auto& r : replay.records) seqs.push_back(r.seq);
  return seqs;
}

TEST(ClaimLogTest, RecordsRoundTripAndApplyInOrder) {
  PreparedClaim all = Entry("a1b2c3d4-0000-4000-8000-000000000003");
  all.driver_data["channels"] = 2048;
  const std::vector<ClaimLogRecord> records = {Prepared(1, "a1b2c3d4-0000-4000-8000-000000000001"),
                                               Prepared(2, "a1b2c3d4-0000-4000-8000-000000000002"),
                                               Unprepared(3, "a1b2c3d4-0000-4000-8000-000000000001"),
                                               {4, ClaimLogRecord::Op::kPrepared, all}};
  const auto replay = ParseClaimLog(Image(records), 0);
  EXPECT_EQ(replay.records, records);
  EXPECT_EQ(replay.last_seq, 4u);
  EXPECT_TRUE(replay.torn_tail.empty()) << replay.torn_tail;
  EXPECT_TRUE(replay.corruption.empty());
  Checkpoint state;
  ApplyClaimLog(state, replay.records);
  EXPECT_EQ(state.claims.size(), 2u);
  EXPECT_EQ(state.Find("a1b2c3d4-0000-4000-8000-000000000001"), nullptr);
  ASSERT_NE(state.Find(all.uid), nullptr);
  EXPECT_EQ(state.Find(all.uid)->driver_data.at("channels"), 2048u);
  EXPECT_EQ(state.log_seq, 4u);
}

TEST(ClaimLogTest, TheChainStartsAfterTheCheckpointAndALogItHoldsIsHistory) {
  const std::string image = Image({Prepared(7, "aaaa-1"), Prepared(8, "aaaa-2")});
  EXPECT_EQ(Seqs(ParseClaimLog(image, 6)), (std::vector<uint64_t>{7, 8}));
  // A compaction took both in; the rewound log has had no append yet.
  const auto replay = ParseClaimLog(image, 8);
  EXPECT_TRUE(replay.records.empty());
  EXPECT_EQ(replay.last_seq, 8u);
  EXPECT_TRUE(replay.torn_tail.empty());
  EXPECT_TRUE(replay.corruption.empty());
}

TEST(ClaimLogTest, ACutLastAppendIsATornTailAndEverythingBeforeItHolds) {
  const std::string first = EncodeClaimLogRecord(Prepared(1, "aaaa-1"));
  const std::string second = EncodeClaimLogRecord(Prepared(2, "aaaa-2"));
  for (std::size_t cut : {std::size_t{3}, std::size_t{12}, kClaimLogHeaderSize + 5, second.size() - 1}) {
    std::string image(8192, '\0');
    image.replace(0, first.size(), first);
    image.replace(first.size(), cut, second.substr(0, cut));
    const auto replay = ParseClaimLog(image, 0);
    EXPECT_EQ(Seqs(replay), std::vector<uint64_t>{1}) << "cut at " << cut;
    EXPECT_TRUE(replay.corruption.empty()) << "cut at " << cut;
    EXPECT_NE(replay.torn_tail.find("from byte " + std::to_string(first.size())), std::string::npos)
        << "cut at " << cut << ": " << replay.torn_tail;
  }
}

TEST(ClaimLogTest, DamageBetweenValidRecordsNamesBytesAndLostSeqsAndKeepsTheRest) {
  const std::vector<ClaimLogRecord> records = {Prepared(1, "aaaa-1"), Prepared(2, "aaaa-2"), Unprepared(3, "aaaa-1"),
                                               Prepared(4, "aaaa-4")};
  std::string image = Image(records);
  const std::size_t second_at = EncodeClaimLogRecord(records[0]).size();
  image[second_at + kClaimLogHeaderSize + 10] ^= 0x20;  // a flipped bit in seq 2's payload
  const auto replay = ParseClaimLog(image, 0);
  EXPECT_EQ(Seqs(replay), (std::vector<uint64_t>{1, 3, 4}));
  ASSERT_EQ(replay.corruption.size(), 1u);
  const std::string& what = replay.corruption[0];
  EXPECT_NE(what.find("bytes " + std::to_string(second_at) + ".."), std::string::npos) << what;
  EXPECT_NE(what.find("checksum"), std::string::npos) << what;
  EXPECT_NE(what.find("record seq 2 is lost"), std::string::npos) << what;
  EXPECT_TRUE(replay.torn_tail.empty());
}

TEST(ClaimLogTest, ALogRewoundAfterACompactionEndsAtItsOlderGeneration) {
  // Generation 1: seqs 1..6; the checkpoint then took them in (base 6) and the log was rewound:
  // seqs 7 and 8 overwrite its start, the rest of generation 1 follows.
  std::vector<ClaimLogRecord> old;
  for (uint64_t seq = 1; seq <= 6; ++seq) old.push_back(Prepared(seq, "aaaa-" + std::to_string(seq)));
  std::string image = Image(old);
  // Before the first append of generation 2 (a crash right after the compaction): nothing new.
  auto replay = ParseClaimLog(image, 6);
  EXPECT_TRUE(replay.records.empty());
  EXPECT_TRUE(replay.torn_tail.empty());
  EXPECT_TRUE(replay.corruption.empty());
  EXPECT_EQ(replay.last_seq, 6u);

  const std::string fresh = EncodeClaimLogRecord(Unprepared(7, "aaaa-1")) + EncodeClaimLogRecord(Prepared(8, "bbbb-8"));
  std::string rewound = image;
  rewound.replace(0, fresh.size(), fresh);
  rewound.replace(fresh.size(), 4, std::string(4, '\0'));  // the end marker
  replay = ParseClaimLog(rewound, 6);
  EXPECT_EQ(Seqs(replay), (std::vector<uint64_t>{7, 8}));
  EXPECT_TRUE(replay.torn_tail.empty()) << replay.torn_tail;
  EXPECT_TRUE(replay.corruption.empty());
  EXPECT_EQ(replay.max_seq, 8u);

  // The same append cut halfway, generation 1's bytes behind it: a torn tail, not corruption.
  std::string torn = image;
  torn.replace(0, fresh.size() / 2 + 30, fresh.substr(0, fresh.size() / 2 + 30));
  replay = ParseClaimLog(torn, 6);
  EXPECT_EQ(Seqs(replay), std::vector<uint64_t>{7});
  EXPECT_FALSE(replay.torn_tail.empty());
  EXPECT_TRUE(replay.corruption.empty());
}

TEST(ClaimLogTest, ALogThatStartsPastTheCheckpointReportsTheMissingSeqs) {
  const auto replay = ParseClaimLog(Image({Prepared(5, "aaaa-5"), Prepared(6, "aaaa-6")}), 2);
  EXPECT_EQ(Seqs(replay), (std::vector<uint64_t>{5, 6}));
  ASSERT_EQ(replay.corruption.size(), 1u);
  EXPECT_NE(replay.corruption[0].find("records seq 3..4 are lost"), std::string::npos) << replay.corruption[0];
}

TEST(ClaimLogTest, WithoutATrustedCheckpointTheChainStartsAtTheFirstRecord) {
  const auto replay = ParseClaimLog(Image({Prepared(41, "aaaa-1"), Prepared(42, "aaaa-2")}), std::nullopt);
  EXPECT_EQ(Seqs(replay), (std::vector<uint64_t>{41, 42}));
  EXPECT_TRUE(replay.corruption.empty());
}

TEST(ClaimLogTest, GarbageAndEmptyInputNeverThrow) {
  EXPECT_TRUE(ParseClaimLog("", 0).records.empty());
  std::string noise(4096, '\x5a');
  noise[100] = '\xFF';
  noise[101] = 'C';
  noise[102] = 'L';
  noise[103] = '\x01';
  const auto replay = ParseClaimLog(noise, 0);
  EXPECT_TRUE(replay.records.empty());
  EXPECT_FALSE(replay.torn_tail.empty());
  // A record whose checksum holds but whose payload is not ours (a newer build's op) is
  // skipped whole and named; the records after it apply.
  const std::string payload = R"({"op":"resized","uid":"aaaa-2"})";
  std::string covered;
  for (int i = 0; i < 8; ++i) covered.push_back(static_cast<char>(i == 0 ? 2 : 0));
  covered += payload;
  const uint32_t crc = Crc32(covered);
  std::string odd("\xFF\x43\x4C\x01", 4);
  for (int i = 0; i < 4; ++i) odd.push_back(static_cast<char>((payload.size() >> (8 * i)) & 0xFF));
  odd += covered.substr(0, 8);
  for (int i = 0; i < 4; ++i) odd.push_back(static_cast<char>((crc >> (8 * i)) & 0xFF));
  odd += payload;
  const std::string first = EncodeClaimLogRecord(Prepared(1, "aaaa-1"));
  const std::string third = EncodeClaimLogRecord(Prepared(3, "aaaa-3"));
  std::string image(8192, '\0');
  image.replace(0, first.size() + odd.size() + third.size(), first + odd + third);
  const auto mixed = ParseClaimLog(image, 0);
  EXPECT_EQ(Seqs(mixed), (std::vector<uint64_t>{1, 3}));
  ASSERT_EQ(mixed.corruption.size(), 1u);
  EXPECT_NE(mixed.corruption[0].find("unknown op \"resized\""), std::string::npos) << mixed.corruption[0];
  EXPECT_NE(mixed.corruption[0].find("record seq 2 is lost"), std::string::npos) << mixed.corruption[0];
}

TEST(ClaimLogTest, TheFileIsPreZeroedPrivateAndReadBackOverTheCheckpoint) {
  gns::test::TempDir dir;
  const std::string log_path = dir / "state/claims.log";
  const std::string checkpoint_path = dir / "state/checkpoint.json";
  ClaimLog log(log_path);
  ASSERT_TRUE(log.Reset());
  struct stat st {};
  ASSERT_EQ(::stat(log_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), kClaimLogCapacity);

  ASSERT_TRUE(log.Append(EncodeClaimLogRecord(Prepared(1, "aaaa-1")) + EncodeClaimLogRecord(Prepared(2, "aaaa-2"))));
  ASSERT_TRUE(log.Append(EncodeClaimLogRecord(Unprepared(3, "aaaa-1"))));
  EXPECT_EQ(::stat(log_path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), kClaimLogCapacity);  // appends overwrite, never grow

  auto load = LoadClaimState(checkpoint_path, log_path);
  EXPECT_EQ(load.checkpoint.status, CheckpointStatus::kMissing);
  EXPECT_TRUE(load.log_found);
  EXPECT_EQ(load.state.claims.size(), 1u);
  EXPECT_NE(load.state.Find("aaaa-2"), nullptr);
  EXPECT_EQ(load.state.log_seq, 3u);

  // A compaction: the checkpoint takes it all in, the log is rewound and written over.
  ASSERT_TRUE(SaveCheckpoint(checkpoint_path, load.state));
  log.Rewind();
  ASSERT_TRUE(log.Append(EncodeClaimLogRecord(Prepared(4, "aaaa-4"))));
  load = LoadClaimState(checkpoint_path, log_path);
  EXPECT_EQ(load.checkpoint.status, CheckpointStatus::kLoaded);
  EXPECT_EQ(load.log.records.size(), 1u);
  EXPECT_TRUE(load.log.torn_tail.empty()) << load.log.torn_tail;
  EXPECT_TRUE(load.log.corruption.empty());
  EXPECT_EQ(load.state.claims.size(), 2u);
  EXPECT_EQ(load.state.log_seq, 4u);
}

}  // namespace
}  // namespace gns::dra
