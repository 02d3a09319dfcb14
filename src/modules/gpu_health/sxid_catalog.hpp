// What each NVSwitch SXid means and what to do about it (config/sxid-catalog.yaml), in the XID
// catalog's style: compiled into the binary, a site file (`sxidCatalog:`) laid over it by SXid,
// every problem a ConfigError "file:line:column: key path: what is wrong".
//
// By default the report's own severity decides: the driver prints "Fatal", "Non-fatal" or
// "Correctable" on the line. An entry's `fatal` overrides it for that SXid (a site that finds a
// Fatal one harmless downgrades it; one that the driver calls Non-fatal but that stalls the
// fabric is made fatal); its `action` is what a fatal report recommends.
//
// File shape (unknown keys are errors):
//
//   version: 1
//   source: "free text"                 # optional
//   defaults:                           # optional; each key optional
//     action: COMPONENT_RESET           # a fatal SXid on a switch port wired to one of our GPUs:
//                                       #   that GPU's verdict (must act on the device)
//     node_action: CONTACT_SUPPORT      # a fatal SXid of the switch itself (no link) or on a port
//                                       #   with no GPU of ours: the node-level HealthEvent
//   sxids:                              # may be empty in a site file
//     - sxid: 20034                     # 1..kMaxSxid, unique
//       mnemonic: LTSSM_FAULT_UP        # optional
//       description: "…"                # required
//       fatal: true                     # optional: absent, the line's severity decides
//       action: RESTART_BM              # optional: what a fatal report recommends, on a GPU's
//                                       #   port or node-level (absent: the defaults'); must act
//                                       #   on the device
#pragma once

#include "modules/gpu_health/xid_catalog.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gns::gpu_health {

// The driver prints SXids with "%05d"; every one so far has five digits.
inline constexpr uint32_t kMaxSxid = 99999;

struct SxidInfo {
  uint32_t sxid = 0;
  std::string mnemonic;  // may be empty
  std::string description;
  std::optional<bool> fatal;                // nullopt: the line's own severity decides
  std::optional<RecommendedAction> action;  // nullopt: the defaults' action
};

struct SxidDefaults {
  // Ours (README, "NVSwitch SXids"): the error is confined to the GPU's NVLink into that port;
  // a GPU reset on a Fabric-Manager node retrains the GPU's links and their switch ports.
  RecommendedAction action = RecommendedAction::kComponentReset;
  // NVSentinel's syslog monitor recommends CONTACT_SUPPORT for every fatal SXid.
  RecommendedAction node_action = RecommendedAction::kContactSupport;
};

// What one report is, judged with the catalog.
struct SxidJudgement {
  bool fatal = false;
  bool overridden = false;  // the catalog's `fatal` differs from the line's severity
  RecommendedAction action = RecommendedAction::kNone;       // for the GPU behind the port
  RecommendedAction node_action = RecommendedAction::kNone;  // for the node-level finding
  std::string_view mnemonic;     // empty when the catalog has none
  std::string_view description;  // empty when the SXid is not in the catalog
};

class SxidCatalog {
 public:
  SxidCatalog() = default;

  // Throws ConfigError (also when the file cannot be read).
  static SxidCatalog LoadFile(const std::string& path);
  // `source_name` stands for the file name in error messages.
  static SxidCatalog LoadString(std::string_view yaml, std::string_view source_name);
  // The catalog compiled into the binary (config/sxid-catalog.yaml at build time), parsed once.
  static const SxidCatalog& Builtin();
  // This catalog with `site`'s entries laid over it by SXid (and its defaults, where set).
  [[nodiscard]] SxidCatalog LaidOver(const SxidCatalog& site) const;

  [[nodiscard]] const SxidInfo* Find(uint32_t sxid) const noexcept;
  // `line_fatal`: the driver's "Fatal" on the line.
  [[nodiscard]] SxidJudgement Judge(uint32_t sxid, bool line_fatal) const noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  [[nodiscard]] const SxidDefaults& defaults() const noexcept { return defaults_; }

 private:
  std::map<uint32_t, SxidInfo> entries_;
  SxidDefaults defaults_;
  // Which defaults the file set (a site file's unset ones leave the built-in's alone).
  bool has_action_ = false;
  bool has_node_action_ = false;
  std::string source_;
};

// The YAML text of the built-in SXid catalog (generated at build time).
[[nodiscard]] std::string_view BuiltinSxidCatalogYaml() noexcept;

}  // namespace gns::gpu_health
