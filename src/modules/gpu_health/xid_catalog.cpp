// Loading and validating the XID catalog and the site overrides with yaml-cpp. Values are
// read from the scalar text rather than through Node::as<T>(), so that "13" in quotes, 0x0d,
// 13.0 or "yes" are reported as mistakes instead of being converted behind the user's back.
#include "modules/gpu_health/xid_catalog.hpp"

#include "modules/gpu_health/catalog_yaml.hpp"

#include <yaml-cpp/yaml.h>

#include <array>
#include <charconv>
#include <initializer_list>
#include <limits>
#include <utility>

namespace gns::gpu_health {
namespace {

using namespace catalog_yaml;

struct ActionNameEntry {
  RecommendedAction action;
  std::string_view name;
  int rank;  // the escalation order (ActionRank): how much the remedy takes out of service
};

constexpr std::array<ActionNameEntry, 10> kActionNames{{
    {RecommendedAction::kNone, "NONE", 0},
    {RecommendedAction::kComponentReset, "COMPONENT_RESET", 3},
    {RecommendedAction::kContactSupport, "CONTACT_SUPPORT", 9},
    {RecommendedAction::kRunFieldDiag, "RUN_FIELDDIAG", 7},
    {RecommendedAction::kRestartVm, "RESTART_VM", 5},
    {RecommendedAction::kRestartBm, "RESTART_BM", 6},
    {RecommendedAction::kReplaceVm, "REPLACE_VM", 8},
    {RecommendedAction::kRunDcgmEud, "RUN_DCGMEUD", 4},
    {RecommendedAction::kRestartApp, "RESTART_APP", 1},
    {RecommendedAction::kUnknown, "UNKNOWN", 2},
}};

}  // namespace

std::string_view ActionName(RecommendedAction action) noexcept {
  for (const auto& entry : kActionNames) {
    if (entry.action == action) return entry.name;
  }
  return "UNKNOWN";
}

std::optional<RecommendedAction> ParseActionName(std::string_view name) noexcept {
  for (const auto& entry : kActionNames) {
    if (entry.name == name) return entry.action;
  }
  return std::nullopt;
}

int ActionRank(RecommendedAction action) noexcept {
  for (const auto& entry : kActionNames) {
    if (entry.action == action) return entry.rank;
  }
  return ActionRank(RecommendedAction::kUnknown);
}

RecommendedAction MoreSevere(RecommendedAction a, RecommendedAction b) noexcept {
  return ActionRank(b) > ActionRank(a) ? b : a;
}

bool ActsOnDevice(RecommendedAction action) noexcept {
  switch (action) {
    case RecommendedAction::kNone:
    case RecommendedAction::kRestartApp:
    case RecommendedAction::kUnknown:
      return false;
    default:
      return true;
  }
}

ConfigError::ConfigError(std::string file, int line, int column, std::string key_path,
                         std::string message)
    : std::runtime_error(file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " +
                         key_path + ": " + message),
      file_(std::move(file)),
      line_(line),
      column_(column),
      key_path_(std::move(key_path)),
      message_(std::move(message)) {}

XidCatalog XidCatalog::LoadFile(const std::string& path) {
  return LoadString(ReadWholeFile(path), path);
}

XidCatalog XidCatalog::LoadString(std::string_view yaml, std::string_view source_name) {
  const std::string source(source_name);
  const Reader r(source);
  const YAML::Node root = ParseDocument(yaml, source);
  if (!root.IsMap()) r.Fail(root, "", "expected a mapping with version and xids, got " + Describe(root));

  const auto fields = r.Fields(root, "", {"version", "source", "defaults", "xids"});
  const auto& version = r.Require(fields, root, "", "version");
  if (r.Uint(version.value, "version", 0, std::numeric_limits<uint32_t>::max(), "version") != 1) {
    r.Fail(version.value, "version", "unsupported version (expected 1)");
  }

  XidCatalog catalog;
  if (auto it = fields.find("source"); it != fields.end()) {
    catalog.source_ = r.String(it->second.value, "source");
  }
  if (auto it = fields.find("defaults"); it != fields.end()) {
    catalog.defaults_ = r.Defaults(it->second.value, "defaults");
  }

  const auto& xids = r.Require(fields, root, "", "xids");
  r.RequireSequence(xids.value, "xids");
  if (xids.value.size() == 0) r.Fail(xids.value, "xids", "the catalog has no entries");

  std::map<uint32_t, int> first_line;
  for (std::size_t i = 0; i < xids.value.size(); ++i) {
    const YAML::Node item = xids.value[i];
    const std::string path = Index("xids", i);
    const auto f = r.Fields(item, path,
                            {"xid", "mnemonic", "description", "fatal", "action", "nvidia_bucket", "threshold",
                             "escalation", "clears", "lookback"});
    XidInfo info;
    const auto& xid = r.Require(f, item, path, "xid");
    info.xid = r.Xid(xid.value, Join(path, "xid"));
    if (auto seen = first_line.find(info.xid); seen != first_line.end()) {
      r.Fail(xid.value, Join(path, "xid"),
             "duplicate XID " + std::to_string(info.xid) + " (first defined at line " +
                 std::to_string(seen->second) + ")");
    }
    first_line.emplace(info.xid, xid.value.Mark().line + 1);
    info.mnemonic = r.String(r.Require(f, item, path, "mnemonic").value, Join(path, "mnemonic"));
    info.description =
        r.String(r.Require(f, item, path, "description").value, Join(path, "description"));
    info.fatal = r.Bool(r.Require(f, item, path, "fatal").value, Join(path, "fatal"));
    const auto& action = r.Require(f, item, path, "action");
    info.action = r.Action(action.value, Join(path, "action"));
    if (info.fatal && !ActsOnDevice(info.action)) {
      r.Fail(action.value, Join(path, "action"),
             "a fatal XID needs an action that acts on the device, not " +
                 std::string(ActionName(info.action)));
    }
    if (auto it = f.find("nvidia_bucket"); it != f.end()) {
      info.nvidia_bucket = r.String(it->second.value, Join(path, "nvidia_bucket"));
    }
    r.PolicyKeys(f, path, info.xid, info.threshold, info.escalation, &info.clears, nullptr, info.lookback);
    if (catalog.slots_.empty()) catalog.slots_.assign(kMaxXid + 1, 0);
    catalog.entries_.push_back(std::move(info));
    catalog.slots_[catalog.entries_.back().xid] = static_cast<uint16_t>(catalog.entries_.size());
  }
  return catalog;
}

XidLookup XidCatalog::Lookup(uint32_t xid) const noexcept {
  XidLookup out;
  out.xid = xid;
  if (const XidInfo* info = Find(xid)) {
    out.known = true;
    out.fatal = info->fatal;
    out.action = info->action;
    out.mnemonic = info->mnemonic;
    out.description = info->description;
    return out;
  }
  out.known = false;
  out.fatal = true;
  out.action = RecommendedAction::kContactSupport;
  out.mnemonic = "UNKNOWN_XID";
  out.description = "XID not in the catalog";
  return out;
}

// slots_ holds entry indices + 1: at most kMaxXid entries must fit.
static_assert(kMaxXid < std::numeric_limits<uint16_t>::max());

const XidCatalog& XidCatalog::Builtin() {
  // Parsed once, on first use; the build checks the file (xid_catalog_test loads it too), so
  // a bad built-in catalog cannot reach a node.
  static const XidCatalog builtin = LoadString(BuiltinXidCatalogYaml(), "built-in xid-catalog.yaml");
  return builtin;
}

XidCatalog XidCatalog::LaidOver(const XidCatalog& site) const {
  XidCatalog out = *this;
  if (site.defaults_.escalation) out.defaults_.escalation = site.defaults_.escalation;
  if (site.defaults_.lookback) out.defaults_.lookback = site.defaults_.lookback;
  if (out.slots_.empty()) out.slots_.assign(kMaxXid + 1, 0);
  for (const auto& info : site.entries_) {
    if (const uint16_t slot = out.slots_[info.xid]; slot != 0) {
      out.entries_[slot - 1] = info;
    } else {
      out.entries_.push_back(info);
      out.slots_[info.xid] = static_cast<uint16_t>(out.entries_.size());
    }
  }
  return out;
}

XidCatalog XidCatalog::Patched(const XidDefaults& defaults, const std::map<uint32_t, XidPatch>& patches) const {
  XidCatalog out = *this;
  if (defaults.escalation) out.defaults_.escalation = defaults.escalation;
  if (defaults.lookback) out.defaults_.lookback = defaults.lookback;
  if (patches.empty()) return out;
  if (out.slots_.empty()) out.slots_.assign(kMaxXid + 1, 0);
  for (const auto& [xid, p] : patches) {
    if (out.slots_[xid] == 0) {
      // Not in the catalog: starts as Lookup answers for an unknown XID, under a name of its own.
      XidInfo fresh;
      fresh.xid = xid;
      fresh.mnemonic = "XID_" + std::to_string(xid);
      fresh.description = "not in the catalog; entry from the site overrides";
      fresh.fatal = true;
      fresh.action = RecommendedAction::kContactSupport;
      out.entries_.push_back(std::move(fresh));
      out.slots_[xid] = static_cast<uint16_t>(out.entries_.size());
    }
    XidInfo& info = out.entries_[out.slots_[xid] - 1];
    if (p.mnemonic) info.mnemonic = *p.mnemonic;
    if (p.description) info.description = *p.description;
    if (p.nvidia_bucket) info.nvidia_bucket = *p.nvidia_bucket;
    if (p.action) {
      info.action = *p.action;
      // An action that leaves the GPU usable cannot hold a verdict (the parser refused it
      // beside `fatal: true`).
      if (!ActsOnDevice(info.action)) info.fatal = false;
    }
    if (p.fatal) {
      info.fatal = *p.fatal;
      // Made fatal without an action: the catalog's if it acts on the device, else a reset (as
      // `critical`).
      if (info.fatal && !ActsOnDevice(info.action)) info.action = RecommendedAction::kComponentReset;
    }
    if (p.threshold) info.threshold = p.threshold;
    if (p.escalation) info.escalation = p.escalation;
    if (p.clears) info.clears = *p.clears;
    if (p.lookback) info.lookback = p.lookback;
  }
  return out;
}

std::optional<XidEscalation> XidCatalog::EscalationFor(uint32_t xid) const noexcept {
  const XidInfo* info = Find(xid);
  std::optional<XidEscalation> e = info != nullptr && info->escalation ? info->escalation : defaults_.escalation;
  if (e && !e->enabled) return std::nullopt;
  return e;
}

std::optional<std::chrono::milliseconds> XidCatalog::LookbackFor(uint32_t xid) const noexcept {
  const XidInfo* info = Find(xid);
  return info != nullptr && info->lookback ? info->lookback : defaults_.lookback;
}

const XidInfo* XidCatalog::Find(uint32_t xid) const noexcept {
  if (xid >= slots_.size() || slots_[xid] == 0) return nullptr;
  return &entries_[slots_[xid] - 1];
}

SiteOverrides ParseSiteOverrides(const YAML::Node& node, std::string_view source_name,
                                 std::string_view key_prefix) {
  SiteOverrides out;
  if (!node.IsDefined() || node.IsNull()) return out;
  const Reader r{std::string(source_name)};
  const auto fields = r.Fields(node, key_prefix, {"ignore", "critical", "thresholds", "dedup_window",
                                                  "cross_source_window", "defaults", "xids"});

  // Where each XID was first listed, to reject one XID in two lists.
  struct Listed {
    std::string list;
    int line;
  };
  std::map<uint32_t, Listed> listed;
  auto claim = [&](uint32_t xid, const YAML::Node& at, const std::string& path,
                   const std::string& list) {
    if (auto it = listed.find(xid); it != listed.end()) {
      const std::string where =
          it->second.list == list ? "already listed" : "also listed in " + it->second.list;
      r.Fail(at, path,
             "XID " + std::to_string(xid) + " is " + where + " (line " +
                 std::to_string(it->second.line) +
                 "); an XID may appear once, in one of ignore, critical, thresholds and xids");
    }
    listed.emplace(xid, Listed{list, at.Mark().line + 1});
  };

  if (auto it = fields.find("ignore"); it != fields.end()) {
    const std::string path = Join(key_prefix, "ignore");
    const YAML::Node seq = it->second.value;
    r.RequireSequence(seq, path);
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const std::string item_path = Index(path, i);
      const uint32_t xid = r.Xid(seq[i], item_path);
      claim(xid, seq[i], item_path, "ignore");
      out.ignore.insert(xid);
    }
  }

  if (auto it = fields.find("critical"); it != fields.end()) {
    const std::string path = Join(key_prefix, "critical");
    const YAML::Node seq = it->second.value;
    r.RequireSequence(seq, path);
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const YAML::Node item = seq[i];
      const std::string item_path = Index(path, i);
      uint32_t xid = 0;
      std::optional<RecommendedAction> action;
      YAML::Node xid_node = item;
      std::string xid_path = item_path;
      if (item.IsMap()) {
        const auto f = r.Fields(item, item_path, {"xid", "action"});
        xid_node = r.Require(f, item, item_path, "xid").value;
        xid_path = Join(item_path, "xid");
        xid = r.Xid(xid_node, xid_path);
        if (auto a = f.find("action"); a != f.end()) {
          const std::string action_path = Join(item_path, "action");
          action = r.Action(a->second.value, action_path);
          if (!ActsOnDevice(*action)) {
            r.Fail(a->second.value, action_path,
                   "a critical XID needs an action that acts on the device, not " +
                       std::string(ActionName(*action)));
          }
        }
      } else {
        xid = r.Xid(item, item_path);
      }
      claim(xid, xid_node, xid_path, "critical");
      out.critical.emplace(xid, action);
    }
  }

  if (auto it = fields.find("thresholds"); it != fields.end()) {
    const std::string path = Join(key_prefix, "thresholds");
    const YAML::Node seq = it->second.value;
    r.RequireSequence(seq, path);
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const YAML::Node item = seq[i];
      const std::string item_path = Index(path, i);
      const auto f = r.Fields(item, item_path, {"xid", "count", "window"});
      const YAML::Node xid_node = r.Require(f, item, item_path, "xid").value;
      const uint32_t xid = r.Xid(xid_node, Join(item_path, "xid"));
      XidThreshold t;
      t.count = r.Uint(r.Require(f, item, item_path, "count").value, Join(item_path, "count"), 1,
                       kMaxThresholdCount, "count");
      t.window = r.Duration(r.Require(f, item, item_path, "window").value, Join(item_path, "window"));
      claim(xid, xid_node, Join(item_path, "xid"), "thresholds");
      out.thresholds.emplace(xid, t);
    }
  }

  if (auto it = fields.find("xids"); it != fields.end()) {
    const std::string path = Join(key_prefix, "xids");
    const YAML::Node seq = it->second.value;
    r.RequireSequence(seq, path);
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const YAML::Node item = seq[i];
      const std::string item_path = Index(path, i);
      const auto f = r.Fields(item, item_path,
                              {"xid", "mnemonic", "description", "fatal", "action", "nvidia_bucket", "threshold",
                               "escalation", "clears", "lookback"});
      const YAML::Node xid_node = r.Require(f, item, item_path, "xid").value;
      XidPatch p;
      p.xid = r.Xid(xid_node, Join(item_path, "xid"));
      claim(p.xid, xid_node, Join(item_path, "xid"), "xids");
      if (auto k = f.find("mnemonic"); k != f.end()) p.mnemonic = r.String(k->second.value, Join(item_path, "mnemonic"));
      if (auto k = f.find("description"); k != f.end()) {
        p.description = r.String(k->second.value, Join(item_path, "description"));
      }
      if (auto k = f.find("nvidia_bucket"); k != f.end()) {
        p.nvidia_bucket = r.String(k->second.value, Join(item_path, "nvidia_bucket"));
      }
      if (auto k = f.find("fatal"); k != f.end()) p.fatal = r.Bool(k->second.value, Join(item_path, "fatal"));
      if (auto k = f.find("action"); k != f.end()) {
        p.action = r.Action(k->second.value, Join(item_path, "action"));
        if (p.fatal.value_or(false) && !ActsOnDevice(*p.action)) {
          r.Fail(k->second.value, Join(item_path, "action"),
                 "a fatal XID needs an action that acts on the device, not " + std::string(ActionName(*p.action)));
        }
      }
      if (f.size() == 1) r.Fail(item, item_path, "sets nothing (give at least one key besides xid)");
      r.PolicyKeys(f, item_path, p.xid, p.threshold, p.escalation, nullptr, &p.clears, p.lookback);
      out.xids.emplace(p.xid, std::move(p));
    }
  }

  if (auto it = fields.find("defaults"); it != fields.end()) {
    out.defaults = r.Defaults(it->second.value, Join(key_prefix, "defaults"));
  }

  if (auto it = fields.find("dedup_window"); it != fields.end()) {
    out.dedup_window = r.Duration(it->second.value, Join(key_prefix, "dedup_window"));
  }
  if (auto it = fields.find("cross_source_window"); it != fields.end()) {
    out.cross_source_window = r.Duration(it->second.value, Join(key_prefix, "cross_source_window"));
  }
  return out;
}

SiteOverrides LoadSiteOverridesString(std::string_view yaml, std::string_view source_name) {
  const std::string source(source_name);
  return ParseSiteOverrides(ParseDocument(yaml, source), source, "");
}

std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text) noexcept {
  if (text.empty()) return std::nullopt;
  int64_t total_ms = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    int64_t value = 0;
    std::size_t digits = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (++digits > 9) return std::nullopt;  // keeps the sum far from overflow
      value = value * 10 + (text[i] - '0');
      ++i;
    }
    if (digits == 0) return std::nullopt;
    int64_t unit_ms = 0;
    if (text.substr(i).starts_with("ms")) {
      unit_ms = 1;
      i += 2;
    } else if (i < text.size() && text[i] == 's') {
      unit_ms = 1000;
      ++i;
    } else if (i < text.size() && text[i] == 'm') {
      unit_ms = 60 * 1000;
      ++i;
    } else if (i < text.size() && text[i] == 'h') {
      unit_ms = 60 * 60 * 1000;
      ++i;
    } else if (i < text.size() && text[i] == 'd') {
      unit_ms = 24 * 60 * 60 * 1000;
      ++i;
    } else {
      return std::nullopt;
    }
    total_ms += value * unit_ms;
    if (total_ms > kMaxWindow.count()) return std::nullopt;
  }
  if (total_ms <= 0) return std::nullopt;
  return std::chrono::milliseconds(total_ms);
}

}  // namespace gns::gpu_health
