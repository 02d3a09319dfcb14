#pragma once
// Site configuration as a tree that remembers where every value came from (file, line,
// column), plus a reader that turns a map section into typed values and rejects anything it
// did not consume. Every error names the file, the position and the key path:
//
//   site.yaml:12:5: modules.metrics.listen: expected host:port, got "9464"
//
// Strings may reference the environment as ${VAR} or ${VAR:-default}; an unset variable
// without a default is an error, never an empty string.

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gns {

struct SourceLocation {
  std::shared_ptr<const std::string> file;
  int line = 0;    // 1-based; 0 when unknown
  int column = 0;  // 1-based
  std::string ToString() const;
};

class ConfigError : public std::runtime_error {
 public:
  ConfigError(const SourceLocation& where, std::string_view path, std::string_view what);
  explicit ConfigError(std::string message) : std::runtime_error(std::move(message)) {}
};

struct ConfigEntry;

class ConfigValue {
 public:
  enum class Kind { kNull, kScalar, kSequence, kMap };

  Kind kind = Kind::kNull;
  std::string scalar;
  std::vector<ConfigValue> items;                        // kSequence
  std::vector<ConfigEntry> entries;  // kMap, in file order
  SourceLocation where;

  const ConfigValue* Find(std::string_view key) const;
  ConfigValue* Find(std::string_view key);
  const ConfigEntry* FindEntry(std::string_view key) const;
  static std::string_view KindName(Kind kind);
};

struct ConfigEntry {
  std::string key;
  SourceLocation key_where;
  ConfigValue value;
};

// Parses YAML text; `file_name` is used in messages. Throws ConfigError on syntax errors and
// duplicate keys.
ConfigValue ParseYaml(std::string_view text, const std::string& file_name);
ConfigValue LoadYamlFile(const std::string& path);

// Lays `overlay` over `base`: maps merge key by key, everything else is replaced.
void MergeOverlay(ConfigValue& base, const ConfigValue& overlay);

// Expands ${VAR} and ${VAR:-default}. Throws ConfigError (at `where`, `path`) for unset
// variables and unterminated references.
std::string ExpandEnv(std::string_view text, const SourceLocation& where, std::string_view path);

// Reads one map section. Each accessor marks its key as consumed; Finish() rejects the rest.
class ConfigMap {
 public:
  // A null value reads as an empty map (a section written as `metrics:` with no keys).
  // `missing_at` is where to point errors when the section itself was left out.
  ConfigMap(const ConfigValue& value, std::string path, const SourceLocation* missing_at = nullptr);

  const std::string& Path() const { return path_; }
  const SourceLocation& Where() const { return where_; }
  // Whether the module this section configures will run. A disabled module's section is still
  // checked for keys and types, but ParseConfig must not open the files it names.
  bool ModuleEnabled() const { return module_enabled_; }
  void SetModuleEnabled(bool enabled) { module_enabled_ = enabled; }
  bool Has(std::string_view key) const;
  // Marks a key as consumed without reading it (read elsewhere).
  void Skip(std::string_view key);

  std::string String(std::string_view key, std::optional<std::string> fallback = std::nullopt);
  std::optional<std::string> OptionalString(std::string_view key);
  bool Bool(std::string_view key, std::optional<bool> fallback = std::nullopt);
  int64_t Int(std::string_view key, int64_t min, int64_t max,
              std::optional<int64_t> fallback = std::nullopt);
  double Double(std::string_view key, double min, double max,
                std::optional<double> fallback = std::nullopt);
  // "250ms", "30s", "5m", "1h", "1m30s". Must lie within [min, max].
  std::chrono::milliseconds Duration(std::string_view key, std::chrono::milliseconds min,
                                     std::chrono::milliseconds max,
                                     std::optional<std::chrono::milliseconds> fallback = std::nullopt);
  std::string Enum(std::string_view key, std::initializer_list<std::string_view> allowed,
                   std::optional<std::string> fallback = std::nullopt);
  std::vector<std::string> StringList(std::string_view key,
                                      std::optional<std::vector<std::string>> fallback = std::nullopt);
  std::vector<int64_t> IntList(std::string_view key, int64_t min, int64_t max,
                               std::optional<std::vector<int64_t>> fallback = std::nullopt);
  std::map<std::string, std::string> StringMap(std::string_view key);
  // A nested map section; missing reads as empty. The caller must Finish() it.
  ConfigMap Section(std::string_view key);
  // The raw node for a key (nullptr if missing), marked consumed.
  const ConfigValue* Raw(std::string_view key);
  // Keys of this map in file order.
  std::vector<std::string> Keys() const;

  // Throws for the first key that no accessor consumed.
  void Finish() const;

  // Throws an error pointing at the key's value (a bad value) or at the key itself (a key
  // that should not be there).
  [[noreturn]] void Fail(std::string_view key, std::string_view what) const;
  [[noreturn]] void FailKey(std::string_view key, std::string_view what) const;

 private:
  bool module_enabled_ = true;
  const ConfigValue& Required(std::string_view key);
  const ConfigValue* Lookup(std::string_view key);
  const ConfigValue& Scalar(std::string_view key, const ConfigValue& v) const;
  std::string KeyPath(std::string_view key) const;

  const ConfigValue* value_;
  std::string path_;
  SourceLocation where_;
  std::set<std::string, std::less<>> consumed_;
  static const ConfigValue kEmpty;
};

// Parses a duration string such as "1m30s"; nullopt if malformed.
std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text);

}  // namespace gns
