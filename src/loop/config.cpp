// YAML → ConfigValue with source positions, overlays, env expansion and the typed reader.
//
// The YAML is read by libfyaml, a YAML 1.2 parser that passes the YAML test suite
// (tests/unit/loop/yaml_suite_test.cpp): text that is not YAML (an unclosed quote, a tab as
// indentation, a NUL byte) is an error with its position, never a different config. Bounded
// (issue #24; loop/config_checks.hpp): a regular file of at most 1 MiB, one document, and
// capped nesting, nodes produced (aliases counted as what they copy: no billion laughs) and
// text; an alias inside the node it names is an error, not a loop.
#include "loop/config.hpp"

#include "loop/config_checks.hpp"

#include <libfyaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

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

// libfyaml objects, released on every path (the builder throws from inside the event loop).
struct ParserDeleter {
  void operator()(fy_parser* p) const { fy_parser_destroy(p); }
};
struct DiagDeleter {
  void operator()(fy_diag* d) const { fy_diag_destroy(d); }
};

// Diagnostics are collected, never printed: the first error becomes the ConfigError. A few
// errors are not collected with a position (e.g. "indentation indicator 0"): their text comes
// through the output function and is kept.
void KeepDiagnosticText(fy_diag*, void* user, const char* buf, size_t len) {
  auto& text = *static_cast<std::string*>(user);
  if (text.empty()) text.assign(buf, len);
}

std::string TokenText(fy_token* token) {
  if (token == nullptr) return {};
  std::size_t length = 0;
  const char* text = fy_token_get_text(token, &length);
  return text == nullptr ? std::string() : std::string(text, length);
}

bool IsPlainNull(std::string_view text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

// Builds the ConfigValue tree from libfyaml's events with an explicit stack (no recursion on
// the input's shape), counting what it produces against YamlLimits.
class TreeBuilder {
 public:
  TreeBuilder(std::shared_ptr<const std::string> file, const YamlLimits& limits)
      : file_(std::move(file)), limits_(limits), last_where_{file_, 1, 1} {}

  // Where the last event was: errors libfyaml reports without a position are placed there.
  const SourceLocation& LastWhere() const { return last_where_; }

  // Returns true when the stream has ended.
  bool On(fy_event* event) {
    const fy_mark* mark = fy_event_start_mark(event);
    // An empty scalar (a missing key or value) has no position: the last one seen stands in.
    if (mark != nullptr) last_where_ = At(mark);
    SourceLocation where = last_where_;
    // libfyaml marks an alias at its name and a quoted scalar after its quote: point at the
    // '*' and the quote, where the value starts.
    const bool quoted = event->type == FYET_SCALAR && event->scalar.value != nullptr &&
                        (fy_token_scalar_style(event->scalar.value) == FYSS_SINGLE_QUOTED ||
                         fy_token_scalar_style(event->scalar.value) == FYSS_DOUBLE_QUOTED);
    if (mark != nullptr && (event->type == FYET_ALIAS || quoted) && where.column > 1) --where.column;
    // An implicit document start has no position: the second document is reported at its
    // first event that has one.
    if (event->type == FYET_DOCUMENT_START && ++documents_ > 1) second_document_ = true;
    if (second_document_ && mark != nullptr) {
      throw YamlError(where, "",
                        "a second YAML document: a config file holds exactly one (remove the `---` and what "
                        "follows, or merge it into the first)");
    }
    switch (event->type) {
      case FYET_NONE:
      case FYET_STREAM_START:
        return false;
      case FYET_STREAM_END:
        return true;
      case FYET_DOCUMENT_START:
      case FYET_DOCUMENT_END:
        return false;
      case FYET_MAPPING_START:
      case FYET_SEQUENCE_START: {
        if (stack_.size() >= limits_.max_depth) {
          throw YamlError(where, PathHere(),
                            "nested deeper than " + std::to_string(limits_.max_depth) + " levels");
        }
        Frame frame;
        frame.value.kind = event->type == FYET_MAPPING_START ? ConfigValue::Kind::kMap : ConfigValue::Kind::kSequence;
        frame.value.where = where;
        frame.anchor = TokenText(fy_event_get_anchor_token(event));
        frame.path = PathHere();
        if (!frame.anchor.empty()) open_anchors_.insert(frame.anchor);
        Count(where, frame.path, 1, 0);
        stack_.push_back(std::move(frame));
        return false;
      }
      case FYET_MAPPING_END:
      case FYET_SEQUENCE_END: {
        Frame frame = std::move(stack_.back());
        stack_.pop_back();
        if (!frame.anchor.empty()) open_anchors_.erase(frame.anchor);
        Add(std::move(frame.value), frame.nodes, frame.bytes, frame.anchor);
        return false;
      }
      case FYET_SCALAR: {
        fy_token* value = event->scalar.value;
        ConfigValue scalar;
        scalar.where = where;
        scalar.scalar = TokenText(value);
        const bool plain = value == nullptr || fy_token_scalar_style(value) == FYSS_PLAIN;
        scalar.kind = plain && event->scalar.tag == nullptr && IsPlainNull(scalar.scalar) ? ConfigValue::Kind::kNull
                                                                                          : ConfigValue::Kind::kScalar;
        const std::size_t bytes = scalar.scalar.size();
        Count(where, PathHere(), 1, bytes);
        Add(std::move(scalar), 1, bytes, TokenText(event->scalar.anchor));
        return false;
      }
      case FYET_ALIAS: {
        const std::string name = TokenText(event->alias.anchor);
        if (open_anchors_.count(name) != 0) {
          throw YamlError(where, PathHere(),
                            "alias *" + name + " refers to the node it is part of (a recursive alias)");
        }
        const auto it = anchors_.find(name);
        if (it == anchors_.end()) throw YamlError(where, PathHere(), "alias *" + name + " refers to no anchor &" + name);
        Count(where, PathHere(), it->second.nodes, it->second.bytes);
        ConfigValue copy = it->second.value;
        copy.where = where;
        Add(std::move(copy), it->second.nodes, it->second.bytes, "");
        return false;
      }
    }
    return false;
  }

  ConfigValue TakeRoot() {
    if (!root_) {
      ConfigValue empty;
      empty.where.file = file_;
      return empty;
    }
    return std::move(*root_);
  }

 private:
  struct Frame {
    ConfigValue value;
    std::string anchor;
    std::string path;  // key path, for messages
    std::size_t nodes = 1;
    std::size_t bytes = 0;
    // Maps: the key read and waiting for its value, and the keys seen (duplicates).
    std::optional<ConfigValue> key;
    std::unordered_map<std::string, int> keys;  // → the line it is first at
  };
  struct Anchored {
    ConfigValue value;
    std::size_t nodes = 0;
    std::size_t bytes = 0;
  };

  SourceLocation At(const fy_mark* mark) const {
    SourceLocation loc;
    loc.file = file_;
    if (mark != nullptr) {
      loc.line = mark->line + 1;
      loc.column = mark->column + 1;
    }
    return loc;
  }

  // The key path of the node about to be added (for messages).
  std::string PathHere() const {
    if (stack_.empty()) return "";
    const Frame& top = stack_.back();
    if (top.value.kind == ConfigValue::Kind::kSequence) {
      return top.path + "[" + std::to_string(top.value.items.size()) + "]";
    }
    if (top.key) return top.path.empty() ? top.key->scalar : top.path + "." + top.key->scalar;
    return top.path;
  }

  // Everything produced counts, aliases included: a billion laughs stops at the limit.
  void Count(const SourceLocation& where, const std::string& path, std::size_t nodes, std::size_t bytes) {
    nodes_ += nodes;
    bytes_ += bytes;
    if (nodes_ > limits_.max_nodes) {
      throw YamlError(where, path,
                        "more than " + std::to_string(limits_.max_nodes) +
                            " YAML nodes (aliases counted as what they copy): refused");
    }
    if (bytes_ > limits_.max_scalar_bytes) {
      throw YamlError(where, path,
                        "more than " + std::to_string(limits_.max_scalar_bytes) +
                            " bytes of text in values (aliases counted as what they copy): refused");
    }
  }

  void Add(ConfigValue value, std::size_t nodes, std::size_t bytes, const std::string& anchor) {
    if (!anchor.empty()) {
      // The stored copy is memory too.
      Count(value.where, PathHere(), nodes, bytes);
      anchors_[anchor] = Anchored{value, nodes, bytes};
    }
    if (stack_.empty()) {
      root_ = std::move(value);
      return;
    }
    Frame& parent = stack_.back();
    parent.nodes += nodes;
    parent.bytes += bytes;
    if (parent.value.kind == ConfigValue::Kind::kSequence) {
      parent.value.items.push_back(std::move(value));
      return;
    }
    if (!parent.key) {
      if (value.kind != ConfigValue::Kind::kScalar && value.kind != ConfigValue::Kind::kNull) {
        throw YamlError(value.where, parent.path, "map keys must be plain strings, got a " +
                                                        std::string(ConfigValue::KindName(value.kind)));
      }
      parent.key = std::move(value);
      return;
    }
    ConfigValue key = std::move(*parent.key);
    parent.key.reset();
    const std::string child_path = parent.path.empty() ? key.scalar : parent.path + "." + key.scalar;
    if (const auto [first, fresh] = parent.keys.emplace(key.scalar, key.where.line); !fresh) {
      throw YamlError(key.where, child_path, "duplicate key (first at line " + std::to_string(first->second) + ")");
    }
    parent.value.entries.push_back(ConfigEntry{std::move(key.scalar), key.where, std::move(value)});
  }

  std::shared_ptr<const std::string> file_;
  YamlLimits limits_;
  std::vector<Frame> stack_;
  std::optional<ConfigValue> root_;
  std::unordered_map<std::string, Anchored> anchors_;
  std::unordered_set<std::string> open_anchors_;
  std::size_t nodes_ = 0;
  std::size_t bytes_ = 0;
  int documents_ = 0;
  bool second_document_ = false;
  SourceLocation last_where_;
};

// YAML streams are UTF-8 here and hold printable characters only (YAML 1.2 §5.1): libfyaml takes a NUL byte for
// the end of the input, which would load the text before it as the whole file, and passes
// other control characters through. Both are refused here, with their position.
void RefuseControlCharacters(std::string_view text, const std::shared_ptr<const std::string>& file) {
  int line = 1;
  int column = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool c0 = c < 0x20 && c != '\t' && c != '\n' && c != '\r';
    const bool c1 = c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F && static_cast<unsigned char>(text[i + 1]) != 0x85;
    if (c0 || c == 0x7F || c1) {
      const unsigned code = c1 ? static_cast<unsigned char>(text[i + 1]) : c;
      char hex[8];
      std::snprintf(hex, sizeof(hex), "%04X", code);
      throw YamlError(SourceLocation{file, line, column}, "",
                        std::string("invalid YAML: control character U+") + hex +
                            " (YAML allows none but tab, line feed and carriage return)");
    }
    // UTF-8 only (libfyaml 0.7.12 can loop forever on some invalid sequences: found by
    // tests/fuzz/config_yaml_fuzz.cpp).
    std::size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool valid = length != 0 && i + length <= text.size() && !(length == 2 && c < 0xC2);
    for (std::size_t k = 1; valid && k < length; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (!valid) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "%02X", c);
      throw YamlError(SourceLocation{file, line, column}, "",
                      std::string("invalid YAML: not UTF-8 (byte 0x") + hex + ")");
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;  // columns count characters
    }
    i += length - 1;
  }
}

// The first error libfyaml collected, with its position; else the text it wrote, at
// `fallback` (where parsing stopped).
YamlError ParserError(fy_diag* diag, std::string_view written, const SourceLocation& fallback) {
  void* iter = nullptr;
  while (fy_diag_error* error = fy_diag_errors_iterate(diag, &iter)) {
    if (error->type != FYET_ERROR || error->line <= 0) continue;
    SourceLocation where = fallback;
    where.line = error->line;  // libfyaml's diagnostics count from 1 (its event marks from 0)
    where.column = std::max(error->column, 1);
    return YamlError(where, "", std::string("invalid YAML: ") + (error->msg != nullptr ? error->msg : "?"));
  }
  // "[ERR]: indentation indicator 0\n" → "indentation indicator 0"
  if (const auto colon = written.find("]: "); colon != std::string_view::npos) written.remove_prefix(colon + 3);
  while (!written.empty() && (written.back() == '\n' || written.back() == ' ')) written.remove_suffix(1);
  return YamlError(fallback, "", "invalid YAML" + (written.empty() ? std::string() : ": " + std::string(written)));
}

}  // namespace

ConfigValue ParseYaml(std::string_view text, const std::string& file_name) {
  return ParseYaml(text, file_name, YamlLimits{});
}

ConfigValue ParseYaml(std::string_view text, const std::string& file_name, const YamlLimits& limits) {
  auto file = std::make_shared<const std::string>(file_name);
  if (text.size() > limits.max_file_bytes) {
    throw ConfigError(file_name + ": larger than " + std::to_string(limits.max_file_bytes) + " bytes: refused");
  }
  RefuseControlCharacters(text, file);
  fy_diag_cfg diag_cfg;
  fy_diag_cfg_default(&diag_cfg);
  std::string written;
  diag_cfg.fp = nullptr;
  diag_cfg.output_fn = KeepDiagnosticText;
  diag_cfg.user = &written;
  diag_cfg.colorize = false;
  std::unique_ptr<fy_diag, DiagDeleter> diag(fy_diag_create(&diag_cfg));
  if (!diag) throw ConfigError(file_name + ": cannot create the YAML parser");
  fy_diag_set_collect_errors(diag.get(), true);
  fy_parse_cfg cfg{};
  cfg.flags = static_cast<fy_parse_cfg_flags>(FYPCF_QUIET | FYPCF_DEFAULT_VERSION_1_2 | FYPCF_JSON_NONE);
  cfg.diag = diag.get();
  std::unique_ptr<fy_parser, ParserDeleter> parser(fy_parser_create(&cfg));
  if (!parser) throw ConfigError(file_name + ": cannot create the YAML parser");
  // libfyaml reads the text in place: it must outlive the parser (it does: `text` is ours).
  if (fy_parser_set_string(parser.get(), text.data(), text.size()) != 0) {
    throw ConfigError(file_name + ": cannot start the YAML parser");
  }
  TreeBuilder builder(file, limits);
  for (;;) {
    fy_event* raw = fy_parser_parse(parser.get());
    if (raw == nullptr) {
      if (fy_parser_get_stream_error(parser.get())) throw ParserError(diag.get(), written, builder.LastWhere());
      break;
    }
    const auto free_event = [&parser](fy_event* e) { fy_parser_event_free(parser.get(), e); };
    std::unique_ptr<fy_event, decltype(free_event)> event(raw, free_event);
    if (builder.On(event.get())) break;
  }
  return builder.TakeRoot();
}

std::string ReadConfigFile(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw ConfigError(path + ": cannot read config file: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw ConfigError(path + ": cannot read config file: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    const char* what = S_ISFIFO(st.st_mode)  ? "a FIFO"
                       : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device"
                       : S_ISDIR(st.st_mode) ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    throw ConfigError(path + ": cannot read config file: " + what + ", not a regular file");
  }
  const auto too_large = [&] {
    return ConfigError(path + ": cannot read config file: larger than " + std::to_string(max_bytes) + " bytes");
  };
  if (static_cast<std::uintmax_t>(st.st_size) > max_bytes) throw too_large();
  std::string out;
  out.resize(std::min<std::size_t>(static_cast<std::size_t>(st.st_size), max_bytes) + 1);
  std::size_t used = 0;
  for (;;) {
    if (used == out.size()) {
      if (out.size() > max_bytes) throw too_large();  // grew while being read
      out.resize(std::min(out.size() * 2, max_bytes + 1));
    }
    const ssize_t n = ::read(fd, out.data() + used, out.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(path + ": cannot read config file: " + std::strerror(errno));
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  if (used > max_bytes) throw too_large();
  out.resize(used);
  return out;
}

ConfigValue LoadYamlFile(const std::string& path) { return LoadYamlFile(path, YamlLimits{}); }

ConfigValue LoadYamlFile(const std::string& path, const YamlLimits& limits) {
  return ParseYaml(ReadConfigFile(path, limits.max_file_bytes), path, limits);
}

void MergeOverlay(ConfigValue& base, const ConfigValue& overlay) {
  if (base.kind != ConfigValue::Kind::kMap || overlay.kind != ConfigValue::Kind::kMap) {
    base = overlay;
    return;
  }
  // Indexed: a map of many keys merges in linear time.
  std::unordered_map<std::string_view, std::size_t> index;
  for (std::size_t i = 0; i < base.entries.size(); ++i) index.emplace(base.entries[i].key, i);
  std::vector<const ConfigEntry*> added;
  for (const auto& entry : overlay.entries) {
    if (const auto it = index.find(entry.key); it != index.end()) {
      MergeOverlay(base.entries[it->second].value, entry.value);
    } else {
      added.push_back(&entry);  // appended after the loop: index holds views into base.entries
    }
  }
  for (const auto* entry : added) base.entries.push_back(*entry);
}

std::string ExpandEnv(std::string_view text, const SourceLocation& where, std::string_view path) {
  // A NUL ("\0" in a double-quoted string) would cut the value short wherever it reaches a C
  // API (a path, an environment variable): no config value has one.
  if (text.find('\0') != std::string_view::npos) throw ConfigError(where, path, "contains a NUL character");
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
      out += value;  // the environment cannot hold a NUL
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
  const ConfigMap section(*v, KeyPath(key));  // throws unless a map
  for (const auto& entry : v->entries) {
    const std::string entry_path = section.KeyPath(entry.key);
    if (entry.value.kind != ConfigValue::Kind::kScalar) {
      throw ConfigError(entry.value.where, entry_path,
                        "expected a scalar, got a " + std::string(ConfigValue::KindName(entry.value.kind)));
    }
    out[entry.key] = ExpandEnv(entry.value.scalar, entry.value.where, entry_path);
  }
  return out;
}

std::string ReadAbsolutePath(ConfigMap& section, std::string_view key, std::optional<std::string> fallback,
                             bool allow_empty) {
  const bool absent = section.Raw(key) == nullptr;
  std::string value = section.String(key, std::move(fallback));
  if (value.empty() && (allow_empty || absent)) return value;  // "" as the default means "derive it"
  if (const auto problem = AbsolutePathProblem(value); !problem.empty()) section.Fail(key, problem);
  while (value.size() > 1 && value.back() == '/') value.pop_back();
  return value;
}

std::string ReadSocketPath(ConfigMap& section, std::string_view key, std::optional<std::string> fallback,
                           bool allow_empty) {
  std::string value = ReadAbsolutePath(section, key, std::move(fallback), allow_empty);
  if (value.empty()) return value;
  if (const auto problem = SocketPathProblem(value); !problem.empty()) section.Fail(key, problem);
  return value;
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

std::string AbsolutePathProblem(std::string_view path) {
  if (path.empty() || path.front() != '/') return "must be an absolute path, got \"" + std::string(path) + "\"";
  if (path.find('\0') != std::string_view::npos) return "contains a NUL character";
  if (path.size() >= PATH_MAX) {
    return "is " + std::to_string(path.size()) + " bytes long, more than a path can be (" +
           std::to_string(PATH_MAX - 1) + ")";
  }
  std::size_t start = 0;
  while (start < path.size()) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    if (end - start > NAME_MAX) {
      return "has a component of " + std::to_string(end - start) + " bytes, more than a file name can be (" +
             std::to_string(NAME_MAX) + ")";
    }
    start = end + 1;
  }
  return "";
}

std::size_t MaxSocketPathBytes() { return sizeof(sockaddr_un::sun_path) - 1; }

std::string SocketPathProblem(std::string_view path) {
  if (auto problem = AbsolutePathProblem(path); !problem.empty()) return problem;
  if (path.size() > MaxSocketPathBytes()) {
    return "\"" + std::string(path) + "\" is " + std::to_string(path.size()) +
           " bytes long, too long for a unix socket path (" + std::to_string(MaxSocketPathBytes()) + " at most)";
  }
  return "";
}

namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

}  // namespace

std::string DnsSubdomainProblem(std::string_view name) {
  constexpr std::size_t kMax = 253;
  if (name.empty()) return "must not be empty";
  if (name.size() > kMax) return "is longer than " + std::to_string(kMax) + " characters";
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = std::min(name.find('.', start), name.size());
    const std::string_view label = name.substr(start, end - start);
    if (label.empty() || !IsLowerAlnum(label.front()) || !IsLowerAlnum(label.back()) ||
        !std::all_of(label.begin(), label.end(), [](char c) { return IsLowerAlnum(c) || c == '-'; })) {
      return "\"" + std::string(name) +
             "\" is not an RFC 1123 subdomain (lowercase letters, digits, '-' and '.', each dot-separated part "
             "starting and ending with a letter or digit)";
    }
    if (end == name.size()) return "";
    start = end + 1;
  }
}

std::string ExtendedResourceNameProblem(std::string_view name) {
  const std::string quoted = "\"" + std::string(name) + "\"";
  const auto slash = name.find('/');
  if (slash == std::string_view::npos || name.find('/', slash + 1) != std::string_view::npos) {
    return quoted + " is not an extended resource name (<domain>/<name>, e.g. nvidia.com/gpu)";
  }
  const std::string_view domain = name.substr(0, slash);
  const std::string_view base = name.substr(slash + 1);
  // The kubelet checks "requests.<domain>" (the quota name) as a subdomain.
  if (!DnsSubdomainProblem("requests." + std::string(domain)).empty()) {
    return quoted + ": the domain \"" + std::string(domain) + "\" is not an RFC 1123 subdomain";
  }
  if (domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") || name.starts_with("requests.")) {
    return quoted + " is in a namespace Kubernetes reserves";
  }
  constexpr std::size_t kMaxName = 63;
  if (base.empty() || base.size() > kMaxName || !IsAlnum(base.front()) || !IsAlnum(base.back()) ||
      !std::all_of(base.begin(), base.end(), [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; })) {
    return quoted + ": the name after the slash must be 1 to 63 characters of letters, digits, '-', '_' and '.', "
                    "starting and ending with a letter or digit";
  }
  return "";
}

}  // namespace gns
