#pragma once
// The claim log: the DRA driver's write-ahead log, so that a NodePrepareResources or
// NodeUnprepareResources call costs one durable write (issue #15). Every prepare and unprepare
// the kubelet is answered for is first one record here (group-committed: the claims of one call
// go into one write and one fdatasync); the checkpoint (checkpoint.hpp) is the compacted state,
// rewritten now and then with the sequence number of the last record it includes.
//
// The file (<stateDir>/dra-compute-domain/claims.log, 0600) is created pre-zeroed at its full
// size, so an append overwrites allocated blocks and its fdatasync flushes data only (no inode
// or journal commit: ~0.3 ms where an atomic file replacement costs two fsyncs). After a
// compaction the log is rewound and overwritten in place from the start.
//
// A record: 20-byte header, then a compact JSON payload.
//   magic   4 bytes  FF 43 4C 01 (0xFF never occurs in UTF-8 JSON)
//   length  u32 LE   payload bytes
//   seq     u64 LE   1, 2, 3 … across the log's whole life (never reused)
//   crc     u32 LE   CRC-32 of the seq bytes and the payload
//   payload {"op":"prepared","claim":{…checkpoint entry…}} or {"op":"unprepared","uid":"…"}
// Every append ends with 4 zero bytes (overwritten by the next append): a clean end.
//
// Reading (ParseClaimLog) from the start, given the checkpoint's seq `base`: records base+1,
// base+2 … in order form the chain; a zero magic ends it cleanly; a record with seq <= the last
// one is an older generation (before a rewind) and ends it too. Bytes that are no valid record
// are scanned over (byte by byte) to the next valid record: when that continues the chain (a
// higher seq) the damage is in the middle — records may be lost; a precise error names the
// bytes and the seqs — and the valid records after it are still applied; when nothing valid
// follows (zeros, the file's end, an older generation) it is a torn tail: the last append was
// cut by a crash, and since we answer only after fdatasync, none of its records was
// acknowledged.

#include "loop/atomic_file.hpp"
#include "dra_plugin/checkpoint.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

inline constexpr std::size_t kClaimLogCapacity = std::size_t{1} << 20;  // pre-zeroed bytes
// Compaction (checkpoint + rewind) once this much is used: ~1000 records of ~500 bytes.
inline constexpr std::size_t kClaimLogCompactAt = kClaimLogCapacity / 2;
inline constexpr std::size_t kClaimLogHeaderSize = 20;
inline constexpr std::size_t kClaimLogMaxPayload = std::size_t{1} << 20;

struct ClaimLogRecord {
  enum class Op { kPrepared, kUnprepared };
  uint64_t seq = 0;
  Op op = Op::kPrepared;
  PreparedClaim claim;  // kPrepared: the whole (PrepareCompleted) entry; kUnprepared: only uid
  bool operator==(const ClaimLogRecord&) const = default;
};

// Header + payload of one record.
std::string EncodeClaimLogRecord(const ClaimLogRecord& record);

struct ClaimLogReplay {
  std::vector<ClaimLogRecord> records;  // the chain, in seq order
  uint64_t last_seq = 0;                // of the chain's last record; the base when it is empty
  uint64_t max_seq = 0;                 // the highest seq of any valid record in the file
  std::size_t end_offset = 0;           // where the chain ends
  std::string torn_tail;                // non-empty: what a cut last append left, and where
  std::vector<std::string> corruption;  // non-empty: damage in the middle (what, where, which seqs)
};

// `base`: the trusted checkpoint's log_seq; nullopt when there is none (missing or corrupt): the
// chain then starts at the log's first valid record. Never throws.
ClaimLogReplay ParseClaimLog(std::string_view bytes, std::optional<uint64_t> base);

// Applies the records to `checkpoint` (prepared → entry set, unprepared → entry removed) and sets
// its log_seq to the last record's.
void ApplyClaimLog(Checkpoint& checkpoint, const std::vector<ClaimLogRecord>& records);

// What a start recovers: the checkpoint, the log replayed over it. Blocking; never throws.
struct ClaimStateLoad {
  CheckpointLoadResult checkpoint;  // the checkpoint file's own status and error
  bool log_found = false;
  std::string log_error;            // non-empty: the log exists but cannot be read
  ClaimLogReplay log;
  Checkpoint state;                 // the checkpoint (empty unless loaded) + the log's chain
};
ClaimStateLoad LoadClaimState(const std::string& checkpoint_path, const std::string& log_path);

// The open log. Blocking; used by one thread at a time (the module's job queue runs one file
// job at a time on the pool).
class ClaimLog {
 public:
  explicit ClaimLog(std::string path);
  ~ClaimLog();
  ClaimLog(const ClaimLog&) = delete;
  ClaimLog& operator=(const ClaimLog&) = delete;

  // Replaces the file with a fresh pre-zeroed one (temp, fsync, rename, fsync of the directory)
  // and opens it, positioned at its start. Called at start, after the checkpoint has taken in
  // everything the old log held.
  FileWriteResult Reset();
  // Writes encoded records (and the end marker) at the current position with one pwrite, then
  // one fdatasync. On failure the position does not move; the caller treats the log as broken
  // (the module restarts and recovers from what is on disk).
  FileWriteResult Append(std::string_view encoded);
  // After a durable checkpoint that includes every record: the next append starts over at 0.
  void Rewind() { offset_ = 0; }
  std::size_t Used() const { return offset_; }
  const std::string& Path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::size_t offset_ = 0;
};

}  // namespace gns::dra
