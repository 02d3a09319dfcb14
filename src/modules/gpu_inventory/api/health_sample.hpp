#pragma once
// What NVML says of each GPU's health, as plain values: the readings gpu-health's checks judge
// (ECC, row remapping, retired pages, NVLink, fabric, PCIe, clock events, temperatures, power
// violations, persistence mode). gpu-inventory owns NVML and reads; gpu-health owns the
// schedule, the thresholds and the verdict. A reading NVML cannot give (NOT_SUPPORTED, a
// function this driver lacks, an error) is left empty: a check with nothing to judge says
// nothing, it never invents a value.
//
// The service (`GpuHealthSampler`, found through the module context's services while
// gpu-inventory runs) reads on the blocking pool, all GPUs in one pass, and answers on the loop.
// Every pass has a deadline: a pass that does not finish in time (an NVML call that hangs, as
// DCGM-style stalls do) is answered with ok = false and the reason, and gpu-inventory marks the
// inventory unavailable; a hung pass is never joined by a second one (the next request is
// answered at once with the same reason until the hung pass returns).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

// Which readings a pass takes; gpu-health asks for the groups whose interval is due.
enum HealthGroup : uint32_t {
  kHealthMemory = 1u << 0,   // ECC counters, row remapping, retired pages
  kHealthNvLink = 1u << 1,   // link states and error counters
  kHealthFabric = 1u << 2,   // nvmlDeviceGetGpuFabricInfoV
  kHealthPcie = 1u << 3,     // link generation/width, replay counter
  kHealthThermal = 1u << 4,  // clock event reasons, temperatures, thresholds, violations
  kHealthHost = 1u << 5,     // persistence mode
  // Not health but usage, read by the same pass for the dcgm-exporter compatible series (the
  // metrics module's gpuMetrics): utilization, frame buffer, power, energy, clocks, and the
  // frame buffer of each MIG device.
  kHealthUsage = 1u << 6,
  kHealthAll = (1u << 7) - 1,
};

struct EccCounts {
  std::optional<uint64_t> corrected_volatile;     // SBE since the driver loaded
  std::optional<uint64_t> uncorrected_volatile;   // DBE since the driver loaded
  std::optional<uint64_t> corrected_aggregate;    // SBE over the GPU's life
  std::optional<uint64_t> uncorrected_aggregate;  // DBE over the GPU's life
};

// nvmlDeviceGetRemappedRows (Ampere and later).
struct RemappedRows {
  uint32_t corrected = 0;    // rows remapped for correctable errors
  uint32_t uncorrected = 0;  // rows remapped for uncorrectable errors
  bool pending = false;      // a remap waits for a GPU reset
  bool failed = false;       // a remap failed: no spare row was left
};

// nvmlDeviceGetRowRemapperHistogram: banks by how many spare rows they have left.
struct RowRemapHistogram {
  uint32_t max = 0, high = 0, partial = 0, low = 0, none = 0;
};

// nvmlDeviceGetRetiredPages* (before Ampere).
struct RetiredPages {
  uint32_t single_bit = 0;  // pages retired for multiple SBEs
  uint32_t double_bit = 0;  // pages retired for a DBE
  bool pending = false;     // a retirement waits for a reboot / driver reload
};

// One NVLink the GPU has. Counters are cumulative since the driver loaded (gpu-health turns them
// into rates).
struct NvLinkReading {
  uint32_t link = 0;
  bool active = false;  // nvmlDeviceGetNvLinkState
  std::optional<uint64_t> replay;     // NVML_NVLINK_ERROR_DL_REPLAY
  std::optional<uint64_t> recovery;   // NVML_NVLINK_ERROR_DL_RECOVERY
  std::optional<uint64_t> crc_flit;   // NVML_NVLINK_ERROR_DL_CRC_FLIT
  std::optional<uint64_t> crc_data;   // NVML_NVLINK_ERROR_DL_CRC_DATA
};

// nvmlDeviceGetGpuFabricInfoV.
struct FabricReading {
  uint8_t state = 0;         // nvmlGpuFabricState_t: 0 not supported … 3 completed
  int32_t status = 0;        // nvmlReturn_t of the registration, meaningful when completed
  uint32_t health_mask = 0;  // NVML_GPU_FABRIC_HEALTH_MASK_* bits
  uint32_t clique_id = 0;
  std::string cluster_uuid;  // empty when not registered
};

struct PcieReading {
  std::optional<uint32_t> generation;      // current
  std::optional<uint32_t> width;           // current lanes
  std::optional<uint32_t> max_generation;  // what this GPU and slot can do
  std::optional<uint32_t> max_width;
  std::optional<uint32_t> replay_counter;  // cumulative
};

struct ThermalReading {
  std::optional<uint64_t> clock_event_reasons;  // nvmlClocksEventReason* bits, current
  std::optional<uint32_t> gpu_temperature_c;
  std::optional<uint32_t> slowdown_threshold_c;  // NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
  std::optional<uint32_t> shutdown_threshold_c;  // NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
  std::optional<uint32_t> memory_temperature_c;  // NVML_FI_DEV_MEMORY_TEMP
  std::optional<uint32_t> memory_max_c;          // NVML_TEMPERATURE_THRESHOLD_MEM_MAX
  std::optional<uint64_t> power_violation_ns;    // nvmlDeviceGetViolationStatus(POWER), cumulative
  std::optional<uint64_t> thermal_violation_ns;  // nvmlDeviceGetViolationStatus(THERMAL), cumulative
};

// kHealthUsage: what dcgm-exporter's default counters show of a GPU's use.
struct UsageReading {
  std::optional<uint32_t> gpu_util_percent;     // nvmlDeviceGetUtilizationRates .gpu
  std::optional<uint32_t> memory_util_percent;  // .memory (DCGM_FI_DEV_MEM_COPY_UTIL)
  std::optional<uint32_t> encoder_util_percent;
  std::optional<uint32_t> decoder_util_percent;
  std::optional<uint64_t> fb_used_bytes;  // nvmlDeviceGetMemoryInfo_v2 where present, else v1
  std::optional<uint64_t> fb_free_bytes;
  std::optional<uint32_t> power_mw;
  std::optional<uint64_t> energy_mj;  // since the driver loaded
  std::optional<uint32_t> sm_clock_mhz;
  std::optional<uint32_t> mem_clock_mhz;
  // NVLink data sent and received over all links, KiB since the driver loaded
  // (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, scope all links). Not read on a GPU whose
  // NVLink group answered "no links" in the same pass; absent where NVML does not answer them.
  std::optional<uint64_t> nvlink_data_tx_kib;
  std::optional<uint64_t> nvlink_data_rx_kib;
};

// One MIG device of a MIG-enabled GPU (kHealthUsage): NVML answers the frame buffer for a MIG
// handle; utilization, power and clocks are the parent GPU's.
struct MigUsageReading {
  std::string uuid;  // "MIG-…"
  uint32_t gpu_instance = 0;
  uint32_t compute_instance = 0;
  std::optional<uint64_t> fb_used_bytes;
  std::optional<uint64_t> fb_free_bytes;
};

struct GpuHealthReading {
  std::string uuid;
  std::string pci_bus_id;  // as the inventory spells it
  uint32_t index = 0;
  // NVML_ERROR_GPU_IS_LOST from any call of this pass: the GPU has fallen off the bus as far as
  // the driver knows; the other readings are what was read before.
  bool lost = false;
  std::optional<bool> ecc_enabled;
  EccCounts ecc;
  std::optional<RemappedRows> remapped_rows;
  std::optional<RowRemapHistogram> remap_histogram;
  std::optional<RetiredPages> retired_pages;
  std::vector<NvLinkReading> nvlinks;  // the links this GPU has; empty on a GPU without NVLink
  std::optional<FabricReading> fabric;
  PcieReading pcie;
  ThermalReading thermal;
  std::optional<bool> persistence_mode;
  UsageReading usage;
  std::vector<MigUsageReading> mig_devices;  // kHealthUsage on a MIG-enabled GPU
  std::vector<std::string> failed_functions;  // NVML calls that failed other than NOT_SUPPORTED
};

struct HealthSample {
  bool ok = false;
  std::string error;     // why not ok: NVML unavailable, the pass ran past its deadline, …
  uint32_t groups = 0;   // HealthGroup bits this pass read
  int64_t taken_unix_ms = 0;
  int64_t pass_micros = 0;             // how long the pass took on the pool
  std::vector<GpuHealthReading> gpus;  // every GPU of the inventory but those out for a reset
  // PCI functions of NVIDIA GPUs (vendor 0x10de, display / 3D controller class) under the
  // host's /sys/bus/pci/devices, read in the same pass: more than NVML sees is a missing GPU.
  std::optional<uint32_t> pci_gpu_count;
  // Their PCI addresses as sysfs names them ("0000:3b:00.0"), sorted: what names a GPU NVML
  // does not list. Empty when pci_gpu_count is nullopt or 0.
  std::vector<std::string> pci_gpu_addresses;
};

// Provided by gpu-inventory while it runs (context.GetServices().Find<GpuHealthSampler>()).
class GpuHealthSampler {
 public:
  virtual ~GpuHealthSampler() = default;
  // Reads `groups` (HealthGroup bits) of every GPU on the pool; `done` runs on the loop, exactly
  // once, unless the sampler is withdrawn first (gpu-inventory stopped): then never.
  virtual void Sample(uint32_t groups, std::function<void(HealthSample)> done) = 0;
};

}  // namespace gns::gpu_inventory
