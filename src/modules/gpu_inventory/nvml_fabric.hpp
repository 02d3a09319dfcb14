#pragma once
// One way to read a GPU's fabric info, for the inventory (clique) and the health readings:
// nvmlDeviceGetGpuFabricInfoV with the v3 tag, then v2 (a driver that does not know v3 answers
// ARGUMENT_VERSION_MISMATCH), then the v1 function. Worker side (blocks).

#include "modules/gpu_inventory/api/nvml_abi.hpp"

namespace gns::gpu_inventory {

struct FabricQuery {
  nvml::Return rc = nvml::kErrorFunctionNotFound;
  const char* function = nullptr;  // the call that gave `rc`; nullptr when the driver has neither
  nvml::GpuFabricInfoV info{};     // on success; a v1 answer leaves healthMask and healthSummary 0
};

FabricQuery QueryFabric(const nvml::Api& api, nvml::Device device);

}  // namespace gns::gpu_inventory
