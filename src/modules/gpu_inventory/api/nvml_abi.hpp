// Our own declarations of the slice of the NVML C ABI that gpu-node-supervisor uses: return
// codes, constants, struct layouts, function-pointer types and the versioned symbol names to
// resolve with dlsym() from libnvidia-ml.so.1. We never include NVIDIA's nvml.h and never link
// against the library: the daemon must start (and report "no NVML") on nodes without a driver.
//
// Everything here is matched byte for byte against NVIDIA's header, because the real library
// is dlopen'd on real GPUs with these layouts. Sources (see also WIRE-FACTS.md §8):
//   - NVIDIA/go-nvml pkg/nvml/nvml.h @075f45fd (NVML 12.2.140, NVIDIA's header as shipped):
//     return codes, buffer sizes, nvmlPciInfo_t, nvmlMemory_t/_v2_t, nvmlEventData_t, event
//     types, nvmlGpuFabricInfo_t, affinity scope, NVLink/event/system prototypes.
//   - Newer mirrored NVIDIA headers (third-party copies): nvmlGpuFabricInfo_v2_t/_v3_t and their
//     version tags 0x02000024 / 0x03000028, nvmlDeviceGetGpuFabricInfoV, nvmlDeviceGetNumaNodeId.
//   - The health readings (issue 26) from the same 12.2 header: ECC mode and counters
//     (nvmlMemoryErrorType_t, nvmlEccCounterType_t), nvmlRowRemapperHistogramValues_t,
//     nvmlPageRetirementCause_t, nvmlNvLinkErrorCounter_t, PCIe link and replay counter,
//     nvmlClocksThrottleReason* bits (renamed nvmlClocksEventReason* from 12.2 on, same values;
//     nvmlDeviceGetCurrentClocksEventReasons is the new name of
//     nvmlDeviceGetCurrentClocksThrottleReasons), temperature sensors and thresholds,
//     nvmlFieldValue_t / NVML_FI_DEV_MEMORY_TEMP (82), nvmlViolationTime_t and nvmlPerfPolicyType_t.
//   - NVLink throughput (issue 27): NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (138/139) and the
//     UINT_MAX "all links" scope, from the same 12.2 header (not in WIRE-FACTS yet).
//   - The usage readings (issue 27) from the same header: nvmlUtilization_t,
//     nvmlDeviceGetUtilizationRates, nvmlDeviceGetEncoder/DecoderUtilization, nvmlDeviceGetPowerUsage
//     (mW), nvmlDeviceGetTotalEnergyConsumption (mJ), nvmlClockType_t and nvmlDeviceGetClockInfo.
// The static_asserts at the bottom pin every size and offset the C ABI depends on (x86-64/arm64
// LP64).
//
// The fake library (tools/sim/fake_nvml) implements every function in GNS_NVML_FUNCTIONS and
// static_asserts its definitions against the types below, so the list, the types and the fake's
// exports cannot drift apart.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace gns::nvml {

// ---- Return codes (nvmlReturn_t is a C enum: 4 bytes, passed like an int) -------------------
using Return = int;

inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorAlreadyInitialized = 5;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorInsufficientPower = 8;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorTimeout = 10;
inline constexpr Return kErrorIrqIssue = 11;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorCorruptedInforom = 14;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorResetRequired = 16;
inline constexpr Return kErrorOperatingSystem = 17;
inline constexpr Return kErrorLibRmVersionMismatch = 18;
inline constexpr Return kErrorInUse = 19;
inline constexpr Return kErrorMemory = 20;
inline constexpr Return kErrorNoData = 21;
inline constexpr Return kErrorVgpuEccNotSupported = 22;
inline constexpr Return kErrorInsufficientResources = 23;
inline constexpr Return kErrorFreqNotSupported = 24;
// Returned by the *_v / V entry points when a struct's `version` field is not one they know.
inline constexpr Return kErrorArgumentVersionMismatch = 25;
inline constexpr Return kErrorDeprecated = 26;
inline constexpr Return kErrorNotReady = 27;
inline constexpr Return kErrorUnknown = 999;

// ---- Opaque handles --------------------------------------------------------------------------
// NVML hands out pointers to its own structs; only the pointer width matters to the ABI.
struct DeviceOpaque;
struct EventSetOpaque;
using Device = DeviceOpaque*;      // nvmlDevice_t
using EventSet = EventSetOpaque*;  // nvmlEventSet_t

// ---- Constants -------------------------------------------------------------------------------
inline constexpr unsigned int kInitFlagNoGpus = 1;    // NVML_INIT_FLAG_NO_GPUS
inline constexpr unsigned int kInitFlagNoAttach = 2;  // NVML_INIT_FLAG_NO_ATTACH

inline constexpr unsigned int kDeviceUuidBufferSize = 80;           // NVML_DEVICE_UUID_BUFFER_SIZE
inline constexpr unsigned int kDeviceUuidV2BufferSize = 96;         // ..._UUID_V2_BUFFER_SIZE
inline constexpr unsigned int kDeviceNameBufferSize = 64;           // ..._NAME_BUFFER_SIZE
inline constexpr unsigned int kDeviceNameV2BufferSize = 96;         // ..._NAME_V2_BUFFER_SIZE
inline constexpr unsigned int kSystemDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_...
inline constexpr unsigned int kDevicePciBusIdBufferSize = 32;       // ..._PCI_BUS_ID_BUFFER_SIZE
inline constexpr unsigned int kDevicePciBusIdBufferV2Size = 16;     // ..._PCI_BUS_ID_BUFFER_V2_SIZE

// NVML_NVLINK_MAX_LINKS: 18 since Hopper-era headers (12 in older ones). Query links
// 0..kNvLinkMaxLinks-1; a link the GPU does not have answers NOT_SUPPORTED/INVALID_ARGUMENT.
inline constexpr unsigned int kNvLinkMaxLinks = 18;

// nvmlEnableState_t (C enum).
using EnableState = int;
inline constexpr EnableState kFeatureDisabled = 0;
inline constexpr EnableState kFeatureEnabled = 1;

// nvmlAffinityScope_t: for nvmlDeviceGetMemoryAffinity / nvmlDeviceGetCpuAffinityWithinScope.
using AffinityScope = unsigned int;
inline constexpr AffinityScope kAffinityScopeNode = 0;
inline constexpr AffinityScope kAffinityScopeSocket = 1;

// Event types (nvmlEventType*), a 64-bit mask.
inline constexpr unsigned long long kEventTypeNone = 0x0000000000000000ULL;
inline constexpr unsigned long long kEventTypeSingleBitEccError = 0x0000000000000001ULL;
inline constexpr unsigned long long kEventTypeDoubleBitEccError = 0x0000000000000002ULL;
inline constexpr unsigned long long kEventTypePState = 0x0000000000000004ULL;
inline constexpr unsigned long long kEventTypeXidCriticalError = 0x0000000000000008ULL;
inline constexpr unsigned long long kEventTypeClock = 0x0000000000000010ULL;
inline constexpr unsigned long long kEventTypePowerSourceChange = 0x0000000000000080ULL;
inline constexpr unsigned long long kEventMigConfigChange = 0x0000000000000100ULL;

// EventData.eventData for an Xid whose number the driver could not decode.
inline constexpr unsigned long long kXidUnknown = 999;
// EventData.gpuInstanceId / computeInstanceId when the event is not attributable to a MIG
// instance (i.e. it concerns the whole GPU).
inline constexpr unsigned int kInstanceIdNone = 0xFFFFFFFFu;

// GPU fabric (NVLink multi-node / IMEX) state.
using GpuFabricState = unsigned char;  // nvmlGpuFabricState_t
inline constexpr GpuFabricState kGpuFabricStateNotSupported = 0;
inline constexpr GpuFabricState kGpuFabricStateNotStarted = 1;
inline constexpr GpuFabricState kGpuFabricStateInProgress = 2;
inline constexpr GpuFabricState kGpuFabricStateCompleted = 3;
inline constexpr std::size_t kGpuFabricUuidLen = 16;

// healthMask, degraded-bandwidth field (C3: mirrored headers only).
inline constexpr unsigned int kGpuFabricHealthMaskDegradedBwNotSupported = 0;
inline constexpr unsigned int kGpuFabricHealthMaskDegradedBwTrue = 1;
inline constexpr unsigned int kGpuFabricHealthMaskDegradedBwFalse = 2;
inline constexpr unsigned int kGpuFabricHealthMaskShiftDegradedBw = 0;
inline constexpr unsigned int kGpuFabricHealthMaskWidthDegradedBw = 0x11;

// ECC (nvmlMemoryErrorType_t, nvmlEccCounterType_t; C enums).
using MemoryErrorType = int;
inline constexpr MemoryErrorType kMemoryErrorTypeCorrected = 0;    // single-bit (SBE)
inline constexpr MemoryErrorType kMemoryErrorTypeUncorrected = 1;  // double-bit (DBE)
using EccCounterType = int;
inline constexpr EccCounterType kVolatileEcc = 0;   // since the driver loaded
inline constexpr EccCounterType kAggregateEcc = 1;  // over the GPU's life

// nvmlPageRetirementCause_t (C enum).
using PageRetirementCause = int;
inline constexpr PageRetirementCause kPageRetirementCauseMultipleSingleBitEccErrors = 0;
inline constexpr PageRetirementCause kPageRetirementCauseDoubleBitEccError = 1;

// nvmlNvLinkErrorCounter_t (C enum).
using NvLinkErrorCounter = int;
inline constexpr NvLinkErrorCounter kNvLinkErrorDlReplay = 0;
inline constexpr NvLinkErrorCounter kNvLinkErrorDlRecovery = 1;
inline constexpr NvLinkErrorCounter kNvLinkErrorDlCrcFlit = 2;
inline constexpr NvLinkErrorCounter kNvLinkErrorDlCrcData = 3;

// nvmlTemperatureSensors_t and nvmlTemperatureThresholds_t (C enums).
using TemperatureSensor = int;
inline constexpr TemperatureSensor kTemperatureGpu = 0;
using TemperatureThreshold = int;
inline constexpr TemperatureThreshold kTemperatureThresholdShutdown = 0;
inline constexpr TemperatureThreshold kTemperatureThresholdSlowdown = 1;
inline constexpr TemperatureThreshold kTemperatureThresholdMemMax = 2;
inline constexpr TemperatureThreshold kTemperatureThresholdGpuMax = 3;

// nvmlClockType_t (C enum) for nvmlDeviceGetClockInfo (current clocks, MHz).
using ClockType = int;
inline constexpr ClockType kClockGraphics = 0;
inline constexpr ClockType kClockSm = 1;
inline constexpr ClockType kClockMem = 2;
inline constexpr ClockType kClockVideo = 3;

// nvmlPerfPolicyType_t (C enum) for nvmlDeviceGetViolationStatus.
using PerfPolicyType = int;
inline constexpr PerfPolicyType kPerfPolicyPower = 0;
inline constexpr PerfPolicyType kPerfPolicyThermal = 1;

// Clock event (formerly "throttle") reasons, a 64-bit mask.
inline constexpr unsigned long long kClocksEventReasonGpuIdle = 0x0000000000000001ULL;
inline constexpr unsigned long long kClocksEventReasonApplicationsClocksSetting = 0x0000000000000002ULL;
inline constexpr unsigned long long kClocksEventReasonSwPowerCap = 0x0000000000000004ULL;
inline constexpr unsigned long long kClocksEventReasonHwSlowdown = 0x0000000000000008ULL;
inline constexpr unsigned long long kClocksEventReasonSyncBoost = 0x0000000000000010ULL;
inline constexpr unsigned long long kClocksEventReasonSwThermalSlowdown = 0x0000000000000020ULL;
inline constexpr unsigned long long kClocksEventReasonHwThermalSlowdown = 0x0000000000000040ULL;
inline constexpr unsigned long long kClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080ULL;
inline constexpr unsigned long long kClocksEventReasonDisplayClockSetting = 0x0000000000000100ULL;

// nvmlDeviceGetFieldValues: field ids (NVML_FI_*) and nvmlValueType_t (C enum).
inline constexpr unsigned int kFieldDevMemoryTemp = 82;  // NVML_FI_DEV_MEMORY_TEMP, degrees C
// NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID: the link number at the far end of the NVLink named by
// scopeId (an NVSwitch's port when the remote is a switch).
inline constexpr unsigned int kFieldDevNvLinkRemoteNvLinkId = 146;
// NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: NVLink data (payload, without protocol overhead)
// sent / received, in KiB, cumulative. scopeId = the link, or UINT_MAX for the sum over all links
// (the same 12.2 header; the older per-lane NVML_FI_DEV_NVLINK_BANDWIDTH_C0/C1_* fields are
// deprecated there in favour of these).
inline constexpr unsigned int kFieldDevNvLinkThroughputDataTx = 138;
inline constexpr unsigned int kFieldDevNvLinkThroughputDataRx = 139;
inline constexpr unsigned int kFieldScopeAllLinks = 0xFFFFFFFFu;  // UINT_MAX
using ValueType = int;
inline constexpr ValueType kValueTypeDouble = 0;
inline constexpr ValueType kValueTypeUnsignedInt = 1;
inline constexpr ValueType kValueTypeUnsignedLong = 2;
inline constexpr ValueType kValueTypeUnsignedLongLong = 3;
inline constexpr ValueType kValueTypeSignedLongLong = 4;
inline constexpr ValueType kValueTypeSignedInt = 5;
inline constexpr ValueType kValueTypeUnsignedShort = 6;

// ---- Structs ---------------------------------------------------------------------------------
// These mirror C structs, so they keep NVML's field names (easier to check against the header)
// instead of our member_ convention.

// nvmlPciInfo_t. busId is "%08X:%02X:%02X.0" (8-hex-digit domain, upper case); busIdLegacy is
// "%04X:%02X:%02X.0". pciDeviceId is (device id << 16) | vendor id.
struct PciInfo {
  char busIdLegacy[kDevicePciBusIdBufferV2Size];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[kDevicePciBusIdBufferSize];
};

// nvmlMemory_t (bytes).
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// nvmlMemory_v2_t: set version = kMemoryV2Version before the call; `used` includes `reserved`.
struct Memory_v2 {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};

// nvmlEventData_t (current layout, NVML >= 11; older headers ended after eventData).
struct EventData {
  Device device;
  unsigned long long eventType;
  unsigned long long eventData;  // the Xid for kEventTypeXidCriticalError, else 0
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

// nvmlGpuFabricInfo_t (v1, for nvmlDeviceGetGpuFabricInfo). The 12.2 header names cliqueId
// `partitionId` and types clusterUuid as char; the layout is the same. `status` is meaningful
// only when state == kGpuFabricStateCompleted.
struct GpuFabricInfo {
  unsigned char clusterUuid[kGpuFabricUuidLen];
  Return status;
  unsigned int cliqueId;
  GpuFabricState state;
};

// nvmlGpuFabricInfo_v2_t (for nvmlDeviceGetGpuFabricInfoV with version kGpuFabricInfoV2Version).
struct GpuFabricInfo_v2 {
  unsigned int version;
  unsigned char clusterUuid[kGpuFabricUuidLen];
  Return status;
  unsigned int cliqueId;
  GpuFabricState state;
  unsigned int healthMask;
};

// nvmlGpuFabricInfo_v3_t: v2 plus healthSummary.
struct GpuFabricInfo_v3 {
  unsigned int version;
  unsigned char clusterUuid[kGpuFabricUuidLen];
  Return status;
  unsigned int cliqueId;
  GpuFabricState state;
  unsigned int healthMask;
  unsigned char healthSummary;
};

// nvmlGpuFabricInfoV_t is "the newest version in the header you build against". We pass v3
// storage; a driver that only knows v2 answers kErrorArgumentVersionMismatch to the v3 tag, and
// the caller retries with kGpuFabricInfoV2Version in the same (larger) buffer.
using GpuFabricInfoV = GpuFabricInfo_v3;

// nvmlProcessInfo_t as the *_v3 process queries fill it (the header's nvmlProcessInfo_v2_t
// layout): one process with a context on the GPU.
struct ProcessInfo {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;      // 0xFFFFFFFF without MIG
  unsigned int computeInstanceId;  // 0xFFFFFFFF without MIG
};

// nvmlRowRemapperHistogramValues_t: memory banks by how many spare rows they have left.
struct RowRemapperHistogramValues {
  unsigned int max;
  unsigned int high;
  unsigned int partial;
  unsigned int low;
  unsigned int none;
};

// nvmlValue_t (a C union, 8 bytes).
union Value {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  signed int siVal;
  unsigned short usVal;
};

// nvmlFieldValue_t: the caller sets fieldId (and scopeId); NVML fills the rest, with a return
// code per field.
struct FieldValue {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;    // microseconds since 1970
  long long latencyUsec;
  ValueType valueType;
  Return nvmlReturn;
  Value value;
};

// nvmlUtilization_t: percent of the last sample period (1/6 s to 1 s, by product) in which a
// kernel ran (gpu) and in which device memory was read or written (memory).
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};

// nvmlViolationTime_t (nanoseconds).
struct ViolationTime {
  unsigned long long referenceTime;
  unsigned long long violationTime;
};

// NVML_STRUCT_VERSION(name, ver) = sizeof(nvml<name>_v<ver>_t) | (ver << 24).
constexpr unsigned int StructVersion(std::size_t size, unsigned int version) {
  return static_cast<unsigned int>(size) | (version << 24U);
}
inline constexpr unsigned int kMemoryV2Version = StructVersion(sizeof(Memory_v2), 2);
inline constexpr unsigned int kGpuFabricInfoV2Version = StructVersion(sizeof(GpuFabricInfo_v2), 2);
inline constexpr unsigned int kGpuFabricInfoV3Version = StructVersion(sizeof(GpuFabricInfo_v3), 3);

// ---- Layout checks (LP64) ---------------------------------------------------------------------
static_assert(sizeof(Return) == 4);
static_assert(sizeof(Device) == 8 && sizeof(EventSet) == 8);
static_assert(sizeof(PciInfo) == 68);
static_assert(offsetof(PciInfo, domain) == 16 && offsetof(PciInfo, pciSubSystemId) == 32);
static_assert(offsetof(PciInfo, busId) == 36);
static_assert(sizeof(Memory) == 24);
static_assert(sizeof(Memory_v2) == 40 && offsetof(Memory_v2, total) == 8);
static_assert(kMemoryV2Version == 0x02000028u);
static_assert(sizeof(EventData) == 32);
static_assert(offsetof(EventData, eventType) == 8 && offsetof(EventData, eventData) == 16);
static_assert(offsetof(EventData, gpuInstanceId) == 24 && offsetof(EventData, computeInstanceId) == 28);
static_assert(sizeof(GpuFabricInfo) == 28);
static_assert(offsetof(GpuFabricInfo, status) == 16 && offsetof(GpuFabricInfo, cliqueId) == 20);
static_assert(offsetof(GpuFabricInfo, state) == 24);
static_assert(sizeof(GpuFabricInfo_v2) == 36 && offsetof(GpuFabricInfo_v2, healthMask) == 32);
static_assert(sizeof(GpuFabricInfo_v3) == 40 && offsetof(GpuFabricInfo_v3, healthSummary) == 36);
static_assert(sizeof(ProcessInfo) == 24 && offsetof(ProcessInfo, usedGpuMemory) == 8);
static_assert(offsetof(ProcessInfo, gpuInstanceId) == 16 && offsetof(ProcessInfo, computeInstanceId) == 20);
static_assert(sizeof(RowRemapperHistogramValues) == 20);
static_assert(sizeof(Value) == 8);
static_assert(sizeof(FieldValue) == 40 && offsetof(FieldValue, timestamp) == 8);
static_assert(offsetof(FieldValue, latencyUsec) == 16 && offsetof(FieldValue, valueType) == 24);
static_assert(offsetof(FieldValue, nvmlReturn) == 28 && offsetof(FieldValue, value) == 32);
static_assert(sizeof(Utilization) == 8 && offsetof(Utilization, memory) == 4);
static_assert(sizeof(ViolationTime) == 16 && offsetof(ViolationTime, violationTime) == 8);
// The tags NVIDIA's headers print: the strongest check that the layouts above are right.
static_assert(kGpuFabricInfoV2Version == 0x02000024u);
static_assert(kGpuFabricInfoV3Version == 0x03000028u);

// ---- Function types (exact C ABI) --------------------------------------------------------------
extern "C" {
using InitFn = Return (*)();                      // nvmlInit_v2
using InitWithFlagsFn = Return (*)(unsigned int);  // nvmlInitWithFlags
using ShutdownFn = Return (*)();                  // nvmlShutdown
using ErrorStringFn = const char* (*)(Return);    // nvmlErrorString
using SystemGetDriverVersionFn = Return (*)(char* version, unsigned int length);
using SystemGetCudaDriverVersionFn = Return (*)(int* cuda_driver_version);  // e.g. 12040
using DeviceGetCudaComputeCapabilityFn = Return (*)(Device device, int* major, int* minor);
// nvmlBrandType_t: 2 Tesla, 14 NVIDIA (datacenter GPUs of Hopper and later), … (nvml.h).
using DeviceGetBrandFn = Return (*)(Device device, unsigned int* type);
using DeviceGetCountFn = Return (*)(unsigned int* device_count);
using DeviceGetHandleByIndexFn = Return (*)(unsigned int index, Device* device);
using DeviceGetHandleByUuidFn = Return (*)(const char* uuid, Device* device);
using DeviceGetHandleByPciBusIdFn = Return (*)(const char* pci_bus_id, Device* device);
using DeviceGetUuidFn = Return (*)(Device device, char* uuid, unsigned int length);
using DeviceGetNameFn = Return (*)(Device device, char* name, unsigned int length);
using DeviceGetPciInfoFn = Return (*)(Device device, PciInfo* pci);
using DeviceGetMinorNumberFn = Return (*)(Device device, unsigned int* minor_number);
using DeviceGetMemoryInfoFn = Return (*)(Device device, Memory* memory);
using DeviceGetMemoryInfoV2Fn = Return (*)(Device device, Memory_v2* memory);
// nodeSet: a bitmask of NUMA nodes, 64 per unsigned long, node_set_size words long.
using DeviceGetMemoryAffinityFn = Return (*)(Device device, unsigned int node_set_size,
                                             unsigned long* node_set, AffinityScope scope);
// Only meaningful where the GPU memory itself is a NUMA node (e.g. Grace Hopper); on x86 nodes
// use nvmlDeviceGetMemoryAffinity or sysfs instead.
using DeviceGetNumaNodeIdFn = Return (*)(Device device, unsigned int* node);
using DeviceGetNvLinkStateFn = Return (*)(Device device, unsigned int link, EnableState* is_active);
// pciSubSystemId is not filled by this call.
using DeviceGetNvLinkRemotePciInfoFn = Return (*)(Device device, unsigned int link, PciInfo* pci);
using DeviceGetGpuFabricInfoFn = Return (*)(Device device, GpuFabricInfo* info);
using DeviceGetGpuFabricInfoVFn = Return (*)(Device device, GpuFabricInfoV* info);
// GPU maintenance (resets): who holds the GPU, persistence mode, pending memory repairs.
// `info_count` is in/out: the array's size, then the number of processes
// (kErrorInsufficientSize with the needed count when the array is too small).
using DeviceGetComputeRunningProcessesFn = Return (*)(Device device, unsigned int* info_count, ProcessInfo* infos);
using DeviceGetPersistenceModeFn = Return (*)(Device device, EnableState* mode);
using DeviceSetPersistenceModeFn = Return (*)(Device device, EnableState mode);  // root only
using DeviceGetRetiredPagesPendingStatusFn = Return (*)(Device device, EnableState* is_pending);
using DeviceGetRemappedRowsFn = Return (*)(Device device, unsigned int* corrected_rows, unsigned int* uncorrected_rows,
                                           unsigned int* is_pending, unsigned int* failure_occurred);
// Health readings (issue 26).
using DeviceGetEccModeFn = Return (*)(Device device, EnableState* current, EnableState* pending);
using DeviceGetTotalEccErrorsFn = Return (*)(Device device, MemoryErrorType error_type, EccCounterType counter_type,
                                             unsigned long long* ecc_counts);
using DeviceGetRowRemapperHistogramFn = Return (*)(Device device, RowRemapperHistogramValues* values);
// page_count in/out: the array's size (0 with addresses = nullptr to ask for the count), then
// the number of pages retired for `cause` (kErrorInsufficientSize when the array is too small).
using DeviceGetRetiredPagesFn = Return (*)(Device device, PageRetirementCause cause, unsigned int* page_count,
                                           unsigned long long* addresses);
using DeviceGetNvLinkErrorCounterFn = Return (*)(Device device, unsigned int link, NvLinkErrorCounter counter,
                                                 unsigned long long* counter_value);
using DeviceGetPcieLinkValueFn = Return (*)(Device device, unsigned int* value);  // generation or width
using DeviceGetPcieReplayCounterFn = Return (*)(Device device, unsigned int* value);
using DeviceGetClocksEventReasonsFn = Return (*)(Device device, unsigned long long* reasons);
using DeviceGetTemperatureFn = Return (*)(Device device, TemperatureSensor sensor, unsigned int* temp);
using DeviceGetTemperatureThresholdFn = Return (*)(Device device, TemperatureThreshold threshold, unsigned int* temp);
using DeviceGetFieldValuesFn = Return (*)(Device device, int values_count, FieldValue* values);
using DeviceGetViolationStatusFn = Return (*)(Device device, PerfPolicyType policy, ViolationTime* time);
// Usage readings (issue 27, dcgm-exporter's default counters).
using DeviceGetUtilizationRatesFn = Return (*)(Device device, Utilization* utilization);
// Encoder / decoder: percent, and the sampling period it covers in microseconds.
using DeviceGetCodecUtilizationFn = Return (*)(Device device, unsigned int* utilization, unsigned int* sampling_period_us);
using DeviceGetPowerUsageFn = Return (*)(Device device, unsigned int* power_mw);                   // milliwatts
using DeviceGetTotalEnergyConsumptionFn = Return (*)(Device device, unsigned long long* energy_mj);  // since driver load
using DeviceGetClockInfoFn = Return (*)(Device device, ClockType type, unsigned int* clock_mhz);
using EventSetCreateFn = Return (*)(EventSet* set);
using DeviceGetSupportedEventTypesFn = Return (*)(Device device, unsigned long long* event_types);
using DeviceRegisterEventsFn = Return (*)(Device device, unsigned long long event_types, EventSet set);
using EventSetWaitFn = Return (*)(EventSet set, EventData* data, unsigned int timeout_ms);
using EventSetFreeFn = Return (*)(EventSet set);
}  // extern "C"

// ---- MIG (its own file, nvml_abi_mig.hpp) ---------------------------------------------------------
}  // namespace gns::nvml
#include "modules/gpu_inventory/nvml_abi_mig.hpp"
namespace gns::nvml {

// ---- Symbol table ------------------------------------------------------------------------------
// X(symbol, FnType, required). `symbol` is the versioned name the library exports (the header's
// unversioned macros such as nvmlInit map to these). `required` = present in every driver we
// support (R450+); the others appeared later and are resolved when present.
#define GNS_NVML_FUNCTIONS(X)                                                   \
  X(nvmlInit_v2, InitFn, true)                                                  \
  GNS_NVML_MIG_FUNCTIONS(X)                                                     \
  X(nvmlInitWithFlags, InitWithFlagsFn, false)                                  \
  X(nvmlShutdown, ShutdownFn, true)                                             \
  X(nvmlErrorString, ErrorStringFn, true)                                       \
  X(nvmlSystemGetDriverVersion, SystemGetDriverVersionFn, true)                 \
  X(nvmlSystemGetCudaDriverVersion_v2, SystemGetCudaDriverVersionFn, false)     \
  X(nvmlDeviceGetCount_v2, DeviceGetCountFn, true)                              \
  X(nvmlDeviceGetHandleByIndex_v2, DeviceGetHandleByIndexFn, true)              \
  X(nvmlDeviceGetHandleByUUID, DeviceGetHandleByUuidFn, true)                   \
  X(nvmlDeviceGetHandleByPciBusId_v2, DeviceGetHandleByPciBusIdFn, true)        \
  X(nvmlDeviceGetUUID, DeviceGetUuidFn, true)                                   \
  X(nvmlDeviceGetName, DeviceGetNameFn, true)                                   \
  X(nvmlDeviceGetPciInfo_v3, DeviceGetPciInfoFn, true)                          \
  X(nvmlDeviceGetMinorNumber, DeviceGetMinorNumberFn, true)                     \
  X(nvmlDeviceGetCudaComputeCapability, DeviceGetCudaComputeCapabilityFn, false) \
  X(nvmlDeviceGetBrand, DeviceGetBrandFn, false)                                \
  X(nvmlDeviceGetMemoryInfo, DeviceGetMemoryInfoFn, true)                       \
  X(nvmlDeviceGetMemoryInfo_v2, DeviceGetMemoryInfoV2Fn, false)                 \
  X(nvmlDeviceGetMemoryAffinity, DeviceGetMemoryAffinityFn, false)              \
  X(nvmlDeviceGetNumaNodeId, DeviceGetNumaNodeIdFn, false)                      \
  X(nvmlDeviceGetNvLinkState, DeviceGetNvLinkStateFn, true)                     \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, DeviceGetNvLinkRemotePciInfoFn, true)  \
  X(nvmlDeviceGetGpuFabricInfo, DeviceGetGpuFabricInfoFn, false)                \
  X(nvmlDeviceGetGpuFabricInfoV, DeviceGetGpuFabricInfoVFn, false)              \
  X(nvmlDeviceGetComputeRunningProcesses_v3, DeviceGetComputeRunningProcessesFn, false) \
  X(nvmlDeviceGetPersistenceMode, DeviceGetPersistenceModeFn, false)            \
  X(nvmlDeviceSetPersistenceMode, DeviceSetPersistenceModeFn, false)            \
  X(nvmlDeviceGetRetiredPagesPendingStatus, DeviceGetRetiredPagesPendingStatusFn, false) \
  X(nvmlDeviceGetRemappedRows, DeviceGetRemappedRowsFn, false)                  \
  X(nvmlDeviceGetEccMode, DeviceGetEccModeFn, false)                            \
  X(nvmlDeviceGetTotalEccErrors, DeviceGetTotalEccErrorsFn, false)              \
  X(nvmlDeviceGetRowRemapperHistogram, DeviceGetRowRemapperHistogramFn, false)  \
  X(nvmlDeviceGetRetiredPages, DeviceGetRetiredPagesFn, false)                  \
  X(nvmlDeviceGetNvLinkErrorCounter, DeviceGetNvLinkErrorCounterFn, false)      \
  X(nvmlDeviceGetCurrPcieLinkGeneration, DeviceGetPcieLinkValueFn, false)       \
  X(nvmlDeviceGetCurrPcieLinkWidth, DeviceGetPcieLinkValueFn, false)            \
  X(nvmlDeviceGetMaxPcieLinkGeneration, DeviceGetPcieLinkValueFn, false)        \
  X(nvmlDeviceGetMaxPcieLinkWidth, DeviceGetPcieLinkValueFn, false)             \
  X(nvmlDeviceGetPcieReplayCounter, DeviceGetPcieReplayCounterFn, false)        \
  X(nvmlDeviceGetCurrentClocksEventReasons, DeviceGetClocksEventReasonsFn, false) \
  X(nvmlDeviceGetCurrentClocksThrottleReasons, DeviceGetClocksEventReasonsFn, false) \
  X(nvmlDeviceGetTemperature, DeviceGetTemperatureFn, false)                    \
  X(nvmlDeviceGetTemperatureThreshold, DeviceGetTemperatureThresholdFn, false)  \
  X(nvmlDeviceGetFieldValues, DeviceGetFieldValuesFn, false)                    \
  X(nvmlDeviceGetViolationStatus, DeviceGetViolationStatusFn, false)            \
  X(nvmlDeviceGetUtilizationRates, DeviceGetUtilizationRatesFn, false)          \
  X(nvmlDeviceGetEncoderUtilization, DeviceGetCodecUtilizationFn, false)        \
  X(nvmlDeviceGetDecoderUtilization, DeviceGetCodecUtilizationFn, false)        \
  X(nvmlDeviceGetPowerUsage, DeviceGetPowerUsageFn, false)                      \
  X(nvmlDeviceGetTotalEnergyConsumption, DeviceGetTotalEnergyConsumptionFn, false) \
  X(nvmlDeviceGetClockInfo, DeviceGetClockInfoFn, false)                        \
  X(nvmlEventSetCreate, EventSetCreateFn, true)                                 \
  X(nvmlDeviceGetSupportedEventTypes, DeviceGetSupportedEventTypesFn, true)     \
  X(nvmlDeviceRegisterEvents, DeviceRegisterEventsFn, true)                     \
  X(nvmlEventSetWait_v2, EventSetWaitFn, true)                                  \
  X(nvmlEventSetFree, EventSetFreeFn, true)

// The library file to dlopen; go-nvml uses RTLD_LAZY | RTLD_GLOBAL.
inline constexpr const char* kLibraryName = "libnvidia-ml.so.1";

struct Symbol {
  std::string_view name;
  bool required;
};

#define GNS_NVML_SYMBOL_ENTRY(symbol, type, required) Symbol{#symbol, required},
inline constexpr Symbol kSymbols[] = {GNS_NVML_FUNCTIONS(GNS_NVML_SYMBOL_ENTRY)};
#undef GNS_NVML_SYMBOL_ENTRY

// Resolved entry points; a null member means the symbol is absent (optional ones only, once
// ResolveApi reported nothing missing).
struct Api {
#define GNS_NVML_API_MEMBER(symbol, type, required) type symbol = nullptr;
  GNS_NVML_FUNCTIONS(GNS_NVML_API_MEMBER)
#undef GNS_NVML_API_MEMBER
};

// Fills `api` through `lookup` (a callable `void*(const char* name)`, normally a dlsym wrapper)
// and returns the names of required symbols that were not found. Taking a callable keeps
// <dlfcn.h> out of this header and lets tests resolve against anything.
template <typename Lookup>
std::vector<std::string_view> ResolveApi(Api& api, Lookup&& lookup) {
  std::vector<std::string_view> missing;
#define GNS_NVML_RESOLVE(symbol, type, required)                          \
  api.symbol = reinterpret_cast<type>(lookup(#symbol));                    \
  if (api.symbol == nullptr && (required)) missing.emplace_back(#symbol);
  GNS_NVML_FUNCTIONS(GNS_NVML_RESOLVE)
#undef GNS_NVML_RESOLVE
  return missing;
}

}  // namespace gns::nvml
