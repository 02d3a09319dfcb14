// The YAML reading shared by gpu-health's catalogs (the XID catalog and its site overrides, the
// SXid catalog): values read from the scalar text rather than through Node::as<T>(), so that "13"
// in quotes, 0x0d, 13.0 or "yes" are reported as mistakes instead of being converted behind the
// user's back, and every problem a ConfigError "file:line:column: key path: what is wrong" that
// points at the node responsible. Private to gpu-health.
#pragma once

#include "loop/config_checks.hpp"
#include "modules/gpu_health/xid_catalog.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health::catalog_yaml {

inline constexpr std::string_view kActionChoices =
    "NONE, COMPONENT_RESET, CONTACT_SUPPORT, RUN_FIELDDIAG, RESTART_VM, RESTART_BM, REPLACE_VM, "
    "RUN_DCGMEUD, RESTART_APP";

inline std::string Join(std::string_view prefix, std::string_view key) {
  if (prefix.empty()) return std::string(key);
  std::string out(prefix);
  out += '.';
  out += key;
  return out;
}

inline std::string Index(std::string_view prefix, std::size_t i) {
  std::string out(prefix);
  out += '[';
  out += std::to_string(i);
  out += ']';
  return out;
}

inline std::string Quoted(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out = "'";
  out += text.substr(0, kMax);
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

inline std::string Describe(const YAML::Node& node) {
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
inline YAML::Node ParseDocument(std::string_view yaml, const std::string& source) {
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
inline std::string ReadWholeFile(const std::string& path) {
  try {
    return gns::ReadConfigFile(path, gns::YamlLimits{}.max_file_bytes);
  } catch (const gns::ConfigError& e) {
    std::string message = e.what();
    if (message.starts_with(path + ": ")) message.erase(0, path.size() + 2);
    throw ConfigError(path, 0, 0, "(file)", message);
  }
}

}  // namespace gns::gpu_health::catalog_yaml
