#pragma once
// The ResourceSlice a DRA driver publishes for its node (WIRE-FACTS §4.2), for any driver: one
// pool named after the node, one slice named "<node>-<driver>", owned by the Node object so it
// goes when the node goes. The driver supplies its devices (SliceDevice builds each entry in the
// shape of the resource.k8s.io version written); this file builds the object around them and
// says whether a slice read back from the API still carries what the driver wants.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gns::dra {

// resource.k8s.io versions we can write. v1 (GA in 1.34) and v1beta2 share the device shape;
// v1beta1 wraps each device's fields in `basic`.
enum class ResourceApiVersion { kV1, kV1beta2, kV1beta1 };
std::string_view ApiVersionString(ResourceApiVersion version);  // "resource.k8s.io/v1", …
std::string_view ApiVersionOnly(ResourceApiVersion version);    // "v1", …

// metadata.name: "<node>-<driver>" (one slice per node and driver, so a fixed name lets the
// publisher create, then update by name).
std::string SliceName(std::string_view node_name, std::string_view driver_name);

// One entry of spec.devices. `attributes` and `capacity` are maps in the API's shape
// ({"type": {"string": "channel"}}, {"memory": {"value": "80Gi"}}); an empty or null capacity is
// left out. `taints` (KEP-5055, gate DRADeviceTaints): DeviceTaint objects
// ({"key", "value", "effect", "timeAdded"}, at most kMaxTaintsPerDevice), left out when empty.
nlohmann::json SliceDevice(std::string_view name, nlohmann::json attributes, nlohmann::json capacity,
                           ResourceApiVersion version, nlohmann::json taints = nlohmann::json::array());

// The API's limits (WIRE-FACTS §4.2): a device holds at most 16 taints; a slice in which any
// device has taints holds at most 64 devices (128 otherwise).
inline constexpr std::size_t kMaxTaintsPerDevice = 16;
inline constexpr std::size_t kMaxDevicesWithTaints = 64;

struct SliceSpec {
  std::string driver_name;
  std::string node_name;
  std::string node_uid;  // for the ownerReference; omitted when empty
  int64_t generation = 1;
  ResourceApiVersion api_version = ResourceApiVersion::kV1;
  nlohmann::json devices = nlohmann::json::array();  // SliceDevice entries
};

// The whole object, ready to POST or PUT (a PUT also needs metadata.resourceVersion).
nlohmann::json BuildSlice(const SliceSpec& spec);

// True when `current` (as read from the API, possibly with server-side fields and defaults) does
// not carry what `desired` says: driver, nodeName, pool name and slice count, the device list
// (by name, with their attributes, capacity and taints), or the owner reference. The pool generation is
// not compared: the publisher bumps it when it writes.
bool SliceNeedsUpdate(const nlohmann::json& current, const nlohmann::json& desired);

}  // namespace gns::dra
