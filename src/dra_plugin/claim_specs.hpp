#pragma once
// The per-claim CDI spec files of a DRA driver (WIRE-FACTS §6 for the format): one file per
// prepared claim in paths.cdiDir, named as the upstream kubelet plugins name theirs,
// "<vendor>-<class>_<claimUID>.json" (compute-domain.nvidia.com: vendor
// "k8s.compute-domain.nvidia.com", class "claim"). What a spec holds (its devices and container
// edits) is the driver's; this file owns the names and the file I/O: the atomic write (durable, or
// visible-only on the prepare hot path), the check that a file holds exactly what a record
// implies, the delete, and the listing and temp-file sweep of the start-up reconcile. The CDI
// directory is shared with other producers (the device plugin, other drivers, the runtime):
// everything here touches only files named for the driver's vendor and class.

#include "loop/atomic_file.hpp"

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

// Spec files are read by the container runtime (root) and by operators' tools: no secrets.
inline constexpr mode_t kCdiSpecFileMode = 0644;

// Kubernetes UIDs are UUIDs. We accept [A-Za-z0-9-], 1..64 characters, starting and ending with
// a letter or digit: safe in a file name and a valid CDI device name.
bool IsValidClaimUid(std::string_view uid);

// The lowest cdiVersion that can carry a spec with this device name: a name that does not start
// with a letter needs 0.5.0, otherwise 0.3.0 (WIRE-FACTS §6; declaring less makes it invalid).
std::string_view MinimumCdiVersion(std::string_view device_name);

// kDurable: WriteFileAtomically (temp fsync'd, renamed, directory fsync'd). kVisibleOnly: the same
// all-or-nothing replacement for readers and for kill -9 (temp, rename), without the fsyncs:
// after a power loss the old content, the new or an empty file may be found. For the prepare hot
// path only, where the spec is derived from a durable claim-log record and the start re-makes
// it when it is not exactly right (ClaimSpecIsCurrent).
enum class SpecDurability { kDurable, kVisibleOnly };

// One driver's per-claim spec names: its CDI kind is "<vendor>/<class>".
struct ClaimSpecNames {
  std::string vendor;
  std::string cdi_class = "claim";

  std::string Kind() const;                                          // "<vendor>/<class>"
  std::string FileName(std::string_view claim_uid) const;           // "<vendor>-<class>_<uid>.json"
  std::string QualifiedDeviceId(std::string_view device_name) const;  // "<kind>=<device>"
  // The claim UID when `file_name` is one of this driver's spec files (FileName of a valid UID).
  std::optional<std::string_view> ClaimUidOf(std::string_view file_name) const;
};

// Writes `content` as the claim's spec atomically (mode 0644), creating cdi_dir (0755) if
// missing. Blocking.
FileWriteResult WriteClaimSpec(const std::string& cdi_dir, const ClaimSpecNames& names, std::string_view claim_uid,
                               const std::string& content, SpecDurability durability = SpecDurability::kDurable);

// True when the claim's spec file exists with exactly `content` (false: missing, unreadable,
// emptied by a power loss, or stale). Blocking.
bool ClaimSpecIsCurrent(const std::string& cdi_dir, const ClaimSpecNames& names, std::string_view claim_uid,
                        const std::string& content);

// Removes the claim's spec; a missing file is success (Unprepare is idempotent). Blocking.
FileWriteResult DeleteClaimSpec(const std::string& cdi_dir, const ClaimSpecNames& names, std::string_view claim_uid);

// Removes temp files of this driver's spec writes that a crash interrupted
// ("<vendor>-<class>_<uid>.json.tmp.<pid>.<n>"); nothing else in the directory is touched,
// other producers' temp files included. Blocking.
TempSweep RemoveInterruptedClaimSpecWrites(const std::string& cdi_dir, const ClaimSpecNames& names);

struct CdiListing {
  bool ok = true;
  std::string error;
  std::vector<std::string> claim_uids;  // sorted; only files named by names.FileName
};
// This driver's spec files in cdi_dir, for the start-up reconcile against the claim state. A
// missing directory lists as empty. Blocking.
CdiListing ListClaimSpecs(const std::string& cdi_dir, const ClaimSpecNames& names);

}  // namespace gns::dra
