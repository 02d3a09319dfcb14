// Label and field selectors with the grammar of k8s.io/apimachinery (labels.Parse,
// fields.ParseSelector), evaluated against JSON objects.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "resources.h"

namespace gns::sim::api {

class LabelSelector {
 public:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist, kGreater, kLess };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };

  // `=`, `==`, `!=`, `in (a,b)`, `notin (a,b)`, `key`, `!key`, `>`, `<`; comma-separated.
  // Returns false and sets *error on a syntax error. An empty selector matches everything.
  bool Parse(std::string_view text, std::string* error);
  bool Matches(const Json& obj) const;
  bool Empty() const { return requirements_.empty(); }

 private:
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  struct Term {
    std::string field;
    bool equals;  // false: !=
    std::string value;
  };

  // `field=value`, `field==value`, `field!=value`; comma-separated; `\` escapes , = ! and \.
  bool Parse(std::string_view text, std::string* error);
  // Fields a resource supports (metadata.name and metadata.namespace everywhere, plus a
  // per-resource table for built-ins; CRDs accept any path, as if declared selectable).
  // Returns the first unsupported field, or "".
  std::string Unsupported(const ResourceKey& key) const;
  bool Matches(const Json& obj) const;
  bool Empty() const { return terms_.empty(); }
  // Adds metadata.name=<name> (a watch on a named URL).
  void RequireName(std::string name) { terms_.push_back({"metadata.name", true, std::move(name)}); }

 private:
  std::vector<Term> terms_;
};

}  // namespace gns::sim::api
