// Simplified server-side apply and YAML-to-JSON conversion (see apply.h).
#include "apply.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

namespace gns::sim::api {
namespace {

// ---- YAML

bool IsStringTag(const std::string& tag) {
  return tag == "!" || tag == "tag:yaml.org,2002:str" || tag == "!!str";
}

Json PlainScalar(const std::string& text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const char* digits = begin + ((text[0] == '-' || text[0] == '+') ? 1 : 0);
  if (digits < end && std::all_of(digits, end, [](char c) { return c >= '0' && c <= '9'; })) {
    std::int64_t value = 0;
    auto [ptr, ec] = std::from_chars(text[0] == '+' ? begin + 1 : begin, end, value);
    if (ec == std::errc() && ptr == end) return value;
    std::uint64_t big = 0;
    auto [ptr2, ec2] = std::from_chars(digits, end, big);
    if (ec2 == std::errc() && ptr2 == end && text[0] != '-') return big;
    return text;
  }
  // A float: digits, one dot and/or an exponent. Anything else stays a string.
  bool has_digit = false;
  bool ok = digits < end;
  for (const char* p = digits; p < end && ok; ++p) {
    char c = *p;
    if (c >= '0' && c <= '9') {
      has_digit = true;
    } else if (c != '.' && c != 'e' && c != 'E' && c != '-' && c != '+') {
      ok = false;
    }
  }
  if (ok && has_digit) {
    try {
      std::size_t used = 0;
      double value = std::stod(text, &used);
      if (used == text.size() && std::isfinite(value)) return value;
    } catch (const std::exception&) {
      // Not a number after all (e.g. "1.2.3"): keep the text.
    }
  }
  return text;
}

// Builds JSON straight from parser events. yaml-cpp's own LoadAll() can loop forever on
// some malformed input (e.g. a stray ',' at the start of a line: the parser keeps returning
// empty documents without consuming the token), so documents, depth and alias expansion
// are all capped here.
class JsonBuilder : public YAML::EventHandler {
 public:
  static constexpr int kMaxDepth = 512;

  // Without aliases a document has fewer nodes than bytes; aliases may multiply that by 10.
  explicit JsonBuilder(std::size_t input_size) : max_nodes_(10 * input_size + 10000) {}

  std::vector<Json> documents;

  void OnDocumentStart(const YAML::Mark&) override {
    stack_.clear();
    root_.reset();
  }
  void OnDocumentEnd() override {
    if (root_ && !root_->is_null()) documents.push_back(std::move(*root_));
    root_.reset();
  }
  void OnNull(const YAML::Mark&, YAML::anchor_t anchor) override { Add(nullptr, anchor); }
  void OnAlias(const YAML::Mark&, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) throw std::runtime_error("an alias refers to an unfinished or unknown anchor");
    // An alias costs as much as the node it copies: this stops "billion laughs" input.
    Count(it->second.nodes);
    Place(it->second.value, 0, it->second.nodes);
  }
  void OnScalar(const YAML::Mark&, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    Add(IsStringTag(tag) ? Json(value) : PlainScalar(value), anchor);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(Json::array(), anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(Json::object(), anchor);
  }
  void OnMapEnd() override { Close(); }

 private:
  struct Frame {
    Json value;
    YAML::anchor_t anchor;
    std::size_t nodes_at_open;
    std::optional<std::string> key;  // maps: the key waiting for its value
  };
  struct Anchored {
    Json value;
    std::size_t nodes;
  };

  void Count(std::size_t n) {
    nodes_ += n;
    if (nodes_ > max_nodes_) throw std::runtime_error("document too large (alias expansion?)");
  }
  void Open(Json empty, YAML::anchor_t anchor) {
    Count(1);
    if (stack_.size() >= kMaxDepth) throw std::runtime_error("document nested too deeply");
    if (!stack_.empty() && stack_.back().value.is_object() && !stack_.back().key) {
      throw std::runtime_error("a map key is not a scalar");
    }
    stack_.push_back(Frame{std::move(empty), anchor, nodes_, std::nullopt});
  }
  void Close() {
    if (stack_.empty()) throw std::runtime_error("unbalanced collection end");
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    Place(std::move(frame.value), frame.anchor, nodes_ - frame.nodes_at_open + 1);
  }
  void Add(Json value, YAML::anchor_t anchor) {
    Count(1);
    Place(std::move(value), anchor, 1);
  }
  void Place(Json value, YAML::anchor_t anchor, std::size_t nodes) {
    if (anchor != 0) anchors_[anchor] = Anchored{value, nodes};
    if (stack_.empty()) {
      root_ = std::move(value);
      return;
    }
    Frame& top = stack_.back();
    if (top.value.is_array()) {
      top.value.push_back(std::move(value));
    } else if (!top.key) {
      if (value.is_object() || value.is_array()) throw std::runtime_error("a map key is not a scalar");
      top.key = value.is_string() ? value.get<std::string>() : value.dump();
    } else {
      top.value[*top.key] = std::move(value);
      top.key.reset();
    }
  }

  std::vector<Frame> stack_;
  std::optional<Json> root_;
  std::map<YAML::anchor_t, Anchored> anchors_;
  std::size_t max_nodes_;
  std::size_t nodes_ = 0;
};

// ---- apply

// A field path is a list of FieldsV1 tokens: "f:<name>" for a map key, "k:<key JSON>" for the
// item of a list-map with those key field values. A path ending in a "k:" token stands for the
// item itself (FieldsV1 writes it as ".": {} beside the item's fields).
using Path = std::vector<std::string>;
using PathSet = std::set<Path>;

bool IsItem(const std::string& token) { return token.rfind("k:", 0) == 0; }

// The key token of a list-map item: its key fields in the schema's order, as the real server
// writes them ("k:{\"name\":\"a\"}").
std::string ItemToken(const Json& item, const std::vector<std::string>& keys) {
  Json key = Json::object();
  for (const auto& k : keys) key[k] = item.at(k);
  return "k:" + key.dump();
}

bool ItemMatches(const Json& item, const std::string& token) {
  if (!item.is_object()) return false;
  const Json key = Json::parse(token.substr(2), nullptr, false);
  if (!key.is_object()) return false;
  for (const auto& [k, v] : key.items()) {
    auto it = item.find(k);
    if (it == item.end() || *it != v) return false;
  }
  return true;
}

struct Collector {
  const ListMapKeys* list_maps;
  PathSet out;
  std::string invalid;

  // `schema_path` holds the field names only (list items do not count).
  void Collect(const Json& node, Path& prefix, std::vector<std::string>& schema_path) {
    if (node.is_object() && !node.empty()) {
      for (const auto& [key, value] : node.items()) {
        prefix.push_back("f:" + key);
        schema_path.push_back(key);
        Collect(value, prefix, schema_path);
        schema_path.pop_back();
        prefix.pop_back();
      }
      return;
    }
    const std::vector<std::string>* keys = nullptr;
    if (list_maps && node.is_array()) {
      auto it = list_maps->find(schema_path);
      if (it != list_maps->end()) keys = &it->second;
    }
    if (!keys) {
      out.insert(prefix);  // a scalar, an empty map, an atomic list
      return;
    }
    // A list-map: each item is owned on its own, by its key. An empty one owns nothing.
    std::set<std::string> seen;
    for (std::size_t i = 0; i < node.size(); ++i) {
      const Json& item = node[i];
      std::string where;
      for (const auto& part : schema_path) where += "." + part;
      where += "[" + std::to_string(i) + "]";
      if (!item.is_object()) {
        invalid = where + ": a list-map item must be an object";
        return;
      }
      for (const auto& k : *keys) {
        if (!item.contains(k) || item[k].is_null()) {
          invalid = where + "." + k + ": Required value: the key of a list-map item";
          return;
        }
      }
      const std::string token = ItemToken(item, *keys);
      if (!seen.insert(token).second) {
        invalid = where + ": Duplicate value: " + token.substr(2);
        return;
      }
      prefix.push_back(token);
      out.insert(prefix);
      Collect(item, prefix, schema_path);
      prefix.pop_back();
    }
  }
};

PathSet AppliedFields(const Json& applied, ApplyScope scope, const ListMapKeys* list_maps, std::string& invalid) {
  Collector c{list_maps, {}, {}};
  for (const auto& [key, value] : applied.items()) {
    if (key == "apiVersion" || key == "kind") continue;
    if (key == "metadata") {
      if (scope == ApplyScope::kStatus || !value.is_object()) continue;
      for (const auto& [meta_key, meta_value] : value.items()) {
        if ((meta_key == "labels" || meta_key == "annotations") && meta_value.is_object()) {
          for (const auto& [label, unused] : meta_value.items()) {
            c.out.insert({"f:metadata", "f:" + meta_key, "f:" + label});
          }
        } else if (meta_key == "finalizers" || meta_key == "ownerReferences") {
          c.out.insert({"f:metadata", "f:" + meta_key});
        }
      }
      continue;
    }
    bool is_status = key == "status";
    if (scope == ApplyScope::kStatus && !is_status) continue;
    if (scope == ApplyScope::kMainWithStatusSubresource && is_status) continue;
    Path prefix{"f:" + key};
    std::vector<std::string> schema_path{key};
    c.Collect(value, prefix, schema_path);
    if (!c.invalid.empty()) break;
  }
  invalid = c.invalid;
  return c.out;
}

Json EncodeFields(const PathSet& set) {
  Json root = Json::object();
  for (const auto& path : set) {
    Json* node = &root;
    for (const auto& part : path) {
      Json& child = (*node)[part];
      if (!child.is_object()) child = Json::object();
      node = &child;
    }
    if (!path.empty() && IsItem(path.back())) (*node)["."] = Json::object();
  }
  // An item with nothing owned inside keeps only its ".": write it as the real server does.
  return root;
}

void DecodeFields(const Json& node, Path& prefix, PathSet& out) {
  bool has_child = false;
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      if (key == ".") {
        if (!prefix.empty()) out.insert(prefix);
        continue;
      }
      if (key.rfind("f:", 0) != 0 && !IsItem(key)) continue;
      has_child = true;
      prefix.push_back(key);
      DecodeFields(value, prefix, out);
      prefix.pop_back();
    }
  }
  if (!has_child && !prefix.empty()) out.insert(prefix);
}

// The child of `node` for one token (nullptr when missing).
const Json* Child(const Json& node, const std::string& token) {
  if (IsItem(token)) {
    if (!node.is_array()) return nullptr;
    for (const auto& item : node) {
      if (ItemMatches(item, token)) return &item;
    }
    return nullptr;
  }
  if (!node.is_object()) return nullptr;
  auto it = node.find(token.substr(2));
  return it == node.end() ? nullptr : &*it;
}

const Json* At(const Json& root, const Path& path) {
  const Json* node = &root;
  for (const auto& part : path) {
    node = Child(*node, part);
    if (!node) return nullptr;
  }
  return node;
}

// The child for `token`, made when missing: a map key, or a list-map item appended with its
// key fields (the live order stays; new items go to the end, as the real merge does).
Json& MakeChild(Json& node, const std::string& token) {
  if (IsItem(token)) {
    if (!node.is_array()) node = Json::array();
    for (auto& item : node) {
      if (ItemMatches(item, token)) return item;
    }
    Json item = Json::parse(token.substr(2), nullptr, false);
    node.push_back(item.is_object() ? std::move(item) : Json::object());
    return node.back();
  }
  if (!node.is_object()) node = Json::object();
  return node[token.substr(2)];
}

void SetAt(Json& root, const Path& path, const Json& value) {
  Json* node = &root;
  for (const auto& part : path) node = &MakeChild(*node, part);
  // An item path only makes sure the item exists; its fields are paths of their own.
  if (!path.empty() && IsItem(path.back())) return;
  *node = value;
}

void EraseAt(Json& root, const Path& path) {
  if (path.empty()) return;
  std::vector<Json*> chain{&root};
  for (std::size_t i = 0; i + 1 < path.size(); ++i) {
    Json* next = const_cast<Json*>(Child(*chain.back(), path[i]));
    if (!next) return;
    chain.push_back(next);
  }
  Json& parent = *chain.back();
  const std::string& last = path.back();
  if (IsItem(last)) {
    if (!parent.is_array()) return;
    for (auto it = parent.begin(); it != parent.end(); ++it) {
      if (ItemMatches(*it, last)) {
        parent.erase(it);
        break;
      }
    }
    return;  // an emptied list stays (as an empty list)
  }
  if (!parent.is_object()) return;
  parent.erase(last.substr(2));
  // Drop maps the removal left empty, but never the top-level sections themselves
  // (metadata, spec, status) so the object keeps its shape, and never list-map items.
  for (std::size_t i = chain.size() - 1; i >= 2; --i) {
    if (!chain[i]->is_object() || !chain[i]->empty() || IsItem(path[i - 1])) break;
    chain[i - 1]->erase(path[i - 1].substr(2));
  }
}

bool IsPrefix(const Path& a, const Path& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

bool Overlaps(const Path& a, const PathSet& set) {
  return std::any_of(set.begin(), set.end(),
                     [&](const Path& b) { return IsPrefix(a, b) || IsPrefix(b, a); });
}

// ".spec.x", ".status.nodes[name=\"a\"].ipAddress": as the real server's conflict messages.
std::string Dotted(const Path& path) {
  std::string out;
  for (const auto& part : path) {
    if (!IsItem(part)) {
      out += "." + part.substr(2);
      continue;
    }
    const Json key = Json::parse(part.substr(2), nullptr, false);
    out += "[";
    bool first = true;
    for (const auto& [k, v] : key.items()) {
      out += (first ? "" : ",") + k + "=" + v.dump();
      first = false;
    }
    out += "]";
  }
  return out;
}

struct Owner {
  std::string manager;
  std::string subresource;
  auto operator<=>(const Owner&) const = default;
};

void CollectListMaps(const Json& schema, std::vector<std::string>& path, ListMapKeys& out) {
  if (!schema.is_object()) return;
  if (schema.value("x-kubernetes-list-type", "") == "map") {
    std::vector<std::string> keys;
    for (const auto& k : schema.value("x-kubernetes-list-map-keys", Json::array())) {
      if (k.is_string()) keys.push_back(k.get<std::string>());
    }
    if (!keys.empty()) out[path] = std::move(keys);
  }
  if (auto props = schema.find("properties"); props != schema.end() && props->is_object()) {
    for (const auto& [name, sub] : props->items()) {
      path.push_back(name);
      CollectListMaps(sub, path, out);
      path.pop_back();
    }
  }
  if (auto items = schema.find("items"); items != schema.end()) CollectListMaps(*items, path, out);
}

}  // namespace

ListMapKeys ListMapsFromSchema(const Json& open_api_v3_schema) {
  ListMapKeys out;
  std::vector<std::string> path;
  CollectListMaps(open_api_v3_schema, path, out);
  return out;
}

bool YamlToJson(std::string_view text, std::vector<Json>* documents, std::string* error) {
  try {
    std::istringstream stream{std::string(text)};
    YAML::Parser parser(stream);
    JsonBuilder builder(text.size());
    for (int calls = 0; parser.HandleNextDocument(builder); ++calls) {
      // Real input has a handful of documents; thousands mean the parser is stuck.
      if (calls >= 10000) throw std::runtime_error("too many documents (or a stuck parser)");
    }
    for (auto& document : builder.documents) documents->push_back(std::move(document));
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
  return true;
}

ApplyResult ApplyMerge(const ApplyRequest& request) {
  const Json& applied = *request.applied;
  ApplyResult result;
  if (request.current) {
    result.object = *request.current;
  } else {
    result.object = Json::object();
    result.object["metadata"] = Json::object();
  }
  Json& obj = result.object;
  if (!request.current) {
    // Identity is not a managed field, but a new object needs it.
    const Json& meta = applied.contains("metadata") ? applied["metadata"] : Json::object();
    for (const char* field : {"name", "namespace"}) {
      if (meta.is_object() && meta.contains(field)) obj["metadata"][field] = meta[field];
    }
  }
  obj["apiVersion"] = applied.value("apiVersion", obj.value("apiVersion", ""));
  obj["kind"] = applied.value("kind", obj.value("kind", ""));

  Owner me{request.manager, request.scope == ApplyScope::kStatus ? "status" : ""};
  std::map<Owner, PathSet> owners;
  std::map<Owner, Json> entries;  // the existing Apply entries (their time and apiVersion stay)
  Json other_entries = Json::array();  // managedFields entries that are not Apply
  if (request.current) {
    auto meta = request.current->find("metadata");
    if (meta != request.current->end() && meta->is_object()) {
      auto managed = meta->find("managedFields");
      if (managed != meta->end() && managed->is_array()) {
        for (const auto& entry : *managed) {
          // managedFields can be written by clients: read it defensively.
          auto text = [&](const char* key) {
            auto it = entry.find(key);
            return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
          };
          if (!entry.is_object() || text("operation") != "Apply" || text("manager").empty()) {
            other_entries.push_back(entry);
            continue;
          }
          Owner owner{text("manager"), text("subresource")};
          entries[owner] = entry;
          Path prefix;
          DecodeFields(entry.value("fieldsV1", Json::object()), prefix, owners[owner]);
        }
      }
    }
  }

  PathSet mine = AppliedFields(applied, request.scope, request.list_maps, result.invalid);
  if (!result.invalid.empty()) return result;
  PathSet previous = owners[me];
  for (const auto& path : previous) {
    if (mine.contains(path)) continue;
    // Kept while another manager owns it, or (a list-map item) anything inside it.
    bool shared = std::any_of(owners.begin(), owners.end(), [&](const auto& entry) {
      if (entry.first == me) return false;
      return std::any_of(entry.second.begin(), entry.second.end(),
                         [&](const Path& theirs) { return IsPrefix(path, theirs); });
    });
    if (!shared) EraseAt(obj, path);
  }
  for (const auto& path : mine) SetAt(obj, path, *At(applied, path));

  // A conflict: another apply manager owns an overlapping field whose value would change.
  const Json empty = Json::object();
  const Json& before = request.current ? *request.current : empty;
  for (auto& [owner, paths] : owners) {
    if (owner == me) continue;
    std::vector<Path> lost;
    for (const auto& path : paths) {
      // An item's own path is its existence, not a value: two managers may share an item.
      if (IsItem(path.back()) || !Overlaps(path, mine)) continue;
      const Json* old_value = At(before, path);
      const Json* new_value = At(obj, path);
      bool same = old_value && new_value && *old_value == *new_value;
      if (same) continue;
      result.conflicts.emplace_back(owner.manager, Dotted(path));
      lost.push_back(path);
    }
    if (request.force) {
      for (const auto& path : lost) paths.erase(path);
    }
  }
  if (!result.conflicts.empty() && !request.force) return result;
  if (request.force) result.conflicts.clear();

  owners[me] = std::move(mine);
  Json managed = Json::array();
  for (const auto& [owner, paths] : owners) {
    if (paths.empty()) continue;
    Json entry = owner == me || !entries.contains(owner) ? Json::object() : entries[owner];
    entry["manager"] = owner.manager;
    entry["operation"] = "Apply";
    if (owner == me || !entry.contains("apiVersion")) entry["apiVersion"] = request.api_version;
    if (owner == me || !entry.contains("time")) entry["time"] = request.now;
    entry["fieldsType"] = "FieldsV1";
    entry["fieldsV1"] = EncodeFields(paths);
    if (!owner.subresource.empty()) entry["subresource"] = owner.subresource;
    managed.push_back(std::move(entry));
  }
  for (auto& entry : other_entries) managed.push_back(std::move(entry));
  if (!obj["metadata"].is_object()) obj["metadata"] = Json::object();
  obj["metadata"]["managedFields"] = std::move(managed);
  return result;
}

}  // namespace gns::sim::api
