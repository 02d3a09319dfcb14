#include "modules/kube/json_reader.hpp"

#include <simdjson.h>

#include <memory>

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

}  // namespace

json ParseJson(std::string_view text, std::string* error) {
  if (text.size() > kSimdjsonMaxBytes) return ParseWithNlohmann(text, error);
  std::unique_ptr<simdjson::dom::parser> own;
  simdjson::dom::parser* parser = &LoopParser();
  if (text.size() > kRetainedJsonBytes) {
    own = std::make_unique<simdjson::dom::parser>(text.size());
    parser = own.get();
  }
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
