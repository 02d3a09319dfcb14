#pragma once
// The ResourceSlice this node publishes for compute-domain.nvidia.com (WIRE-FACTS §4.2): one
// pool named after the node, one slice, owned by the Node object so it goes when the node goes
// (the object and the drift check are the DRA plugin core's, dra_plugin/slice.hpp).
// Under HostManagedIMEX the only device is channel-0 (seed 000 §7.1); without the gate the
// daemon device is listed too. Attributes follow the upstream plugin: domain-less names, which
// belong to the driver's domain, so DeviceClass CEL reads
// device.attributes["compute-domain.nvidia.com"].type == "channel" && ….id == 0.

#include "dra_plugin/slice.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::dra {

struct SliceInputs {
  std::string node_name;
  std::string node_uid;   // for the ownerReference; omitted when empty
  std::string clique_id;  // adds the "cliqueID" string attribute to channel-0 when set
  bool host_managed = true;
  int64_t generation = 1;
  ResourceApiVersion api_version = ResourceApiVersion::kV1;
};

// metadata.name we use: "<node>-compute-domain.nvidia.com".
std::string ResourceSliceName(std::string_view node_name);

// The devices of the slice (spec.devices).
nlohmann::json ChannelSliceDevices(std::string_view clique_id, bool host_managed, ResourceApiVersion version);

// The whole object, ready to POST or PUT (a PUT also needs metadata.resourceVersion).
nlohmann::json BuildResourceSlice(const SliceInputs& inputs);

// SliceNeedsUpdate (the drift check) is the core's: dra_plugin/slice.hpp.

}  // namespace gns::dra
