// Label and field selectors (see selectors.h).
#include "selectors.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <optional>

namespace gns::sim::api {
namespace {

bool ToUint(std::string_view text, std::uint64_t* out) {
  if (text.empty()) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool IsSpecial(char c) {
  return c == '!' || c == '=' || c == ',' || c == '(' || c == ')' || c == '<' || c == '>';
}

bool ValidKey(std::string_view key) {
  if (key.empty() || key.size() > 317) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/';
  });
}

bool ValidValue(std::string_view value) {
  if (value.size() > 63) return false;
  return std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}
  void SkipSpace() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ >= text_.size();
  }
  char Peek() {
    SkipSpace();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool Consume(std::string_view token) {
    SkipSpace();
    if (text_.substr(pos_, token.size()) == token) {
      pos_ += token.size();
      return true;
    }
    return false;
  }
  std::string Identifier() {
    SkipSpace();
    std::size_t start = pos_;
    while (pos_ < text_.size() && !IsSpace(text_[pos_]) && !IsSpecial(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  // An identifier without consuming it (for the in/notin keywords).
  std::string PeekIdentifier() {
    std::size_t saved = pos_;
    std::string id = Identifier();
    pos_ = saved;
    return id;
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

std::optional<std::string> LabelValue(const Json& obj, const std::string& key) {
  if (!obj.is_object()) return std::nullopt;
  auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return std::nullopt;
  auto labels = meta->find("labels");
  if (labels == meta->end() || !labels->is_object()) return std::nullopt;
  auto it = labels->find(key);
  if (it == labels->end()) return std::nullopt;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// The value of a dotted path, the way the real field selectors see it: "" when absent.
std::string FieldValue(const Json& obj, std::string_view path) {
  const Json* node = &obj;
  while (!path.empty()) {
    std::size_t dot = path.find('.');
    std::string part(path.substr(0, dot));
    path = dot == std::string_view::npos ? std::string_view{} : path.substr(dot + 1);
    if (!node->is_object()) return {};
    auto it = node->find(part);
    if (it == node->end()) return {};
    node = &*it;
  }
  if (node->is_string()) return node->get<std::string>();
  if (node->is_null()) return {};
  return node->dump();  // true/false and numbers print as the Go conversion does
}

struct FieldTable {
  std::string_view group;
  std::string_view resource;
  std::array<std::string_view, 12> fields;
};

// Field labels the real server supports per built-in resource (besides metadata.name and
// metadata.namespace). Built-ins not listed support only those two.
constexpr std::array kFieldTables = {
    FieldTable{"",
               "pods",
               {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
                "status.podIPs", "status.nominatedNodeName"}},
    FieldTable{"", "nodes", {"spec.unschedulable"}},
    FieldTable{"", "secrets", {"type"}},
    FieldTable{"", "namespaces", {"status.phase"}},
    FieldTable{"",
               "events",
               {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                "involvedObject.uid", "involvedObject.apiVersion",
                "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                "reportingComponent", "source", "type"}},
    FieldTable{"resource.k8s.io", "resourceslices", {"spec.nodeName", "spec.driver", "spec.pool.name"}},
};

}  // namespace

bool LabelSelector::Parse(std::string_view text, std::string* error) {
  requirements_.clear();
  Lexer lex(text);
  auto fail = [&](std::string message) {
    *error = "unable to parse requirement: " + message;
    return false;
  };
  while (!lex.AtEnd()) {
    Requirement req;
    if (lex.Consume("!")) {
      req.key = lex.Identifier();
      req.op = Op::kDoesNotExist;
      if (!ValidKey(req.key)) return fail("invalid label key: \"" + req.key + "\"");
    } else {
      req.key = lex.Identifier();
      if (!ValidKey(req.key)) return fail("invalid label key: \"" + req.key + "\"");
      char next = lex.Peek();
      if (next == '\0' || next == ',') {
        req.op = Op::kExists;
      } else if (lex.Consume("==") || lex.Consume("=")) {
        req.op = Op::kEquals;
      } else if (lex.Consume("!=")) {
        req.op = Op::kNotEquals;
      } else if (lex.Consume(">")) {
        req.op = Op::kGreater;
      } else if (lex.Consume("<")) {
        req.op = Op::kLess;
      } else {
        std::string word = lex.PeekIdentifier();
        if (word == "in" || word == "notin") {
          lex.Identifier();
          req.op = word == "in" ? Op::kIn : Op::kNotIn;
        } else {
          return fail("found '" + word + "', expected: in, notin, =, ==, !=, gt, lt");
        }
      }
      if (req.op == Op::kIn || req.op == Op::kNotIn) {
        if (!lex.Consume("(")) return fail("found '" + lex.PeekIdentifier() + "', expected: '('");
        for (;;) {
          std::string value = lex.Identifier();
          if (!ValidValue(value)) return fail("invalid label value: \"" + value + "\"");
          req.values.push_back(value);
          if (lex.Consume(")")) break;
          if (!lex.Consume(",")) return fail("expected ',' or ')' in a value set");
        }
      } else if (req.op != Op::kExists) {
        std::string value = lex.Identifier();
        if (!ValidValue(value)) return fail("invalid label value: \"" + value + "\"");
        if ((req.op == Op::kGreater || req.op == Op::kLess) && !ParseUint(value).has_value()) {
          return fail("for 'gt', 'lt' operators, exactly one integer value is required");
        }
        req.values.push_back(value);
      }
    }
    requirements_.push_back(std::move(req));
    if (lex.AtEnd()) break;
    if (!lex.Consume(",")) return fail("found '" + lex.PeekIdentifier() + "', expected: ',' or 'end of string'");
    if (lex.AtEnd()) return fail("found 'end of string', expected: identifier");
  }
  return true;
}

bool LabelSelector::Matches(const Json& obj) const {
  for (const auto& req : requirements_) {
    auto value = LabelValue(obj, req.key);
    auto in_values = [&] {
      return value && std::find(req.values.begin(), req.values.end(), *value) != req.values.end();
    };
    bool ok = false;
    switch (req.op) {
      case Op::kEquals: ok = value && *value == req.values.front(); break;
      case Op::kNotEquals: ok = !value || *value != req.values.front(); break;
      case Op::kIn: ok = in_values(); break;
      case Op::kNotIn: ok = !in_values(); break;
      case Op::kExists: ok = value.has_value(); break;
      case Op::kDoesNotExist: ok = !value.has_value(); break;
      case Op::kGreater:
      case Op::kLess: {
        // Plain integers: g++ 12 -O1 reports a maybe-uninitialized std::optional here.
        std::uint64_t have = 0;
        std::uint64_t want = 0;
        if (!value || !ToUint(*value, &have) || !ToUint(req.values.front(), &want)) break;
        ok = req.op == Op::kGreater ? have > want : have < want;
        break;
      }
    }
    if (!ok) return false;
  }
  return true;
}

bool FieldSelector::Parse(std::string_view text, std::string* error) {
  terms_.clear();
  // Split on unescaped commas, then each term on its first unescaped operator.
  std::vector<std::string> raw_terms;
  std::string current;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      current.push_back(text[i]);
      current.push_back(text[++i]);
    } else if (text[i] == ',') {
      raw_terms.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(text[i]);
    }
  }
  if (!current.empty() || !raw_terms.empty()) raw_terms.push_back(std::move(current));
  for (const auto& raw : raw_terms) {
    if (raw.empty()) continue;
    std::size_t op_pos = std::string::npos;
    std::size_t op_len = 0;
    bool equals = true;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\') {
        ++i;
        continue;
      }
      if (raw.compare(i, 2, "!=") == 0) {
        op_pos = i, op_len = 2, equals = false;
      } else if (raw.compare(i, 2, "==") == 0) {
        op_pos = i, op_len = 2;
      } else if (raw[i] == '=') {
        op_pos = i, op_len = 1;
      }
      if (op_pos != std::string::npos) break;
    }
    if (op_pos == std::string::npos || op_pos == 0) {
      *error = "invalid selector: '" + std::string(text) + "'; can't understand '" + raw + "'";
      return false;
    }
    auto unescape = [](std::string_view in) {
      std::string out;
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i] == '\\' && i + 1 < in.size()) ++i;
        out.push_back(in[i]);
      }
      return out;
    };
    terms_.push_back({unescape(std::string_view(raw).substr(0, op_pos)), equals,
                      unescape(std::string_view(raw).substr(op_pos + op_len))});
  }
  return true;
}

std::string FieldSelector::Unsupported(const ResourceKey& key) const {
  if (!IsBuiltinGroup(key.group)) return {};
  const FieldTable* table = nullptr;
  for (const auto& t : kFieldTables) {
    if (t.group == key.group && t.resource == key.resource) table = &t;
  }
  for (const auto& term : terms_) {
    if (term.field == "metadata.name" || term.field == "metadata.namespace") continue;
    if (table && std::find(table->fields.begin(), table->fields.end(), term.field) != table->fields.end()) {
      continue;
    }
    return term.field;
  }
  return {};
}

bool FieldSelector::Matches(const Json& obj) const {
  for (const auto& term : terms_) {
    bool same = FieldValue(obj, term.field) == term.value;
    if (same != term.equals) return false;
  }
  return true;
}

}  // namespace gns::sim::api
