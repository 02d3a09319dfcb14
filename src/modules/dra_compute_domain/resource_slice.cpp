// The node's compute-domain ResourceSlice.
#include "modules/dra_compute_domain/resource_slice.hpp"

#include "modules/dra_compute_domain/driver_paths.hpp"

namespace gns::dra {

namespace {

using nlohmann::json;

json Device(std::string_view name, std::string_view type, int64_t id, std::string_view clique_id,
            ResourceApiVersion version) {
  json attributes{{"type", {{"string", type}}}, {"id", {{"int", id}}}};
  // Lets workloads and DeviceClasses select nodes of one NVLink clique. A string attribute holds
  // at most 64 characters; "<uuid>.<uint32>" is at most 47.
  if (!clique_id.empty()) attributes["cliqueID"] = {{"string", clique_id}};
  return SliceDevice(name, std::move(attributes), json(), version);
}

}  // namespace

std::string ResourceSliceName(std::string_view node_name) { return SliceName(node_name, kDriverName); }

json ChannelSliceDevices(std::string_view clique_id, bool host_managed, ResourceApiVersion version) {
  json devices = json::array();
  devices.push_back(Device(kChannelDeviceName, "channel", 0, clique_id, version));
  if (!host_managed) {
    // Driver-managed mode publishes the daemon device too; this build never prepares it.
    devices.push_back(Device(kDaemonDeviceName, "daemon", 0, {}, version));
  }
  return devices;
}

json BuildResourceSlice(const SliceInputs& inputs) {
  SliceSpec spec;
  spec.driver_name = std::string(kDriverName);
  spec.node_name = inputs.node_name;
  spec.node_uid = inputs.node_uid;
  spec.generation = inputs.generation;
  spec.api_version = inputs.api_version;
  spec.devices = ChannelSliceDevices(inputs.clique_id, inputs.host_managed, inputs.api_version);
  return BuildSlice(spec);
}

}  // namespace gns::dra
