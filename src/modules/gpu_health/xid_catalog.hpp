// What each XID means for the device and what to do about it (config/xid-catalog.yaml), plus
// the site overrides a cluster operator layers on top. Loading validates everything and
// reports each problem as "file:line:column: key path: what is wrong" (ConfigError), so a bad
// file stops the daemon at start-up with a message that points at the offending character.
//
// Catalog file shape (all keys required unless marked optional; unknown keys are errors):
//
//   version: 1
//   source: "free text"                  # optional: where the entries come from
//   xids:
//     - xid: 48                          # 1..kMaxXid, unique
//       mnemonic: ROBUST_CHANNEL_GPU_ECC_DBE
//       description: "Double Bit ECC Error"
//       fatal: true                      # true: the device must be marked Unhealthy
//       action: COMPONENT_RESET          # RecommendedAction name (NVSentinel's vocabulary)
//       nvidia_bucket: WORKFLOW_XID_48   # optional: NVIDIA's own resolution bucket
//       threshold: {count: 3, window: 10m}  # optional: fatal only once `count` occurrences on
//                                        #   one GPU fall within `window`; below, only counted
//       escalation: {boots: 2, window: 7d}  # optional: see `defaults`; `false`: never escalate
//       clears: [162]                    # optional: an occurrence of this XID on a GPU clears a
//                                        #   verdict held by these XIDs on that GPU
//       lookback: 24h                    # optional: see `defaults`
//   defaults:                            # optional: what an entry without its own key gets
//     escalation: {boots: 2, window: 7d} # a fatal XID whose action is a reset or reboot (an
//                                        #   action below CONTACT_SUPPORT) seen on one GPU in
//                                        #   more than `boots` distinct boots within `window`:
//                                        #   CONTACT_SUPPORT (hardware inspection). Absent: never
//     lookback: 24h                      # an occurrence older than this when it is read is
//                                        #   counted (and kept in the boot history) but not acted
//                                        #   on. Absent: every occurrence read is acted on
//
// Site overrides shape (a YAML mapping; every key optional; unknown keys are errors):
//
//   ignore: [43, 63]                     # never act on, count or report these XIDs
//   critical:                            # fatal on the first occurrence
//     - 31                               #   action: the catalog's if it acts on the
//     - {xid: 94, action: RESTART_BM}    #   device, else COMPONENT_RESET; or as given
//   thresholds:                          # fatal once `count` occurrences on one GPU fall
//     - {xid: 13, count: 3, window: 10m} # within `window`; below that they are only counted
//   dedup_window: 5m                     # identical (GPU, XID) decisions are emitted at most
//                                        # once per window (default 5m)
//   cross_source_window: 2s              # an XID NVML and the kernel log both report within
//                                        # this of each other is one occurrence (default 2s)
//   defaults: {escalation: {boots: 3, window: 7d}, lookback: 24h}  # laid over the catalog's
//   xids:                                # per-XID keys in the catalog's format, laid over its
//     - {xid: 79, escalation: {boots: 1, window: 3d}}  # entry: any of mnemonic, description,
//     - {xid: 13, threshold: {count: 3, window: 10m}}  # fatal, action, nvidia_bucket,
//     - {xid: 163, clears: [162], lookback: 1h}        # threshold, escalation, clears, lookback
//
// An XID may appear in at most one of ignore, critical, thresholds and xids. In an `xids` entry,
// `fatal: true` without `action` keeps the catalog's action if it acts on the device, else
// COMPONENT_RESET (as `critical`); an `action` that does not act on the device without `fatal`
// makes the XID non-fatal. Durations are <integer><unit> groups with units ms, s, m, h, d
// ("90s", "1h30m", "7d"), > 0 and at most 7 days.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace YAML {
class Node;
}

namespace gns::gpu_health {

// Largest XID number the catalog and overrides accept. NVIDIA's catalog ends in the 170s;
// the margin leaves room for new drivers without accepting obvious garbage.
inline constexpr uint32_t kMaxXid = 1023;
// Largest `count` of a threshold: the policy keeps that many timestamps per (GPU, XID).
inline constexpr uint32_t kMaxThresholdCount = 100;
inline constexpr std::chrono::milliseconds kMaxWindow = std::chrono::hours(24 * 7);
inline constexpr std::chrono::milliseconds kDefaultDedupWindow = std::chrono::minutes(5);
inline constexpr std::chrono::milliseconds kDefaultCrossSourceWindow = std::chrono::seconds(2);
// Largest `boots` of an escalation: the boot history keeps that many boots per (GPU, XID).
inline constexpr uint32_t kMaxEscalationBoots = 15;
// Largest `clears` list of one entry.
inline constexpr std::size_t kMaxClears = 16;

// NVSentinel's HealthEvent RecommendedAction (data-models/protobufs/health_event.proto);
// the numbers are the proto enum values so they can be sent as they are.
enum class RecommendedAction : int {
  kNone = 0,
  kComponentReset = 2,
  kContactSupport = 5,
  kRunFieldDiag = 6,
  kRestartVm = 15,
  kRestartBm = 24,
  kReplaceVm = 25,
  kRunDcgmEud = 26,
  kRestartApp = 39,
  kUnknown = 99,
};

// "COMPONENT_RESET" etc. — the proto enum value names.
[[nodiscard]] std::string_view ActionName(RecommendedAction action) noexcept;
[[nodiscard]] std::optional<RecommendedAction> ParseActionName(std::string_view name) noexcept;
// True for actions that take the device (or the machine) out of service; false for NONE,
// RESTART_APP and UNKNOWN, which leave the GPU usable.
[[nodiscard]] bool ActsOnDevice(RecommendedAction action) noexcept;
// The escalation order of actions, the one place it is defined: how much a remedy takes out of
// service, least first: NONE < RESTART_APP < UNKNOWN < COMPONENT_RESET < RUN_DCGMEUD <
// RESTART_VM < RESTART_BM < RUN_FIELDDIAG < REPLACE_VM < CONTACT_SUPPORT. An Unhealthy GPU's
// recommended action only moves up this order until the GPU is recovered (reset validated, new
// boot, set-healthy): a milder XID after XID 79 (RESTART_BM) never turns it into COMPONENT_RESET.
[[nodiscard]] int ActionRank(RecommendedAction action) noexcept;
// The higher ranked of the two (`a` when they rank the same).
[[nodiscard]] RecommendedAction MoreSevere(RecommendedAction a, RecommendedAction b) noexcept;

// Every configuration problem. what() is "file:line:column: key path: message".
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string file, int line, int column, std::string key_path, std::string message);

  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }      // 1-based
  [[nodiscard]] int column() const noexcept { return column_; }  // 1-based
  [[nodiscard]] const std::string& key_path() const noexcept { return key_path_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

 private:
  std::string file_;
  int line_;
  int column_;
  std::string key_path_;
  std::string message_;
};

struct XidThreshold {
  uint32_t count = 1;
  std::chrono::milliseconds window{0};
};

// The same XID asking for a reset or reboot again on one GPU in more than `boots` distinct
// boots within `window` is a hardware problem: CONTACT_SUPPORT (gpud's reboot threshold).
struct XidEscalation {
  bool enabled = true;  // false: `escalation: false`, never escalate this XID
  uint32_t boots = 2;
  std::chrono::milliseconds window = std::chrono::hours(24 * 7);
  bool operator==(const XidEscalation&) const = default;
};

// The catalog's `defaults` (and the site's): what an entry without its own key gets.
struct XidDefaults {
  std::optional<XidEscalation> escalation;            // nullopt: no escalation
  std::optional<std::chrono::milliseconds> lookback;  // nullopt: every occurrence is acted on
};

struct XidInfo {
  uint32_t xid = 0;
  std::string mnemonic;
  std::string description;
  bool fatal = false;
  RecommendedAction action = RecommendedAction::kNone;
  std::string nvidia_bucket;  // empty when the file does not say
  std::optional<XidThreshold> threshold;
  std::optional<XidEscalation> escalation;            // nullopt: the defaults'
  std::vector<uint32_t> clears;                       // XIDs whose verdicts this one clears
  std::optional<std::chrono::milliseconds> lookback;  // nullopt: the defaults'
};

// One `xids` entry of the site overrides: the keys it sets, laid over the catalog's entry.
struct XidPatch {
  uint32_t xid = 0;
  std::optional<std::string> mnemonic;
  std::optional<std::string> description;
  std::optional<bool> fatal;
  std::optional<RecommendedAction> action;
  std::optional<std::string> nvidia_bucket;
  std::optional<XidThreshold> threshold;
  std::optional<XidEscalation> escalation;
  std::optional<std::vector<uint32_t>> clears;
  std::optional<std::chrono::milliseconds> lookback;
};

// The answer to "what is XID n?". Views point into the catalog that produced it.
struct XidLookup {
  uint32_t xid = 0;
  bool known = false;
  bool fatal = false;
  RecommendedAction action = RecommendedAction::kContactSupport;
  std::string_view mnemonic;
  std::string_view description;
};

class XidCatalog {
 public:
  XidCatalog() = default;

  // Throws ConfigError (also when the file cannot be read).
  static XidCatalog LoadFile(const std::string& path);
  // `source_name` stands for the file name in error messages.
  static XidCatalog LoadString(std::string_view yaml, std::string_view source_name);
  // The catalog compiled into the binary (config/xid-catalog.yaml at build time), parsed once.
  static const XidCatalog& Builtin();
  // This catalog with `site`'s entries laid over it: an XID in both takes site's entry, one
  // only in site is added. The source stays this catalog's.
  // Site defaults set there replace this catalog's.
  [[nodiscard]] XidCatalog LaidOver(const XidCatalog& site) const;
  // This catalog with the site overrides' `defaults` and `xids` entries laid over it.
  [[nodiscard]] XidCatalog Patched(const XidDefaults& defaults, const std::map<uint32_t, XidPatch>& patches) const;

  // Unknown XIDs come back known=false, action CONTACT_SUPPORT, fatal: a driver that reports
  // an XID we have no entry for is newer than our catalog, and a human should look.
  [[nodiscard]] XidLookup Lookup(uint32_t xid) const noexcept;
  [[nodiscard]] const XidInfo* Find(uint32_t xid) const noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  [[nodiscard]] const XidDefaults& defaults() const noexcept { return defaults_; }
  // The entry's key, else the defaults' (unknown XIDs get the defaults). Escalation: nullopt
  // when the XID never escalates.
  [[nodiscard]] std::optional<XidEscalation> EscalationFor(uint32_t xid) const noexcept;
  [[nodiscard]] std::optional<std::chrono::milliseconds> LookbackFor(uint32_t xid) const noexcept;

 private:
  std::vector<XidInfo> entries_;  // in file order
  XidDefaults defaults_;
  // entries_ index + 1 by XID (0: not in the catalog), so that Lookup, which runs for every Xid
  // line, is one array read instead of a walk over scattered map nodes. Indices, not
  // pointers: the catalog is copied (into the config, into each XidPolicy).
  std::vector<uint16_t> slots_;
  std::string source_;
};

struct SiteOverrides {
  std::set<uint32_t> ignore;
  // nullopt: use the catalog's action when it acts on the device, else COMPONENT_RESET.
  std::map<uint32_t, std::optional<RecommendedAction>> critical;
  std::map<uint32_t, XidThreshold> thresholds;
  std::chrono::milliseconds dedup_window = kDefaultDedupWindow;
  std::chrono::milliseconds cross_source_window = kDefaultCrossSourceWindow;
  XidDefaults defaults;                  // set keys replace the catalog's defaults
  std::map<uint32_t, XidPatch> xids;     // per-XID keys laid over the catalog's entries
};

// `node` is the overrides mapping inside a larger document (a null node means "no
// overrides"); `key_prefix` is its key path there (e.g. "modules.gpu_health.xid") and
// prefixes every key path in errors. Throws ConfigError.
[[nodiscard]] SiteOverrides ParseSiteOverrides(const YAML::Node& node, std::string_view source_name,
                                               std::string_view key_prefix);
// The overrides as a document of their own (tests, a drop-in file).
[[nodiscard]] SiteOverrides LoadSiteOverridesString(std::string_view yaml,
                                                    std::string_view source_name);

// The YAML text of the built-in catalog (generated at build time).
[[nodiscard]] std::string_view BuiltinXidCatalogYaml() noexcept;

// "90s", "10m", "1h30m", "250ms", "7d" → milliseconds; nullopt when malformed, zero or above
// kMaxWindow.
[[nodiscard]] std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text) noexcept;

}  // namespace gns::gpu_health
