// A GPUReset's selector, checked (see reset_request.hpp).
#include "modules/gpu_reset/reset_request.hpp"

#include "loop/pci_address.hpp"

#include <algorithm>
#include <cctype>

namespace gns::gpu_reset {
namespace {

constexpr std::string_view kHowToSelect =
    "name the GPUs in uuids or pciBusIDs, or ask for every GPU of the node with all: true";

// What a value is, for a message: "a string", "an empty list", "null", …
std::string Kind(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::array: return value.empty() ? "an empty list" : "a list";
    case nlohmann::json::value_t::object: return value.empty() ? "an empty object" : "an object";
    default: return "a value of another kind";
  }
}

// A value quoted for a message, bounded.
std::string Shown(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// One of the lists: a non-empty list of strings each of which `valid` accepts.
struct ListSpec {
  const char* key;
  std::string_view item;  // "a GPU UUID (GPU-…)"
  std::string_view items;  // "GPU UUIDs"
  bool (*valid)(std::string_view);
};

bool ReadList(const nlohmann::json& selector, const ListSpec& spec, std::vector<std::string>& out, std::string& error) {
  const char* key = spec.key;
  const auto it = selector.find(key);
  if (it == selector.end()) return true;
  const std::string field = std::string("spec.selector.") + key;
  if (!it->is_array() || it->empty()) {
    error = field + ": expected a non-empty list of " + std::string(spec.items) + ", got " + Kind(*it);
    return false;
  }
  for (std::size_t i = 0; i < it->size(); ++i) {
    const auto& item = (*it)[i];
    if (!item.is_string() || !spec.valid(item.get_ref<const std::string&>())) {
      error = field + "[" + std::to_string(i) + "]: expected " + std::string(spec.item) + ", got " +
              (item.is_string() ? Shown(item) : Kind(item));
      return false;
    }
    out.push_back(item.get<std::string>());
  }
  return true;
}

bool LooksLikePciAddress(std::string_view text) { return ParsePciAddress(text).has_value(); }

}  // namespace

bool LooksLikeGpuUuid(std::string_view text) {
  if (text.size() < 8 || text.substr(0, 4) != "GPU-") return false;
  return std::all_of(text.begin() + 4, text.end(),
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == '-'; });
}

namespace {

GpuSelection Check(const nlohmann::json& spec) {
  GpuSelection out;
  const auto selector = spec.is_object() ? spec.find("selector") : spec.end();
  if (!spec.is_object() || selector == spec.end()) {
    out.error = "spec.selector: missing; " + std::string(kHowToSelect);
    return out;
  }
  if (!selector->is_object()) {
    out.error = "spec.selector: expected an object (uuids, pciBusIDs or all), got " + Kind(*selector);
    return out;
  }
  for (const auto& [key, value] : selector->items()) {
    if (key != "uuids" && key != "pciBusIDs" && key != "all") {
      out.error = "spec.selector." + key + ": unknown field (expected uuids, pciBusIDs or all)";
      return out;
    }
  }
  if (const auto all = selector->find("all"); all != selector->end()) {
    if (!all->is_boolean()) {
      out.error = "spec.selector.all: expected true or false, got " + Kind(*all);
      return out;
    }
    out.all = all->get<bool>();
  }
  static constexpr ListSpec kUuids{"uuids", "a GPU UUID (GPU-…)", "GPU UUIDs", LooksLikeGpuUuid};
  static constexpr ListSpec kPci{"pciBusIDs", "a PCI bus ID (0000:3b:00.0)", "PCI bus IDs", LooksLikePciAddress};
  if (!ReadList(*selector, kUuids, out.uuids, out.error) || !ReadList(*selector, kPci, out.pci_bus_ids, out.error)) {
    return out;
  }
  const bool named = !out.uuids.empty() || !out.pci_bus_ids.empty();
  if (out.all && named) {
    out.error = "spec.selector: all: true cannot be combined with uuids or pciBusIDs";
    return out;
  }
  if (!out.all && !named) {
    out.error = std::string(selector->empty() ? "spec.selector: is empty (a misspelt key such as uuid: arrives so, "
                                                "the schema drops it)"
                                              : "spec.selector: names no GPU (all: false, no uuids, no pciBusIDs)") +
                "; " + std::string(kHowToSelect);
    return out;
  }
  return out;
}

}  // namespace

GpuSelection ParseGpuSelector(const nlohmann::json& spec) {
  GpuSelection out = Check(spec);
  // An invalid request selects nothing, whatever was read before the problem.
  if (!out.error.empty()) out = GpuSelection{false, {}, {}, std::move(out.error)};
  return out;
}

}  // namespace gns::gpu_reset
