#pragma once
// Reading one field of an API object (nlohmann::json) without trusting its shape.

#include <nlohmann/json.hpp>

#include <string>

namespace gns {

// The string at JSON pointer `pointer` (e.g. "/metadata/uid") of `object`; empty when `object`
// is not an object, the path is missing, or the value is not a string.
inline std::string JsonStringAt(const nlohmann::json& object, const char* pointer) {
  if (!object.is_object()) return {};
  const nlohmann::json::json_pointer ptr(pointer);
  if (!object.contains(ptr)) return {};
  const auto& value = object.at(ptr);
  return value.is_string() ? value.get<std::string>() : std::string{};
}

}  // namespace gns
