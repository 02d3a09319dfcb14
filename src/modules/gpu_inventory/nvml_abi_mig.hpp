// The MIG (Multi-Instance GPU) slice of the NVML C ABI: MIG mode, MIG device handles, their
// GPU/compute instance ids and attributes. Included by nvml_abi.hpp, whose symbol table lists
// GNS_NVML_MIG_FUNCTIONS; kept in its own file so MIG additions merge apart from the rest.
//
// Checked against NVIDIA's nvml.h (NVML 12.x, as mirrored in go-nvml and third-party copies):
//   nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t, unsigned int *currentMode, unsigned int *pendingMode);
//   nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t, unsigned int *count);
//   nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t, unsigned int index, nvmlDevice_t *migDevice);
//   nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t, unsigned int *id);
//   nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t, unsigned int *id);
//   nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t, nvmlDeviceAttributes_t *attributes);
//   nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t, unsigned int id, nvmlGpuInstance_t *gpuInstance);
//   nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t, nvmlGpuInstanceInfo_t *info);
// nvmlDeviceGetMigDeviceHandleByIndex answers NOT_FOUND for an index with no MIG device (the
// slots are sparse); nvmlDeviceGetUUID on a MIG handle gives "MIG-<uuid>".
#pragma once
// Included by nvml_abi.hpp only (after Return and Device are declared).
#include <cstddef>

namespace gns::nvml {

// NVML_DEVICE_MIG_DISABLE / NVML_DEVICE_MIG_ENABLE.
inline constexpr unsigned int kDeviceMigDisable = 0;
inline constexpr unsigned int kDeviceMigEnable = 1;

// nvmlDeviceAttributes_t (the _v2 entry point fills all nine fields).
struct DeviceAttributes {
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
  unsigned int gpuInstanceSliceCount;
  unsigned int computeInstanceSliceCount;
  unsigned long long memorySizeMB;  // MiB
};
static_assert(sizeof(DeviceAttributes) == 40);
static_assert(offsetof(DeviceAttributes, gpuInstanceSliceCount) == 24);
static_assert(offsetof(DeviceAttributes, memorySizeMB) == 32);

// nvmlGpuInstance_t and nvmlGpuInstanceInfo_t (its parent device, id, profile id, and placement
// {start, size} in memory slices).
struct GpuInstanceOpaque;
using GpuInstance = GpuInstanceOpaque*;
struct GpuInstancePlacement {
  unsigned int start;
  unsigned int size;
};
struct GpuInstanceInfo {
  Device device;
  unsigned int id;
  unsigned int profileId;
  GpuInstancePlacement placement;
};
static_assert(sizeof(GpuInstanceInfo) == 24);
static_assert(offsetof(GpuInstanceInfo, placement) == 16);

extern "C" {
using DeviceGetMigModeFn = Return (*)(Device device, unsigned int* current_mode, unsigned int* pending_mode);
using DeviceGetMaxMigDeviceCountFn = Return (*)(Device device, unsigned int* count);
using DeviceGetMigDeviceHandleByIndexFn = Return (*)(Device device, unsigned int index, Device* mig_device);
using DeviceGetGpuInstanceIdFn = Return (*)(Device mig_device, unsigned int* id);
using DeviceGetComputeInstanceIdFn = Return (*)(Device mig_device, unsigned int* id);
using DeviceGetAttributesV2Fn = Return (*)(Device device, DeviceAttributes* attributes);
using DeviceGetGpuInstanceByIdFn = Return (*)(Device device, unsigned int id, GpuInstance* gpu_instance);
using GpuInstanceGetInfoFn = Return (*)(GpuInstance gpu_instance, GpuInstanceInfo* info);
}  // extern "C"

// X(symbol, FnType, required): all optional (drivers before R450 and GPUs without MIG).
#define GNS_NVML_MIG_FUNCTIONS(X)                                              \
  X(nvmlDeviceGetMigMode, DeviceGetMigModeFn, false)                           \
  X(nvmlDeviceGetMaxMigDeviceCount, DeviceGetMaxMigDeviceCountFn, false)       \
  X(nvmlDeviceGetMigDeviceHandleByIndex, DeviceGetMigDeviceHandleByIndexFn, false) \
  X(nvmlDeviceGetGpuInstanceId, DeviceGetGpuInstanceIdFn, false)               \
  X(nvmlDeviceGetComputeInstanceId, DeviceGetComputeInstanceIdFn, false)       \
  X(nvmlDeviceGetAttributes_v2, DeviceGetAttributesV2Fn, false)               \
  X(nvmlDeviceGetGpuInstanceById, DeviceGetGpuInstanceByIdFn, false)           \
  X(nvmlGpuInstanceGetInfo, GpuInstanceGetInfoFn, false)

}  // namespace gns::nvml
