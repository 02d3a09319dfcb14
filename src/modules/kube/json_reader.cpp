#include "modules/kube/api/json_reader.hpp"

#include <simdjson.h>

#include <memory>
#include <optional>

namespace gns::kube {
namespace {

using nlohmann::json;

// Recursion is bounded: simdjson refuses documents nested deeper than its max depth (1024).
void Build(simdjson::dom::element element, json& out) {
  using Type = simdjson::dom::element_type;
  switch (element.type()) {
    case Type::OBJECT: {
      out = json::object();
      auto& object = out.get_ref<json::object_t&>();
      for (const auto field : simdjson::dom::object(element)) {
        // A duplicate key finds the earlier entry, which Build overwrites: the last one wins.
        auto it = object.emplace_hint(object.end(), std::piecewise_construct, std::forward_as_tuple(field.key),
                                      std::forward_as_tuple());
        Build(field.value, it->second);
      }
      return;
    }
    case Type::ARRAY: {
      out = json::array();
      auto& array = out.get_ref<json::array_t&>();
      const simdjson::dom::array items(element);
      array.reserve(items.size());
      for (const auto item : items) Build(item, array.emplace_back());
      return;
    }
    case Type::STRING:
      out = std::string(std::string_view(element));
      return;
    case Type::INT64: {
      const auto value = int64_t(element);
      if (value >= 0) {
        out = static_cast<uint64_t>(value);  // as nlohmann: non-negative integers are unsigned
      } else {
        out = value;
      }
      return;
    }
    case Type::UINT64:
      out = uint64_t(element);
      return;
    case Type::DOUBLE:
      out = double(element);
      return;
    case Type::BOOL:
      out = bool(element);
      return;
    case Type::NULL_VALUE:
      out = nullptr;
      return;
  }
}

// Builds what `node` keeps of `element` into `out`; false when nothing is kept (the caller
// leaves the member out).
bool BuildProjected(simdjson::dom::element element, const Projection::Node& node, json& out) {
  if (node.children.empty() || element.type() != simdjson::dom::element_type::OBJECT) {
    if (!node.keep_rest) return false;
    Build(element, out);
    return true;
  }
  out = json::object();
  auto& object = out.get_ref<json::object_t&>();
  for (const auto field : simdjson::dom::object(element)) {
    const auto child = node.children.find(field.key);
    if (child == node.children.end()) {
      if (!node.keep_rest) continue;
      auto it = object.emplace_hint(object.end(), std::piecewise_construct, std::forward_as_tuple(field.key),
                                    std::forward_as_tuple());
      Build(field.value, it->second);
      continue;
    }
    json value;
    if (BuildProjected(field.value, child->second, value)) object[std::string(field.key)] = std::move(value);
  }
  return true;
}

// In place: false when `value` is to be removed whole.
bool Prune(json& value, const Projection::Node& node) {
  if (node.children.empty() || !value.is_object()) return node.keep_rest;
  auto& object = value.get_ref<json::object_t&>();
  for (auto it = object.begin(); it != object.end();) {
    const auto child = node.children.find(it->first);
    const bool keep = child == node.children.end() ? node.keep_rest : Prune(it->second, child->second);
    it = keep ? std::next(it) : object.erase(it);
  }
  return true;
}

json ParseWithNlohmann(std::string_view text, std::string* error) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    if (error) *error = e.what();
    return json(json::value_t::discarded);
  }
}

simdjson::dom::parser& LoopParser() {
  // One per thread: informers all run on the loop thread, so this is in effect one parser.
  thread_local simdjson::dom::parser parser(kRetainedJsonBytes);
  return parser;
}

// The identity of a list item, from simdjson's index: nullopt when it has no string
// metadata.name and metadata.resourceVersion (the cache judges such an item, whole).
struct ItemIdentity {
  std::string_view name;
  std::string_view ns;
  std::string_view resource_version;
};

std::optional<ItemIdentity> IdentityOf(simdjson::dom::element item) {
  simdjson::dom::object meta;
  if (item["metadata"].get(meta) != simdjson::SUCCESS) return std::nullopt;
  ItemIdentity id;
  if (meta["name"].get(id.name) != simdjson::SUCCESS || id.name.empty()) return std::nullopt;
  if (meta["resourceVersion"].get(id.resource_version) != simdjson::SUCCESS || id.resource_version.empty()) {
    return std::nullopt;
  }
  // Absent (cluster-scoped) or not a string: no namespace, as ObjectMeta::From reads it.
  if (meta["namespace"].get(id.ns) != simdjson::SUCCESS) id.ns = {};
  return id;
}

void BuildListItems(simdjson::dom::array items, const Projection::Node& item_projection, const CachedFn& cached,
                    json& out) {
  out = json::array();
  auto& array = out.get_ref<json::array_t&>();
  array.reserve(items.size());
  std::string key;
  for (const auto item : items) {
    auto& built = array.emplace_back();
    if (item.type() != simdjson::dom::element_type::OBJECT) {
      Build(item, built);  // the cache reports it
      continue;
    }
    if (const auto id = IdentityOf(item); id && cached) {
      key.assign(id->ns);
      if (!key.empty()) key += '/';
      key += id->name;
      if (cached(key, id->resource_version)) {
        json meta = {{"name", std::string(id->name)}, {"resourceVersion", std::string(id->resource_version)}};
        if (!id->ns.empty()) meta["namespace"] = std::string(id->ns);
        built = {{"metadata", std::move(meta)}};
        continue;
      }
    }
    BuildProjected(item, item_projection, built);
  }
}

// The loop thread's parser for documents up to kRetainedJsonBytes; a parser of their own
// (in `own`, freed by the caller at once) for larger ones, so the retained one stays small.
simdjson::dom::parser* ParserFor(std::string_view text, std::unique_ptr<simdjson::dom::parser>& own) {
  if (text.size() <= kRetainedJsonBytes) return &LoopParser();
  own = std::make_unique<simdjson::dom::parser>(text.size());
  return own.get();
}

}  // namespace

Projection::Projection(const std::vector<std::string>& fields) {
  if (fields.empty()) {
    root_.keep_rest = true;
    auto& metadata = root_.children["metadata"];
    metadata.keep_rest = true;
    metadata.children["managedFields"];  // a leaf that keeps nothing
  } else {
    for (const char* identity : {"metadata.name", "metadata.namespace", "metadata.uid", "metadata.resourceVersion",
                                 "metadata.generation", "metadata.deletionTimestamp", "metadata.finalizers"}) {
      Add(identity);
    }
    for (const auto& field : fields) Add(field);
  }
  event_.keep_rest = true;
  event_.children["object"] = root_;
}

void Projection::Add(std::string_view path) {
  Node* node = &root_;
  while (!path.empty()) {
    if (node->keep_rest && node->children.empty()) return;  // already kept whole
    const auto dot = path.find('.');
    const auto name = path.substr(0, dot);
    node = &node->children[std::string(name)];
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  }
  node->children.clear();
  node->keep_rest = true;
}

void Projection::Apply(json& object) const { Prune(object, root_); }

json ParseJson(std::string_view text, const Projection::Node& projection, std::string* error) {
  if (text.size() > kRetainedJsonBytes) {
    json out = ParseJson(text, error);
    if (!out.is_discarded()) Prune(out, projection);
    return out;
  }
  simdjson::dom::element root;
  if (LoopParser().parse(text.data(), text.size()).get(root) != simdjson::SUCCESS) {
    json out = ParseWithNlohmann(text, error);
    if (!out.is_discarded()) Prune(out, projection);
    return out;
  }
  json out;
  if (!BuildProjected(root, projection, out)) out = json(json::value_t::discarded);
  return out;
}

json ParseListPage(std::string_view text, const Projection::Node& item_projection, const CachedFn& cached,
                   std::string* error) {
  std::unique_ptr<simdjson::dom::parser> own;
  simdjson::dom::parser* parser = ParserFor(text, own);
  simdjson::dom::element root;
  if (parser->parse(text.data(), text.size()).get(root) != simdjson::SUCCESS ||
      root.type() != simdjson::dom::element_type::OBJECT) {
    // nlohmann decides what is JSON (and words the error); the items are projected, none skipped.
    json out = ParseWithNlohmann(text, error);
    if (out.is_object()) {
      const auto items = out.find("items");
      if (items != out.end() && items->is_array()) {
        for (auto& item : *items) Prune(item, item_projection);
      }
    }
    return out;
  }
  json out = json::object();
  auto& object = out.get_ref<json::object_t&>();
  for (const auto field : simdjson::dom::object(root)) {
    auto it = object.emplace_hint(object.end(), std::piecewise_construct, std::forward_as_tuple(field.key),
                                  std::forward_as_tuple());
    if (field.key == "items" && field.value.type() == simdjson::dom::element_type::ARRAY) {
      BuildListItems(simdjson::dom::array(field.value), item_projection, cached, it->second);
    } else {
      Build(field.value, it->second);
    }
  }
  return out;
}

json ParseJson(std::string_view text, std::string* error) {
  if (text.size() > kSimdjsonMaxBytes) return ParseWithNlohmann(text, error);
  std::unique_ptr<simdjson::dom::parser> own;
  simdjson::dom::parser* parser = ParserFor(text, own);
  simdjson::dom::element root;
  if (parser->parse(text.data(), text.size()).get(root) != simdjson::SUCCESS) {
    // nlohmann decides: it accepts what simdjson cannot represent, and words the error.
    return ParseWithNlohmann(text, error);
  }
  json out;
  Build(root, out);
  return out;
}

}  // namespace gns::kube
