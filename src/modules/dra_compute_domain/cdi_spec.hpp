#pragma once
// The per-claim CDI spec that puts /dev/nvidia-caps-imex-channels/channel0 into the workload's
// containers (WIRE-FACTS §6 for the format, §9.1 for the node). Names follow the upstream
// compute-domain kubelet plugin, so tools that know its files recognise ours: vendor
// "k8s.compute-domain.nvidia.com", class "claim", device "<claimUID>-channel-0", file
// "k8s.compute-domain.nvidia.com-claim_<claimUID>.json" in paths.cdiDir. The container runtime
// creates the node from type/major/minor, so the host's channel0 file need not exist (§13).
// The file names and I/O are the DRA plugin core's (dra_plugin/claim_specs.hpp); this is what
// the spec holds, and this driver's names for the core's functions.

#include "dra_plugin/claim_specs.hpp"
#include "loop/atomic_file.hpp"
#include "modules/dra_compute_domain/driver_paths.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

inline constexpr std::string_view kCdiVendor = "k8s.compute-domain.nvidia.com";
inline constexpr std::string_view kCdiClass = "claim";
inline constexpr std::string_view kCdiKind = "k8s.compute-domain.nvidia.com/claim";
inline constexpr std::string_view kChannelDir = "/dev/nvidia-caps-imex-channels";
inline constexpr std::string_view kChannelPath = "/dev/nvidia-caps-imex-channels/channel0";
inline constexpr uint32_t kChannelMinor = 0;
// The mode the upstream plugin gives the channel node (S_IFCHR | 0666): any container user.
inline constexpr uint32_t kChannelFileMode = 0666;

// Vendor kCdiVendor, class kCdiClass: the core's names of this driver's spec files.
const ClaimSpecNames& ChannelSpecNames();

std::string CdiSpecFileName(std::string_view claim_uid);   // "k8s.compute-domain.nvidia.com-claim_<uid>.json"
std::string CdiDeviceName(std::string_view claim_uid);     // "<uid>-channel-0"
std::string CdiQualifiedDeviceId(std::string_view claim_uid);  // "<kind>=<uid>-channel-0"

// The spec for one claim. `claim_uid` must satisfy IsValidClaimUid. `channel_count` > 1 (the
// driver-managed allocationMode "All") puts channel0..channel<count-1> into the one device.
nlohmann::json BuildChannelCdiSpec(std::string_view claim_uid, uint32_t channel_major, uint32_t channel_count = 1);

// The spec file's exact bytes (what WriteChannelCdiSpec writes and CdiSpecIsCurrent expects).
std::string ChannelCdiSpecContent(std::string_view claim_uid, uint32_t channel_major, uint32_t channel_count = 1);

// Writes the spec atomically (mode 0644), creating cdi_dir (0755) if missing. Blocking.
// The prepare hot path writes it kVisibleOnly: the spec is derived from the claim log's record,
// and the start-up reconcile re-makes a spec that a power loss emptied (CdiSpecIsCurrent).
FileWriteResult WriteChannelCdiSpec(const std::string& cdi_dir, std::string_view claim_uid, uint32_t channel_major,
                                    uint32_t channel_count = 1,
                                    SpecDurability durability = SpecDurability::kDurable);

// True when the claim's spec file exists with exactly the content the record implies (false:
// missing, unreadable, emptied by a power loss, or stale, e.g. the channel major changed). Blocking.
bool CdiSpecIsCurrent(const std::string& cdi_dir, std::string_view claim_uid, uint32_t channel_major,
                      uint32_t channel_count = 1);

// Removes the claim's spec; a missing file is success (Unprepare is idempotent). Blocking.
FileWriteResult DeleteCdiSpec(const std::string& cdi_dir, std::string_view claim_uid);

// The claim UID when `file_name` is one of our spec files (CdiSpecFileName of a valid UID).
std::optional<std::string_view> ClaimUidOfCdiSpecFile(std::string_view file_name);

// Removes temp files of our spec writes that a crash interrupted
// ("k8s.compute-domain.nvidia.com-claim_<uid>.json.tmp.<pid>.<n>"). The CDI directory is shared
// with other producers: nothing else there is touched, their temp files included. Blocking.
TempSweep RemoveInterruptedCdiSpecWrites(const std::string& cdi_dir);

// Our spec files in cdi_dir, for the startup reconcile against the checkpoint. A missing
// directory lists as empty. Blocking.
CdiListing ListCdiSpecClaimUids(const std::string& cdi_dir);

}  // namespace gns::dra
