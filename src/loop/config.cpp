// YAML → ConfigValue with source positions, overlays, env expansion and the typed reader.
#include "loop/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gns {

std::string SourceLocation::ToString() const {
  std::string out = file ? *file : std::string("<config>");
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(column);
  return out;
}

ConfigError::ConfigError(const SourceLocation& where, std::string_view path, std::string_view what)
    : std::runtime_error(where.ToString() + ": " + (path.empty() ? std::string("(top level)") : std::string(path)) +
                         ": " + std::string(what)) {}

const ConfigEntry* ConfigValue::FindEntry(std::string_view key) const {
  for (const auto& e : entries)
    if (e.key == key) return &e;
  return nullptr;
}

const ConfigValue* ConfigValue::Find(std::string_view key) const {
  const auto* e = FindEntry(key);
  return e ? &e->value : nullptr;
}

ConfigValue* ConfigValue::Find(std::string_view key) {
  for (auto& e : entries)
    if (e.key == key) return &e.value;
  return nullptr;
}

std::string_view ConfigValue::KindName(Kind kind) {
  switch (kind) {
    case Kind::kNull: return "null";
    case Kind::kScalar: return "scalar";
    case Kind::kSequence: return "list";
    case Kind::kMap: return "map";
  }
  return "?";
}

namespace {

SourceLocation At(const std::shared_ptr<const std::string>& file, const YAML::Mark& mark) {
  SourceLocation loc;
  loc.file = file;
  if (mark.line >= 0) {
    loc.line = mark.line + 1;
    loc.column = mark.column + 1;
  }
  return loc;
}

ConfigValue Convert(const YAML::Node& node, const std::shared_ptr<const std::string>& file,
                    const std::string& path) {
  ConfigValue out;
  out.where = At(file, node.Mark());
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out.kind = ConfigValue::Kind::kNull;
      break;
    case YAML::NodeType::Scalar:
      out.kind = ConfigValue::Kind::kScalar;
      out.scalar = node.Scalar();
      break;
    case YAML::NodeType::Sequence: {
      out.kind = ConfigValue::Kind::kSequence;
      std::size_t i = 0;
      for (const auto& item : node) {
        out.items.push_back(Convert(item, file, path + "[" + std::to_string(i++) + "]"));
      }
      break;
    }
    case YAML::NodeType::Map:
      out.kind = ConfigValue::Kind::kMap;
      for (const auto& kv : node) {
        const auto key_loc = At(file, kv.first.Mark());
        if (!kv.first.IsScalar()) throw ConfigError(key_loc, path, "map keys must be plain strings");
        std::string key = kv.first.Scalar();
        const std::string child_path = path.empty() ? key : path + "." + key;
        if (out.FindEntry(key) != nullptr) throw ConfigError(key_loc, child_path, "duplicate key");
        out.entries.push_back(ConfigEntry{key, key_loc, Convert(kv.second, file, child_path)});
      }
      break;
  }
  return out;
}

}  // namespace

ConfigValue ParseYaml(std::string_view text, const std::string& file_name) {
  auto file = std::make_shared<const std::string>(file_name);
  try {
    YAML::Node root = YAML::Load(std::string(text));
    return Convert(root, file, "");
  } catch (const YAML::Exception& e) {
    throw ConfigError(At(file, e.mark), "", "invalid YAML: " + e.msg);
  }
}

ConfigValue LoadYamlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(path + ": cannot read config file: " + std::strerror(errno));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return ParseYaml(buffer.str(), path);
}

void MergeOverlay(ConfigValue& base, const ConfigValue& overlay) {
  if (base.kind != ConfigValue::Kind::kMap || overlay.kind != ConfigValue::Kind::kMap) {
    base = overlay;
    return;
  }
  for (const auto& entry : overlay.entries) {
    if (auto* existing = base.Find(entry.key)) {
      MergeOverlay(*existing, entry.value);
    } else {
      base.entries.push_back(entry);
    }
  }
}

std::string ExpandEnv(std::string_view text, const SourceLocation& where, std::string_view path) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '$') {  // "$$" is a literal '$'
      out += '$';
      i += 2;
      continue;
    }
    if (text[i] != '$' || i + 1 >= text.size() || text[i + 1] != '{') {
      out += text[i++];
      continue;
    }
    const auto close = text.find('}', i + 2);
    if (close == std::string_view::npos) {
      throw ConfigError(where, path, "unterminated ${ in \"" + std::string(text) + "\"");
    }
    std::string_view ref = text.substr(i + 2, close - i - 2);
    std::optional<std::string_view> fallback;
    if (const auto sep = ref.find(":-"); sep != std::string_view::npos) {
      fallback = ref.substr(sep + 2);
      ref = ref.substr(0, sep);
    }
    const bool valid_name = !ref.empty() && std::all_of(ref.begin(), ref.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    if (!valid_name) {
      throw ConfigError(where, path, "invalid environment reference ${" + std::string(ref) + "}");
    }
    const char* value = std::getenv(std::string(ref).c_str());
    if (value != nullptr && *value != '\0') {
      out += value;
    } else if (fallback) {
      out += *fallback;
    } else {
      throw ConfigError(where, path,
                        "environment variable " + std::string(ref) + " is not set (use ${" +
                            std::string(ref) + ":-default} for a default)");
    }
    i = close + 1;
  }
  return out;
}

std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (text == "0") return std::chrono::milliseconds(0);
  long long total_ms = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    long long number = 0;
    const auto* begin = text.data() + i;
    const auto [ptr, ec] = std::from_chars(begin, text.data() + text.size(), number);
    if (ec != std::errc() || ptr == begin || number < 0) return std::nullopt;
    i = static_cast<std::size_t>(ptr - text.data());
    std::size_t unit_end = i;
    while (unit_end < text.size() && std::isalpha(static_cast<unsigned char>(text[unit_end]))) ++unit_end;
    const std::string_view unit = text.substr(i, unit_end - i);
    long long scale = 0;
    if (unit == "ms") scale = 1;
    else if (unit == "s") scale = 1000;
    else if (unit == "m") scale = 60'000;
    else if (unit == "h") scale = 3'600'000;
    else return std::nullopt;
    if (number > (1LL << 40)) return std::nullopt;
    total_ms += number * scale;
    i = unit_end;
  }
  return std::chrono::milliseconds(total_ms);
}

const ConfigValue ConfigMap::kEmpty{};

ConfigMap::ConfigMap(const ConfigValue& value, std::string path, const SourceLocation* missing_at)
    : value_(&value), path_(std::move(path)), where_(missing_at && value.where.line == 0 ? *missing_at : value.where) {
  if (value.kind == ConfigValue::Kind::kNull) return;
  if (value.kind != ConfigValue::Kind::kMap) {
    throw ConfigError(value.where, path_,
                      "expected a map, got a " + std::string(ConfigValue::KindName(value.kind)));
  }
}

std::string ConfigMap::KeyPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void ConfigMap::Fail(std::string_view key, std::string_view what) const {
  const ConfigValue* v = value_->Find(key);
  throw ConfigError(v ? v->where : where_, KeyPath(key), what);
}

void ConfigMap::FailKey(std::string_view key, std::string_view what) const {
  const ConfigEntry* e = value_->FindEntry(key);
  throw ConfigError(e ? e->key_where : where_, KeyPath(key), what);
}

bool ConfigMap::Has(std::string_view key) const { return value_->Find(key) != nullptr; }

void ConfigMap::Skip(std::string_view key) { consumed_.emplace(key); }

const ConfigValue* ConfigMap::Lookup(std::string_view key) {
  consumed_.emplace(key);
  const ConfigValue* v = value_->Find(key);
  // `key: ~` means "not set", same as leaving it out.
  if (v != nullptr && v->kind == ConfigValue::Kind::kNull) return nullptr;
  return v;
}

const ConfigValue* ConfigMap::Raw(std::string_view key) { return Lookup(key); }

const ConfigValue& ConfigMap::Required(std::string_view key) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) throw ConfigError(where_, KeyPath(key), "required key is missing");
  return *v;
}

const ConfigValue& ConfigMap::Scalar(std::string_view key, const ConfigValue& v) const {
  if (v.kind != ConfigValue::Kind::kScalar) {
    throw ConfigError(v.where, KeyPath(key),
                      "expected a scalar, got a " + std::string(ConfigValue::KindName(v.kind)));
  }
  return v;
}

std::string ConfigMap::String(std::string_view key, std::optional<std::string> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  return ExpandEnv(Scalar(key, *v).scalar, v->where, KeyPath(key));
}

std::optional<std::string> ConfigMap::OptionalString(std::string_view key) {
  if (Lookup(key) == nullptr) return std::nullopt;
  return String(key);
}

bool ConfigMap::Bool(std::string_view key, std::optional<bool> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  const std::string text = ExpandEnv(Scalar(key, *v).scalar, v->where, KeyPath(key));
  if (text == "true") return true;
  if (text == "false") return false;
  throw ConfigError(v->where, KeyPath(key), "expected true or false, got \"" + text + "\"");
}

int64_t ConfigMap::Int(std::string_view key, int64_t min, int64_t max, std::optional<int64_t> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  const std::string text = ExpandEnv(Scalar(key, *v).scalar, v->where, KeyPath(key));
  int64_t number = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    throw ConfigError(v->where, KeyPath(key), "expected an integer, got \"" + text + "\"");
  }
  if (number < min || number > max) {
    throw ConfigError(v->where, KeyPath(key),
                      "value " + text + " is out of range [" + std::to_string(min) + ", " +
                          std::to_string(max) + "]");
  }
  return number;
}

double ConfigMap::Double(std::string_view key, double min, double max, std::optional<double> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  const std::string text = ExpandEnv(Scalar(key, *v).scalar, v->where, KeyPath(key));
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(number)) {
    throw ConfigError(v->where, KeyPath(key), "expected a number, got \"" + text + "\"");
  }
  if (number < min || number > max) {
    throw ConfigError(v->where, KeyPath(key), "value " + text + " is out of range");
  }
  return number;
}

std::chrono::milliseconds ConfigMap::Duration(std::string_view key, std::chrono::milliseconds min,
                                              std::chrono::milliseconds max,
                                              std::optional<std::chrono::milliseconds> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  const std::string text = ExpandEnv(Scalar(key, *v).scalar, v->where, KeyPath(key));
  const auto parsed = ParseDuration(text);
  if (!parsed) {
    throw ConfigError(v->where, KeyPath(key),
                      "expected a duration such as 500ms, 30s, 5m or 1h, got \"" + text + "\"");
  }
  if (*parsed < min || *parsed > max) {
    throw ConfigError(v->where, KeyPath(key),
                      "duration " + text + " is out of range [" + std::to_string(min.count()) + "ms, " +
                          std::to_string(max.count()) + "ms]");
  }
  return *parsed;
}

std::string ConfigMap::Enum(std::string_view key, std::initializer_list<std::string_view> allowed,
                            std::optional<std::string> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  const std::string text = ExpandEnv(Scalar(key, *v).scalar, v->where, KeyPath(key));
  for (auto a : allowed)
    if (a == text) return text;
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  throw ConfigError(v->where, KeyPath(key), "\"" + text + "\" is not one of: " + list);
}

std::vector<std::string> ConfigMap::StringList(std::string_view key,
                                               std::optional<std::vector<std::string>> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  if (v->kind != ConfigValue::Kind::kSequence) {
    throw ConfigError(v->where, KeyPath(key),
                      "expected a list, got a " + std::string(ConfigValue::KindName(v->kind)));
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v->items.size(); ++i) {
    const auto& item = v->items[i];
    const std::string item_path = KeyPath(key) + "[" + std::to_string(i) + "]";
    if (item.kind != ConfigValue::Kind::kScalar) {
      throw ConfigError(item.where, item_path, "expected a string");
    }
    out.push_back(ExpandEnv(item.scalar, item.where, item_path));
  }
  return out;
}

std::vector<int64_t> ConfigMap::IntList(std::string_view key, int64_t min, int64_t max,
                                        std::optional<std::vector<int64_t>> fallback) {
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    throw ConfigError(where_, KeyPath(key), "required key is missing");
  }
  if (v->kind != ConfigValue::Kind::kSequence) {
    throw ConfigError(v->where, KeyPath(key),
                      "expected a list of integers, got a " + std::string(ConfigValue::KindName(v->kind)));
  }
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < v->items.size(); ++i) {
    const auto& item = v->items[i];
    const std::string item_path = KeyPath(key) + "[" + std::to_string(i) + "]";
    if (item.kind != ConfigValue::Kind::kScalar) throw ConfigError(item.where, item_path, "expected an integer");
    int64_t number = 0;
    const auto [ptr, ec] = std::from_chars(item.scalar.data(), item.scalar.data() + item.scalar.size(), number);
    if (ec != std::errc() || ptr != item.scalar.data() + item.scalar.size()) {
      throw ConfigError(item.where, item_path, "expected an integer, got \"" + item.scalar + "\"");
    }
    if (number < min || number > max) {
      throw ConfigError(item.where, item_path,
                        "value " + item.scalar + " is out of range [" + std::to_string(min) + ", " +
                            std::to_string(max) + "]");
    }
    out.push_back(number);
  }
  return out;
}

std::map<std::string, std::string> ConfigMap::StringMap(std::string_view key) {
  std::map<std::string, std::string> out;
  const ConfigValue* v = Lookup(key);
  if (v == nullptr) return out;
  ConfigMap section(*v, KeyPath(key));
  for (const auto& entry : v->entries) out[entry.key] = section.String(entry.key);
  return out;
}

ConfigMap ConfigMap::Section(std::string_view key) {
  const ConfigValue* v = Lookup(key);
  return ConfigMap(v ? *v : kEmpty, KeyPath(key), &where_);
}

std::vector<std::string> ConfigMap::Keys() const {
  std::vector<std::string> out;
  for (const auto& e : value_->entries) out.push_back(e.key);
  return out;
}

void ConfigMap::Finish() const {
  for (const auto& entry : value_->entries) {
    if (consumed_.count(entry.key) != 0) continue;
    std::string known;
    for (const auto& k : consumed_) known += (known.empty() ? "" : ", ") + k;
    throw ConfigError(entry.key_where, KeyPath(entry.key),
                      "unknown key" + (known.empty() ? std::string() : " (expected one of: " + known + ")"));
  }
}

}  // namespace gns
