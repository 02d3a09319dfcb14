// A fake libnvidia-ml.so.1 for the simulated node: it exports the versioned NVML symbols that
// src/modules/gpu_inventory/api/nvml_abi.hpp lists, with NVML's exact C ABI, and serves GPUs
// described by the JSON file named in FAKE_NVML_CONFIG. Xid events and failures can be injected
// in-process (fake_nvml_control.h) or, when FAKE_NVML_CONTROL names a path, through a unix
// datagram socket created by nvmlInit (fakenvmlctl.py sends the commands).
//
// NVML is a process-wide C library, so this fake keeps process-wide state (one FakeNvml
// object); everything behind one mutex, which is plenty for a handful of fake GPUs.
#include "fake_nvml_control.h"
#include "maintenance_state.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "modules/gpu_inventory/api/nvml_abi.hpp"

#define FAKE_NVML_EXPORT extern "C" __attribute__((visibility("default")))

namespace gns::sim::fake_nvml {
namespace {

namespace nvml = gns::nvml;
using nvml::Return;
using Json = nlohmann::json;

// ---- Configuration -------------------------------------------------------------------------

// H200 SXM: PCI device id 0x2335, vendor 0x10DE, combined as NVML reports it.
constexpr unsigned int kDefaultPciDeviceId = 0x233510DEu;
constexpr const char* kDefaultName = "NVIDIA H200";
constexpr const char* kDefaultDriverVersion = "550.90.07";
constexpr int kDefaultCudaDriverVersion = 12040;
constexpr unsigned long long kDefaultSupportedEvents =
    nvml::kEventTypeSingleBitEccError | nvml::kEventTypeDoubleBitEccError | nvml::kEventTypePState |
    nvml::kEventTypeXidCriticalError | nvml::kEventTypeClock;

struct PciAddress {
  unsigned int domain = 0;
  unsigned int bus = 0;
  unsigned int device = 0;
  unsigned int function = 0;
};

struct Fabric {
  bool present = false;
  std::array<unsigned char, nvml::kGpuFabricUuidLen> cluster_uuid{};
  Return status = nvml::kSuccess;
  unsigned int clique_id = 0;
  nvml::GpuFabricState state = nvml::kGpuFabricStateNotSupported;
  unsigned int health_mask = 0;
  unsigned char health_summary = 0;
};

// NVLink DL error counters of one link (nvmlDeviceGetNvLinkErrorCounter).
struct NvLinkCounters {
  unsigned long long replay = 0, recovery = 0, crc_flit = 0, crc_data = 0;
};

// NVLink data throughput of one link, KiB (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX).
struct NvLinkThroughput {
  unsigned long long data_tx_kib = 0, data_rx_kib = 0;
};

// What the health readings answer (issue 26): healthy unless configured ("health" of a GPU) or
// set at run time (setHealth). Row-remap pending/failure, retired-pages pending and persistence
// live in the maintenance state (maintenance_state.h), which a reset changes.
struct Health {
  bool ecc_enabled = true;
  unsigned long long ecc[2][2] = {};  // [nvmlMemoryErrorType_t][nvmlEccCounterType_t]
  unsigned int remapped_corrected = 0;
  unsigned int remapped_uncorrected = 0;
  nvml::RowRemapperHistogramValues histogram{640, 0, 0, 0, 0};  // every bank has all its spare rows
  unsigned int retired_sbe = 0;
  unsigned int retired_dbe = 0;
  std::set<unsigned int> nvlinks_down;
  std::map<unsigned int, NvLinkCounters> nvlink_errors;
  std::map<unsigned int, NvLinkThroughput> nvlink_throughput;
  unsigned int pcie_generation = 5, pcie_width = 16, pcie_max_generation = 5, pcie_max_width = 16;
  unsigned int pcie_replay = 0;
  unsigned long long clocks_event_reasons = 0;
  unsigned int temperature = 40, slowdown = 87, shutdown = 92;
  unsigned int memory_temperature = 45, memory_max = 95;
  unsigned long long power_violation_ns = 0, thermal_violation_ns = 0;
  bool lost = false;  // every call that names the GPU answers GPU_IS_LOST
  // Usage (issue 27, the dcgm-exporter compatible series): an idle GPU unless set.
  unsigned int gpu_util = 0, memory_util = 0, encoder_util = 0, decoder_util = 0;  // percent
  unsigned int power_mw = 70000;
  unsigned long long energy_mj = 1000000;
  unsigned int sm_clock_mhz = 1980, mem_clock_mhz = 2619;
  std::map<unsigned int, unsigned long long> mig_memory_used_mib;  // MIG slot → MiB used
  std::optional<unsigned long long> memory_used;  // over the GPU's configured memoryUsedBytes
};

// One MIG device of a MIG-enabled GPU (a compute instance in a GPU instance).
struct MigDevice {
  std::string uuid;  // "MIG-…"
  unsigned int gpu_instance = 0;
  unsigned int compute_instance = 0;
  nvml::DeviceAttributes attributes{};
  // nvmlGpuInstanceGetInfo's profile id and placement; without them (not configured) it answers
  // NOT_SUPPORTED, as an older driver would.
  bool placed = false;
  unsigned int profile_id = 0, placement_start = 0, placement_size = 0;

  // What a MIG reconfiguration changes (fakeNvmlReloadConfig compares layouts with it).
  bool SameLayout(const MigDevice& other) const {
    return uuid == other.uuid && gpu_instance == other.gpu_instance && compute_instance == other.compute_instance &&
           std::memcmp(&attributes, &other.attributes, sizeof attributes) == 0 && placed == other.placed &&
           profile_id == other.profile_id && placement_start == other.placement_start &&
           placement_size == other.placement_size;
  }
};

// The NVSwitch port at the far end of one of a GPU's NVLinks (issue 26: SXid → GPU).
struct SwitchPort {
  PciAddress nvswitch;
  unsigned int port = 0;
};

struct Gpu {
  std::string uuid;
  std::string name;
  PciAddress address;
  nvml::PciInfo pci{};
  unsigned int minor = 0;
  unsigned long long memory_total = 0;
  unsigned long long memory_reserved = 0;
  unsigned long long memory_used = 0;
  int numa_node = -1;
  int cc_major = 9;  // H200-like unless configured
  int cc_minor = 0;
  unsigned int brand = 14;  // nvmlBrandType_t: NVML_BRAND_NVIDIA, as an H200 reports ("brand")
  std::vector<std::string> nvlink_peer_names;  // as configured, resolved into nvlink_remote
  std::vector<nvml::PciInfo> nvlink_remote;    // one entry per active link, in link order
  unsigned int nvlink_count = 0;               // links the GPU has (default: one per peer)
  // Links into NVSwitch ports (nvswitchLinks), by the GPU's link number; none by default (a
  // PCIe-like GPU, or NVLink to peers only).
  std::map<unsigned int, SwitchPort> nvswitch_links;
  Fabric fabric;
  unsigned long long supported_events = kDefaultSupportedEvents;
  bool mig_enabled = false;
  std::vector<std::optional<MigDevice>> mig_slots;  // index = nvmlDeviceGetMigDeviceHandleByIndex slot
  Health health;
};

// MIG devices per GPU are at most 7 on every MIG-capable GPU so far; the fake allows 8 slots.
constexpr unsigned int kMaxMigSlots = 8;

struct Config {
  std::string driver_version = kDefaultDriverVersion;
  int cuda_driver_version = kDefaultCudaDriverVersion;
  std::vector<Gpu> gpus;
};

// A config error: nvmlInit prints `message` and returns `code`.
struct ConfigError : std::runtime_error {
  ConfigError(Return code, const std::string& message) : std::runtime_error(message), code(code) {}
  Return code;
};

bool ParseHex(std::string_view text, unsigned int* value) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value, 16);
  return ec == std::errc() && end == text.data() + text.size();
}

// Accepts what NVML's nvmlDeviceGetHandleByPciBusId accepts: "domain:bus:device.function" (any
// domain width), "domain:bus:device" and "bus:device.function", in hex.
std::optional<PciAddress> ParsePciBusId(std::string_view text) {
  PciAddress address;
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) return std::nullopt;
  std::size_t i = 0;
  if (parts.size() == 3 && !ParseHex(parts[i++], &address.domain)) return std::nullopt;
  if (!ParseHex(parts[i++], &address.bus)) return std::nullopt;
  std::string_view device = parts[i];
  if (const std::size_t dot = device.find('.'); dot != std::string_view::npos) {
    if (!ParseHex(device.substr(dot + 1), &address.function)) return std::nullopt;
    device = device.substr(0, dot);
  }
  if (!ParseHex(device, &address.device)) return std::nullopt;
  if (address.bus > 0xFF || address.device > 0x1F || address.function > 7) return std::nullopt;
  return address;
}

nvml::PciInfo MakePciInfo(const PciAddress& address, unsigned int device_id, unsigned int subsystem_id) {
  nvml::PciInfo pci{};
  pci.domain = address.domain;
  pci.bus = address.bus;
  pci.device = address.device;
  pci.pciDeviceId = device_id;
  pci.pciSubSystemId = subsystem_id;
  // NVML_DEVICE_PCI_BUS_ID_FMT / _LEGACY_FMT: the function is always printed as 0.
  std::snprintf(pci.busId, sizeof(pci.busId), "%08X:%02X:%02X.0", address.domain, address.bus,
                address.device);
  std::snprintf(pci.busIdLegacy, sizeof(pci.busIdLegacy), "%04X:%02X:%02X.0",
                address.domain & 0xFFFFu, address.bus, address.device);
  return pci;
}

bool ParseUuidBytes(std::string_view text, std::array<unsigned char, nvml::kGpuFabricUuidLen>* out) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '-') continue;
    unsigned int byte = 0;
    if (i + 1 >= text.size() || n >= out->size() || !ParseHex(text.substr(i, 2), &byte)) return false;
    (*out)[n++] = static_cast<unsigned char>(byte);
    ++i;
  }
  return n == out->size();
}

// Rejects keys we do not know, so a typo in a config fails loudly instead of being ignored.
void CheckKeys(const Json& object, std::initializer_list<std::string_view> known, const std::string& where) {
  if (!object.is_object()) throw ConfigError(nvml::kErrorUnknown, where + " must be a JSON object");
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (const auto k : known) found = found || key == k;
    if (!found) throw ConfigError(nvml::kErrorUnknown, where + ": unknown key \"" + key + "\"");
  }
}

nvml::GpuFabricState ParseFabricState(const Json& value) {
  if (value.is_number_unsigned() && value.get<unsigned int>() <= nvml::kGpuFabricStateCompleted) {
    return static_cast<nvml::GpuFabricState>(value.get<unsigned int>());
  }
  if (value.is_string()) {
    const auto s = value.get<std::string>();
    if (s == "notSupported") return nvml::kGpuFabricStateNotSupported;
    if (s == "notStarted") return nvml::kGpuFabricStateNotStarted;
    if (s == "inProgress") return nvml::kGpuFabricStateInProgress;
    if (s == "completed") return nvml::kGpuFabricStateCompleted;
  }
  throw ConfigError(nvml::kErrorUnknown,
                    "fabric.state must be 0-3 or notSupported|notStarted|inProgress|completed");
}

Return ParseReturnCode(const Json& value, const std::string& where) {
  if (value.is_number_integer()) return value.get<Return>();
  if (value.is_string() && value.get<std::string>() == "success") return nvml::kSuccess;
  throw ConfigError(nvml::kErrorUnknown, where + " must be an NVML return code or \"success\"");
}

// "migEnabled": true and "migDevices": [{"slot": 0, "uuid": "MIG-…", "gpuInstanceId": 7,
// "computeInstanceId": 0, "gpuInstanceSliceCount": 1, "computeInstanceSliceCount": 1,
// "memorySizeMB": 9856, "multiprocessorCount": 16, "sharedCopyEngineCount": 1, "sharedDecoderCount": 1,
// "sharedEncoderCount": 0, "sharedJpegCount": 1, "sharedOfaCount": 0, "gpuInstanceProfileId": 19,
// "placementStart": 6, "placementSize": 1}]. "slot" defaults to the entry's position; the engine
// counts default to 0; the GPU instance's profile id and placement come together or not at all.
void ParseMig(const Json& j, Gpu& gpu, const std::string& where) {
  gpu.mig_enabled = j.value("migEnabled", false);
  if (!j.contains("migDevices")) return;
  if (!gpu.mig_enabled) throw ConfigError(nvml::kErrorUnknown, where + ": migDevices needs migEnabled: true");
  const Json& devices = j.at("migDevices");
  if (!devices.is_array()) throw ConfigError(nvml::kErrorUnknown, where + ".migDevices must be an array");
  gpu.mig_slots.assign(kMaxMigSlots, std::nullopt);
  std::set<std::pair<unsigned int, unsigned int>> instances;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const std::string at = where + ".migDevices[" + std::to_string(i) + "]";
    const Json& d = devices[i];
    CheckKeys(d, {"slot", "uuid", "gpuInstanceId", "computeInstanceId", "gpuInstanceSliceCount",
                  "computeInstanceSliceCount", "memorySizeMB", "multiprocessorCount", "sharedCopyEngineCount",
                  "sharedDecoderCount", "sharedEncoderCount", "sharedJpegCount", "sharedOfaCount",
                  "gpuInstanceProfileId", "placementStart", "placementSize"},
              at);
    const auto slot = d.value("slot", static_cast<unsigned int>(i));
    if (slot >= kMaxMigSlots || gpu.mig_slots[slot]) throw ConfigError(nvml::kErrorUnknown, at + ": slot taken or >= 8");
    MigDevice mig;
    mig.uuid = d.at("uuid").get<std::string>();
    if (mig.uuid.rfind("MIG-", 0) != 0) throw ConfigError(nvml::kErrorUnknown, at + ".uuid must start with MIG-");
    mig.gpu_instance = d.at("gpuInstanceId").get<unsigned int>();
    mig.compute_instance = d.value("computeInstanceId", 0u);
    if (!instances.insert({mig.gpu_instance, mig.compute_instance}).second) {
      throw ConfigError(nvml::kErrorUnknown, at + ": duplicate (gpuInstanceId, computeInstanceId)");
    }
    mig.attributes.gpuInstanceSliceCount = d.at("gpuInstanceSliceCount").get<unsigned int>();
    mig.attributes.computeInstanceSliceCount = d.value("computeInstanceSliceCount", mig.attributes.gpuInstanceSliceCount);
    mig.attributes.memorySizeMB = d.at("memorySizeMB").get<unsigned long long>();
    mig.attributes.multiprocessorCount = d.value("multiprocessorCount", 16u * mig.attributes.computeInstanceSliceCount);
    mig.attributes.sharedCopyEngineCount = d.value("sharedCopyEngineCount", 0u);
    mig.attributes.sharedDecoderCount = d.value("sharedDecoderCount", 0u);
    mig.attributes.sharedEncoderCount = d.value("sharedEncoderCount", 0u);
    mig.attributes.sharedJpegCount = d.value("sharedJpegCount", 0u);
    mig.attributes.sharedOfaCount = d.value("sharedOfaCount", 0u);
    const int placement_keys = static_cast<int>(d.contains("gpuInstanceProfileId")) +
                               static_cast<int>(d.contains("placementStart")) +
                               static_cast<int>(d.contains("placementSize"));
    if (placement_keys != 0 && placement_keys != 3) {
      throw ConfigError(nvml::kErrorUnknown, at + ": gpuInstanceProfileId, placementStart and placementSize go together");
    }
    if (placement_keys == 3) {
      mig.placed = true;
      mig.profile_id = d.at("gpuInstanceProfileId").get<unsigned int>();
      mig.placement_start = d.at("placementStart").get<unsigned int>();
      mig.placement_size = d.at("placementSize").get<unsigned int>();
    }
    gpu.mig_slots[slot] = std::move(mig);
  }
}

// NVSwitch ports of an NVSwitch's device id (GH100 NVSwitch, 0x22A3, vendor 0x10DE).
constexpr unsigned int kNvSwitchPciDeviceId = 0x22A310DEu;

// "nvswitchLinks": [{"switch": "<PCI bus id>", "links": [0, 1], "ports": [10, 11]}, …]: the GPU's
// link links[k] ends in port ports[k] of that switch. Replaces the GPU's switch links; a link
// that has an nvlinkPeers entry cannot also go to a switch. The GPU has at least as many links as
// the highest one named.
void ApplySwitchLinks(const Json& list, Gpu& gpu, const std::string& where) {
  if (!list.is_array()) throw ConfigError(nvml::kErrorUnknown, where + " must be a list");
  std::map<unsigned int, SwitchPort> links;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Json& entry = list[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    CheckKeys(entry, {"switch", "links", "ports"}, at);
    const auto bus_id = entry.at("switch").get<std::string>();
    const auto address = ParsePciBusId(bus_id);
    if (!address) throw ConfigError(nvml::kErrorUnknown, at + ".switch \"" + bus_id + "\" is not a PCI address");
    const auto local = entry.at("links").get<std::vector<unsigned int>>();
    const auto ports = entry.at("ports").get<std::vector<unsigned int>>();
    if (local.size() != ports.size()) throw ConfigError(nvml::kErrorUnknown, at + ": links and ports differ in length");
    for (std::size_t k = 0; k < local.size(); ++k) {
      if (local[k] >= nvml::kNvLinkMaxLinks || local[k] < gpu.nvlink_peer_names.size()) {
        throw ConfigError(nvml::kErrorUnknown, at + ".links: link " + std::to_string(local[k]) +
                                                   " is past 17 or already goes to an nvlinkPeers entry");
      }
      if (!links.emplace(local[k], SwitchPort{*address, ports[k]}).second) {
        throw ConfigError(nvml::kErrorUnknown, at + ".links: link " + std::to_string(local[k]) + " is named twice");
      }
    }
  }
  gpu.nvswitch_links = std::move(links);
  if (!gpu.nvswitch_links.empty()) gpu.nvlink_count = std::max(gpu.nvlink_count, gpu.nvswitch_links.rbegin()->first + 1);
}

// Applies health keys (README: "Health readings") to `gpu`. `runtime`: a setHealth command,
// which may also name the maintenance state's keys (handled by the caller) and "uuid".
void ApplyHealth(const Json& h, Gpu& gpu, const std::string& where, bool runtime) {
  static const std::set<std::string, std::less<>> kKeys = {
      "eccEnabled", "eccCorrectedVolatile", "eccUncorrectedVolatile", "eccCorrectedAggregate",
      "eccUncorrectedAggregate", "remappedRowsCorrected", "remappedRowsUncorrected", "rowRemapHistogram",
      "retiredPagesSbe", "retiredPagesDbe", "nvlinkDown", "nvlinkErrors", "fabricState", "fabricStatus",
      "fabricHealthMask", "pcieGeneration", "pcieWidth", "pcieMaxGeneration", "pcieMaxWidth", "pcieReplayCounter",
      "clocksEventReasons", "temperature", "temperatureSlowdown", "temperatureShutdown", "memoryTemperature",
      "memoryTemperatureMax", "powerViolationNs", "thermalViolationNs", "lost", "gpuUtil", "memoryUtil",
      "encoderUtil", "decoderUtil", "powerMilliwatts", "energyMillijoules", "smClockMhz", "memClockMhz",
      "memoryUsedBytes", "migMemoryUsedMiB", "nvswitchLinks", "nvlinkThroughput"};
  static const std::set<std::string, std::less<>> kRuntimeKeys = {"uuid", "remapPending", "remapFailure",
                                                                   "retiredPagesPending", "persistence"};
  if (!h.is_object()) throw ConfigError(nvml::kErrorUnknown, where + " must be a JSON object");
  for (const auto& [key, value] : h.items()) {
    if (kKeys.count(key) == 0 && (!runtime || kRuntimeKeys.count(key) == 0)) {
      throw ConfigError(nvml::kErrorUnknown, where + ": unknown key \"" + key + "\"");
    }
  }
  Health& health = gpu.health;
  auto u32 = [&](const char* key, unsigned int& out) {
    if (h.contains(key)) out = h.at(key).get<unsigned int>();
  };
  auto u64 = [&](const char* key, unsigned long long& out) {
    if (h.contains(key)) out = h.at(key).get<unsigned long long>();
  };
  if (h.contains("eccEnabled")) health.ecc_enabled = h.at("eccEnabled").get<bool>();
  u64("eccCorrectedVolatile", health.ecc[nvml::kMemoryErrorTypeCorrected][nvml::kVolatileEcc]);
  u64("eccUncorrectedVolatile", health.ecc[nvml::kMemoryErrorTypeUncorrected][nvml::kVolatileEcc]);
  u64("eccCorrectedAggregate", health.ecc[nvml::kMemoryErrorTypeCorrected][nvml::kAggregateEcc]);
  u64("eccUncorrectedAggregate", health.ecc[nvml::kMemoryErrorTypeUncorrected][nvml::kAggregateEcc]);
  u32("remappedRowsCorrected", health.remapped_corrected);
  u32("remappedRowsUncorrected", health.remapped_uncorrected);
  if (h.contains("rowRemapHistogram")) {
    const Json& r = h.at("rowRemapHistogram");
    CheckKeys(r, {"max", "high", "partial", "low", "none"}, where + ".rowRemapHistogram");
    auto& v = health.histogram;
    v = {r.value("max", 0u), r.value("high", 0u), r.value("partial", 0u), r.value("low", 0u), r.value("none", 0u)};
  }
  u32("retiredPagesSbe", health.retired_sbe);
  u32("retiredPagesDbe", health.retired_dbe);
  if (h.contains("nvswitchLinks")) ApplySwitchLinks(h.at("nvswitchLinks"), gpu, where + ".nvswitchLinks");
  if (h.contains("nvlinkDown")) {
    health.nvlinks_down.clear();
    for (const auto& link : h.at("nvlinkDown")) health.nvlinks_down.insert(link.get<unsigned int>());
  }
  if (h.contains("nvlinkErrors")) {
    const Json& e = h.at("nvlinkErrors");
    if (!e.is_object()) throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkErrors must map link numbers to counters");
    health.nvlink_errors.clear();
    for (const auto& [link, counters] : e.items()) {
      unsigned int n = 0;
      const auto [end, ec] = std::from_chars(link.data(), link.data() + link.size(), n);
      if (ec != std::errc() || end != link.data() + link.size() || n >= nvml::kNvLinkMaxLinks) {
        throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkErrors: \"" + link + "\" is not a link number below 18");
      }
      CheckKeys(counters, {"replay", "recovery", "crcFlit", "crcData"}, where + ".nvlinkErrors." + link);
      health.nvlink_errors[n] = {counters.value("replay", 0ULL), counters.value("recovery", 0ULL),
                                 counters.value("crcFlit", 0ULL), counters.value("crcData", 0ULL)};
    }
  }
  if (h.contains("nvlinkThroughput")) {
    const Json& e = h.at("nvlinkThroughput");
    if (!e.is_object()) throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkThroughput must map link numbers to counters");
    health.nvlink_throughput.clear();
    for (const auto& [link, counters] : e.items()) {
      unsigned int n = 0;
      const auto [end, ec] = std::from_chars(link.data(), link.data() + link.size(), n);
      if (ec != std::errc() || end != link.data() + link.size() || n >= nvml::kNvLinkMaxLinks) {
        throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkThroughput: \"" + link + "\" is not a link number below 18");
      }
      CheckKeys(counters, {"dataTxKiB", "dataRxKiB"}, where + ".nvlinkThroughput." + link);
      health.nvlink_throughput[n] = {counters.value("dataTxKiB", 0ULL), counters.value("dataRxKiB", 0ULL)};
    }
  }
  if (h.contains("fabricState") || h.contains("fabricStatus") || h.contains("fabricHealthMask")) {
    if (!gpu.fabric.present) throw ConfigError(nvml::kErrorUnknown, where + ": the GPU has no \"fabric\" to change");
    if (h.contains("fabricState")) gpu.fabric.state = ParseFabricState(h.at("fabricState"));
    if (h.contains("fabricStatus")) gpu.fabric.status = ParseReturnCode(h.at("fabricStatus"), where + ".fabricStatus");
    u32("fabricHealthMask", gpu.fabric.health_mask);
  }
  u32("pcieGeneration", health.pcie_generation);
  u32("pcieWidth", health.pcie_width);
  u32("pcieMaxGeneration", health.pcie_max_generation);
  u32("pcieMaxWidth", health.pcie_max_width);
  u32("pcieReplayCounter", health.pcie_replay);
  u64("clocksEventReasons", health.clocks_event_reasons);
  u32("temperature", health.temperature);
  u32("temperatureSlowdown", health.slowdown);
  u32("temperatureShutdown", health.shutdown);
  u32("memoryTemperature", health.memory_temperature);
  u32("memoryTemperatureMax", health.memory_max);
  u64("powerViolationNs", health.power_violation_ns);
  u64("thermalViolationNs", health.thermal_violation_ns);
  if (h.contains("lost")) health.lost = h.at("lost").get<bool>();
  u32("gpuUtil", health.gpu_util);
  u32("memoryUtil", health.memory_util);
  u32("encoderUtil", health.encoder_util);
  u32("decoderUtil", health.decoder_util);
  u32("powerMilliwatts", health.power_mw);
  u64("energyMillijoules", health.energy_mj);
  u32("smClockMhz", health.sm_clock_mhz);
  u32("memClockMhz", health.mem_clock_mhz);
  if (h.contains("memoryUsedBytes")) {
    health.memory_used = h.at("memoryUsedBytes").get<unsigned long long>();  // capped at the total when read
  }
  if (h.contains("migMemoryUsedMiB")) {
    const Json& m = h.at("migMemoryUsedMiB");
    if (!m.is_object()) throw ConfigError(nvml::kErrorUnknown, where + ".migMemoryUsedMiB must be an object of slot: MiB");
    health.mig_memory_used_mib.clear();
    for (const auto& [slot, mib] : m.items()) {
      unsigned int n = 0;
      const auto [end, ec] = std::from_chars(slot.data(), slot.data() + slot.size(), n);
      if (ec != std::errc() || end != slot.data() + slot.size() || n >= kMaxMigSlots) {
        throw ConfigError(nvml::kErrorUnknown, where + ".migMemoryUsedMiB: \"" + slot + "\" is no MIG slot");
      }
      health.mig_memory_used_mib[n] = mib.get<unsigned long long>();
    }
  }
}

Gpu ParseGpu(const Json& j, std::size_t index) {
  const std::string where = "gpus[" + std::to_string(index) + "]";
  CheckKeys(j,
            {"uuid", "name", "pciBusId", "minor", "memoryTotalBytes", "memoryReservedBytes",
             "memoryUsedBytes", "numaNode", "nvlinkPeers", "fabric", "pciDeviceId",
             "pciSubSystemId", "supportedEventTypes", "computeCapability", "brand", "migEnabled", "migDevices",
             "nvlinkCount", "nvswitchLinks", "health"},
            where);
  Gpu gpu;
  gpu.uuid = j.at("uuid").get<std::string>();
  if (gpu.uuid.empty()) throw ConfigError(nvml::kErrorUnknown, where + ".uuid is empty");
  gpu.name = j.value("name", std::string(kDefaultName));
  const auto bus_id = j.at("pciBusId").get<std::string>();
  const auto address = ParsePciBusId(bus_id);
  if (!address) throw ConfigError(nvml::kErrorUnknown, where + ".pciBusId \"" + bus_id + "\" is not a PCI address");
  gpu.address = *address;
  gpu.pci = MakePciInfo(*address, j.value("pciDeviceId", kDefaultPciDeviceId), j.value("pciSubSystemId", 0u));
  gpu.minor = j.at("minor").get<unsigned int>();
  gpu.memory_total = j.at("memoryTotalBytes").get<unsigned long long>();
  gpu.memory_reserved = j.value("memoryReservedBytes", 0ULL);
  gpu.memory_used = j.value("memoryUsedBytes", gpu.memory_reserved);
  if (gpu.memory_used > gpu.memory_total || gpu.memory_reserved > gpu.memory_used) {
    throw ConfigError(nvml::kErrorUnknown, where + ": need memoryReservedBytes <= memoryUsedBytes <= memoryTotalBytes");
  }
  gpu.numa_node = j.value("numaNode", -1);
  if (j.contains("computeCapability")) {
    const auto cc = j.at("computeCapability").get<std::string>();
    const auto dot = cc.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 >= cc.size() ||
        cc.find_first_not_of("0123456789.") != std::string::npos) {
      throw ConfigError(nvml::kErrorUnknown, where + ".computeCapability \"" + cc + "\" is not MAJOR.MINOR");
    }
    gpu.cc_major = std::stoi(cc.substr(0, dot));
    gpu.cc_minor = std::stoi(cc.substr(dot + 1));
  }
  gpu.brand = j.value("brand", gpu.brand);
  gpu.nvlink_peer_names = j.value("nvlinkPeers", std::vector<std::string>{});
  if (gpu.nvlink_peer_names.size() > nvml::kNvLinkMaxLinks) {
    throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkPeers has more than 18 links");
  }
  gpu.nvlink_count = j.value("nvlinkCount", static_cast<unsigned int>(gpu.nvlink_peer_names.size()));
  if (gpu.nvlink_count < gpu.nvlink_peer_names.size() || gpu.nvlink_count > nvml::kNvLinkMaxLinks) {
    throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkCount must be at least the number of nvlinkPeers and at most 18");
  }
  if (j.contains("nvswitchLinks")) {
    const unsigned int configured = gpu.nvlink_count;
    ApplySwitchLinks(j.at("nvswitchLinks"), gpu, where + ".nvswitchLinks");
    if (j.contains("nvlinkCount") && gpu.nvlink_count != configured) {
      throw ConfigError(nvml::kErrorUnknown, where + ".nvlinkCount is below a link of nvswitchLinks");
    }
  }
  ParseMig(j, gpu, where);
  // MIG reconfigurations (nvmlEventMigConfigChange) are reported by default on every GPU of
  // compute capability 8.0 (Ampere) or newer, MIG mode on or off, as current drivers do (DCGM
  // registers it on those GPUs "regardless MIG state", and NOT_SUPPORTED only from older
  // drivers), and on any GPU with MIG mode on. "supportedEventTypes" models another driver.
  const bool mig_capable = gpu.cc_major >= 8 || gpu.mig_enabled;
  gpu.supported_events =
      j.value("supportedEventTypes", kDefaultSupportedEvents | (mig_capable ? nvml::kEventMigConfigChange : 0));
  if (j.contains("fabric")) {
    const Json& f = j.at("fabric");
    CheckKeys(f, {"clusterUuid", "cliqueId", "state", "status", "healthMask", "healthSummary"}, where + ".fabric");
    gpu.fabric.present = true;
    const auto cluster = f.at("clusterUuid").get<std::string>();
    if (!ParseUuidBytes(cluster, &gpu.fabric.cluster_uuid)) {
      throw ConfigError(nvml::kErrorUnknown, where + ".fabric.clusterUuid \"" + cluster + "\" is not a UUID");
    }
    gpu.fabric.clique_id = f.at("cliqueId").get<unsigned int>();
    gpu.fabric.state = ParseFabricState(f.at("state"));
    gpu.fabric.status = ParseReturnCode(f.value("status", Json("success")), where + ".fabric.status");
    gpu.fabric.health_mask = f.value("healthMask", 0u);
    gpu.fabric.health_summary = f.value("healthSummary", static_cast<unsigned char>(0));
  }
  if (j.contains("health")) ApplyHealth(j.at("health"), gpu, where + ".health", false);
  return gpu;
}

// Turns each nvlinkPeers entry (a GPU UUID or a PCI bus id) into what
// nvmlDeviceGetNvLinkRemotePciInfo_v2 reports: the remote's PCI info without pciSubSystemId.
void ResolvePeers(Config& config) {
  for (std::size_t i = 0; i < config.gpus.size(); ++i) {
    Gpu& gpu = config.gpus[i];
    for (const std::string& name : gpu.nvlink_peer_names) {
      const Gpu* peer = nullptr;
      const auto address = ParsePciBusId(name);
      for (const Gpu& other : config.gpus) {
        const bool same_bus = address && other.address.domain == address->domain &&
                              other.address.bus == address->bus && other.address.device == address->device;
        if (other.uuid == name || same_bus) peer = &other;
      }
      if (peer == nullptr && !address) {
        throw ConfigError(nvml::kErrorUnknown, "gpus[" + std::to_string(i) + "].nvlinkPeers: \"" + name +
                                                   "\" is neither a configured GPU UUID nor a PCI bus id");
      }
      // A PCI address that is no configured GPU stands for another device (e.g. an NVSwitch).
      gpu.nvlink_remote.push_back(peer != nullptr ? MakePciInfo(peer->address, peer->pci.pciDeviceId, 0)
                                                  : MakePciInfo(*address, 0, 0));
    }
  }
}

Config LoadConfig() {
  const char* path = std::getenv("FAKE_NVML_CONFIG");
  if (path == nullptr || *path == '\0') {
    throw ConfigError(nvml::kErrorDriverNotLoaded, "FAKE_NVML_CONFIG is not set (it names the GPU description JSON file)");
  }
  const std::string file = path;
  std::ifstream in(file);
  if (!in) {
    throw ConfigError(nvml::kErrorDriverNotLoaded, "cannot read FAKE_NVML_CONFIG file " + file + ": " + std::strerror(errno));
  }
  try {
    const Json j = Json::parse(in);
    CheckKeys(j, {"driverVersion", "cudaDriverVersion", "gpus"}, "top level");
    Config config;
    config.driver_version = j.value("driverVersion", std::string(kDefaultDriverVersion));
    config.cuda_driver_version = j.value("cudaDriverVersion", kDefaultCudaDriverVersion);
    const Json& gpus = j.at("gpus");
    if (!gpus.is_array()) throw ConfigError(nvml::kErrorUnknown, "gpus must be an array");
    for (std::size_t i = 0; i < gpus.size(); ++i) config.gpus.push_back(ParseGpu(gpus[i], i));
    std::set<std::string> uuids;
    std::set<std::string> bus_ids;
    std::set<unsigned int> minors;
    for (const Gpu& gpu : config.gpus) {
      if (!uuids.insert(gpu.uuid).second) throw ConfigError(nvml::kErrorUnknown, "duplicate uuid " + gpu.uuid);
      for (const auto& mig : gpu.mig_slots) {
        if (mig && !uuids.insert(mig->uuid).second) throw ConfigError(nvml::kErrorUnknown, "duplicate uuid " + mig->uuid);
      }
      if (!bus_ids.insert(gpu.pci.busId).second) throw ConfigError(nvml::kErrorUnknown, std::string("duplicate pciBusId ") + gpu.pci.busId);
      if (!minors.insert(gpu.minor).second) throw ConfigError(nvml::kErrorUnknown, "duplicate minor " + std::to_string(gpu.minor));
    }
    ResolvePeers(config);
    return config;
  } catch (const ConfigError& e) {
    throw ConfigError(e.code, "invalid FAKE_NVML_CONFIG file " + file + ": " + e.what());
  } catch (const Json::exception& e) {
    throw ConfigError(nvml::kErrorUnknown, "invalid FAKE_NVML_CONFIG file " + file + ": " + e.what());
  }
}

Return CopyString(const std::string& value, char* out, unsigned int length) {
  if (out == nullptr) return nvml::kErrorInvalidArgument;
  if (value.size() + 1 > length) return nvml::kErrorInsufficientSize;
  std::memcpy(out, value.c_str(), value.size() + 1);
  return nvml::kSuccess;
}

bool IsKnownFunction(std::string_view name) {
  for (const auto& symbol : nvml::kSymbols) {
    if (symbol.name == name) return true;
  }
  return false;
}

// ---- Control socket -------------------------------------------------------------------------

// A unix datagram socket at FAKE_NVML_CONTROL; one JSON command per datagram. A sender that
// bound its own address (fakenvmlctl.py binds an abstract one) gets a JSON reply.
class ControlServer {
 public:
  using Handler = std::string (*)(std::string_view command);

  static std::unique_ptr<ControlServer> Start(const std::string& path, Handler handler, std::string* error) {
    std::unique_ptr<ControlServer> server(new ControlServer(path, handler));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
      *error = "control socket path " + path + " is too long";
      return nullptr;
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    server->sock_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    server->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (server->sock_fd_ < 0 || server->wake_fd_ < 0) {
      *error = std::string("cannot create control socket: ") + std::strerror(errno);
      return nullptr;
    }
    // A socket left behind by a crashed run would make bind fail with EADDRINUSE.
    ::unlink(path.c_str());
    if (::bind(server->sock_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      *error = "cannot bind control socket " + path + ": " + std::strerror(errno);
      return nullptr;
    }
    server->thread_ = std::thread([s = server.get()] { s->Run(); });
    return server;
  }

  ~ControlServer() {
    if (thread_.joinable()) {
      const std::uint64_t one = 1;
      // Ignoring a short write is safe: the eventfd counter cannot overflow from one write.
      [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
      thread_.join();
    }
    if (sock_fd_ >= 0) ::close(sock_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  // Removes the socket's path. Called under the library's lock, before the server is handed
  // out of it to be joined: a newer nvmlInit may bind a fresh socket at the same path right
  // after, and removing the path later (even "only if the inode is still ours") could remove
  // that one, since a freed inode number is often reused at once.
  void Unlink() {
    if (!unlinked_) ::unlink(path_.c_str());
    unlinked_ = true;
  }

  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

 private:
  ControlServer(std::string path, Handler handler) : path_(std::move(path)), handler_(handler) {}

  void Run() {
    std::vector<char> buffer(64 * 1024);
    while (true) {
      pollfd fds[2] = {{sock_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "fake_nvml: control socket poll failed: %s\n", std::strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      sockaddr_un from{};
      socklen_t from_len = sizeof(from);
      const ssize_t n = ::recvfrom(sock_fd_, buffer.data(), buffer.size(), MSG_DONTWAIT,
                                   reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n < 0) continue;  // EAGAIN after a spurious wake-up
      const std::string reply = handler_(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
      if (from_len > sizeof(sa_family_t)) {
        // Best effort: a client that stopped listening must not stall the fake.
        ::sendto(sock_fd_, reply.data(), reply.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&from), from_len);
      }
    }
  }

  std::string path_;
  Handler handler_;
  int sock_fd_ = -1;
  int wake_fd_ = -1;
  bool unlinked_ = false;
  std::thread thread_;
};

// Whether a live process serves the datagram socket at `path` (a stale one refuses).
bool LiveSocketAt(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

// Sends `command` to the control socket at `to` and returns its reply; nullopt when nothing
// answers there. `gone`: the socket refused (its process is gone: the kernel closed what it held).
std::optional<Json> Ask(const std::string& to_path, const std::string& text, bool* gone = nullptr) {
  sockaddr_un to{};
  to.sun_family = AF_UNIX;
  if (to_path.size() >= sizeof(to.sun_path)) return std::nullopt;
  std::memcpy(to.sun_path, to_path.c_str(), to_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::optional<Json> reply;
  sockaddr_un self{};
  self.sun_family = AF_UNIX;  // autobind: an abstract address the reply can come back to
  timeval timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&self), sizeof(sa_family_t)) == 0 &&
      ::sendto(fd, text.data(), text.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) >= 0) {
    std::vector<char> buffer(64 * 1024);
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
    if (n > 0) {
      auto parsed = Json::parse(std::string_view(buffer.data(), static_cast<std::size_t>(n)), nullptr, false);
      if (!parsed.is_discarded()) reply = std::move(parsed);
    }
  } else if (gone != nullptr) {
    *gone = errno == ECONNREFUSED || errno == ENOENT;
  }
  ::close(fd);
  return reply;
}

// Sends `command` to every client process of the driver served at `primary` (their sockets are
// <primary>.c<pid>) and returns their replies. A client that is gone (its socket refuses) is
// forgotten.
std::vector<Json> AskClients(const std::string& primary, const Json& command) {
  std::vector<Json> replies;
  if (primary.empty()) return replies;
  const auto slash = primary.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : primary.substr(0, slash);
  const std::string prefix = (slash == std::string::npos ? primary : primary.substr(slash + 1)) + ".c";
  std::error_code ec;
  std::vector<std::string> clients;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) clients.push_back(entry.path().string());
  }
  const std::string text = command.dump();
  for (const auto& client : clients) {
    bool gone = false;
    if (auto reply = Ask(client, text, &gone)) replies.push_back(std::move(*reply));
    if (gone) ::unlink(client.c_str());
  }
  return replies;
}

// A process-wide object that is never destroyed: a caller's thread may still be inside an NVML
// call (a detached event waiter in nvmlEventSetWait_v2, a hung call) while the process exits, so
// the state must outlive static destruction; and LSan is told it is kept on purpose, also after
// dlclose unmaps the pointer to it.
template <typename T>
T& Immortal() {
  static T* object = [] {
    auto* created = new T;
#if defined(__SANITIZE_ADDRESS__)
    __lsan_ignore_object(created);
#endif
    return created;
  }();
  return *object;
}

// ---- Hung calls ------------------------------------------------------------------------------

// NVML calls that block, as DCGM-style stalls do: a named function (or every one, "*") blocks
// for N seconds, or until released when N is 0. Its own lock, not the library's: a hung call
// holds nothing, so other calls (and the control socket) go on meanwhile.
class HangState {
 public:
  void Hang(const std::string& function, unsigned int seconds) {
    std::lock_guard lock(mu_);
    hangs_[function] = seconds == 0 ? std::chrono::steady_clock::time_point::max()
                                    : std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  }

  // Ends every hang: blocked calls go on, later calls do not block.
  void Release() {
    std::lock_guard lock(mu_);
    hangs_.clear();
    cv_.notify_all();
  }

  // Blocks while a hang covers `function`.
  void Wait(std::string_view function) {
    std::unique_lock lock(mu_);
    if (hangs_.empty()) return;
    bool counted = false;
    while (true) {
      auto it = hangs_.find(function);
      if (it == hangs_.end()) it = hangs_.find("*");
      if (it == hangs_.end() || std::chrono::steady_clock::now() >= it->second) break;
      if (!counted) {
        counted = true;
        ++hung_;
      }
      if (it->second == std::chrono::steady_clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, it->second);
      }
    }
    if (counted) --hung_;
  }

  unsigned int Hung() const {
    std::lock_guard lock(mu_);
    return hung_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::chrono::steady_clock::time_point, std::less<>> hangs_;
  unsigned int hung_ = 0;  // calls blocked right now
};

HangState& Hangs() { return Immortal<HangState>(); }

// ---- The fake library state ---------------------------------------------------------------------

struct EventSetState {
  std::map<std::size_t, unsigned long long> registered;  // GPU index -> event mask
  std::deque<nvml::EventData> queue;
  bool closed = false;
  std::condition_variable cv;
};

class FakeNvml {
 public:
  // At exit or dlclose (ControlStopper below): stop the control thread.
  void StopControl() {
    std::unique_ptr<ControlServer> control;
    {
      std::lock_guard lock(mu_);
      control = std::move(control_);
      if (control) control->Unlink();
    }
  }

  Return Init(std::string_view function, unsigned int flags) {
    Hangs().Wait(function);
    std::unique_lock lock(mu_);
    if (const auto failure = Failure(function)) return *failure;
    if (init_count_ > 0) {
      ++init_count_;  // reference counted, as documented for nvmlInit_v2
      return nvml::kSuccess;
    }
    Config config;
    try {
      config = LoadConfig();
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "fake_nvml: %.*s failed: %s\n", static_cast<int>(function.size()), function.data(), e.what());
      return e.code;
    }
    if (config.gpus.empty() && (flags & nvml::kInitFlagNoGpus) == 0) {
      std::fprintf(stderr, "fake_nvml: %s lists no GPUs; init fails without NVML_INIT_FLAG_NO_GPUS\n",
                   std::getenv("FAKE_NVML_CONFIG"));
      return nvml::kErrorDriverNotLoaded;
    }
    if (const char* control_path = std::getenv("FAKE_NVML_CONTROL"); control_path != nullptr && *control_path != '\0') {
      std::string error;
      // One driver, several NVML clients: when another live process serves the path (the
      // supervisor, for its NVML event waiter child), this one is a client of the same
      // simulated driver, at <path>.c<pid>; the serving one forwards what the driver does
      // (XIDs, failures, MIG reconfigurations) to it and asks it what its event sets hold.
      std::string path = control_path;
      primary_path_.clear();
      if (LiveSocketAt(path)) {
        // The driver's failures so far hold for this client too (a GPU lost stays lost).
        if (auto reply = Ask(path, R"({"getFailures":true})"); reply && reply->contains("failures")) {
          for (const auto& [name, code] : reply->at("failures").items()) failures_[name] = code.get<Return>();
          // So does what was set of the GPUs' health.
          if (reply->contains("health")) {
            for (const auto& [uuid, patch] : reply->at("health").items()) health_patches_[uuid] = patch;
          }
        }
        path += ".c" + std::to_string(::getpid());
      } else {
        primary_path_ = path;
      }
      control_ = ControlServer::Start(path, &FakeNvml::HandleCommand, &error);
      if (!control_) {
        std::fprintf(stderr, "fake_nvml: FAKE_NVML_CONTROL: %s\n", error.c_str());
        return nvml::kErrorUnknown;
      }
    }
    config_ = std::move(config);
    ApplyHealthPatches();
    ++generation_;
    init_count_ = 1;
    return nvml::kSuccess;
  }

  Return Shutdown(std::string_view function) {
    Hangs().Wait(function);
    std::unique_ptr<ControlServer> stopping;
    {
      std::lock_guard lock(mu_);
      if (const auto failure = Failure(function)) return *failure;
      // "For backwards compatibility, no error is reported if nvmlShutdown() is called more
      // times than nvmlInit()."
      if (init_count_ == 0 || --init_count_ > 0) return nvml::kSuccess;
      for (auto& [id, set] : event_sets_) {
        set->closed = true;
        set->cv.notify_all();
      }
      event_sets_.clear();
      config_ = Config{};
      stopping = std::move(control_);
      if (stopping) stopping->Unlink();
    }
    // Joined outside the lock: the control thread may be waiting for it in a command.
    stopping.reset();
    return nvml::kSuccess;
  }

  // Runs `body(config)` for an initialized library after failure injection.
  template <typename Body>
  Return WithInit(std::string_view function, Body&& body) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    Hangs().Wait(function);  // outside the lock: a hung call blocks only its caller
    std::lock_guard lock(mu_);
    if (const auto failure = Failure(function)) return *failure;
    if (init_count_ == 0) return nvml::kErrorUninitialized;
    return body(config_);
  }

  // Runs `body(gpu, index)` for a valid device handle of the current init generation.
  template <typename Body>
  Return WithGpu(std::string_view function, nvml::Device device, Body&& body) {
    return WithInit(function, [&](const Config& config) {
      const auto index = IndexOf(device, config);
      if (!index) return nvml::kErrorInvalidArgument;
      if (config.gpus[*index].health.lost) return nvml::kErrorGpuIsLost;
      return body(config.gpus[*index], *index);
    });
  }

  // Handles encode (init generation, MIG slot + 1 or 0 for the whole GPU, GPU index + 1) instead
  // of pointing at memory, so a handle kept across nvmlShutdown is rejected instead of
  // dereferenced. Whole-GPU functions reject MIG handles (INVALID_ARGUMENT).
  nvml::Device HandleOf(std::size_t index, std::optional<std::size_t> mig_slot = std::nullopt) const {
    const std::uintptr_t mig = mig_slot ? *mig_slot + 1 : 0;
    return reinterpret_cast<nvml::Device>(static_cast<std::uintptr_t>((generation_ << 16) | (mig << 8) | (index + 1)));
  }

  std::optional<std::size_t> IndexOf(nvml::Device device, const Config& config) const {
    const auto value = reinterpret_cast<std::uintptr_t>(device);
    if ((value & 0xFF00u) != 0) return std::nullopt;  // a MIG handle
    const std::size_t index = (value & 0xFFu) - 1;
    if ((value >> 16) != generation_ || (value & 0xFFu) == 0 || index >= config.gpus.size()) return std::nullopt;
    return index;
  }

  // Runs `body(gpu, index, mig)` for a whole-GPU handle (mig == nullptr) or a MIG handle.
  template <typename Body>
  Return WithDevice(std::string_view function, nvml::Device device, Body&& body) {
    return WithInit(function, [&](const Config& config) {
      const auto value = reinterpret_cast<std::uintptr_t>(device);
      const std::size_t index = (value & 0xFFu) - 1;
      const std::size_t mig = (value >> 8) & 0xFFu;
      if ((value >> 16) != generation_ || (value & 0xFFu) == 0 || index >= config.gpus.size()) {
        return nvml::kErrorInvalidArgument;
      }
      const Gpu& gpu = config.gpus[index];
      if (gpu.health.lost) return nvml::kErrorGpuIsLost;
      if (mig == 0) return body(gpu, index, static_cast<const MigDevice*>(nullptr));
      // A MIG handle from before a reconfiguration is stale.
      if (!gpu.mig_enabled || mig - 1 >= gpu.mig_slots.size() || !gpu.mig_slots[mig - 1]) {
        return nvml::kErrorInvalidArgument;
      }
      return body(gpu, index, &*gpu.mig_slots[mig - 1]);
    });
  }

  unsigned long long Calls() const { return calls_.load(std::memory_order_relaxed); }

  Return EventSetCreate(std::string_view function, nvml::EventSet* set) {
    return WithInit(function, [&](const Config&) {
      if (set == nullptr) return nvml::kErrorInvalidArgument;
      const std::uintptr_t id = next_event_set_id_++;
      event_sets_.emplace(id, std::make_shared<EventSetState>());
      *set = reinterpret_cast<nvml::EventSet>(id);
      return nvml::kSuccess;
    });
  }

  Return RegisterEvents(std::string_view function, nvml::Device device, unsigned long long types, nvml::EventSet set) {
    return WithGpu(function, device, [&](const Gpu& gpu, std::size_t index) {
      const auto it = event_sets_.find(reinterpret_cast<std::uintptr_t>(set));
      if (it == event_sets_.end()) return nvml::kErrorInvalidArgument;
      // "If function reports NVML_ERROR_NOT_SUPPORTED ... None of the requested eventTypes are
      // registered in that case."
      if ((types & ~gpu.supported_events) != 0) return nvml::kErrorNotSupported;
      it->second->registered[index] |= types;
      return nvml::kSuccess;
    });
  }

  Return EventSetWait(std::string_view function, nvml::EventSet set, nvml::EventData* data, unsigned int timeout_ms) {
    Hangs().Wait(function);
    std::unique_lock lock(mu_);
    last_wait_timeout_ms_ = timeout_ms;
    if (const auto failure = Failure(function)) return *failure;
    if (init_count_ == 0) return nvml::kErrorUninitialized;
    const auto it = event_sets_.find(reinterpret_cast<std::uintptr_t>(set));
    if (it == event_sets_.end() || data == nullptr) return nvml::kErrorInvalidArgument;
    // Held while waiting: nvmlEventSetFree or nvmlShutdown may drop the set meanwhile.
    const std::shared_ptr<EventSetState> state = it->second;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      if (!state->closed && !state->queue.empty()) {
        *data = state->queue.front();
        state->queue.pop_front();
        return nvml::kSuccess;
      }
      // A failure injected while we wait (say GPU_IS_LOST) ends the wait, like a real error.
      if (const auto failure = Failure(function)) return *failure;
      // Nothing else ends a wait before its timeout: NVML has no way to interrupt one, and a
      // set freed (or NVML shut down) under a wait is the caller's bug, not a wake-up.
      if (state->cv.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (state->closed) return init_count_ == 0 ? nvml::kErrorUninitialized : nvml::kErrorInvalidArgument;
        if (state->queue.empty() && !Failure(function)) return nvml::kErrorTimeout;
      }
    }
  }

  Return EventSetFree(std::string_view function, nvml::EventSet set) {
    return WithInit(function, [&](const Config&) {
      const auto it = event_sets_.find(reinterpret_cast<std::uintptr_t>(set));
      if (it == event_sets_.end()) return nvml::kErrorInvalidArgument;
      it->second->closed = true;
      it->second->cv.notify_all();
      event_sets_.erase(it);
      return nvml::kSuccess;
    });
  }

  // Returns the NVML code and, through `delivered`, how many event sets got the event.
  Return InjectXid(std::string_view gpu_name, unsigned long long xid, std::size_t* delivered,
                   unsigned int gpu_instance = nvml::kInstanceIdNone,
                   unsigned int compute_instance = nvml::kInstanceIdNone) {
    return InjectEvent(gpu_name, nvml::kEventTypeXidCriticalError, xid, delivered, gpu_instance, compute_instance);
  }

  // Queues an event of `type` (one nvmlEventType* bit) with `data` as its eventData on every
  // event set of this process registered for that type on the GPU. Returns the NVML code and,
  // through `delivered`, how many event sets got it.
  Return InjectEvent(std::string_view gpu_name, unsigned long long type, unsigned long long data,
                     std::size_t* delivered, unsigned int gpu_instance = nvml::kInstanceIdNone,
                     unsigned int compute_instance = nvml::kInstanceIdNone) {
    std::lock_guard lock(mu_);
    *delivered = 0;
    if (init_count_ == 0) return nvml::kErrorUninitialized;
    const auto index = FindGpuLocked(gpu_name);
    if (!index) return nvml::kErrorNotFound;
    for (auto& [id, set] : event_sets_) {
      const auto reg = set->registered.find(*index);
      if (reg == set->registered.end() || (reg->second & type) == 0) continue;
      // A MIG-attributed Xid names the GPU instance (and compute instance) on the parent's handle.
      set->queue.push_back(nvml::EventData{HandleOf(*index), type, data, gpu_instance, compute_instance});
      set->cv.notify_all();
      ++*delivered;
    }
    return nvml::kSuccess;
  }

  // The event types this process's event sets registered on the GPU (OR of them); 0 when none,
  // nullopt for an unknown GPU.
  std::optional<unsigned long long> RegisteredEvents(std::string_view gpu_name) {
    std::lock_guard lock(mu_);
    if (init_count_ == 0) return 0;
    const auto index = FindGpuLocked(gpu_name);
    if (!index) return std::nullopt;
    unsigned long long types = 0;
    for (const auto& [id, set] : event_sets_) {
      const auto reg = set->registered.find(*index);
      if (reg != set->registered.end()) types |= reg->second;
    }
    return types;
  }

  // The GPU named by a UUID or a PCI bus id (any function). mu_ held.
  std::optional<std::size_t> FindGpuLocked(std::string_view gpu_name) const {
    const auto address = ParsePciBusId(gpu_name);
    std::optional<std::size_t> index;
    for (std::size_t i = 0; i < config_.gpus.size(); ++i) {
      const PciAddress& a = config_.gpus[i].address;
      const bool same_bus = address && a.domain == address->domain && a.bus == address->bus && a.device == address->device;
      if (config_.gpus[i].uuid == gpu_name || same_bus) index = i;
    }
    return index;
  }

  // Reads FAKE_NVML_CONFIG again, as a MIG reconfiguration changes what the driver reports
  // while NVML stays initialized: the same GPUs (UUIDs, in order) must be listed, so the init
  // generation and every whole-GPU handle stay valid; MIG handles of changed GPUs go stale.
  // Queues nvmlEventMigConfigChange on every event set registered for it on each GPU whose MIG
  // mode or MIG devices changed; `changed` counts those GPUs.
  Return ReloadConfig(std::size_t* changed, std::string* error) {
    std::lock_guard lock(mu_);
    *changed = 0;
    if (init_count_ == 0) {
      *error = "NVML is not initialized";
      return nvml::kErrorUninitialized;
    }
    Config config;
    try {
      config = LoadConfig();
    } catch (const ConfigError& e) {
      *error = e.what();
      return e.code;
    }
    bool same_gpus = config.gpus.size() == config_.gpus.size();
    for (std::size_t i = 0; same_gpus && i < config.gpus.size(); ++i) same_gpus = config.gpus[i].uuid == config_.gpus[i].uuid;
    if (!same_gpus) {
      *error = "reloadConfig: the GPUs (UUIDs, in order) must stay the same; only what a MIG reconfiguration changes may";
      return nvml::kErrorInvalidArgument;
    }
    std::vector<std::size_t> changed_gpus;
    for (std::size_t i = 0; i < config.gpus.size(); ++i) {
      const Gpu& before = config_.gpus[i];
      const Gpu& after = config.gpus[i];
      bool same = before.mig_enabled == after.mig_enabled;
      // A GPU without "migDevices" has no slots at all: the same as eight empty ones.
      for (std::size_t slot = 0; same && slot < kMaxMigSlots; ++slot) {
        const MigDevice* a = slot < before.mig_slots.size() && before.mig_slots[slot] ? &*before.mig_slots[slot] : nullptr;
        const MigDevice* b = slot < after.mig_slots.size() && after.mig_slots[slot] ? &*after.mig_slots[slot] : nullptr;
        same = (a == nullptr) == (b == nullptr) && (a == nullptr || a->SameLayout(*b));
      }
      if (!same) changed_gpus.push_back(i);
    }
    config_ = std::move(config);
    ApplyHealthPatches();
    for (const std::size_t index : changed_gpus) {
      for (auto& [id, set] : event_sets_) {
        const auto reg = set->registered.find(index);
        if (reg == set->registered.end() || (reg->second & nvml::kEventMigConfigChange) == 0) continue;
        set->queue.push_back(
            nvml::EventData{HandleOf(index), nvml::kEventMigConfigChange, 0, nvml::kInstanceIdNone, nvml::kInstanceIdNone});
        set->cv.notify_all();
      }
    }
    *changed = changed_gpus.size();
    return nvml::kSuccess;
  }

  // For a reset: "" when `uuid` is a configured GPU that no event set holds, else why not.
  std::string ResetBlocker(const std::string& uuid) {
    std::lock_guard lock(mu_);
    if (init_count_ == 0) return "NVML is not initialized (no GPUs visible)";
    std::optional<std::size_t> index;
    for (std::size_t i = 0; i < config_.gpus.size(); ++i) {
      if (config_.gpus[i].uuid == uuid) index = i;
    }
    if (!index) return "No GPU with UUID " + uuid + " was found";
    for (const auto& [id, set] : event_sets_) {
      if (set->registered.count(*index) != 0) return "GPU " + uuid + " is in use by an NVML client (an event set holds it)";
    }
    return "";
  }

  // "" when `uuid` is one of the fake's GPUs, else the error a tool would print.
  std::string KnowsGpu(const std::string& uuid) {
    std::lock_guard lock(mu_);
    if (init_count_ == 0) return "NVML is not initialized (no GPUs visible)";
    for (const auto& gpu : config_.gpus) {
      if (gpu.uuid == uuid) return "";
    }
    return "No GPU with UUID " + uuid + " was found";
  }

  // Whether an event set of this process holds `uuid` (asked by the serving process).
  bool HoldsGpu(const std::string& uuid) {
    std::lock_guard lock(mu_);
    if (init_count_ == 0) return false;
    for (std::size_t i = 0; i < config_.gpus.size(); ++i) {
      if (config_.gpus[i].uuid != uuid) continue;
      for (const auto& [id, set] : event_sets_) {
        if (set->registered.count(i) != 0) return true;
      }
    }
    return false;
  }

  // The serving process's path, "" in a client process (or without a control socket).
  std::string PrimaryPath() const {
    std::lock_guard lock(mu_);
    return control_ ? primary_path_ : std::string();
  }

  Return SetFailure(std::string_view function, Return code) {
    if (function != "*" && !IsKnownFunction(function)) return nvml::kErrorInvalidArgument;
    std::lock_guard lock(mu_);
    failures_[std::string(function)] = code;
    WakeAllWaiters();
    return nvml::kSuccess;
  }

  std::map<std::string, Return> Failures() const {
    std::lock_guard lock(mu_);
    return {failures_.begin(), failures_.end()};
  }

  Return ClearFailures() {
    std::lock_guard lock(mu_);
    failures_.clear();
    return nvml::kSuccess;
  }

  // A run-time change of one GPU's health readings (setHealth), kept by UUID for the life of the
  // process (across nvmlShutdown/nvmlInit and reloadConfig, as a fault of the hardware is) and
  // applied over what the config says. Keys of the maintenance state go there. Throws
  // ConfigError / a JSON error for a bad patch (nothing changes then).
  void SetHealth(const std::string& uuid, const Json& patch) {
    Json maintenance = Json::object();
    Json health = Json::object();
    for (const auto& [key, value] : patch.items()) {
      if (key == "uuid") continue;
      if (key == "remapPending" || key == "remapFailure" || key == "retiredPagesPending" || key == "persistence") {
        maintenance[key] = value;
      } else {
        health[key] = value;
      }
    }
    {
      std::lock_guard lock(mu_);
      Json merged = health_patches_.count(uuid) != 0 ? health_patches_[uuid] : Json::object();
      merged.update(health);
      Gpu probe;  // validates the patch before anything changes
      probe.fabric.present = true;
      ApplyHealth(merged, probe, "setHealth", false);
      health_patches_[uuid] = std::move(merged);
      ApplyHealthPatches();
    }
    if (!maintenance.empty()) {
      maintenance["uuid"] = uuid;
      Maintenance().Set(maintenance);
    }
  }

  // Forgets every run-time health change: the GPUs read as configured again.
  void ClearHealth() {
    std::lock_guard lock(mu_);
    health_patches_.clear();
    if (init_count_ == 0) return;
    try {
      Config config = LoadConfig();
      if (config.gpus.size() == config_.gpus.size()) {
        for (std::size_t i = 0; i < config.gpus.size(); ++i) {
          config_.gpus[i].health = config.gpus[i].health;
          config_.gpus[i].fabric = config.gpus[i].fabric;
          config_.gpus[i].nvswitch_links = config.gpus[i].nvswitch_links;
          config_.gpus[i].nvlink_count = config.gpus[i].nvlink_count;
        }
      }
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "fake_nvml: clearHealth: %s\n", e.what());
    }
  }

  Json HealthPatches() const {
    std::lock_guard lock(mu_);
    Json out = Json::object();
    for (const auto& [uuid, patch] : health_patches_) out[uuid] = patch;
    return out;
  }

  Return LastWaitTimeout(unsigned int* timeout_ms) const {
    if (timeout_ms == nullptr) return nvml::kErrorInvalidArgument;
    std::lock_guard lock(mu_);
    *timeout_ms = last_wait_timeout_ms_;
    return nvml::kSuccess;
  }

 private:
  // Caller holds mu_.
  std::optional<Return> Failure(std::string_view function) const {
    if (failures_.empty()) return std::nullopt;
    if (const auto it = failures_.find(function); it != failures_.end()) return it->second;
    if (const auto it = failures_.find("*"); it != failures_.end()) return it->second;
    return std::nullopt;
  }

  // Caller holds mu_. Applies the run-time health changes over the configured GPUs.
  void ApplyHealthPatches() {
    for (Gpu& gpu : config_.gpus) {
      const auto it = health_patches_.find(gpu.uuid);
      if (it == health_patches_.end()) continue;
      try {
        ApplyHealth(it->second, gpu, "setHealth", false);
      } catch (const std::exception& e) {  // validated when set: only a fabric the config dropped
        std::fprintf(stderr, "fake_nvml: setHealth for %s: %s\n", gpu.uuid.c_str(), e.what());
      }
    }
  }

  void WakeAllWaiters() {
    for (auto& [id, set] : event_sets_) set->cv.notify_all();
  }

  static std::string HandleCommand(std::string_view text);

  mutable std::mutex mu_;
  std::atomic<unsigned long long> calls_{0};  // NVML calls through WithInit (fakeNvmlCallCount)
  unsigned int last_wait_timeout_ms_ = 0;  // of the latest nvmlEventSetWait_v2 call (0: none yet)
  int init_count_ = 0;
  std::uintptr_t generation_ = 0;
  Config config_;
  std::uintptr_t next_event_set_id_ = 1;
  std::map<std::uintptr_t, std::shared_ptr<EventSetState>> event_sets_;
  std::map<std::string, Return, std::less<>> failures_;
  std::string primary_path_;  // FAKE_NVML_CONTROL when this process serves it
  std::map<std::string, Json> health_patches_;  // UUID → setHealth keys in force
  // Last member: destroyed (thread joined) first.
  std::unique_ptr<ControlServer> control_;
};

// Never destroyed: a caller's detached event waiter may still be inside nvmlEventSetWait_v2
// (and then free its set) while the process exits.
FakeNvml& Fake() { return Immortal<FakeNvml>(); }

// Stops the control thread at exit or dlclose, before the code it runs goes away.
struct ControlStopper {
  ~ControlStopper() { Fake().StopControl(); }
} control_stopper;

// An event type by the name injectEvent takes: "xid", "singleBitEcc", "doubleBitEcc", "clock",
// "pstate", or a number (the nvmlEventType* mask bit).
unsigned long long EventTypeByName(const std::string& name) {
  if (name == "xid") return nvml::kEventTypeXidCriticalError;
  if (name == "singleBitEcc") return nvml::kEventTypeSingleBitEccError;
  if (name == "doubleBitEcc") return nvml::kEventTypeDoubleBitEccError;
  if (name == "clock") return nvml::kEventTypeClock;
  if (name == "pstate") return nvml::kEventTypePState;
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(name, &used, 0);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != name.size() || value == 0 || (value & (value - 1)) != 0) {
    throw std::runtime_error("injectEvent: unknown event type \"" + name + "\"");
  }
  return value;
}

// One control-socket command: {"injectXid":{"uuid":"GPU-…","xid":79}},
// {"injectEvent":{"uuid":"GPU-…","type":"doubleBitEcc","data":0}},
// {"registeredEvents":{"uuid":"GPU-…"}} (reply "types": the mask every process registered),
// {"fail":{"function":"*","return":999}}, {"clearFailures":true}, {"reloadConfig":true} or
// {"setTimeSlice":{"uuid":"GPU-…","value":3}} (nvidia-smi compute-policy), {"ping":true}. Several keys
// in one object run in order. The reply is {"ok":true} or {"ok":false,"error":"…"}.
std::string FakeNvml::HandleCommand(std::string_view text) {
  Json reply = {{"ok", true}};
  try {
    const Json command = Json::parse(text);
    if (!command.is_object() || command.empty()) throw std::runtime_error("a command must be a non-empty JSON object");
    for (const auto& [key, value] : command.items()) {
      if (key == "injectXid") {
        std::size_t delivered = 0;
        const auto gpu = value.at("uuid").get<std::string>();
        // Optional MIG attribution: "gpuInstance" / "computeInstance" (absent: the whole GPU).
        const Return rc = Fake().InjectXid(gpu, value.at("xid").get<unsigned long long>(), &delivered,
                                           value.value("gpuInstance", nvml::kInstanceIdNone),
                                           value.value("computeInstance", nvml::kInstanceIdNone));
        // The driver raises it for every NVML client: the other processes' event sets too.
        for (const auto& answer : AskClients(Fake().PrimaryPath(), {{key, value}})) {
          delivered += answer.value("delivered", std::size_t{0});
        }
        if (rc != nvml::kSuccess && (rc != nvml::kErrorUninitialized || delivered == 0)) {
          throw std::runtime_error("injectXid " + gpu + ": NVML error " + std::to_string(rc));
        }
        reply["delivered"] = delivered;
      } else if (key == "injectEvent") {
        std::size_t delivered = 0;
        const auto gpu = value.at("uuid").get<std::string>();
        const auto type = EventTypeByName(value.at("type").get<std::string>());
        const Return rc = Fake().InjectEvent(gpu, type, value.value("data", 0ULL), &delivered);
        for (const auto& answer : AskClients(Fake().PrimaryPath(), {{key, value}})) {
          delivered += answer.value("delivered", std::size_t{0});
        }
        if (rc != nvml::kSuccess && (rc != nvml::kErrorUninitialized || delivered == 0)) {
          throw std::runtime_error("injectEvent " + gpu + ": NVML error " + std::to_string(rc));
        }
        reply["delivered"] = delivered;
      } else if (key == "registeredEvents") {
        // What the event sets of every process of this driver registered on the GPU.
        const auto gpu = value.at("uuid").get<std::string>();
        const auto own = Fake().RegisteredEvents(gpu);
        if (!own) throw std::runtime_error("registeredEvents: unknown GPU " + gpu);
        unsigned long long types = *own;
        if (!value.value("local", false)) {
          Json ask = value;
          ask["local"] = true;
          for (const auto& answer : AskClients(Fake().PrimaryPath(), {{key, ask}})) {
            types |= answer.value("types", 0ULL);
          }
        }
        reply["types"] = types;
      } else if (key == "fail") {
        const auto function = value.at("function").get<std::string>();
        if (Fake().SetFailure(function, value.at("return").get<Return>()) != nvml::kSuccess) {
          throw std::runtime_error("fail: unknown NVML function \"" + function + "\"");
        }
        AskClients(Fake().PrimaryPath(), {{key, value}});
      } else if (key == "clearFailures") {
        Fake().ClearFailures();
        AskClients(Fake().PrimaryPath(), {{key, value}});
      } else if (key == "reloadConfig") {
        std::size_t changed = 0;
        std::string error;
        if (Fake().ReloadConfig(&changed, &error) != nvml::kSuccess) throw std::runtime_error("reloadConfig: " + error);
        AskClients(Fake().PrimaryPath(), {{key, value}});
        reply["changed"] = changed;
      } else if (key == "getFailures") {
        reply["failures"] = Fake().Failures();
        reply["health"] = Fake().HealthPatches();
      } else if (key == "setHealth") {
        Fake().SetHealth(value.at("uuid").get<std::string>(), value);
        AskClients(Fake().PrimaryPath(), {{key, value}});
      } else if (key == "clearHealth") {
        Fake().ClearHealth();
        AskClients(Fake().PrimaryPath(), {{key, value}});
      } else if (key == "hang") {
        const auto function = value.at("function").get<std::string>();
        if (function != "*" && !IsKnownFunction(function)) throw std::runtime_error("hang: unknown NVML function \"" + function + "\"");
        Hangs().Hang(function, value.value("seconds", 0u));
        AskClients(Fake().PrimaryPath(), {{key, value}});
      } else if (key == "releaseHangs") {
        Hangs().Release();
        AskClients(Fake().PrimaryPath(), {{key, value}});
      } else if (key == "getHung") {
        reply["hung"] = Hangs().Hung();
      } else if (key == "holds") {
        reply["holds"] = Fake().HoldsGpu(value.at("uuid").get<std::string>());
      } else if (key == "setGpuState") {
        Maintenance().Set(value);
      } else if (key == "getGpuState") {
        reply["state"] = Maintenance().Get(value.at("uuid").get<std::string>());
      } else if (key == "setTimeSlice") {
        const auto uuid = value.at("uuid").get<std::string>();
        std::string error = Fake().KnowsGpu(uuid);
        if (error.empty()) error = Maintenance().SetTimeSlice(uuid, value.at("value").get<int>());
        if (!error.empty()) throw std::runtime_error(error);
      } else if (key == "resetGpu") {
        const auto uuid = value.at("uuid").get<std::string>();
        std::string error = Fake().ResetBlocker(uuid);
        if (error.empty()) {
          for (const auto& answer : AskClients(Fake().PrimaryPath(), {{"holds", {{"uuid", uuid}}}})) {
            if (answer.value("holds", false)) {
              error = "GPU " + uuid + " is in use by an NVML client (an event set of another process holds it)";
            }
          }
        }
        bool hang = false;
        if (error.empty()) error = Maintenance().Reset(uuid, hang);
        if (!error.empty()) throw std::runtime_error(error);
        if (hang) reply["hang"] = true;
      } else if (key != "ping") {
        throw std::runtime_error("unknown command \"" + key + "\"");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake_nvml: control command %.*s: %s\n", static_cast<int>(text.size()), text.data(), e.what());
    reply = {{"ok", false}, {"error", e.what()}};
  }
  return reply.dump();
}

const char* ErrorString(Return code) {
  switch (code) {
    case nvml::kSuccess: return "Success";
    case nvml::kErrorUninitialized: return "Uninitialized";
    case nvml::kErrorInvalidArgument: return "Invalid Argument";
    case nvml::kErrorNotSupported: return "Not Supported";
    case nvml::kErrorNoPermission: return "Insufficient Permissions";
    case nvml::kErrorAlreadyInitialized: return "Already Initialized";
    case nvml::kErrorNotFound: return "Not Found";
    case nvml::kErrorInsufficientSize: return "Insufficient Size";
    case nvml::kErrorInsufficientPower: return "Insufficient External Power";
    case nvml::kErrorDriverNotLoaded: return "Driver Not Loaded";
    case nvml::kErrorTimeout: return "Timeout";
    case nvml::kErrorIrqIssue: return "Interrupt Request Issue";
    case nvml::kErrorLibraryNotFound: return "NVML Shared Library Not Found";
    case nvml::kErrorFunctionNotFound: return "Function Not Found";
    case nvml::kErrorCorruptedInforom: return "Corrupted infoROM";
    case nvml::kErrorGpuIsLost: return "GPU is lost";
    case nvml::kErrorResetRequired: return "GPU requires restart";
    case nvml::kErrorOperatingSystem: return "The operating system has blocked the request";
    case nvml::kErrorLibRmVersionMismatch: return "RM has detected an NVML/RM version mismatch";
    case nvml::kErrorInUse: return "In use by another client";
    case nvml::kErrorMemory: return "Insufficient Memory";
    case nvml::kErrorNoData: return "No Data";
    case nvml::kErrorArgumentVersionMismatch: return "Argument version mismatch";
    case nvml::kErrorDeprecated: return "Deprecated";
    case nvml::kErrorNotReady: return "Not Ready";
    case nvml::kErrorUnknown: return "Unknown Error";
    default: return "Unknown Error";
  }
}

}  // namespace
}  // namespace gns::sim::fake_nvml

// ---- Exported NVML entry points (exact C ABI; __func__ names the injected-failure key) --------

namespace fake = gns::sim::fake_nvml;
namespace nvml = gns::nvml;
using nvml::Return;

FAKE_NVML_EXPORT Return nvmlInit_v2() { return fake::Fake().Init(__func__, 0); }

FAKE_NVML_EXPORT Return nvmlInitWithFlags(unsigned int flags) { return fake::Fake().Init(__func__, flags); }

FAKE_NVML_EXPORT Return nvmlShutdown() { return fake::Fake().Shutdown(__func__); }

FAKE_NVML_EXPORT const char* nvmlErrorString(Return result) { return fake::ErrorString(result); }

FAKE_NVML_EXPORT Return nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return fake::Fake().WithInit(__func__, [&](const fake::Config& c) { return fake::CopyString(c.driver_version, version, length); });
}

FAKE_NVML_EXPORT Return nvmlSystemGetCudaDriverVersion_v2(int* cuda_driver_version) {
  return fake::Fake().WithInit(__func__, [&](const fake::Config& c) {
    if (cuda_driver_version == nullptr) return nvml::kErrorInvalidArgument;
    *cuda_driver_version = c.cuda_driver_version;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetCount_v2(unsigned int* device_count) {
  return fake::Fake().WithInit(__func__, [&](const fake::Config& c) {
    if (device_count == nullptr) return nvml::kErrorInvalidArgument;
    *device_count = static_cast<unsigned int>(c.gpus.size());
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvml::Device* device) {
  return fake::Fake().WithInit(__func__, [&](const fake::Config& c) {
    if (device == nullptr || index >= c.gpus.size()) return nvml::kErrorInvalidArgument;
    if (c.gpus[index].health.lost) return nvml::kErrorGpuIsLost;
    *device = fake::Fake().HandleOf(index);
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByUUID(const char* uuid, nvml::Device* device) {
  return fake::Fake().WithInit(__func__, [&](const fake::Config& c) {
    if (uuid == nullptr || device == nullptr) return nvml::kErrorInvalidArgument;
    for (std::size_t i = 0; i < c.gpus.size(); ++i) {
      if (c.gpus[i].uuid == uuid) {
        if (c.gpus[i].health.lost) return nvml::kErrorGpuIsLost;
        *device = fake::Fake().HandleOf(i);
        return nvml::kSuccess;
      }
    }
    return nvml::kErrorNotFound;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByPciBusId_v2(const char* pci_bus_id, nvml::Device* device) {
  return fake::Fake().WithInit(__func__, [&](const fake::Config& c) {
    if (pci_bus_id == nullptr || device == nullptr) return nvml::kErrorInvalidArgument;
    const auto address = fake::ParsePciBusId(pci_bus_id);
    if (!address) return nvml::kErrorInvalidArgument;
    for (std::size_t i = 0; i < c.gpus.size(); ++i) {
      const fake::PciAddress& a = c.gpus[i].address;
      if (a.domain == address->domain && a.bus == address->bus && a.device == address->device &&
          a.function == address->function) {
        if (c.gpus[i].health.lost) return nvml::kErrorGpuIsLost;
        *device = fake::Fake().HandleOf(i);
        return nvml::kSuccess;
      }
    }
    return nvml::kErrorNotFound;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetUUID(nvml::Device device, char* uuid, unsigned int length) {
  return fake::Fake().WithDevice(__func__, device, [&](const fake::Gpu& g, std::size_t, const fake::MigDevice* mig) {
    return fake::CopyString(mig != nullptr ? mig->uuid : g.uuid, uuid, length);
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetName(nvml::Device device, char* name, unsigned int length) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) { return fake::CopyString(g.name, name, length); });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetPciInfo_v3(nvml::Device device, nvml::PciInfo* pci) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (pci == nullptr) return nvml::kErrorInvalidArgument;
    *pci = g.pci;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMinorNumber(nvml::Device device, unsigned int* minor_number) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (minor_number == nullptr) return nvml::kErrorInvalidArgument;
    *minor_number = g.minor;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetCudaComputeCapability(nvml::Device device, int* major, int* minor) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (major == nullptr || minor == nullptr) return nvml::kErrorInvalidArgument;
    *major = g.cc_major;
    *minor = g.cc_minor;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetBrand(nvml::Device device, unsigned int* type) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (type == nullptr) return nvml::kErrorInvalidArgument;
    *type = g.brand;
    return nvml::kSuccess;
  });
}

namespace {
// The memory a GPU or one of its MIG devices (its memorySizeMB; used: the GPU's
// migMemoryUsedMiB for that slot, else 0) reports.
nvml::Memory_v2 MemoryOf(const fake::Gpu& g, const fake::MigDevice* mig) {
  nvml::Memory_v2 m{};
  if (mig == nullptr) {
    m.total = g.memory_total;
    m.reserved = g.memory_reserved;
    m.used = std::min(g.health.memory_used.value_or(g.memory_used), g.memory_total);
  } else {
    constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
    m.total = mig->attributes.memorySizeMB * kMiB;
    for (std::size_t slot = 0; slot < g.mig_slots.size(); ++slot) {
      if (!g.mig_slots[slot] || &*g.mig_slots[slot] != mig) continue;
      const auto it = g.health.mig_memory_used_mib.find(static_cast<unsigned int>(slot));
      if (it != g.health.mig_memory_used_mib.end()) m.used = std::min(it->second * kMiB, m.total);
    }
  }
  m.free = m.total - m.used;
  return m;
}
}  // namespace

// Whole GPUs and MIG devices (a MIG device's own slice of the frame buffer).
FAKE_NVML_EXPORT Return nvmlDeviceGetMemoryInfo(nvml::Device device, nvml::Memory* memory) {
  return fake::Fake().WithDevice(__func__, device, [&](const fake::Gpu& g, std::size_t, const fake::MigDevice* mig) {
    if (memory == nullptr) return nvml::kErrorInvalidArgument;
    const nvml::Memory_v2 m = MemoryOf(g, mig);
    *memory = nvml::Memory{m.total, m.free, m.used};
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMemoryInfo_v2(nvml::Device device, nvml::Memory_v2* memory) {
  return fake::Fake().WithDevice(__func__, device, [&](const fake::Gpu& g, std::size_t, const fake::MigDevice* mig) {
    if (memory == nullptr) return nvml::kErrorInvalidArgument;
    if (memory->version != nvml::kMemoryV2Version) return nvml::kErrorArgumentVersionMismatch;
    nvml::Memory_v2 m = MemoryOf(g, mig);
    m.version = memory->version;
    *memory = m;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMemoryAffinity(nvml::Device device, unsigned int node_set_size,
                                                    unsigned long* node_set, nvml::AffinityScope scope) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (node_set == nullptr || node_set_size == 0 ||
        (scope != nvml::kAffinityScopeNode && scope != nvml::kAffinityScopeSocket)) {
      return nvml::kErrorInvalidArgument;
    }
    if (g.numa_node < 0) return nvml::kErrorNotSupported;
    constexpr unsigned int kBitsPerWord = 8 * sizeof(unsigned long);
    const auto node = static_cast<unsigned int>(g.numa_node);
    if (node / kBitsPerWord >= node_set_size) return nvml::kErrorInsufficientSize;
    std::fill(node_set, node_set + node_set_size, 0UL);
    node_set[node / kBitsPerWord] = 1UL << (node % kBitsPerWord);
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetNumaNodeId(nvml::Device device, unsigned int* node) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (node == nullptr) return nvml::kErrorInvalidArgument;
    if (g.numa_node < 0) return nvml::kErrorNotSupported;
    *node = static_cast<unsigned int>(g.numa_node);
    return nvml::kSuccess;
  });
}

// A GPU configured without NVLink links (no nvlinkPeers, no nvlinkCount) answers NOT_SUPPORTED,
// like a PCIe card; a link past the GPU's nvlinkCount INVALID_ARGUMENT, as NVML does for a link
// number the GPU lacks. Links with a peer or an NVSwitch port are active unless set down
// (health.nvlinkDown); the others are inactive.
FAKE_NVML_EXPORT Return nvmlDeviceGetNvLinkState(nvml::Device device, unsigned int link, nvml::EnableState* is_active) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (is_active == nullptr || link >= nvml::kNvLinkMaxLinks) return nvml::kErrorInvalidArgument;
    if (g.nvlink_count == 0) return nvml::kErrorNotSupported;
    if (link >= g.nvlink_count) return nvml::kErrorInvalidArgument;
    const bool wired = link < g.nvlink_remote.size() || g.nvswitch_links.count(link) != 0;
    const bool up = wired && g.health.nvlinks_down.count(link) == 0;
    *is_active = up ? nvml::kFeatureEnabled : nvml::kFeatureDisabled;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetNvLinkRemotePciInfo_v2(nvml::Device device, unsigned int link, nvml::PciInfo* pci) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (pci == nullptr || link >= nvml::kNvLinkMaxLinks) return nvml::kErrorInvalidArgument;
    if (const auto it = g.nvswitch_links.find(link); it != g.nvswitch_links.end()) {
      *pci = fake::MakePciInfo(it->second.nvswitch, fake::kNvSwitchPciDeviceId, 0);
      return nvml::kSuccess;
    }
    if (link >= g.nvlink_remote.size()) return nvml::kErrorNotSupported;
    *pci = g.nvlink_remote[link];
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetGpuFabricInfo(nvml::Device device, nvml::GpuFabricInfo* info) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (info == nullptr) return nvml::kErrorInvalidArgument;
    if (!g.fabric.present) return nvml::kErrorNotSupported;
    std::memcpy(info->clusterUuid, g.fabric.cluster_uuid.data(), nvml::kGpuFabricUuidLen);
    info->status = g.fabric.status;
    info->cliqueId = g.fabric.clique_id;
    info->state = g.fabric.state;
    return nvml::kSuccess;
  });
}

// The caller picks the layout through `version`; v2 callers may pass a v2-sized buffer, so only
// v2's bytes are written for the v2 tag.
FAKE_NVML_EXPORT Return nvmlDeviceGetGpuFabricInfoV(nvml::Device device, nvml::GpuFabricInfoV* info) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (info == nullptr) return nvml::kErrorInvalidArgument;
    if (!g.fabric.present) return nvml::kErrorNotSupported;
    auto fill = [&](auto* out) {
      std::memcpy(out->clusterUuid, g.fabric.cluster_uuid.data(), nvml::kGpuFabricUuidLen);
      out->status = g.fabric.status;
      out->cliqueId = g.fabric.clique_id;
      out->state = g.fabric.state;
      out->healthMask = g.fabric.health_mask;
    };
    if (info->version == nvml::kGpuFabricInfoV3Version) {
      fill(info);
      info->healthSummary = g.fabric.health_summary;
      return nvml::kSuccess;
    }
    if (info->version == nvml::kGpuFabricInfoV2Version) {
      fill(reinterpret_cast<nvml::GpuFabricInfo_v2*>(info));
      return nvml::kSuccess;
    }
    return nvml::kErrorArgumentVersionMismatch;
  });
}

// ---- MIG (nvml_abi_mig.hpp) ------------------------------------------------------------------

FAKE_NVML_EXPORT Return nvmlDeviceGetMigMode(nvml::Device device, unsigned int* current_mode, unsigned int* pending_mode) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (current_mode == nullptr || pending_mode == nullptr) return nvml::kErrorInvalidArgument;
    *current_mode = *pending_mode = g.mig_enabled ? nvml::kDeviceMigEnable : nvml::kDeviceMigDisable;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMaxMigDeviceCount(nvml::Device device, unsigned int* count) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (count == nullptr) return nvml::kErrorInvalidArgument;
    *count = g.mig_enabled ? fake::kMaxMigSlots : 0;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMigDeviceHandleByIndex(nvml::Device device, unsigned int index, nvml::Device* mig_device) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t gpu_index) {
    if (mig_device == nullptr) return nvml::kErrorInvalidArgument;
    if (!g.mig_enabled) return nvml::kErrorNotSupported;
    if (index >= fake::kMaxMigSlots) return nvml::kErrorInvalidArgument;
    if (index >= g.mig_slots.size() || !g.mig_slots[index]) return nvml::kErrorNotFound;
    *mig_device = fake::Fake().HandleOf(gpu_index, index);
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetGpuInstanceId(nvml::Device device, unsigned int* id) {
  return fake::Fake().WithDevice(__func__, device, [&](const fake::Gpu&, std::size_t, const fake::MigDevice* mig) {
    if (id == nullptr || mig == nullptr) return nvml::kErrorInvalidArgument;
    *id = mig->gpu_instance;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetComputeInstanceId(nvml::Device device, unsigned int* id) {
  return fake::Fake().WithDevice(__func__, device, [&](const fake::Gpu&, std::size_t, const fake::MigDevice* mig) {
    if (id == nullptr || mig == nullptr) return nvml::kErrorInvalidArgument;
    *id = mig->compute_instance;
    return nvml::kSuccess;
  });
}

// For a whole GPU: its SM count is not modelled (0) and the slice counts are 0, as NVML reports
// them for a GPU that is not a MIG device.
FAKE_NVML_EXPORT Return nvmlDeviceGetAttributes_v2(nvml::Device device, nvml::DeviceAttributes* attributes) {
  return fake::Fake().WithDevice(__func__, device, [&](const fake::Gpu& g, std::size_t, const fake::MigDevice* mig) {
    if (attributes == nullptr) return nvml::kErrorInvalidArgument;
    if (mig != nullptr) {
      *attributes = mig->attributes;
    } else {
      *attributes = nvml::DeviceAttributes{};
      attributes->memorySizeMB = g.memory_total / (1024ULL * 1024ULL);
    }
    return nvml::kSuccess;
  });
}

// A GPU instance handle is the handle of the first MIG device (slot) in that GPU instance: both
// are opaque to the caller.
FAKE_NVML_EXPORT Return nvmlDeviceGetGpuInstanceById(nvml::Device device, unsigned int id, nvml::GpuInstance* gpu_instance) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t gpu_index) {
    if (gpu_instance == nullptr) return nvml::kErrorInvalidArgument;
    if (!g.mig_enabled) return nvml::kErrorNotSupported;
    for (std::size_t slot = 0; slot < g.mig_slots.size(); ++slot) {
      if (g.mig_slots[slot] && g.mig_slots[slot]->gpu_instance == id) {
        *gpu_instance = reinterpret_cast<nvml::GpuInstance>(fake::Fake().HandleOf(gpu_index, slot));
        return nvml::kSuccess;
      }
    }
    return nvml::kErrorNotFound;
  });
}

FAKE_NVML_EXPORT Return nvmlGpuInstanceGetInfo(nvml::GpuInstance gpu_instance, nvml::GpuInstanceInfo* info) {
  return fake::Fake().WithDevice(__func__, reinterpret_cast<nvml::Device>(gpu_instance),
                                 [&](const fake::Gpu&, std::size_t gpu_index, const fake::MigDevice* mig) {
    if (info == nullptr || mig == nullptr) return nvml::kErrorInvalidArgument;
    if (!mig->placed) return nvml::kErrorNotSupported;
    info->device = fake::Fake().HandleOf(gpu_index);
    info->id = mig->gpu_instance;
    info->profileId = mig->profile_id;
    info->placement = nvml::GpuInstancePlacement{mig->placement_start, mig->placement_size};
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlEventSetCreate(nvml::EventSet* set) { return fake::Fake().EventSetCreate(__func__, set); }

FAKE_NVML_EXPORT Return nvmlDeviceGetSupportedEventTypes(nvml::Device device, unsigned long long* event_types) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (event_types == nullptr) return nvml::kErrorInvalidArgument;
    *event_types = g.supported_events;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceRegisterEvents(nvml::Device device, unsigned long long event_types, nvml::EventSet set) {
  return fake::Fake().RegisterEvents(__func__, device, event_types, set);
}

FAKE_NVML_EXPORT Return nvmlEventSetWait_v2(nvml::EventSet set, nvml::EventData* data, unsigned int timeout_ms) {
  return fake::Fake().EventSetWait(__func__, set, data, timeout_ms);
}

FAKE_NVML_EXPORT Return nvmlEventSetFree(nvml::EventSet set) { return fake::Fake().EventSetFree(__func__, set); }

// ---- GPU maintenance (maintenance_state.h) ----------------------------------------------------

FAKE_NVML_EXPORT Return nvmlDeviceGetComputeRunningProcesses_v3(nvml::Device device, unsigned int* info_count,
                                                                nvml::ProcessInfo* infos) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (info_count == nullptr) return nvml::kErrorInvalidArgument;
    return fake::Maintenance().With(g.uuid, [&](const fake::GpuMaintenance& m) {
      const auto n = static_cast<unsigned int>(m.processes.size());
      if (*info_count < n || (n > 0 && infos == nullptr)) {
        *info_count = n;
        return nvml::kErrorInsufficientSize;
      }
      std::copy(m.processes.begin(), m.processes.end(), infos);
      *info_count = n;
      return nvml::kSuccess;
    });
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetPersistenceMode(nvml::Device device, nvml::EnableState* mode) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (mode == nullptr) return nvml::kErrorInvalidArgument;
    return fake::Maintenance().With(g.uuid, [&](const fake::GpuMaintenance& m) {
      *mode = m.persistence ? nvml::kFeatureEnabled : nvml::kFeatureDisabled;
      return nvml::kSuccess;
    });
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceSetPersistenceMode(nvml::Device device, nvml::EnableState mode) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (mode != nvml::kFeatureEnabled && mode != nvml::kFeatureDisabled) return nvml::kErrorInvalidArgument;
    return fake::Maintenance().With(g.uuid, [&](fake::GpuMaintenance& m) {
      m.persistence = mode == nvml::kFeatureEnabled;
      return nvml::kSuccess;
    });
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetRetiredPagesPendingStatus(nvml::Device device, nvml::EnableState* is_pending) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (is_pending == nullptr) return nvml::kErrorInvalidArgument;
    return fake::Maintenance().With(g.uuid, [&](const fake::GpuMaintenance& m) {
      *is_pending = m.retired_pages_pending ? nvml::kFeatureEnabled : nvml::kFeatureDisabled;
      return nvml::kSuccess;
    });
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetRemappedRows(nvml::Device device, unsigned int* corrected_rows,
                                                  unsigned int* uncorrected_rows, unsigned int* is_pending,
                                                  unsigned int* failure_occurred) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (corrected_rows == nullptr || uncorrected_rows == nullptr || is_pending == nullptr || failure_occurred == nullptr) {
      return nvml::kErrorInvalidArgument;
    }
    return fake::Maintenance().With(g.uuid, [&](const fake::GpuMaintenance& m) {
      *corrected_rows = 0;
      *uncorrected_rows = m.remap_pending ? 1 : 0;
      *is_pending = m.remap_pending ? 1 : 0;
      *failure_occurred = m.remap_failure ? 1 : 0;
      return nvml::kSuccess;
    });
  });
}

// ---- Usage readings (issue 27): what Health's usage keys say of the GPU ---------------------------

FAKE_NVML_EXPORT Return nvmlDeviceGetUtilizationRates(nvml::Device device, nvml::Utilization* utilization) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (utilization == nullptr) return nvml::kErrorInvalidArgument;
    *utilization = nvml::Utilization{g.health.gpu_util, g.health.memory_util};
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetEncoderUtilization(nvml::Device device, unsigned int* utilization,
                                                        unsigned int* sampling_period_us) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (utilization == nullptr || sampling_period_us == nullptr) return nvml::kErrorInvalidArgument;
    *utilization = g.health.encoder_util;
    *sampling_period_us = 167000;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetDecoderUtilization(nvml::Device device, unsigned int* utilization,
                                                        unsigned int* sampling_period_us) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (utilization == nullptr || sampling_period_us == nullptr) return nvml::kErrorInvalidArgument;
    *utilization = g.health.decoder_util;
    *sampling_period_us = 167000;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetPowerUsage(nvml::Device device, unsigned int* power_mw) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (power_mw == nullptr) return nvml::kErrorInvalidArgument;
    *power_mw = g.health.power_mw;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetTotalEnergyConsumption(nvml::Device device, unsigned long long* energy_mj) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (energy_mj == nullptr) return nvml::kErrorInvalidArgument;
    *energy_mj = g.health.energy_mj;
    return nvml::kSuccess;
  });
}

// SM and memory clocks as set; graphics = SM, video a fixed 1755 MHz.
FAKE_NVML_EXPORT Return nvmlDeviceGetClockInfo(nvml::Device device, nvml::ClockType type, unsigned int* clock_mhz) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (clock_mhz == nullptr) return nvml::kErrorInvalidArgument;
    switch (type) {
      case nvml::kClockGraphics:
      case nvml::kClockSm: *clock_mhz = g.health.sm_clock_mhz; return nvml::kSuccess;
      case nvml::kClockMem: *clock_mhz = g.health.mem_clock_mhz; return nvml::kSuccess;
      case nvml::kClockVideo: *clock_mhz = 1755; return nvml::kSuccess;
      default: return nvml::kErrorInvalidArgument;
    }
  });
}

// ---- Health readings (issue 26): what Health says of the GPU ------------------------------------

FAKE_NVML_EXPORT Return nvmlDeviceGetEccMode(nvml::Device device, nvml::EnableState* current, nvml::EnableState* pending) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (current == nullptr || pending == nullptr) return nvml::kErrorInvalidArgument;
    *current = *pending = g.health.ecc_enabled ? nvml::kFeatureEnabled : nvml::kFeatureDisabled;
    return nvml::kSuccess;
  });
}

// Counters exist only while ECC is on (NVML answers NOT_SUPPORTED otherwise).
FAKE_NVML_EXPORT Return nvmlDeviceGetTotalEccErrors(nvml::Device device, nvml::MemoryErrorType error_type,
                                                    nvml::EccCounterType counter_type, unsigned long long* ecc_counts) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (ecc_counts == nullptr || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1) {
      return nvml::kErrorInvalidArgument;
    }
    if (!g.health.ecc_enabled) return nvml::kErrorNotSupported;
    *ecc_counts = g.health.ecc[error_type][counter_type];
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetRowRemapperHistogram(nvml::Device device, nvml::RowRemapperHistogramValues* values) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (values == nullptr) return nvml::kErrorInvalidArgument;
    *values = g.health.histogram;
    return nvml::kSuccess;
  });
}

// The count query (page_count 0, addresses null) answers INSUFFICIENT_SIZE with the count when
// pages were retired, as NVML does; a big enough array gets made-up page addresses.
FAKE_NVML_EXPORT Return nvmlDeviceGetRetiredPages(nvml::Device device, nvml::PageRetirementCause cause,
                                                  unsigned int* page_count, unsigned long long* addresses) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (page_count == nullptr || (cause != nvml::kPageRetirementCauseMultipleSingleBitEccErrors &&
                                  cause != nvml::kPageRetirementCauseDoubleBitEccError)) {
      return nvml::kErrorInvalidArgument;
    }
    const unsigned int n = cause == nvml::kPageRetirementCauseDoubleBitEccError ? g.health.retired_dbe : g.health.retired_sbe;
    if (*page_count < n || (n > 0 && addresses == nullptr)) {
      *page_count = n;
      return nvml::kErrorInsufficientSize;
    }
    for (unsigned int i = 0; i < n; ++i) addresses[i] = 0x100000ULL * (i + 1) + static_cast<unsigned long long>(cause);
    *page_count = n;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetNvLinkErrorCounter(nvml::Device device, unsigned int link,
                                                        nvml::NvLinkErrorCounter counter, unsigned long long* value) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (value == nullptr || link >= nvml::kNvLinkMaxLinks || counter < 0 || counter > 3) return nvml::kErrorInvalidArgument;
    if (g.nvlink_count == 0) return nvml::kErrorNotSupported;
    if (link >= g.nvlink_count) return nvml::kErrorInvalidArgument;
    const auto it = g.health.nvlink_errors.find(link);
    const fake::NvLinkCounters c = it != g.health.nvlink_errors.end() ? it->second : fake::NvLinkCounters{};
    const unsigned long long values[] = {c.replay, c.recovery, c.crc_flit, c.crc_data};
    *value = values[counter];
    return nvml::kSuccess;
  });
}

namespace {
// One unsigned reading of the GPU's Health.
template <typename Member>
Return ReadHealthValue(std::string_view function, nvml::Device device, unsigned int* out, Member member) {
  return fake::Fake().WithGpu(function, device, [&](const fake::Gpu& g, std::size_t) {
    if (out == nullptr) return nvml::kErrorInvalidArgument;
    *out = g.health.*member;
    return nvml::kSuccess;
  });
}
}  // namespace

FAKE_NVML_EXPORT Return nvmlDeviceGetCurrPcieLinkGeneration(nvml::Device device, unsigned int* value) {
  return ReadHealthValue(__func__, device, value, &fake::Health::pcie_generation);
}

FAKE_NVML_EXPORT Return nvmlDeviceGetCurrPcieLinkWidth(nvml::Device device, unsigned int* value) {
  return ReadHealthValue(__func__, device, value, &fake::Health::pcie_width);
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMaxPcieLinkGeneration(nvml::Device device, unsigned int* value) {
  return ReadHealthValue(__func__, device, value, &fake::Health::pcie_max_generation);
}

FAKE_NVML_EXPORT Return nvmlDeviceGetMaxPcieLinkWidth(nvml::Device device, unsigned int* value) {
  return ReadHealthValue(__func__, device, value, &fake::Health::pcie_max_width);
}

FAKE_NVML_EXPORT Return nvmlDeviceGetPcieReplayCounter(nvml::Device device, unsigned int* value) {
  return ReadHealthValue(__func__, device, value, &fake::Health::pcie_replay);
}

namespace {
// The clock event reasons under either name (12.2 renamed the function, not what it answers).
Return ReadClocksEventReasons(std::string_view function, nvml::Device device, unsigned long long* reasons) {
  return fake::Fake().WithGpu(function, device, [&](const fake::Gpu& g, std::size_t) {
    if (reasons == nullptr) return nvml::kErrorInvalidArgument;
    *reasons = g.health.clocks_event_reasons;
    return nvml::kSuccess;
  });
}
}  // namespace

FAKE_NVML_EXPORT Return nvmlDeviceGetCurrentClocksEventReasons(nvml::Device device, unsigned long long* reasons) {
  return ReadClocksEventReasons(__func__, device, reasons);
}

FAKE_NVML_EXPORT Return nvmlDeviceGetCurrentClocksThrottleReasons(nvml::Device device, unsigned long long* reasons) {
  return ReadClocksEventReasons(__func__, device, reasons);
}

FAKE_NVML_EXPORT Return nvmlDeviceGetTemperature(nvml::Device device, nvml::TemperatureSensor sensor, unsigned int* temp) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (temp == nullptr || sensor != nvml::kTemperatureGpu) return nvml::kErrorInvalidArgument;
    *temp = g.health.temperature;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetTemperatureThreshold(nvml::Device device, nvml::TemperatureThreshold threshold,
                                                          unsigned int* temp) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (temp == nullptr) return nvml::kErrorInvalidArgument;
    switch (threshold) {
      case nvml::kTemperatureThresholdShutdown: *temp = g.health.shutdown; return nvml::kSuccess;
      case nvml::kTemperatureThresholdSlowdown: *temp = g.health.slowdown; return nvml::kSuccess;
      case nvml::kTemperatureThresholdMemMax: *temp = g.health.memory_max; return nvml::kSuccess;
      case nvml::kTemperatureThresholdGpuMax: *temp = g.health.slowdown - 2; return nvml::kSuccess;
      default: return nvml::kErrorNotSupported;
    }
  });
}

// Knows NVML_FI_DEV_MEMORY_TEMP and NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID (scopeId = the link: an
// NVSwitch link's port, a peer link's own number, as a symmetric bridge has it; NOT_SUPPORTED on
// a GPU without NVLink or a link with nothing at its end, INVALID_ARGUMENT past nvlinkCount);
// other fields answer NOT_SUPPORTED in their nvmlReturn.
FAKE_NVML_EXPORT Return nvmlDeviceGetFieldValues(nvml::Device device, int values_count, nvml::FieldValue* values) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (values == nullptr || values_count <= 0) return nvml::kErrorInvalidArgument;
    const auto now = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
    for (int i = 0; i < values_count; ++i) {
      nvml::FieldValue& v = values[i];
      v.timestamp = now.count();
      v.latencyUsec = 0;
      if (v.fieldId == nvml::kFieldDevMemoryTemp) {
        v.valueType = nvml::kValueTypeUnsignedInt;
        v.value.uiVal = g.health.memory_temperature;
        v.nvmlReturn = nvml::kSuccess;
      } else if (v.fieldId == nvml::kFieldDevNvLinkRemoteNvLinkId) {
        const auto port = g.nvswitch_links.find(v.scopeId);
        v.valueType = nvml::kValueTypeUnsignedInt;
        v.nvmlReturn = nvml::kSuccess;
        if (g.nvlink_count == 0) {
          v.nvmlReturn = nvml::kErrorNotSupported;
        } else if (v.scopeId >= g.nvlink_count) {
          v.nvmlReturn = nvml::kErrorInvalidArgument;
        } else if (port != g.nvswitch_links.end()) {
          v.value.uiVal = port->second.port;
        } else if (v.scopeId < g.nvlink_remote.size()) {
          v.value.uiVal = v.scopeId;
        } else {
          v.nvmlReturn = nvml::kErrorNotSupported;
        }
      } else if (v.fieldId == nvml::kFieldDevNvLinkThroughputDataTx || v.fieldId == nvml::kFieldDevNvLinkThroughputDataRx) {
        // scopeId = a link, or UINT_MAX for the sum over the GPU's links.
        const bool tx = v.fieldId == nvml::kFieldDevNvLinkThroughputDataTx;
        auto of = [&](unsigned int link) {
          const auto it = g.health.nvlink_throughput.find(link);
          if (it == g.health.nvlink_throughput.end()) return 0ULL;
          return tx ? it->second.data_tx_kib : it->second.data_rx_kib;
        };
        v.valueType = nvml::kValueTypeUnsignedLongLong;
        v.nvmlReturn = nvml::kSuccess;
        if (g.nvlink_count == 0) {
          v.nvmlReturn = nvml::kErrorNotSupported;
        } else if (v.scopeId == nvml::kFieldScopeAllLinks) {
          v.value.ullVal = 0;
          for (unsigned int link = 0; link < g.nvlink_count; ++link) v.value.ullVal += of(link);
        } else if (v.scopeId >= g.nvlink_count) {
          v.nvmlReturn = nvml::kErrorInvalidArgument;
        } else {
          v.value.ullVal = of(v.scopeId);
        }
      } else {
        v.nvmlReturn = nvml::kErrorNotSupported;
      }
    }
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT Return nvmlDeviceGetViolationStatus(nvml::Device device, nvml::PerfPolicyType policy,
                                                     nvml::ViolationTime* time) {
  return fake::Fake().WithGpu(__func__, device, [&](const fake::Gpu& g, std::size_t) {
    if (time == nullptr) return nvml::kErrorInvalidArgument;
    if (policy != nvml::kPerfPolicyPower && policy != nvml::kPerfPolicyThermal) return nvml::kErrorNotSupported;
    time->referenceTime = static_cast<unsigned long long>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    time->violationTime = policy == nvml::kPerfPolicyPower ? g.health.power_violation_ns : g.health.thermal_violation_ns;
    return nvml::kSuccess;
  });
}

// ---- Control entry points -------------------------------------------------------------------

// What the driver does reaches every NVML client: the other processes' (fake::AskClients) too.
FAKE_NVML_EXPORT int fakeNvmlInjectXid(const char* uuid, unsigned long long xid) {
  if (uuid == nullptr) return nvml::kErrorInvalidArgument;
  std::size_t delivered = 0;
  const Return rc = fake::Fake().InjectXid(uuid, xid, &delivered);
  fake::AskClients(fake::Fake().PrimaryPath(), {{"injectXid", {{"uuid", uuid}, {"xid", xid}}}});
  return rc;
}

FAKE_NVML_EXPORT int fakeNvmlInjectEvent(const char* uuid, unsigned long long event_type, unsigned long long data) {
  if (uuid == nullptr || event_type == 0 || (event_type & (event_type - 1)) != 0) return nvml::kErrorInvalidArgument;
  std::size_t delivered = 0;
  const Return rc = fake::Fake().InjectEvent(uuid, event_type, data, &delivered);
  fake::AskClients(fake::Fake().PrimaryPath(),
                   {{"injectEvent", {{"uuid", uuid}, {"type", std::to_string(event_type)}, {"data", data}}}});
  return rc;
}

FAKE_NVML_EXPORT int fakeNvmlRegisteredEvents(const char* uuid, unsigned long long* event_types) {
  if (uuid == nullptr || event_types == nullptr) return nvml::kErrorInvalidArgument;
  const auto own = fake::Fake().RegisteredEvents(uuid);
  if (!own) return nvml::kErrorNotFound;
  *event_types = *own;
  for (const auto& answer : fake::AskClients(fake::Fake().PrimaryPath(),
                                             {{"registeredEvents", {{"uuid", uuid}, {"local", true}}}})) {
    *event_types |= answer.value("types", 0ULL);
  }
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlSetFailure(const char* function_name, int nvml_return) {
  if (function_name == nullptr) return nvml::kErrorInvalidArgument;
  const Return rc = fake::Fake().SetFailure(function_name, nvml_return);
  if (rc == nvml::kSuccess) {
    fake::AskClients(fake::Fake().PrimaryPath(), {{"fail", {{"function", function_name}, {"return", nvml_return}}}});
  }
  return rc;
}

FAKE_NVML_EXPORT int fakeNvmlClearFailures() {
  const Return rc = fake::Fake().ClearFailures();
  fake::AskClients(fake::Fake().PrimaryPath(), {{"clearFailures", true}});
  return rc;
}

FAKE_NVML_EXPORT int fakeNvmlSetHealth(const char* uuid, const char* json_keys) {
  if (uuid == nullptr || json_keys == nullptr) return nvml::kErrorInvalidArgument;
  try {
    const auto keys = fake::Json::parse(json_keys);
    fake::Fake().SetHealth(uuid, keys);
    fake::Json command = keys;
    command["uuid"] = uuid;
    fake::AskClients(fake::Fake().PrimaryPath(), {{"setHealth", command}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake_nvml: fakeNvmlSetHealth(%s): %s\n", uuid, e.what());
    return nvml::kErrorInvalidArgument;
  }
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlClearHealth() {
  fake::Fake().ClearHealth();
  fake::AskClients(fake::Fake().PrimaryPath(), {{"clearHealth", true}});
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlHang(const char* function_name, unsigned int seconds) {
  if (function_name == nullptr) return nvml::kErrorInvalidArgument;
  const std::string_view function = function_name;
  if (function != "*" && !fake::IsKnownFunction(function)) return nvml::kErrorInvalidArgument;
  fake::Hangs().Hang(function_name, seconds);
  fake::AskClients(fake::Fake().PrimaryPath(), {{"hang", {{"function", function_name}, {"seconds", seconds}}}});
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlReleaseHangs() {
  fake::Hangs().Release();
  fake::AskClients(fake::Fake().PrimaryPath(), {{"releaseHangs", true}});
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlHungCalls(unsigned int* calls) {
  if (calls == nullptr) return nvml::kErrorInvalidArgument;
  *calls = fake::Hangs().Hung();
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlCallCount(unsigned long long* calls) {
  if (calls == nullptr) return nvml::kErrorInvalidArgument;
  *calls = fake::Fake().Calls();
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT int fakeNvmlLastWaitTimeout(unsigned int* timeout_ms) {
  return fake::Fake().LastWaitTimeout(timeout_ms);
}

FAKE_NVML_EXPORT int fakeNvmlReloadConfig(unsigned int* changed_gpus) {
  std::size_t changed = 0;
  std::string error;
  const Return rc = fake::Fake().ReloadConfig(&changed, &error);
  if (rc != nvml::kSuccess) std::fprintf(stderr, "fake_nvml: fakeNvmlReloadConfig: %s\n", error.c_str());
  if (rc == nvml::kSuccess) fake::AskClients(fake::Fake().PrimaryPath(), {{"reloadConfig", true}});
  if (changed_gpus != nullptr) *changed_gpus = static_cast<unsigned int>(changed);
  return rc;
}

// Every symbol the daemon resolves is exported here with exactly the type nvml_abi.hpp gives it.
#define GNS_FAKE_NVML_CHECK(symbol, type, required) \
  static_assert(std::is_same_v<decltype(&::symbol), nvml::type>, #symbol " does not match nvml_abi.hpp");
GNS_NVML_FUNCTIONS(GNS_FAKE_NVML_CHECK)
#undef GNS_FAKE_NVML_CHECK

static_assert(std::is_same_v<decltype(&::fakeNvmlInjectXid), fakeNvmlInjectXid_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlInjectEvent), fakeNvmlInjectEvent_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlRegisteredEvents), fakeNvmlRegisteredEvents_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlSetFailure), fakeNvmlSetFailure_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlClearFailures), fakeNvmlClearFailures_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlLastWaitTimeout), fakeNvmlLastWaitTimeout_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlReloadConfig), fakeNvmlReloadConfig_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlSetHealth), fakeNvmlSetHealth_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlClearHealth), fakeNvmlClearHealth_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlHang), fakeNvmlHang_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlReleaseHangs), fakeNvmlReleaseHangs_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlHungCalls), fakeNvmlHungCalls_t>);
static_assert(std::is_same_v<decltype(&::fakeNvmlCallCount), fakeNvmlCallCount_t>);
