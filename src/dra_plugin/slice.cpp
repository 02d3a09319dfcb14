// A DRA driver's ResourceSlice for its node.
#include "dra_plugin/slice.hpp"

#include <map>

namespace gns::dra {

namespace {

using nlohmann::json;

const json* FindAt(const json& object, std::initializer_list<const char*> path) {
  const json* node = &object;
  for (const char* key : path) {
    if (!node->is_object()) return nullptr;
    const auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

bool SameAt(const json& a, const json& b, std::initializer_list<const char*> path) {
  const json* x = FindAt(a, path);
  const json* y = FindAt(b, path);
  if (x == nullptr || y == nullptr) return x == y;
  return *x == *y;
}

// A device's comparable part, whichever shape the version uses.
struct DeviceView {
  json attributes = json::object();
  json capacity = json::object();
  json taints = json::array();  // as written: the order is ours and stable
};

DeviceView ViewOf(const json& device) {
  DeviceView view;
  const json* body = &device;
  if (const json* basic = FindAt(device, {"basic"}); basic != nullptr && basic->is_object()) body = basic;
  if (const json* attributes = FindAt(*body, {"attributes"}); attributes != nullptr && !attributes->is_null()) {
    view.attributes = *attributes;
  }
  if (const json* capacity = FindAt(*body, {"capacity"}); capacity != nullptr && !capacity->is_null()) {
    view.capacity = *capacity;
  }
  if (const json* taints = FindAt(*body, {"taints"}); taints != nullptr && taints->is_array()) view.taints = *taints;
  return view;
}

std::map<std::string, DeviceView> DevicesOf(const json& slice) {
  std::map<std::string, DeviceView> out;
  const json* devices = FindAt(slice, {"spec", "devices"});
  if (devices == nullptr || !devices->is_array()) return out;
  for (const json& device : *devices) {
    const json* name = FindAt(device, {"name"});
    if (name == nullptr || !name->is_string()) continue;
    out[name->get<std::string>()] = ViewOf(device);
  }
  return out;
}

bool OwnerMatches(const json& current, const json& desired) {
  const json* want = FindAt(desired, {"metadata", "ownerReferences"});
  if (want == nullptr || !want->is_array() || want->empty()) return true;
  const json* have = FindAt(current, {"metadata", "ownerReferences"});
  if (have == nullptr || !have->is_array()) return false;
  const json& w = want->front();
  for (const json& h : *have) {
    if (SameAt(h, w, {"apiVersion"}) && SameAt(h, w, {"kind"}) && SameAt(h, w, {"name"}) && SameAt(h, w, {"uid"})) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string_view ApiVersionString(ResourceApiVersion version) {
  switch (version) {
    case ResourceApiVersion::kV1:
      return "resource.k8s.io/v1";
    case ResourceApiVersion::kV1beta2:
      return "resource.k8s.io/v1beta2";
    case ResourceApiVersion::kV1beta1:
      return "resource.k8s.io/v1beta1";
  }
  return "resource.k8s.io/v1";
}

std::string_view ApiVersionOnly(ResourceApiVersion version) {
  const std::string_view full = ApiVersionString(version);
  return full.substr(full.find('/') + 1);
}

std::string SliceName(std::string_view node_name, std::string_view driver_name) {
  return std::string(node_name) + "-" + std::string(driver_name);
}

json SliceDevice(std::string_view name, json attributes, json capacity, ResourceApiVersion version, json taints) {
  json body{{"attributes", std::move(attributes)}};
  if (capacity.is_object() && !capacity.empty()) body["capacity"] = std::move(capacity);
  if (taints.is_array() && !taints.empty()) body["taints"] = std::move(taints);
  if (version == ResourceApiVersion::kV1beta1) return json{{"name", name}, {"basic", std::move(body)}};
  body["name"] = name;
  return body;
}

json BuildSlice(const SliceSpec& spec) {
  json metadata{{"name", SliceName(spec.node_name, spec.driver_name)}};
  if (!spec.node_uid.empty()) {
    // Garbage-collected with the Node, as the upstream kubelet-plugin helper does.
    metadata["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                                {"kind", "Node"},
                                                {"name", spec.node_name},
                                                {"uid", spec.node_uid},
                                                {"controller", true}}});
  }
  return json{{"apiVersion", ApiVersionString(spec.api_version)},
              {"kind", "ResourceSlice"},
              {"metadata", std::move(metadata)},
              {"spec",
               {{"driver", spec.driver_name},
                {"nodeName", spec.node_name},
                {"pool", {{"name", spec.node_name}, {"generation", spec.generation}, {"resourceSliceCount", 1}}},
                {"devices", spec.devices.is_array() ? spec.devices : json::array()}}}};
}

bool SliceNeedsUpdate(const json& current, const json& desired) {
  if (!current.is_object()) return true;
  if (!SameAt(current, desired, {"spec", "driver"}) || !SameAt(current, desired, {"spec", "nodeName"}) ||
      !SameAt(current, desired, {"spec", "pool", "name"}) ||
      !SameAt(current, desired, {"spec", "pool", "resourceSliceCount"})) {
    return true;
  }
  const auto have = DevicesOf(current);
  const auto want = DevicesOf(desired);
  if (have.size() != want.size()) return true;
  for (const auto& [name, view] : want) {
    const auto it = have.find(name);
    if (it == have.end()) return true;
    if (it->second.attributes != view.attributes || it->second.capacity != view.capacity ||
        it->second.taints != view.taints) {
      return true;
    }
  }
  return !OwnerMatches(current, desired);
}

}  // namespace gns::dra
