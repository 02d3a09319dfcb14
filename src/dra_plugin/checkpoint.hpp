#pragma once
// The DRA driver's node-local record of prepared claims, kept in
// <stateDir>/dra-compute-domain/checkpoint.json (mode 0600, directory 0700). It is what makes
// Prepare idempotent, what detects a second claim on channel-0 (seed 000 §7.2 step 5), and what
// Unprepare and the startup reconcile clean up from. The file is versioned and checksummed; a
// file we cannot trust is never half-used: Load reports it as corrupt, the caller moves it aside
// (checkpoint.json.corrupt-<unix-ts>), tells the operator, and starts clean. It is read as every
// state file is (loop/state_file.hpp): a regular file of bounded size, or it is corrupt.

#include "loop/atomic_file.hpp"
#include "loop/state_file.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

inline constexpr int kCheckpointVersion = 1;

enum class ClaimState { kPrepareStarted, kPrepareCompleted };
std::string_view ToString(ClaimState state);
std::optional<ClaimState> ParseClaimState(std::string_view text);

// A device of a claim beyond its first (a claim that asks for several GPUs): what the kubelet is
// answered for it. Written as "moreDevices" only when there are any.
struct PreparedClaimDevice {
  std::string device;
  std::vector<std::string> request_names;
  std::string cdi_device_id;
  bool operator==(const PreparedClaimDevice&) const = default;
};

// One claim's record, driver-neutral: who the claim is, its state, the devices the kubelet was
// answered with (the first in `device`…`cdi_device_id`, as every record has had since the first
// release; any others in `more_devices`), and the driver's own members (`driver_data`).
struct PreparedClaim {
  std::string uid;
  std::string namespace_name;
  std::string name;
  ClaimState state = ClaimState::kPrepareStarted;
  std::string device;                      // the first device ("channel-0", "gpu-0")
  std::string pool_name;                   // the node name
  std::vector<std::string> request_names;  // the claim requests the first device serves
  std::string cdi_spec_file;               // file name inside paths.cdiDir
  std::string cdi_device_id;               // fully qualified, as returned to the kubelet
  int64_t started_unix_ms = 0;
  int64_t completed_unix_ms = 0;           // 0 until PrepareCompleted
  std::vector<PreparedClaimDevice> more_devices;  // "moreDevices", absent when empty
  // The driver's own members of the record, written beside the ones above at the top level of
  // the entry (compute-domain.nvidia.com: "domainUID", always, and "channels" when not 1). On
  // read, every member not named above lands here, so a record keeps its bytes through a load
  // and a save, and a driver's members never need the core to know them. Always an object.
  nlohmann::json driver_data = nlohmann::json::object();
  bool operator==(const PreparedClaim&) const = default;

  // Every device the kubelet was answered with, the first first.
  std::vector<PreparedClaimDevice> Devices() const;
};

struct Checkpoint {
  std::map<std::string, PreparedClaim> claims;  // by claim UID
  // The last claim-log record (claim_log.hpp) this checkpoint includes; records up to it in the
  // log are history. Absent in older files: 0.
  uint64_t log_seq = 0;
  bool operator==(const Checkpoint&) const = default;

  const PreparedClaim* Find(std::string_view uid) const;
  // A PrepareCompleted entry of a claim other than `except_uid` holding `device`, or nullptr.
  const PreparedClaim* CompletedHolderOf(std::string_view device, std::string_view except_uid) const;
};

enum class CheckpointStatus {
  kLoaded,      // parsed and verified
  kMissing,     // no file: a fresh node, start empty
  kCorrupt,     // bad JSON, bad checksum, unknown version or wrong shape: move aside, start empty
  kUnreadable,  // exists but cannot be read (permissions, I/O): fail the start, retry later
};
std::string_view ToString(CheckpointStatus status);

struct CheckpointLoadResult {
  CheckpointStatus status = CheckpointStatus::kMissing;
  Checkpoint checkpoint;  // empty unless kLoaded
  std::string error;      // why, for kCorrupt and kUnreadable
};

// The file's bytes. Deterministic: the same checkpoint always serializes the same way.
std::string SerializeCheckpoint(const Checkpoint& checkpoint);
// kLoaded or kCorrupt; never throws.
CheckpointLoadResult ParseCheckpoint(std::string_view text);

// Blocking (run on the BlockingPool). Never throws.
CheckpointLoadResult LoadCheckpoint(const std::string& path);
// Creates the directory (0700) if missing, then writes through WriteFileAtomically (0600).
FileWriteResult SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Renames a corrupt checkpoint out of the way ("<path>.corrupt-<unix_seconds>[-n]", never over
// an earlier one), keeping it for the operator. Never throws.
MoveAsideResult MoveCorruptCheckpointAside(const std::string& path, int64_t unix_seconds);

// CRC-32 (IEEE 802.3, as zlib's crc32) of `data`; the checksum over the serialized `data` member.
uint32_t Crc32(std::string_view data);

void to_json(nlohmann::json& j, const PreparedClaim& claim);
// The inverse of to_json (the "uid" member may be absent: `uid` names the claim). Throws
// std::runtime_error naming the field (`where` prefixes it) when the shape is wrong.
PreparedClaim ClaimFromJson(const std::string& uid, const nlohmann::json& entry, const std::string& where);

}  // namespace gns::dra
