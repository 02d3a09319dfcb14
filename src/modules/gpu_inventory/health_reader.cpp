// The health readings (api/health_sample.hpp) of every GPU through NVML, in one blocking pass,
// and the count of NVIDIA GPUs on the PCI bus. Worker side: runs on the blocking pool (or in the
// CLI), never on the loop.
#include "modules/gpu_inventory/api/nvml_session.hpp"

#include "modules/gpu_inventory/clique.hpp"
#include "modules/gpu_inventory/nvml_fabric.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

namespace gns::gpu_inventory {

namespace {

class HealthReader {
 public:
  HealthReader(const NvmlLibrary& library, uint32_t groups, const ExcludedGpus& excluded,
               const std::vector<GpuInfo>& known)
      : library_(library), api_(library.Api()), groups_(groups), excluded_(excluded), known_(known) {}

  HealthSample Run(const std::string& host_root) {
    const auto started = std::chrono::steady_clock::now();
    HealthSample sample;
    sample.groups = groups_ & kHealthAll;
    sample.taken_unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    if (auto on_bus = ListPciGpus(host_root)) {
      sample.pci_gpu_count = static_cast<uint32_t>(on_bus->size());
      sample.pci_gpu_addresses = std::move(*on_bus);
    }
    unsigned int count = 0;
    const nvml::Return rc = api_.nvmlDeviceGetCount_v2(&count);
    if (rc != nvml::kSuccess) {
      sample.error = "nvmlDeviceGetCount_v2 failed: " + library_.Describe(rc);
    } else {
      sample.ok = true;
      for (unsigned int i = 0; i < count; ++i) {
        if (excluded_.count(i) != 0) continue;  // out for a reset: not touched at all
        GpuHealthReading gpu;
        if (ReadGpu(i, gpu)) sample.gpus.push_back(std::move(gpu));
      }
    }
    sample.pass_micros =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();
    return sample;
  }

 private:
  // Whether `rc` gave a value. NOT_SUPPORTED / FUNCTION_NOT_FOUND: no value, no error.
  static bool Ok(GpuHealthReading& gpu, const char* function, nvml::Return rc) {
    if (rc == nvml::kSuccess) return true;
    if (rc == nvml::kErrorNotSupported || rc == nvml::kErrorFunctionNotFound) return false;
    if (rc == nvml::kErrorGpuIsLost) {
      gpu.lost = true;
    } else {
      gpu.failed_functions.emplace_back(function);
    }
    return false;
  }

  bool IsExcluded(const std::string& uuid) const {
    for (const auto& [index, excluded] : excluded_)
      if (excluded == uuid) return true;
    return false;
  }

  // Names a GPU NVML cannot name any more from the inventory last read.
  void NameFromKnown(GpuHealthReading& gpu) const {
    for (const auto& known : known_) {
      if (known.index != gpu.index) continue;
      if (gpu.uuid.empty()) gpu.uuid = known.uuid;
      if (gpu.pci_bus_id.empty()) gpu.pci_bus_id = known.pci_bus_id;
    }
  }

  // False when the GPU is not to be reported (excluded by UUID).
  bool ReadGpu(unsigned int index, GpuHealthReading& gpu) {
    gpu.index = index;
    nvml::Device device = nullptr;
    if (!Ok(gpu, "nvmlDeviceGetHandleByIndex_v2", api_.nvmlDeviceGetHandleByIndex_v2(index, &device))) {
      NameFromKnown(gpu);
      return !IsExcluded(gpu.uuid);
    }
    char uuid[nvml::kDeviceUuidV2BufferSize] = {};
    if (Ok(gpu, "nvmlDeviceGetUUID", api_.nvmlDeviceGetUUID(device, uuid, sizeof(uuid)))) gpu.uuid = uuid;
    nvml::PciInfo pci{};
    if (!gpu.lost && Ok(gpu, "nvmlDeviceGetPciInfo_v3", api_.nvmlDeviceGetPciInfo_v3(device, &pci))) {
      gpu.pci_bus_id = std::string(pci.busId, strnlen(pci.busId, sizeof(pci.busId)));
    }
    NameFromKnown(gpu);
    if (IsExcluded(gpu.uuid)) return false;  // released, found at another index
    if (gpu.lost) return true;
    if ((groups_ & kHealthMemory) != 0) ReadMemory(device, gpu);
    if (!gpu.lost && (groups_ & kHealthNvLink) != 0) ReadNvLinks(device, gpu);
    if (!gpu.lost && (groups_ & kHealthFabric) != 0) ReadFabric(device, gpu);
    if (!gpu.lost && (groups_ & kHealthPcie) != 0) ReadPcie(device, gpu);
    if (!gpu.lost && (groups_ & kHealthThermal) != 0) ReadThermal(device, gpu);
    if (!gpu.lost && (groups_ & kHealthHost) != 0) ReadHost(device, gpu);
    if (!gpu.lost && (groups_ & kHealthUsage) != 0) ReadUsage(device, gpu);
    return true;
  }

  void ReadMemory(nvml::Device device, GpuHealthReading& gpu) {
    if (api_.nvmlDeviceGetEccMode != nullptr) {
      nvml::EnableState current = nvml::kFeatureDisabled, pending = nvml::kFeatureDisabled;
      if (Ok(gpu, "nvmlDeviceGetEccMode", api_.nvmlDeviceGetEccMode(device, &current, &pending))) {
        gpu.ecc_enabled = current == nvml::kFeatureEnabled;
      }
    }
    // Counters mean nothing with ECC off (NVML answers NOT_SUPPORTED then anyway).
    if (api_.nvmlDeviceGetTotalEccErrors != nullptr && gpu.ecc_enabled.value_or(true) && !gpu.lost) {
      auto read = [&](nvml::MemoryErrorType type, nvml::EccCounterType counter, std::optional<uint64_t>& out) {
        if (gpu.lost) return;
        unsigned long long value = 0;
        if (Ok(gpu, "nvmlDeviceGetTotalEccErrors", api_.nvmlDeviceGetTotalEccErrors(device, type, counter, &value))) {
          out = value;
        }
      };
      read(nvml::kMemoryErrorTypeCorrected, nvml::kVolatileEcc, gpu.ecc.corrected_volatile);
      read(nvml::kMemoryErrorTypeUncorrected, nvml::kVolatileEcc, gpu.ecc.uncorrected_volatile);
      read(nvml::kMemoryErrorTypeCorrected, nvml::kAggregateEcc, gpu.ecc.corrected_aggregate);
      read(nvml::kMemoryErrorTypeUncorrected, nvml::kAggregateEcc, gpu.ecc.uncorrected_aggregate);
    }
    if (api_.nvmlDeviceGetRemappedRows != nullptr && !gpu.lost) {
      unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
      if (Ok(gpu, "nvmlDeviceGetRemappedRows",
             api_.nvmlDeviceGetRemappedRows(device, &corrected, &uncorrected, &pending, &failed))) {
        gpu.remapped_rows = RemappedRows{corrected, uncorrected, pending != 0, failed != 0};
      }
    }
    if (api_.nvmlDeviceGetRowRemapperHistogram != nullptr && !gpu.lost) {
      nvml::RowRemapperHistogramValues values{};
      if (Ok(gpu, "nvmlDeviceGetRowRemapperHistogram", api_.nvmlDeviceGetRowRemapperHistogram(device, &values))) {
        gpu.remap_histogram = RowRemapHistogram{values.max, values.high, values.partial, values.low, values.none};
      }
    }
    if (api_.nvmlDeviceGetRetiredPages != nullptr && !gpu.lost) ReadRetiredPages(device, gpu);
  }

  // The count query (no address array) per cause: NVML answers the count with SUCCESS, or with
  // INSUFFICIENT_SIZE when pages were retired.
  void ReadRetiredPages(nvml::Device device, GpuHealthReading& gpu) {
    RetiredPages pages;
    auto count = [&](nvml::PageRetirementCause cause, uint32_t& out) {
      unsigned int n = 0;
      nvml::Return rc = api_.nvmlDeviceGetRetiredPages(device, cause, &n, nullptr);
      if (rc == nvml::kErrorInsufficientSize) rc = nvml::kSuccess;
      if (!Ok(gpu, "nvmlDeviceGetRetiredPages", rc)) return false;
      out = n;
      return true;
    };
    if (!count(nvml::kPageRetirementCauseMultipleSingleBitEccErrors, pages.single_bit) || gpu.lost) return;
    if (!count(nvml::kPageRetirementCauseDoubleBitEccError, pages.double_bit) || gpu.lost) return;
    if (api_.nvmlDeviceGetRetiredPagesPendingStatus != nullptr) {
      nvml::EnableState pending = nvml::kFeatureDisabled;
      if (Ok(gpu, "nvmlDeviceGetRetiredPagesPendingStatus", api_.nvmlDeviceGetRetiredPagesPendingStatus(device, &pending))) {
        pages.pending = pending == nvml::kFeatureEnabled;
      }
      if (gpu.lost) return;
    }
    gpu.retired_pages = pages;
  }

  // Links 0, 1, … until the first the GPU does not have (INVALID_ARGUMENT, or NOT_SUPPORTED on
  // a GPU without NVLink).
  void ReadNvLinks(nvml::Device device, GpuHealthReading& gpu) {
    for (unsigned int link = 0; link < nvml::kNvLinkMaxLinks; ++link) {
      nvml::EnableState active = nvml::kFeatureDisabled;
      const nvml::Return rc = api_.nvmlDeviceGetNvLinkState(device, link, &active);
      if (rc == nvml::kErrorInvalidArgument || rc == nvml::kErrorNotSupported) break;
      if (!Ok(gpu, "nvmlDeviceGetNvLinkState", rc)) break;
      NvLinkReading reading;
      reading.link = link;
      reading.active = active == nvml::kFeatureEnabled;
      if (api_.nvmlDeviceGetNvLinkErrorCounter != nullptr) {
        auto read = [&](nvml::NvLinkErrorCounter counter, std::optional<uint64_t>& out) {
          if (gpu.lost) return;
          unsigned long long value = 0;
          if (Ok(gpu, "nvmlDeviceGetNvLinkErrorCounter", api_.nvmlDeviceGetNvLinkErrorCounter(device, link, counter, &value))) {
            out = value;
          }
        };
        read(nvml::kNvLinkErrorDlReplay, reading.replay);
        read(nvml::kNvLinkErrorDlRecovery, reading.recovery);
        read(nvml::kNvLinkErrorDlCrcFlit, reading.crc_flit);
        read(nvml::kNvLinkErrorDlCrcData, reading.crc_data);
      }
      gpu.nvlinks.push_back(reading);
      if (gpu.lost) break;
    }
  }

  // As the inventory reads it (QueryFabric); a v1-only driver gives no health mask (0).
  void ReadFabric(nvml::Device device, GpuHealthReading& gpu) {
    const FabricQuery query = QueryFabric(api_, device);
    if (query.function == nullptr || !Ok(gpu, query.function, query.rc)) return;
    FabricReading reading;
    reading.state = query.info.state;
    reading.status = query.info.status;
    reading.clique_id = query.info.cliqueId;
    reading.health_mask = query.info.healthMask;
    reading.cluster_uuid = FormatClusterUuid(query.info.clusterUuid, nvml::kGpuFabricUuidLen);
    gpu.fabric = std::move(reading);
  }

  void ReadPcie(nvml::Device device, GpuHealthReading& gpu) {
    auto read = [&](nvml::DeviceGetPcieLinkValueFn fn, const char* name, std::optional<uint32_t>& out) {
      if (fn == nullptr || gpu.lost) return;
      unsigned int value = 0;
      if (Ok(gpu, name, fn(device, &value))) out = value;
    };
    read(api_.nvmlDeviceGetCurrPcieLinkGeneration, "nvmlDeviceGetCurrPcieLinkGeneration", gpu.pcie.generation);
    read(api_.nvmlDeviceGetCurrPcieLinkWidth, "nvmlDeviceGetCurrPcieLinkWidth", gpu.pcie.width);
    read(api_.nvmlDeviceGetMaxPcieLinkGeneration, "nvmlDeviceGetMaxPcieLinkGeneration", gpu.pcie.max_generation);
    read(api_.nvmlDeviceGetMaxPcieLinkWidth, "nvmlDeviceGetMaxPcieLinkWidth", gpu.pcie.max_width);
    read(api_.nvmlDeviceGetPcieReplayCounter, "nvmlDeviceGetPcieReplayCounter", gpu.pcie.replay_counter);
  }

  void ReadThermal(nvml::Device device, GpuHealthReading& gpu) {
    ThermalReading& t = gpu.thermal;
    {
      // The 12.2 name first; drivers before it only have the old name of the same function.
      unsigned long long reasons = 0;
      nvml::Return rc = nvml::kErrorFunctionNotFound;
      const char* name = "nvmlDeviceGetCurrentClocksEventReasons";
      if (api_.nvmlDeviceGetCurrentClocksEventReasons != nullptr) {
        rc = api_.nvmlDeviceGetCurrentClocksEventReasons(device, &reasons);
      }
      if (rc == nvml::kErrorFunctionNotFound && api_.nvmlDeviceGetCurrentClocksThrottleReasons != nullptr) {
        name = "nvmlDeviceGetCurrentClocksThrottleReasons";
        rc = api_.nvmlDeviceGetCurrentClocksThrottleReasons(device, &reasons);
      }
      if (Ok(gpu, name, rc)) t.clock_event_reasons = reasons;
    }
    if (api_.nvmlDeviceGetTemperature != nullptr && !gpu.lost) {
      unsigned int value = 0;
      if (Ok(gpu, "nvmlDeviceGetTemperature", api_.nvmlDeviceGetTemperature(device, nvml::kTemperatureGpu, &value))) {
        t.gpu_temperature_c = value;
      }
    }
    if (api_.nvmlDeviceGetTemperatureThreshold != nullptr) {
      auto read = [&](nvml::TemperatureThreshold which, std::optional<uint32_t>& out) {
        if (gpu.lost) return;
        unsigned int value = 0;
        if (Ok(gpu, "nvmlDeviceGetTemperatureThreshold", api_.nvmlDeviceGetTemperatureThreshold(device, which, &value))) {
          out = value;
        }
      };
      read(nvml::kTemperatureThresholdSlowdown, t.slowdown_threshold_c);
      read(nvml::kTemperatureThresholdShutdown, t.shutdown_threshold_c);
      read(nvml::kTemperatureThresholdMemMax, t.memory_max_c);
    }
    if (api_.nvmlDeviceGetFieldValues != nullptr && !gpu.lost) {
      nvml::FieldValue field{};
      field.fieldId = nvml::kFieldDevMemoryTemp;
      if (Ok(gpu, "nvmlDeviceGetFieldValues", api_.nvmlDeviceGetFieldValues(device, 1, &field)) &&
          Ok(gpu, "nvmlDeviceGetFieldValues", field.nvmlReturn)) {
        t.memory_temperature_c = FieldValueAsUnsigned(field);
      }
    }
    if (api_.nvmlDeviceGetViolationStatus != nullptr) {
      auto read = [&](nvml::PerfPolicyType policy, std::optional<uint64_t>& out) {
        if (gpu.lost) return;
        nvml::ViolationTime time{};
        if (Ok(gpu, "nvmlDeviceGetViolationStatus", api_.nvmlDeviceGetViolationStatus(device, policy, &time))) {
          out = time.violationTime;
        }
      };
      read(nvml::kPerfPolicyPower, t.power_violation_ns);
      read(nvml::kPerfPolicyThermal, t.thermal_violation_ns);
    }
  }

  // Frame buffer of a GPU or MIG device: v2 where the driver has it (its `used` is what
  // nvidia-smi shows), else v1.
  bool ReadFrameBuffer(nvml::Device device, GpuHealthReading& gpu, std::optional<uint64_t>& used,
                       std::optional<uint64_t>& free) {
    if (api_.nvmlDeviceGetMemoryInfo_v2 != nullptr) {
      nvml::Memory_v2 memory{};
      memory.version = nvml::kMemoryV2Version;
      const nvml::Return rc = api_.nvmlDeviceGetMemoryInfo_v2(device, &memory);
      if (rc == nvml::kSuccess) {
        used = memory.used;
        free = memory.free;
        return true;
      }
      // An old driver that exports the name but not this version: v1 below.
      if (rc != nvml::kErrorArgumentVersionMismatch && rc != nvml::kErrorFunctionNotFound) {
        return Ok(gpu, "nvmlDeviceGetMemoryInfo_v2", rc);
      }
    }
    nvml::Memory memory{};
    if (!Ok(gpu, "nvmlDeviceGetMemoryInfo", api_.nvmlDeviceGetMemoryInfo(device, &memory))) return false;
    used = memory.used;
    free = memory.free;
    return true;
  }

  void ReadUsage(nvml::Device device, GpuHealthReading& gpu) {
    UsageReading& u = gpu.usage;
    if (api_.nvmlDeviceGetUtilizationRates != nullptr) {
      nvml::Utilization rates{};
      if (Ok(gpu, "nvmlDeviceGetUtilizationRates", api_.nvmlDeviceGetUtilizationRates(device, &rates))) {
        u.gpu_util_percent = rates.gpu;
        u.memory_util_percent = rates.memory;
      }
    }
    auto codec = [&](nvml::DeviceGetCodecUtilizationFn fn, const char* name, std::optional<uint32_t>& out) {
      if (fn == nullptr || gpu.lost) return;
      unsigned int value = 0, period_us = 0;
      if (Ok(gpu, name, fn(device, &value, &period_us))) out = value;
    };
    codec(api_.nvmlDeviceGetEncoderUtilization, "nvmlDeviceGetEncoderUtilization", u.encoder_util_percent);
    codec(api_.nvmlDeviceGetDecoderUtilization, "nvmlDeviceGetDecoderUtilization", u.decoder_util_percent);
    if (!gpu.lost) ReadFrameBuffer(device, gpu, u.fb_used_bytes, u.fb_free_bytes);
    if (api_.nvmlDeviceGetPowerUsage != nullptr && !gpu.lost) {
      unsigned int mw = 0;
      if (Ok(gpu, "nvmlDeviceGetPowerUsage", api_.nvmlDeviceGetPowerUsage(device, &mw))) u.power_mw = mw;
    }
    if (api_.nvmlDeviceGetTotalEnergyConsumption != nullptr && !gpu.lost) {
      unsigned long long mj = 0;
      if (Ok(gpu, "nvmlDeviceGetTotalEnergyConsumption", api_.nvmlDeviceGetTotalEnergyConsumption(device, &mj))) {
        u.energy_mj = mj;
      }
    }
    if (api_.nvmlDeviceGetClockInfo != nullptr) {
      auto clock = [&](nvml::ClockType type, std::optional<uint32_t>& out) {
        if (gpu.lost) return;
        unsigned int mhz = 0;
        if (Ok(gpu, "nvmlDeviceGetClockInfo", api_.nvmlDeviceGetClockInfo(device, type, &mhz))) out = mhz;
      };
      clock(nvml::kClockSm, u.sm_clock_mhz);
      clock(nvml::kClockMem, u.mem_clock_mhz);
    }
    if (!gpu.lost) ReadNvLinkThroughput(device, gpu);
    if (!gpu.lost) ReadMigUsage(device, gpu);
  }

  // Data sent and received over all of the GPU's NVLinks: one call, both counters, scope "all
  // links". A GPU the NVLink group of this pass found without links is not asked at all; one
  // that answers NOT_SUPPORTED simply has no value (no error, no series).
  void ReadNvLinkThroughput(nvml::Device device, GpuHealthReading& gpu) {
    if (api_.nvmlDeviceGetFieldValues == nullptr) return;
    if ((groups_ & kHealthNvLink) != 0 && gpu.nvlinks.empty()) return;
    nvml::FieldValue fields[2]{};
    fields[0].fieldId = nvml::kFieldDevNvLinkThroughputDataTx;
    fields[1].fieldId = nvml::kFieldDevNvLinkThroughputDataRx;
    fields[0].scopeId = fields[1].scopeId = nvml::kFieldScopeAllLinks;
    if (!Ok(gpu, "nvmlDeviceGetFieldValues", api_.nvmlDeviceGetFieldValues(device, 2, fields))) return;
    // Per field, anything but a value (a driver without these fields, or one that refuses the
    // all-links scope) is no value, not a failed function: a metric, not a health reading.
    auto take = [&](const nvml::FieldValue& field, std::optional<uint64_t>& out) {
      if (field.nvmlReturn == nvml::kErrorGpuIsLost) gpu.lost = true;
      if (field.nvmlReturn == nvml::kSuccess) out = FieldValueAsCounter(field);
    };
    take(fields[0], gpu.usage.nvlink_data_tx_kib);
    take(fields[1], gpu.usage.nvlink_data_rx_kib);
  }

  // Every MIG device of a MIG-enabled GPU: its ids and frame buffer. Slots are sparse
  // (NOT_FOUND for an empty one).
  void ReadMigUsage(nvml::Device device, GpuHealthReading& gpu) {
    if (api_.nvmlDeviceGetMigMode == nullptr || api_.nvmlDeviceGetMaxMigDeviceCount == nullptr ||
        api_.nvmlDeviceGetMigDeviceHandleByIndex == nullptr) {
      return;
    }
    unsigned int current = nvml::kDeviceMigDisable, pending = nvml::kDeviceMigDisable;
    if (!Ok(gpu, "nvmlDeviceGetMigMode", api_.nvmlDeviceGetMigMode(device, &current, &pending)) ||
        current != nvml::kDeviceMigEnable) {
      return;
    }
    unsigned int slots = 0;
    if (!Ok(gpu, "nvmlDeviceGetMaxMigDeviceCount", api_.nvmlDeviceGetMaxMigDeviceCount(device, &slots))) return;
    for (unsigned int slot = 0; slot < slots && !gpu.lost; ++slot) {
      nvml::Device mig = nullptr;
      const nvml::Return rc = api_.nvmlDeviceGetMigDeviceHandleByIndex(device, slot, &mig);
      if (rc == nvml::kErrorNotFound) continue;
      if (!Ok(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", rc)) continue;
      MigUsageReading reading;
      char uuid[nvml::kDeviceUuidV2BufferSize] = {};
      if (!Ok(gpu, "nvmlDeviceGetUUID", api_.nvmlDeviceGetUUID(mig, uuid, sizeof(uuid)))) continue;
      reading.uuid = uuid;
      unsigned int id = 0;
      if (api_.nvmlDeviceGetGpuInstanceId != nullptr &&
          Ok(gpu, "nvmlDeviceGetGpuInstanceId", api_.nvmlDeviceGetGpuInstanceId(mig, &id))) {
        reading.gpu_instance = id;
      }
      if (api_.nvmlDeviceGetComputeInstanceId != nullptr &&
          Ok(gpu, "nvmlDeviceGetComputeInstanceId", api_.nvmlDeviceGetComputeInstanceId(mig, &id))) {
        reading.compute_instance = id;
      }
      if (!gpu.lost) ReadFrameBuffer(mig, gpu, reading.fb_used_bytes, reading.fb_free_bytes);
      gpu.mig_devices.push_back(std::move(reading));
    }
  }

  void ReadHost(nvml::Device device, GpuHealthReading& gpu) {
    if (api_.nvmlDeviceGetPersistenceMode == nullptr) return;
    nvml::EnableState mode = nvml::kFeatureDisabled;
    if (Ok(gpu, "nvmlDeviceGetPersistenceMode", api_.nvmlDeviceGetPersistenceMode(device, &mode))) {
      gpu.persistence_mode = mode == nvml::kFeatureEnabled;
    }
  }

  const NvmlLibrary& library_;
  const nvml::Api& api_;
  uint32_t groups_;
  const ExcludedGpus& excluded_;
  const std::vector<GpuInfo>& known_;
};

// "0x10de\n" → 0x10de; nullopt when unreadable.
std::optional<unsigned long> ReadHexFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  try {
    std::size_t used = 0;
    const unsigned long value = std::stoul(text, &used, 16);
    if (used != text.size()) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<std::vector<std::string>> ListPciGpus(const std::string& host_root) {
  constexpr unsigned long kNvidiaVendor = 0x10de;
  constexpr unsigned long kClassDisplayVga = 0x0300;  // class >> 8: base class and subclass
  constexpr unsigned long kClassDisplay3d = 0x0302;
  const auto devices = std::filesystem::path(host_root.empty() ? "/" : host_root) / "sys/bus/pci/devices";
  std::error_code ec;
  std::filesystem::directory_iterator it(devices, ec);
  if (ec) return std::nullopt;
  std::vector<std::string> found;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return std::nullopt;
    const auto vendor = ReadHexFile(it->path() / "vendor");
    if (!vendor || *vendor != kNvidiaVendor) continue;
    const auto pci_class = ReadHexFile(it->path() / "class");
    if (pci_class && ((*pci_class >> 8) == kClassDisplayVga || (*pci_class >> 8) == kClassDisplay3d)) {
      found.push_back(it->path().filename().string());
    }
  }
  if (ec) return std::nullopt;
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<uint32_t> CountPciGpus(const std::string& host_root) {
  const auto found = ListPciGpus(host_root);
  if (!found) return std::nullopt;
  return static_cast<uint32_t>(found->size());
}

HealthSample ReadHealth(const NvmlLibrary& library, uint32_t groups, const std::string& host_root,
                        const ExcludedGpus& excluded, const std::vector<GpuInfo>& known) {
  return HealthReader(library, groups, excluded, known).Run(host_root);
}

}  // namespace gns::gpu_inventory
