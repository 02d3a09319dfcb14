// The pool side of a DRA driver's prepare and unprepare commits.
#include "dra_plugin/claim_commit.hpp"

namespace gns::dra {

CommitOutcome AppendPrepares(ClaimLog& log, const ClaimSpecIo& specs, const std::vector<PreparedClaim>& entries,
                             uint64_t seq) {
  CommitOutcome out;
  std::string records;
  for (const auto& entry : entries) {
    if (auto r = specs.write(entry, SpecDurability::kVisibleOnly); !r) {
      out.failed[entry.uid] = "cannot write the CDI spec: " + r.error;
      continue;
    }
    records += EncodeClaimLogRecord({seq++, ClaimLogRecord::Op::kPrepared, entry});
    out.committed.push_back(entry.uid);
  }
  out.last_seq = seq - 1;
  if (!records.empty()) {
    if (auto r = log.Append(records); !r) out.log_error = "cannot append to the claim log: " + r.error;
  }
  out.log_used = log.Used();
  return out;
}

CommitOutcome AppendUnprepares(ClaimLog& log, const ClaimSpecIo& specs, const std::vector<std::string>& uids,
                               const std::vector<bool>& known, uint64_t seq) {
  CommitOutcome out;
  std::string records;
  for (std::size_t i = 0; i < uids.size(); ++i) {
    const std::string& uid = uids[i];
    if (auto r = specs.remove(uid); !r) {
      out.failed[uid] = "cannot delete the CDI spec: " + r.error;
      continue;
    }
    if (i >= known.size() || !known[i]) continue;
    ClaimLogRecord record;
    record.seq = seq++;
    record.op = ClaimLogRecord::Op::kUnprepared;
    record.claim.uid = uid;
    records += EncodeClaimLogRecord(record);
    out.committed.push_back(uid);
  }
  out.last_seq = seq - 1;
  if (!records.empty()) {
    if (auto r = log.Append(records); !r) out.log_error = "cannot append to the claim log: " + r.error;
  }
  out.log_used = log.Used();
  return out;
}

std::string CompactClaimLog(ClaimLog& log, const std::string& checkpoint_file, const Checkpoint& snapshot) {
  if (auto r = SaveCheckpoint(checkpoint_file, snapshot); !r) return r.error;
  log.Rewind();
  return std::string{};
}

}  // namespace gns::dra
