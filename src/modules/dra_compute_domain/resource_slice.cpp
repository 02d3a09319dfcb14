// The node's compute-domain ResourceSlice.
#include "modules/dra_compute_domain/resource_slice.hpp"

#include "dra_plugin/driver_paths.hpp"

#include <map>

namespace gns::dra {

namespace {

using nlohmann::json;

json Device(std::string_view name, std::string_view type, int64_t id, std::string_view clique_id,
            ResourceApiVersion version) {
  json attributes{{"type", {{"string", type}}}, {"id", {{"int", id}}}};
  // Lets workloads and DeviceClasses select nodes of one NVLink clique. A string attribute holds
  // at most 64 characters; "<uuid>.<uint32>" is at most 47.
  if (!clique_id.empty()) attributes["cliqueID"] = {{"string", clique_id}};
  if (version == ResourceApiVersion::kV1beta1) {
    return json{{"name", name}, {"basic", {{"attributes", std::move(attributes)}}}};
  }
  return json{{"name", name}, {"attributes", std::move(attributes)}};
}

const json* Find(const json& object, std::initializer_list<const char*> path) {
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
  const json* x = Find(a, path);
  const json* y = Find(b, path);
  if (x == nullptr || y == nullptr) return x == y;
  return *x == *y;
}

// A device's comparable part, whichever shape the version uses.
struct DeviceView {
  json attributes = json::object();
  json capacity = json::object();
};

DeviceView ViewOf(const json& device) {
  DeviceView view;
  const json* body = &device;
  if (const json* basic = Find(device, {"basic"}); basic != nullptr && basic->is_object()) body = basic;
  if (const json* attributes = Find(*body, {"attributes"}); attributes != nullptr && !attributes->is_null()) {
    view.attributes = *attributes;
  }
  if (const json* capacity = Find(*body, {"capacity"}); capacity != nullptr && !capacity->is_null()) {
    view.capacity = *capacity;
  }
  return view;
}

std::map<std::string, DeviceView> DevicesOf(const json& slice) {
  std::map<std::string, DeviceView> out;
  const json* devices = Find(slice, {"spec", "devices"});
  if (devices == nullptr || !devices->is_array()) return out;
  for (const json& device : *devices) {
    const json* name = Find(device, {"name"});
    if (name == nullptr || !name->is_string()) continue;
    out[name->get<std::string>()] = ViewOf(device);
  }
  return out;
}

bool OwnerMatches(const json& current, const json& desired) {
  const json* want = Find(desired, {"metadata", "ownerReferences"});
  if (want == nullptr || !want->is_array() || want->empty()) return true;
  const json* have = Find(current, {"metadata", "ownerReferences"});
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

std::string ResourceSliceName(std::string_view node_name) {
  return std::string(node_name) + "-" + std::string(kDriverName);
}

json BuildResourceSlice(const SliceInputs& inputs) {
  json devices = json::array();
  devices.push_back(Device(kChannelDeviceName, "channel", 0, inputs.clique_id, inputs.api_version));
  if (!inputs.host_managed) {
    // Driver-managed mode publishes the daemon device too; this build never prepares it.
    devices.push_back(Device(kDaemonDeviceName, "daemon", 0, {}, inputs.api_version));
  }
  json metadata{{"name", ResourceSliceName(inputs.node_name)}};
  if (!inputs.node_uid.empty()) {
    // Garbage-collected with the Node, as the upstream kubelet-plugin helper does.
    metadata["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                                {"kind", "Node"},
                                                {"name", inputs.node_name},
                                                {"uid", inputs.node_uid},
                                                {"controller", true}}});
  }
  return json{{"apiVersion", ApiVersionString(inputs.api_version)},
              {"kind", "ResourceSlice"},
              {"metadata", std::move(metadata)},
              {"spec",
               {{"driver", kDriverName},
                {"nodeName", inputs.node_name},
                {"pool", {{"name", inputs.node_name}, {"generation", inputs.generation}, {"resourceSliceCount", 1}}},
                {"devices", std::move(devices)}}}};
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
    if (it->second.attributes != view.attributes || it->second.capacity != view.capacity) return true;
  }
  return !OwnerMatches(current, desired);
}

}  // namespace gns::dra
