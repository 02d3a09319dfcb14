// Loading and validating the XID catalog and the site overrides with yaml-cpp. Values are
// read from the scalar text rather than through Node::as<T>(), so that "13" in quotes, 0x0d,
// 13.0 or "yes" are reported as mistakes instead of being converted behind the user's back.
#include "modules/gpu_health/xid_catalog.hpp"

#include "loop/config_checks.hpp"

#include <yaml-cpp/yaml.h>

#include <array>
#include <charconv>
#include <initializer_list>
#include <limits>
#include <utility>

namespace gns::gpu_health {
namespace {

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

constexpr std::string_view kActionChoices =
    "NONE, COMPONENT_RESET, CONTACT_SUPPORT, RUN_FIELDDIAG, RESTART_VM, RESTART_BM, REPLACE_VM, "
    "RUN_DCGMEUD, RESTART_APP";

std::string Join(std::string_view prefix, std::string_view key) {
  if (prefix.empty()) return std::string(key);
  std::string out(prefix);
  out += '.';
  out += key;
  return out;
}

std::string Index(std::string_view prefix, std::size_t i) {
  std::string out(prefix);
  out += '[';
  out += std::to_string(i);
  out += ']';
  return out;
}

std::string Quoted(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out = "'";
  out += text.substr(0, kMax);
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a sequence";
  if (node.IsMap()) return "a mapping";
  if (node.Tag() == "!") return "the quoted string " + Quoted(node.Scalar());
  return Quoted(node.Scalar());
}

// Reads typed values out of one YAML document and turns every problem into a ConfigError
// that points at the node responsible.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void Fail(const YAML::Mark& mark, std::string_view path, std::string message) const {
    // A node without a position is the (empty) document itself: point at its start.
    const bool known = !mark.is_null();
    throw ConfigError(source_, known ? mark.line + 1 : 1, known ? mark.column + 1 : 1,
                      path.empty() ? std::string("(root)") : std::string(path),
                      std::move(message));
  }
  [[noreturn]] void Fail(const YAML::Node& at, std::string_view path, std::string message) const {
    Fail(at.Mark(), path, std::move(message));
  }

  void RequireMap(const YAML::Node& node, std::string_view path) const {
    if (!node.IsMap()) Fail(node, path, "expected a mapping, got " + Describe(node));
  }
  void RequireSequence(const YAML::Node& node, std::string_view path) const {
    if (!node.IsSequence()) Fail(node, path, "expected a sequence, got " + Describe(node));
  }

  // The entries of a mapping by key, after rejecting non-scalar, duplicate and unknown keys.
  struct Field {
    YAML::Node key;
    YAML::Node value;
  };
  std::map<std::string, Field> Fields(const YAML::Node& map, std::string_view path,
                                      std::initializer_list<std::string_view> allowed) const {
    RequireMap(map, path);
    std::map<std::string, Field> out;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) Fail(key, path, "keys must be plain strings, got " + Describe(key));
      const std::string name = key.Scalar();
      const std::string key_path = Join(path, name);
      bool ok = false;
      for (std::string_view a : allowed) ok = ok || a == name;
      if (!ok) {
        std::string list;
        for (std::string_view a : allowed) {
          if (!list.empty()) list += ", ";
          list += a;
        }
        Fail(key, key_path, "unknown key (allowed: " + list + ")");
      }
      if (auto seen = out.find(name); seen != out.end()) {
        Fail(key, key_path,
             "duplicate key (first at line " + std::to_string(seen->second.key.Mark().line + 1) +
                 ")");
      }
      out.emplace(name, Field{key, it->second});
    }
    return out;
  }

  const Field& Require(const std::map<std::string, Field>& fields, const YAML::Node& map,
                       std::string_view path, const std::string& name) const {
    auto it = fields.find(name);
    if (it == fields.end()) Fail(map, Join(path, name), "missing required key");
    return it->second;
  }

  uint32_t Uint(const YAML::Node& node, std::string_view path, uint64_t min, uint64_t max,
                std::string_view noun) const {
    if (!node.IsScalar() || node.Tag() == "!") {
      Fail(node, path, "expected an integer, got " + Describe(node));
    }
    const std::string& text = node.Scalar();
    uint64_t value = 0;
    const char* first = text.data();
    const char* last = first + text.size();
    auto [ptr, ec] = std::from_chars(first, last, value, 10);
    if (text.empty() || ptr != last || ec == std::errc::invalid_argument) {
      Fail(node, path, "expected an integer, got " + Quoted(text));
    }
    if (ec == std::errc::result_out_of_range || value < min || value > max) {
      Fail(node, path,
           std::string(noun) + " " + text + " is out of range (" + std::to_string(min) + "-" +
               std::to_string(max) + ")");
    }
    return static_cast<uint32_t>(value);
  }

  uint32_t Xid(const YAML::Node& node, std::string_view path) const {
    return Uint(node, path, 1, kMaxXid, "XID");
  }

  bool Bool(const YAML::Node& node, std::string_view path) const {
    if (node.IsScalar() && node.Tag() != "!") {
      const std::string& s = node.Scalar();
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
    }
    Fail(node, path, "expected true or false, got " + Describe(node));
  }

  std::string String(const YAML::Node& node, std::string_view path) const {
    if (!node.IsScalar() || node.Scalar().empty()) {
      Fail(node, path, "expected a non-empty string, got " + Describe(node));
    }
    return node.Scalar();
  }

  RecommendedAction Action(const YAML::Node& node, std::string_view path) const {
    const std::string name = String(node, path);
    auto action = ParseActionName(name);
    if (!action || *action == RecommendedAction::kUnknown) {
      Fail(node, path,
           "unknown action " + Quoted(name) + " (expected one of " + std::string(kActionChoices) +
               ")");
    }
    return *action;
  }

  std::chrono::milliseconds Duration(const YAML::Node& node, std::string_view path) const {
    if (node.IsScalar()) {
      if (auto d = ParseDuration(node.Scalar())) return *d;
    }
    Fail(node, path,
         "expected a duration like 30s, 10m, 1h30m or 7d (more than 0, at most 7 days), got " +
             Describe(node));
  }

  // {count: 3, window: 10m}
  XidThreshold Threshold(const YAML::Node& node, std::string_view path) const {
    const auto f = Fields(node, path, {"count", "window"});
    XidThreshold t;
    t.count = Uint(Require(f, node, path, "count").value, Join(path, "count"), 1, kMaxThresholdCount, "count");
    t.window = Duration(Require(f, node, path, "window").value, Join(path, "window"));
    return t;
  }

  // {boots: 2, window: 7d}, or false (never escalate).
  XidEscalation Escalation(const YAML::Node& node, std::string_view path) const {
    XidEscalation e;
    if (node.IsScalar() && node.Tag() != "!") {
      const std::string& s = node.Scalar();
      if (s == "false" || s == "False" || s == "FALSE") {
        e.enabled = false;
        return e;
      }
    }
    if (!node.IsMap()) Fail(node, path, "expected {boots: N, window: D} or false, got " + Describe(node));
    const auto f = Fields(node, path, {"boots", "window"});
    e.boots = Uint(Require(f, node, path, "boots").value, Join(path, "boots"), 1, kMaxEscalationBoots, "boots");
    e.window = Duration(Require(f, node, path, "window").value, Join(path, "window"));
    return e;
  }

  // [162, 170]: distinct XIDs, not `self`.
  std::vector<uint32_t> Clears(const YAML::Node& node, std::string_view path, uint32_t self) const {
    RequireSequence(node, path);
    if (node.size() > kMaxClears) {
      Fail(node, path, "at most " + std::to_string(kMaxClears) + " XIDs, got " + std::to_string(node.size()));
    }
    std::vector<uint32_t> out;
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string item_path = Index(path, i);
      const uint32_t xid = Xid(node[i], item_path);
      if (xid == self) Fail(node[i], item_path, "an XID cannot clear itself");
      for (const uint32_t seen : out) {
        if (seen == xid) Fail(node[i], item_path, "XID " + std::to_string(xid) + " is listed twice");
      }
      out.push_back(xid);
    }
    return out;
  }

  // The `defaults` mapping of a catalog or of the site overrides.
  XidDefaults Defaults(const YAML::Node& node, std::string_view path) const {
    const auto f = Fields(node, path, {"escalation", "lookback"});
    XidDefaults d;
    if (auto it = f.find("escalation"); it != f.end()) {
      d.escalation = Escalation(it->second.value, Join(path, "escalation"));
    }
    if (auto it = f.find("lookback"); it != f.end()) d.lookback = Duration(it->second.value, Join(path, "lookback"));
    return d;
  }

  // The optional per-XID policy keys shared by catalog entries and site `xids` entries.
  template <class FieldMap>
  void PolicyKeys(const FieldMap& f, std::string_view path, uint32_t xid, std::optional<XidThreshold>& threshold,
                  std::optional<XidEscalation>& escalation, std::vector<uint32_t>* clears,
                  std::optional<std::vector<uint32_t>>* clears_patch,
                  std::optional<std::chrono::milliseconds>& lookback) const {
    if (auto it = f.find("threshold"); it != f.end()) threshold = Threshold(it->second.value, Join(path, "threshold"));
    if (auto it = f.find("escalation"); it != f.end()) {
      escalation = Escalation(it->second.value, Join(path, "escalation"));
    }
    if (auto it = f.find("clears"); it != f.end()) {
      auto list = Clears(it->second.value, Join(path, "clears"), xid);
      if (clears != nullptr) *clears = std::move(list);
      if (clears_patch != nullptr) *clears_patch = std::move(list);
    }
    if (auto it = f.find("lookback"); it != f.end()) lookback = Duration(it->second.value, Join(path, "lookback"));
  }

 private:
  std::string source_;
};

// The text is first read by the site config's YAML reader (loop/config.hpp): YAML 1.2, one
// document, bounded nesting and alias expansion (issue #24: an alias loop or a billion laughs
// must be an error, not a crash or gigabytes). yaml-cpp then reads what is known to be safe.
YAML::Node ParseDocument(std::string_view yaml, const std::string& source) {
  try {
    (void)gns::ParseYaml(yaml, source);
  } catch (const gns::YamlError& e) {
    throw ConfigError(source, e.Where().line, e.Where().column, e.KeyPath().empty() ? "(syntax)" : e.KeyPath(),
                      e.What());
  } catch (const gns::ConfigError& e) {
    throw ConfigError(source, 0, 0, "(syntax)", e.what());
  }
  try {
    return YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    const bool known = !e.mark.is_null();
    throw ConfigError(source, known ? e.mark.line + 1 : 0, known ? e.mark.column + 1 : 0,
                      "(syntax)", e.msg);
  }
}

// Bounded, regular files only, never blocking (a FIFO or /dev/zero is an error).
std::string ReadWholeFile(const std::string& path) {
  try {
    return gns::ReadConfigFile(path, gns::YamlLimits{}.max_file_bytes);
  } catch (const gns::ConfigError& e) {
    std::string message = e.what();
    if (message.starts_with(path + ": ")) message.erase(0, path.size() + 2);
    throw ConfigError(path, 0, 0, "(file)", message);
  }
}

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
