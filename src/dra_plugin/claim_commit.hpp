#pragma once
// The durable steps of a DRA driver's prepare and unprepare calls, run on the BlockingPool (no
// loop state travels there): a call's claims become one claim-log append + one fdatasync
// (claim_log.hpp), beside the per-claim CDI spec files that the driver's ClaimSpecIo writes; and
// the compaction that folds the log into the checkpoint. The loop side (the FIFO of kubelet
// calls, the decisions, the answers) takes in exactly what the outcome says reached the disk.
//
// Order, for crash safety (kill -9 anywhere, nothing lost, nothing doubled):
//   prepare:   spec files first (visible at once, no fsync: re-made from the record at start),
//              then the records in one append; a crash before the append leaves orphan specs
//              that the start-up reconcile deletes (the kubelet got no answer and retries);
//   unprepare: spec files deleted first, then the "unprepared" records; a crash in between
//              leaves the record, whose spec the start re-makes and the kubelet's retry deletes.

#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/claim_specs.hpp"
#include "loop/atomic_file.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

// How a driver's per-claim CDI specs are written and removed, as the pool calls them: plain
// functions of the record (no loop state; they may run on any pool thread).
struct ClaimSpecIo {
  // The spec the record implies, written with `durability` (kVisibleOnly on the prepare path).
  std::function<FileWriteResult(const PreparedClaim& entry, SpecDurability durability)> write;
  // The claim's spec removed; a missing file is success.
  std::function<FileWriteResult(std::string_view claim_uid)> remove;
  // The claim's spec on disk is exactly what the record implies (the start-up reconcile re-makes
  // it, durably, when not: missing, emptied by a power loss, or stale).
  std::function<bool(const PreparedClaim& entry)> current;
};

// What the pool reports back from a commit: the records that reached the disk.
struct CommitOutcome {
  std::vector<std::string> committed;         // claim UIDs whose record is durable
  std::map<std::string, std::string> failed;  // claim UID → why (its own file step failed)
  std::string log_error;                      // the append failed: nothing is durable
  uint64_t last_seq = 0;                      // of the last record written (seq - 1 when none)
  std::size_t log_used = 0;
};

// One prepare call's claims (PrepareCompleted entries): each claim's spec, then every record
// whose spec was written, from `seq` on, in one append.
CommitOutcome AppendPrepares(ClaimLog& log, const ClaimSpecIo& specs, const std::vector<PreparedClaim>& entries,
                             uint64_t seq);

// One unprepare call's claims: the spec of every claim in `uids` deleted, then one "unprepared"
// record per claim whose `known[i]` is set (the claim state holds it), all in one append.
CommitOutcome AppendUnprepares(ClaimLog& log, const ClaimSpecIo& specs, const std::vector<std::string>& uids,
                               const std::vector<bool>& known, uint64_t seq);

// The checkpoint takes in the log (durably, atomically: `snapshot` with its log_seq), then the
// log starts over. The error, or empty.
std::string CompactClaimLog(ClaimLog& log, const std::string& checkpoint_file, const Checkpoint& snapshot);

}  // namespace gns::dra
