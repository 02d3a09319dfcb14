// The gpu.nvidia.com driver's pure parts (gpu_claims.hpp).
#include "modules/dra_gpu/gpu_claims.hpp"

#include "loop/json_fields.hpp"
#include "modules/device_plugin/api/mps.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

namespace gns::dra_gpu {

namespace {

using nlohmann::json;

// "550.54" → "550.54.0"; "550.54.15" stays; anything else (empty, letters): nullopt.
std::optional<std::string> SemVer(const std::string& text) {
  std::vector<std::string> parts;
  std::string part;
  for (const char c : text) {
    if (c == '.') {
      parts.push_back(part);
      part.clear();
    } else if (c >= '0' && c <= '9') {
      part += c;
    } else {
      return std::nullopt;
    }
  }
  parts.push_back(part);
  if (parts.empty() || parts.size() > 3) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < 3; ++i) {
    std::string p = i < parts.size() ? parts[i] : "0";
    if (p.empty()) return std::nullopt;
    // SemVer forbids leading zeros: "00" → "0".
    const auto first = p.find_first_not_of('0');
    p = first == std::string::npos ? "0" : p.substr(first);
    out += (i ? "." : "") + p;
  }
  return out;
}

// NVML's architecture names for a compute capability (nvmlDeviceGetArchitecture's, as upstream
// prints them); empty when unknown.
std::string Architecture(int major, int minor) {
  switch (major) {
    case 7: return minor >= 5 ? "Turing" : "Volta";
    case 8: return minor == 9 ? "Ada Lovelace" : "Ampere";
    case 9: return "Hopper";
    case 10:
    case 12: return "Blackwell";
    default: return {};
  }
}

// nvmlDeviceGetBrand's nvmlBrandType_t (nvml.h) as upstream names it (go-nvlib's
// GetBrandAsString); empty for a value it does not name.
std::string BrandName(uint32_t brand) {
  static constexpr std::array<std::string_view, 17> kNames = {
      "Unknown",   "Quadro",    "Tesla",     "NVS",     "Grid",      "GeForce",   "Titan",    "NvidiaVApps", "NvidiaVPC",
      "NvidiaVCS", "NvidiaVWS", "NvidiaCloudGaming", "QuadroRTX", "NvidiaRTX", "Nvidia", "GeForceRTX", "TitanRTX"};
  return brand < kNames.size() ? std::string(kNames[brand]) : std::string();
}

// "00000000:3B:00.0" → "0000:3b:00.0" (the form of resource.kubernetes.io/pciBusID).
std::string KubernetesPciBusId(const std::string& nvml) {
  std::string id = nvml.size() > 12 ? nvml.substr(nvml.size() - 12) : nvml;
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return id;
}

GpuClaimPlan Refuse(GpuClaimPlan plan, std::string why, bool permanent = true) {
  plan.error = "ResourceClaim " + plan.namespace_name + "/" + plan.name + ": " + std::move(why);
  plan.permanent = permanent;
  plan.gpus.clear();
  return plan;
}

struct OurConfig {
  std::vector<std::string> requests;  // empty: every request
  bool mig = false;                   // MigDeviceConfig (else GpuConfig)
  std::string where;                  // its JSON path, for errors
  GpuSharing sharing;
  bool AppliesTo(const std::string& request) const {
    if (requests.empty()) return true;
    // "main/sub" results (prioritized lists) match a config for "main".
    const std::string main = request.substr(0, request.find('/'));
    return std::any_of(requests.begin(), requests.end(), [&](const std::string& r) { return r == request || r == main; });
  }
};

}  // namespace

const dra::ClaimSpecNames& GpuSpecNames() {
  static const dra::ClaimSpecNames names{std::string(kCdiVendor), "claim"};
  return names;
}

std::vector<gpu_inventory::GpuInfo> ServedGpus(const gpu_inventory::GpuInventory& inventory,
                                               const GpuSelection& selection) {
  std::vector<gpu_inventory::GpuInfo> out;
  for (const auto& gpu : inventory.gpus) {
    if (selection.Matches(gpu.uuid, gpu.index)) out.push_back(gpu);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.minor < b.minor; });
  return out;
}

std::vector<ServedDevice> ServedDevices(const std::vector<gpu_inventory::GpuInfo>& gpus) {
  std::vector<ServedDevice> out;
  std::set<std::string> names;
  for (const auto& gpu : gpus) {
    if (!gpu.mig_enabled) {
      out.push_back(ServedDevice{GpuDeviceName(gpu.minor), &gpu, nullptr});
      continue;
    }
    // Upstream names a MIG device by its GPU instance: a second compute instance of the same GPU
    // instance would share the name, and is not offered (the first one is).
    for (const auto& mig : gpu.mig_devices) {
      if (!mig.placement_known) continue;
      std::string name = MigDeviceName(gpu.minor, mig);
      if (!names.insert(name).second) continue;
      out.push_back(ServedDevice{std::move(name), &gpu, &mig});
    }
  }
  return out;
}

std::string BinaryQuantity(uint64_t bytes) {
  static constexpr std::pair<const char*, int> kSuffixes[] = {{"Ei", 60}, {"Pi", 50}, {"Ti", 40},
                                                              {"Gi", 30}, {"Mi", 20}, {"Ki", 10}};
  if (bytes == 0) return "0";
  for (const auto& [suffix, shift] : kSuffixes) {
    const uint64_t unit = uint64_t{1} << shift;
    if (bytes % unit == 0) return std::to_string(bytes / unit) + suffix;
  }
  return std::to_string(bytes);
}

json GpuSliceDevices(const gpu_inventory::GpuInventory& inventory, const std::vector<gpu_inventory::GpuInfo>& gpus,
                     dra::ResourceApiVersion version, const std::map<std::string, nlohmann::json>& taints) {
  json devices = json::array();
  const auto driver = SemVer(inventory.driver_version);
  std::optional<std::string> cuda;
  if (inventory.cuda_driver_version > 0) {
    cuda = std::to_string(inventory.cuda_driver_version / 1000) + "." +
           std::to_string((inventory.cuda_driver_version % 1000) / 10) + ".0";
  }
  const auto count = [](uint32_t n) { return json{{"value", std::to_string(n)}}; };
  for (const ServedDevice& device : ServedDevices(gpus)) {
    const gpu_inventory::GpuInfo& gpu = *device.gpu;
    // What a whole GPU and its MIG devices share: the parent's product, driver and PCI facts.
    json attributes{{"type", {{"string", device.mig ? "mig" : "gpu"}}},
                    {"uuid", {{"string", device.mig ? device.mig->uuid : gpu.uuid}}},
                    {"productName", {{"string", gpu.name}}},
                    {"index", {{"int", gpu.index}}},
                    {"minor", {{"int", gpu.minor}}}};
    if (const auto arch = Architecture(gpu.cc_major, gpu.cc_minor); !arch.empty()) {
      attributes["architecture"] = {{"string", arch}};
    }
    if (gpu.brand) {
      if (const auto brand = BrandName(*gpu.brand); !brand.empty()) attributes["brand"] = {{"string", brand}};
    }
    if (gpu.cc_major > 0) {
      attributes["cudaComputeCapability"] = {
          {"version", std::to_string(gpu.cc_major) + "." + std::to_string(gpu.cc_minor) + ".0"}};
    }
    if (driver) attributes["driverVersion"] = {{"version", *driver}};
    if (cuda) attributes["cudaDriverVersion"] = {{"version", *cuda}};
    if (!gpu.pci_bus_id.empty()) {
      attributes["pcieBusID"] = {{"string", gpu.pci_bus_id}};
      attributes["resource.kubernetes.io/pciBusID"] = {{"string", KubernetesPciBusId(gpu.pci_bus_id)}};
    }
    json capacity = json::object();
    if (device.mig == nullptr) {
      if (gpu.memory_total_bytes > 0) capacity["memory"] = {{"value", BinaryQuantity(gpu.memory_total_bytes)}};
    } else {
      const gpu_inventory::MigDeviceInfo& mig = *device.mig;
      attributes["parentUUID"] = {{"string", gpu.uuid}};
      if (!mig.profile.empty()) attributes["profile"] = {{"string", mig.profile}};
      capacity["multiprocessors"] = count(mig.multiprocessors);
      capacity["copyEngines"] = count(mig.copy_engines);
      capacity["decoders"] = count(mig.decoders);
      capacity["encoders"] = count(mig.encoders);
      capacity["jpegEngines"] = count(mig.jpeg_engines);
      capacity["ofaEngines"] = count(mig.ofa_engines);
      if (mig.memory_bytes > 0) capacity["memory"] = {{"value", BinaryQuantity(mig.memory_bytes)}};
      // The memory slices the GPU instance occupies: what keeps two overlapping placements of
      // one GPU from being allocated together (upstream's memorySlice<i>).
      for (uint32_t i = mig.placement_start; i < mig.placement_start + mig.placement_size; ++i) {
        capacity["memorySlice" + std::to_string(i)] = count(1);
      }
    }
    const auto tainted = taints.find(device.name);
    devices.push_back(dra::SliceDevice(device.name, std::move(attributes), std::move(capacity), version,
                                       tainted == taints.end() ? json::array() : tainted->second));
  }
  return devices;
}

namespace {

// GpuConfig and MigDeviceConfig: the same envelope; a MIG device's sharing has no
// timeSlicingConfig (upstream's MigDeviceSharing: strategy, mpsConfig).
GpuConfigParse ParseSharingConfig(const json& parameters, const std::string& where, bool mig) {
  const std::string kind(mig ? kMigDeviceConfigKind : kGpuConfigKind);
  GpuConfigParse out;
  const auto fail = [&out](std::string why) {
    out.error = std::move(why);
    return out;
  };
  if (!parameters.is_object()) return fail(where + ": expected an object, got " + std::string(parameters.type_name()));
  for (const auto& [key, value] : parameters.items()) {
    if (key != "apiVersion" && key != "kind" && key != "sharing") {
      return fail(where + "." + key + ": unknown field (" + kind + " has apiVersion, kind, sharing)");
    }
  }
  if (JsonStringAt(parameters, "/apiVersion") != kConfigApiVersion) {
    return fail(where + ".apiVersion: expected \"" + std::string(kConfigApiVersion) + "\"");
  }
  if (JsonStringAt(parameters, "/kind") != kind) return fail(where + ".kind: expected \"" + kind + "\"");
  GpuSharing sharing;
  const auto it = parameters.find("sharing");
  if (it != parameters.end() && !it->is_null()) {
    const std::string at = where + ".sharing";
    if (!it->is_object()) return fail(at + ": expected an object, got " + std::string(it->type_name()));
    for (const auto& [key, value] : it->items()) {
      if (key != "strategy" && (mig || key != "timeSlicingConfig") && key != "mpsConfig") {
        return fail(at + "." + key + ": unknown field (" + kind + "'s sharing has strategy" +
                    (mig ? "" : ", timeSlicingConfig") + ", mpsConfig)");
      }
    }
    const auto strategy = it->find("strategy");
    if (strategy == it->end() || !strategy->is_string()) return fail(at + ".strategy: required, TimeSlicing or MPS");
    sharing.strategy = strategy->get<std::string>();
    if (sharing.strategy != "TimeSlicing" && sharing.strategy != "MPS") {
      return fail(at + ".strategy: \"" + sharing.strategy + "\" is not TimeSlicing or MPS");
    }
    const auto ts = it->find("timeSlicingConfig");
    const bool has_ts = ts != it->end() && !ts->is_null();
    const auto mps = it->find("mpsConfig");
    const bool has_mps = mps != it->end() && !mps->is_null();
    if (sharing.strategy == "TimeSlicing" && has_mps) {
      return fail(at + ".mpsConfig: set, but the strategy is TimeSlicing");
    }
    if (sharing.strategy == "MPS" && has_ts) return fail(at + ".timeSlicingConfig: set, but the strategy is MPS");
    if (has_ts) {
      if (!ts->is_object()) return fail(at + ".timeSlicingConfig: expected an object");
      for (const auto& [key, value] : ts->items()) {
        if (key != "interval") return fail(at + ".timeSlicingConfig." + key + ": unknown field (it has interval)");
      }
      if (const auto interval = ts->find("interval"); interval != ts->end() && !interval->is_null()) {
        if (!interval->is_string()) return fail(at + ".timeSlicingConfig.interval: expected a string");
        sharing.interval = interval->get<std::string>();
        static const std::set<std::string> kIntervals = {"Default", "Short", "Medium", "Long"};
        if (!kIntervals.count(sharing.interval)) {
          return fail(at + ".timeSlicingConfig.interval: \"" + sharing.interval +
                      "\" is not Default, Short, Medium or Long");
        }
      }
    }
    if (has_mps) {
      if (!mps->is_object()) return fail(at + ".mpsConfig: expected an object");
      const std::string mat = at + ".mpsConfig";
      for (const auto& [key, value] : mps->items()) {
        if (value.is_null()) continue;
        if (key == "defaultActiveThreadPercentage") {
          if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > 100) {
            return fail(mat + ".defaultActiveThreadPercentage: expected an integer from 1 to 100, got " + value.dump());
          }
          sharing.active_thread_percentage = static_cast<int>(value.get<int64_t>());
        } else if (key == "defaultPinnedDeviceMemoryLimit") {
          std::string why;
          sharing.pinned_memory_bytes = QuantityBytes(value, why);
          if (!why.empty()) return fail(mat + ".defaultPinnedDeviceMemoryLimit: " + why);
        } else if (key == "defaultPerDevicePinnedMemoryLimit") {
          if (!value.is_object()) return fail(mat + ".defaultPerDevicePinnedMemoryLimit: expected an object");
          for (const auto& [device, limit] : value.items()) {
            std::string why;
            const uint64_t bytes = QuantityBytes(limit, why);
            if (!why.empty()) return fail(mat + ".defaultPerDevicePinnedMemoryLimit." + device + ": " + why);
            sharing.pinned_memory_per_device[device] = bytes;
          }
        } else if (key == "multiUser") {
          if (!value.is_boolean()) return fail(mat + ".multiUser: expected true or false");
          sharing.multi_user = value.get<bool>();
        } else {
          return fail(mat + "." + key + ": unknown field (mpsConfig has defaultActiveThreadPercentage, "
                                        "defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser)");
        }
      }
    }
  }
  out.sharing = sharing;
  return out;
}

}  // namespace

uint64_t QuantityBytes(const json& value, std::string& error) {
  error.clear();
  if (value.is_number_integer()) {
    if (value.get<int64_t>() <= 0) error = "expected a positive quantity, got " + value.dump();
    return error.empty() ? value.get<uint64_t>() : 0;
  }
  if (!value.is_string()) {
    error = "expected a quantity such as \"10Gi\", got " + std::string(value.type_name());
    return 0;
  }
  const std::string text = value.get<std::string>();
  std::size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  const std::string suffix = text.substr(i);
  static const std::map<std::string, long double> kScale = {
      {"", 1.0L},          {"k", 1e3L},         {"M", 1e6L},         {"G", 1e9L},         {"T", 1e12L},
      {"P", 1e15L},        {"E", 1e18L},        {"Ki", 0x1p10L},     {"Mi", 0x1p20L},     {"Gi", 0x1p30L},
      {"Ti", 0x1p40L},     {"Pi", 0x1p50L},     {"Ei", 0x1p60L}};
  const auto scale = kScale.find(suffix);
  const bool one_dot = std::count(number.begin(), number.end(), '.') <= 1;
  if (number.empty() || number == "." || !one_dot || scale == kScale.end()) {
    error = "\"" + text + "\" is not a quantity (digits with Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E)";
    return 0;
  }
  const long double bytes = std::floor(std::stold(number) * scale->second);
  if (bytes < 1.0L || bytes > 0x1p63L) {
    error = "\"" + text + "\" is out of range (at least one byte, below 8Ei)";
    return 0;
  }
  return static_cast<uint64_t>(bytes);
}

std::string GpuMpsPipeDir(const std::string& mps_root, const std::string& device) {
  return device_plugin::MpsPipeDir(mps_root, std::string(kDriverName) + "/" + device);
}

std::optional<ClaimMps> MpsFor(const GpuClaimPlan& plan, const std::string& mps_root) {
  if (plan.sharing.strategy != "MPS" || plan.gpus.size() != 1) return std::nullopt;
  const ClaimGpu& gpu = plan.gpus.front();
  ClaimMps mps;
  mps.pipe_dir = GpuMpsPipeDir(mps_root, gpu.device);
  mps.shm_dir = device_plugin::MpsShmDir(mps_root);
  mps.container_pipe_dir = GpuMpsPipeDir(device_plugin::kMpsContainerRoot, gpu.device);
  mps.active_thread_percentage = plan.sharing.active_thread_percentage;
  // A per-device limit names the device as the container sees it ("0": its one device) or by
  // UUID (the MIG device's own, or the GPU's); it wins over the default.
  uint64_t limit = plan.sharing.pinned_memory_bytes;
  for (const std::string& key : {std::string("0"), gpu.Mig() ? gpu.mig_uuid : gpu.uuid}) {
    if (const auto it = plan.sharing.pinned_memory_per_device.find(key); it != plan.sharing.pinned_memory_per_device.end()) {
      limit = it->second;
    }
  }
  // CUDA reads the limit in whole MiB at least: anything below one MiB is one.
  mps.pinned_memory_mib = limit == 0 ? 0 : std::max<uint64_t>(1, limit / (1024 * 1024));
  return mps;
}

std::optional<ClaimMps> MpsOf(const dra::PreparedClaim& entry) {
  const auto it = entry.driver_data.find("mps");
  if (it == entry.driver_data.end() || !it->is_object()) return std::nullopt;
  ClaimMps mps;
  mps.pipe_dir = JsonStringAt(*it, "/pipeDir");
  mps.shm_dir = JsonStringAt(*it, "/shmDir");
  mps.container_pipe_dir = JsonStringAt(*it, "/containerPipeDir");
  if (mps.pipe_dir.empty() || mps.shm_dir.empty() || mps.container_pipe_dir.empty()) return std::nullopt;
  if (const auto t = it->find("activeThreadPercentage"); t != it->end()) {
    if (!t->is_number_integer() || t->get<int64_t>() < 1 || t->get<int64_t>() > 100) return std::nullopt;
    mps.active_thread_percentage = t->get<int>();
  }
  if (const auto m = it->find("pinnedMemoryMiB"); m != it->end()) {
    if (!m->is_number_integer() || m->get<int64_t>() < 1) return std::nullopt;
    mps.pinned_memory_mib = m->get<uint64_t>();
  }
  return mps;
}

GpuConfigParse ParseGpuConfig(const json& parameters, const std::string& where) {
  return ParseSharingConfig(parameters, where, false);
}

GpuConfigParse ParseMigDeviceConfig(const json& parameters, const std::string& where) {
  return ParseSharingConfig(parameters, where, true);
}

GpuClaimPlan PlanGpuClaim(const json& claim, std::string_view expected_uid, const std::string& node_name,
                          const std::vector<gpu_inventory::GpuInfo>& served, const dra::Checkpoint& state) {
  GpuClaimPlan plan;
  plan.namespace_name = JsonStringAt(claim, "/metadata/namespace");
  plan.name = JsonStringAt(claim, "/metadata/name");
  const std::string uid = JsonStringAt(claim, "/metadata/uid");
  if (uid != expected_uid) {
    return Refuse(std::move(plan), "the API's claim has uid \"" + uid + "\", the kubelet asked for \"" +
                                       std::string(expected_uid) + "\" (deleted and re-created?)");
  }
  const json* allocation = nullptr;
  if (const auto status = claim.find("status"); status != claim.end() && status->is_object()) {
    if (const auto it = status->find("allocation"); it != status->end() && it->is_object()) allocation = &*it;
  }
  if (allocation == nullptr) return Refuse(std::move(plan), "status.allocation is not set (the claim is not allocated)");
  const json empty = json::array();
  const json* results = &empty;
  const json* configs = &empty;
  if (const auto devices = allocation->find("devices"); devices != allocation->end() && devices->is_object()) {
    if (const auto it = devices->find("results"); it != devices->end() && !it->is_null()) results = &*it;
    if (const auto it = devices->find("config"); it != devices->end() && !it->is_null()) configs = &*it;
  }
  if (!results->is_array()) return Refuse(std::move(plan), "status.allocation.devices.results: expected an array");
  if (!configs->is_array()) return Refuse(std::move(plan), "status.allocation.devices.config: expected an array");

  // Our configs: class configs first, then claim configs, each in API order; the last that
  // applies to a request wins (claim over class, as upstream).
  std::vector<OurConfig> ours;
  for (const char* source : {"FromClass", "FromClaim"}) {
    for (std::size_t i = 0; i < configs->size(); ++i) {
      const json& entry = (*configs)[i];
      const std::string where = "status.allocation.devices.config[" + std::to_string(i) + "]";
      if (!entry.is_object()) return Refuse(std::move(plan), where + ": expected an object");
      if (JsonStringAt(entry, "/opaque/driver") != kDriverName) continue;
      if (JsonStringAt(entry, "/source") != source) {
        const std::string s = JsonStringAt(entry, "/source");
        if (s != "FromClass" && s != "FromClaim") {
          return Refuse(std::move(plan), where + ".source: \"" + s + "\" is not FromClass or FromClaim");
        }
        continue;
      }
      const json& parameters = entry["opaque"].value("parameters", json());
      const std::string at = where + ".opaque.parameters";
      const std::string kind = parameters.is_object() ? JsonStringAt(parameters, "/kind") : std::string();
      if (kind != kGpuConfigKind && kind != kMigDeviceConfigKind) {
        return Refuse(std::move(plan), at + ".kind: \"" + kind + "\" is not a config of " + std::string(kDriverName) +
                                           " (GpuConfig, MigDeviceConfig)");
      }
      OurConfig config;
      config.mig = kind == kMigDeviceConfigKind;
      config.where = where;
      const GpuConfigParse parsed = config.mig ? ParseMigDeviceConfig(parameters, at) : ParseGpuConfig(parameters, at);
      if (!parsed.sharing) return Refuse(std::move(plan), "invalid opaque config: " + parsed.error);
      config.sharing = *parsed.sharing;
      if (const auto requests = entry.find("requests"); requests != entry.end() && requests->is_array()) {
        for (const auto& r : *requests) {
          if (r.is_string()) config.requests.push_back(r.get<std::string>());
        }
      }
      ours.push_back(std::move(config));
    }
  }

  const std::vector<ServedDevice> devices = ServedDevices(served);
  std::set<std::string> seen;
  std::optional<GpuSharing> sharing;
  for (std::size_t i = 0; i < results->size(); ++i) {
    const json& entry = (*results)[i];
    const std::string where = "status.allocation.devices.results[" + std::to_string(i) + "]";
    if (!entry.is_object()) return Refuse(std::move(plan), where + ": expected an object");
    if (JsonStringAt(entry, "/driver") != kDriverName) continue;
    ClaimGpu gpu;
    gpu.request = JsonStringAt(entry, "/request");
    gpu.device = JsonStringAt(entry, "/device");
    const std::string pool = JsonStringAt(entry, "/pool");
    if (gpu.request.empty() || gpu.device.empty()) {
      return Refuse(std::move(plan), where + ": request and device must be non-empty strings");
    }
    if (pool != node_name) {
      return Refuse(std::move(plan), where + ".pool: \"" + pool + "\" is not this node's pool (" + node_name + ")");
    }
    if (!seen.insert(gpu.device).second) return Refuse(std::move(plan), where + ".device: " + gpu.device + " twice");
    const auto device = std::find_if(devices.begin(), devices.end(), [&](const auto& d) { return d.name == gpu.device; });
    if (device == devices.end()) {
      // Not (or no longer) ours: the slice changed after the allocation; the scheduler's next
      // allocation reads the new slice.
      return Refuse(std::move(plan), where + ".device: " + gpu.device +
                                         " is not a GPU or MIG device this node serves through " +
                                         std::string(kDriverName));
    }
    const gpu_inventory::GpuInfo* found = device->gpu;
    if (found->released) {
      return Refuse(std::move(plan),
                    gpu.device + " (" + found->uuid + ") is taken out for a reset (" + found->release_reason +
                        "); the kubelet retries",
                    false);
    }
    if (const dra::PreparedClaim* holder = state.CompletedHolderOf(gpu.device, expected_uid)) {
      return Refuse(std::move(plan),
                    gpu.device + " is held by prepared claim " + holder->namespace_name + "/" + holder->name +
                        " (uid " + holder->uid + "); the kubelet retries once it is unprepared",
                    false);
    }
    gpu.uuid = found->uuid;
    gpu.minor = found->minor;
    if (device->mig != nullptr) {
      gpu.mig_uuid = device->mig->uuid;
      gpu.gpu_instance = device->mig->gpu_instance;
      gpu.compute_instance = device->mig->compute_instance;
    }
    const OurConfig* applies = nullptr;
    for (const auto& config : ours) {
      if (config.AppliesTo(gpu.request)) applies = &config;
    }
    if (applies != nullptr && applies->mig != gpu.Mig()) {
      return Refuse(std::move(plan),
                    applies->where + ": a " + std::string(applies->mig ? kMigDeviceConfigKind : kGpuConfigKind) +
                        " applies to request \"" + gpu.request + "\", but " + gpu.device + " is " +
                        (gpu.Mig() ? "a MIG device (use MigDeviceConfig)" : "a whole GPU (use GpuConfig)"));
    }
    const GpuSharing applied = applies != nullptr ? applies->sharing : GpuSharing{};
    // Time-slicing at an interval other than Default sets the GPU's scheduler: the module does
    // that before the claim is prepared (time_slices.hpp).
    // MPS: the operator's control daemon for the device serves the claim's containers (MpsFor).
    // One daemon per device, and a CUDA client talks to one daemon: one device per MPS claim.
    if (applied.strategy == "MPS" && applied.multi_user) {
      return Refuse(std::move(plan), gpu.device + ": sharing.mpsConfig.multiUser is the control daemon's setting, "
                                                  "which the operator runs here; this driver does not set it");
    }
    if (sharing && *sharing != applied) {
      return Refuse(std::move(plan), "the claim's GPUs have different sharing configs; one claim, one sharing");
    }
    sharing = applied;
    plan.gpus.push_back(std::move(gpu));
  }
  if (plan.gpus.empty()) {
    return Refuse(std::move(plan), "no allocation result for driver " + std::string(kDriverName));
  }
  if (sharing) plan.sharing = *sharing;
  if (plan.sharing.strategy == "MPS" && plan.gpus.size() != 1) {
    return Refuse(std::move(plan), "sharing.strategy MPS on " + std::to_string(plan.gpus.size()) +
                                       " devices: an MPS claim has one device (a CUDA client talks to the one "
                                       "control daemon of its device)");
  }
  return plan;
}

std::string QualifiedGpuDeviceId(std::string_view claim_uid, std::string_view device) {
  return GpuSpecNames().QualifiedDeviceId(std::string(claim_uid) + "-" + std::string(device));
}

dra::PreparedClaim RecordFor(std::string_view claim_uid, const std::string& node_name, const GpuClaimPlan& plan,
                             const std::optional<ClaimMps>& mps) {
  dra::PreparedClaim entry;
  entry.uid = std::string(claim_uid);
  entry.namespace_name = plan.namespace_name;
  entry.name = plan.name;
  entry.pool_name = node_name;
  entry.cdi_spec_file = GpuSpecNames().FileName(claim_uid);
  json gpus = json::array();
  for (std::size_t i = 0; i < plan.gpus.size(); ++i) {
    const ClaimGpu& gpu = plan.gpus[i];
    const std::string id = QualifiedGpuDeviceId(claim_uid, gpu.device);
    if (i == 0) {
      entry.device = gpu.device;
      entry.request_names = {gpu.request};
      entry.cdi_device_id = id;
    } else {
      entry.more_devices.push_back(dra::PreparedClaimDevice{gpu.device, {gpu.request}, id});
    }
    json member{{"device", gpu.device}, {"request", gpu.request}, {"uuid", gpu.uuid}, {"minor", gpu.minor}};
    if (gpu.Mig()) {
      member["mig"] = json{{"uuid", gpu.mig_uuid},
                           {"gpuInstance", gpu.gpu_instance},
                           {"computeInstance", gpu.compute_instance}};
    }
    gpus.push_back(std::move(member));
  }
  entry.driver_data["gpus"] = std::move(gpus);
  if (!plan.sharing.strategy.empty()) {
    entry.driver_data["sharing"] = json{{"strategy", plan.sharing.strategy}, {"interval", plan.sharing.interval}};
  }
  if (mps) {
    json m{{"pipeDir", mps->pipe_dir}, {"shmDir", mps->shm_dir}, {"containerPipeDir", mps->container_pipe_dir}};
    if (mps->active_thread_percentage > 0) m["activeThreadPercentage"] = mps->active_thread_percentage;
    if (mps->pinned_memory_mib > 0) m["pinnedMemoryMiB"] = mps->pinned_memory_mib;
    entry.driver_data["mps"] = std::move(m);
  }
  return entry;
}

std::vector<ClaimGpu> GpusOf(const dra::PreparedClaim& entry) {
  std::vector<ClaimGpu> out;
  const auto it = entry.driver_data.find("gpus");
  if (it == entry.driver_data.end() || !it->is_array()) return {};
  for (const auto& g : *it) {
    if (!g.is_object() || !g.contains("minor") || !g["minor"].is_number_unsigned()) return {};
    ClaimGpu gpu;
    gpu.device = JsonStringAt(g, "/device");
    gpu.request = JsonStringAt(g, "/request");
    gpu.uuid = JsonStringAt(g, "/uuid");
    gpu.minor = g["minor"].get<uint32_t>();
    const auto mig = g.find("mig");
    if (mig != g.end()) {
      if (!mig->is_object() || !mig->contains("gpuInstance") || !(*mig)["gpuInstance"].is_number_unsigned() ||
          !mig->contains("computeInstance") || !(*mig)["computeInstance"].is_number_unsigned()) {
        return {};
      }
      gpu.mig_uuid = JsonStringAt(*mig, "/uuid");
      gpu.gpu_instance = (*mig)["gpuInstance"].get<uint32_t>();
      gpu.compute_instance = (*mig)["computeInstance"].get<uint32_t>();
    }
    // The device's name must be this driver's for that minor: a MIG name for a record with a MIG
    // device (and its UUID), a whole GPU's otherwise.
    const bool has_mig = mig != g.end();
    const auto parts = ParseDeviceName(gpu.device);
    if (!parts || parts->minor != gpu.minor || parts->mig != has_mig || (has_mig && gpu.mig_uuid.empty())) return {};
    out.push_back(std::move(gpu));
  }
  return out;
}

json BuildGpuClaimSpec(std::string_view claim_uid, const std::vector<ClaimGpu>& gpus,
                       const device_plugin::CdiSettings& settings, const device_plugin::CdiHostFacts& facts,
                       const std::optional<ClaimMps>& mps) {
  device_plugin::CdiSettings claim_settings = settings;
  claim_settings.kind = GpuSpecNames().Kind();
  std::vector<device_plugin::PhysicalDevice> devices;
  for (const auto& gpu : gpus) {
    device_plugin::PhysicalDevice d;
    d.uuid = gpu.Mig() ? gpu.mig_uuid : gpu.uuid;
    d.parent_uuid = gpu.uuid;
    d.id = std::string(claim_uid) + "-" + gpu.device;
    d.minor = gpu.minor;
    // A MIG device: the device plugin's builder adds its GPU and compute instance's
    // /dev/nvidia-caps nodes (the host's mig-minors map).
    d.mig = gpu.Mig();
    d.gpu_instance = gpu.gpu_instance;
    d.compute_instance = gpu.compute_instance;
    devices.push_back(std::move(d));
  }
  json spec = device_plugin::BuildCdiSpec(claim_settings, devices, facts);
  // The device plugin's spec adds "all" (its resource's every device); a claim has only its own.
  auto& list = spec["devices"];
  list.erase(std::remove_if(list.begin(), list.end(), [](const json& d) { return d.value("name", "") == "all"; }),
             list.end());
  if (mps) {
    // The pipe and shm directories read-write (clients create their sockets and shared memory
    // there, as the device plugin's MPS mounts them), the pipe's path and the client limits.
    json env = json::array({std::string(device_plugin::kMpsPipeEnv) + "=" + mps->container_pipe_dir});
    if (mps->active_thread_percentage > 0) {
      env.push_back(std::string(device_plugin::kMpsThreadPercentageEnv) + "=" +
                    std::to_string(mps->active_thread_percentage));
    }
    if (mps->pinned_memory_mib > 0) {
      env.push_back(std::string(device_plugin::kMpsPinnedMemEnv) + "=0=" + std::to_string(mps->pinned_memory_mib) + "M");
    }
    const json options = json::array({"rw", "nosuid", "nodev", "bind"});
    json mounts = json::array({json{{"hostPath", mps->pipe_dir}, {"containerPath", mps->container_pipe_dir}, {"options", options}},
                               json{{"hostPath", mps->shm_dir}, {"containerPath", device_plugin::kMpsContainerShm}, {"options", options}}});
    for (auto& device : list) {
      auto& edits = device["containerEdits"];
      for (const auto& e : env) edits["env"].push_back(e);
      for (const auto& m : mounts) edits["mounts"].push_back(m);
    }
  }
  return spec;
}

std::string GpuClaimSpecContent(std::string_view claim_uid, const std::vector<ClaimGpu>& gpus,
                                const device_plugin::CdiSettings& settings, const device_plugin::CdiHostFacts& facts,
                                const std::optional<ClaimMps>& mps) {
  return BuildGpuClaimSpec(claim_uid, gpus, settings, facts, mps).dump(2) + "\n";
}

}  // namespace gns::dra_gpu
