// Reading a GPU's fabric info through whichever entry point the driver has.
#include "modules/gpu_inventory/nvml_fabric.hpp"

#include <cstring>

namespace gns::gpu_inventory {

FabricQuery QueryFabric(const nvml::Api& api, nvml::Device device) {
  FabricQuery query;
  if (api.nvmlDeviceGetGpuFabricInfoV != nullptr) {
    query.function = "nvmlDeviceGetGpuFabricInfoV";
    query.info.version = nvml::kGpuFabricInfoV3Version;
    query.rc = api.nvmlDeviceGetGpuFabricInfoV(device, &query.info);
    if (query.rc == nvml::kErrorArgumentVersionMismatch) {
      // The v2 fields sit at the same offsets as v3's, so the same buffer reads both.
      query.info = {};
      query.info.version = nvml::kGpuFabricInfoV2Version;
      query.rc = api.nvmlDeviceGetGpuFabricInfoV(device, &query.info);
    }
    // Only a driver that knows neither version (or not the function behind the symbol) falls
    // back to v1; without v1 its answer stands.
    if (query.rc != nvml::kErrorArgumentVersionMismatch && query.rc != nvml::kErrorFunctionNotFound) return query;
    if (api.nvmlDeviceGetGpuFabricInfo == nullptr) return query;
  }
  if (api.nvmlDeviceGetGpuFabricInfo == nullptr) return query;  // a driver before fabric
  query.function = "nvmlDeviceGetGpuFabricInfo";
  nvml::GpuFabricInfo v1{};
  query.rc = api.nvmlDeviceGetGpuFabricInfo(device, &v1);
  query.info = {};
  if (query.rc == nvml::kSuccess) {
    std::memcpy(query.info.clusterUuid, v1.clusterUuid, sizeof(v1.clusterUuid));
    query.info.status = v1.status;
    query.info.cliqueId = v1.cliqueId;
    query.info.state = v1.state;
  }
  return query;
}

}  // namespace gns::gpu_inventory
