#pragma once
// The ResourceSlice this node publishes for compute-domain.nvidia.com (WIRE-FACTS §4.2): one
// pool named after the node, one slice, owned by the Node object so it goes when the node goes.
// Under HostManagedIMEX the only device is channel-0 (seed 000 §7.1); without the gate the
// daemon device is listed too. Attributes follow the upstream plugin: domain-less names, which
// belong to the driver's domain, so DeviceClass CEL reads
// device.attributes["compute-domain.nvidia.com"].type == "channel" && ….id == 0.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::dra {

// resource.k8s.io versions we can write. v1 (GA in 1.34) and v1beta2 share the device shape;
// v1beta1 wraps each device's fields in `basic`.
enum class ResourceApiVersion { kV1, kV1beta2, kV1beta1 };
std::string_view ApiVersionString(ResourceApiVersion version);  // "resource.k8s.io/v1", …

struct SliceInputs {
  std::string node_name;
  std::string node_uid;   // for the ownerReference; omitted when empty
  std::string clique_id;  // adds the "cliqueID" string attribute to channel-0 when set
  bool host_managed = true;
  int64_t generation = 1;
  ResourceApiVersion api_version = ResourceApiVersion::kV1;
};

// metadata.name we use: "<node>-compute-domain.nvidia.com" (one slice per node and driver, so a
// fixed name lets the publisher create, then update by name).
std::string ResourceSliceName(std::string_view node_name);

// The whole object, ready to POST or PUT (a PUT also needs metadata.resourceVersion).
nlohmann::json BuildResourceSlice(const SliceInputs& inputs);

// True when `current` (as read from the API, possibly with server-side fields and defaults) does
// not carry what `desired` says: driver, nodeName, pool name and slice count, the device list
// (by name, with their attributes and capacity), or the owner reference. The pool generation is
// not compared: the publisher bumps it when it writes.
bool SliceNeedsUpdate(const nlohmann::json& current, const nlohmann::json& desired);

}  // namespace gns::dra
