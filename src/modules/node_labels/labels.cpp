// GPU node labels.
#include "modules/node_labels/labels.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <vector>

namespace gns::node_labels {

namespace {

using gpu_inventory::GpuInfo;
using gpu_inventory::GpuInventory;
using gpu_inventory::MigDeviceInfo;

// GFD's sanitise(): drop what is not [A-Za-z0-9-_. ], then runs of spaces become one '-'.
std::string Sanitise(const std::string& text) {
  std::string kept;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ' ') kept += c;
  }
  std::istringstream words(kept);
  std::string out;
  for (std::string word; words >> word;) out += (out.empty() ? "" : "-") + word;
  return out;
}

std::string MiB(uint64_t bytes) { return std::to_string(bytes / (1024 * 1024)); }

// One MIG profile on the node: its devices in GPU then slot order, each with its parent.
struct MigProfile {
  std::vector<std::pair<const GpuInfo*, const MigDeviceInfo*>> devices;
};

std::map<std::string, MigProfile> MigProfiles(const GpuInventory& inventory) {
  std::map<std::string, MigProfile> profiles;
  for (const auto& gpu : inventory.gpus) {
    if (!gpu.mig_enabled) continue;
    for (const auto& mig : gpu.mig_devices) profiles[mig.profile].devices.emplace_back(&gpu, &mig);
  }
  return profiles;
}

// How the device plugin shares one resource: replicas, and whether it is advertised under
// another name (then its product carries no "-SHARED").
struct Sharing {
  int replicas = 1;
  bool renamed = false;
};

// The resource serving this MIG device under mig.strategy mixed: the one whose device IDs
// name it (by UUID or "<gpu index>:<slot>", a replica as "<id>::<n>"). Its advertised name
// differs from `resource` when time-slicing renamed it.
Sharing MigSharing(const device_plugin::DevicePluginState& plugin, const std::string& resource, const GpuInfo& gpu,
                   const MigDeviceInfo& mig) {
  const std::string index_id = std::to_string(gpu.index) + ":" + std::to_string(mig.index);
  for (const auto& r : plugin.resources) {
    for (const auto& id : r.device_ids) {
      const std::string physical = id.substr(0, id.find("::"));
      if (physical == mig.uuid || physical == index_id) return Sharing{std::max(r.replicas, 1), r.name != resource};
    }
  }
  return {};
}

// GFD's labels of one MIG resource (NewMIGResourceLabeler): `prefix` is nvidia.com/gpu under
// single, nvidia.com/mig-<profile> under mixed; the attributes are the first device's.
void MigResourceLabels(Labels& labels, const std::string& prefix, const std::string& profile, const MigProfile& devices,
                       const Sharing& sharing, const std::string& sharing_strategy) {
  const auto& [gpu, mig] = devices.devices.front();
  std::vector<std::string> product = {gpu->name, "MIG", profile};
  if (sharing.replicas > 1 && !sharing.renamed) product.emplace_back("SHARED");
  labels[prefix + ".product"] = ProductName(product);
  labels[prefix + ".count"] = std::to_string(devices.devices.size());
  labels[prefix + ".replicas"] = std::to_string(sharing.replicas);
  labels[prefix + ".sharing-strategy"] = sharing.replicas > 1 ? sharing_strategy : "none";
  labels[prefix + ".memory"] = MiB(mig->memory_bytes);
  labels[prefix + ".multiprocessors"] = std::to_string(mig->multiprocessors);
  labels[prefix + ".slices.gi"] = std::to_string(mig->gpu_instance_slices);
  labels[prefix + ".slices.ci"] = std::to_string(mig->compute_instance_slices);
  labels[prefix + ".engines.copy"] = std::to_string(mig->copy_engines);
  labels[prefix + ".engines.decoder"] = std::to_string(mig->decoders);
  labels[prefix + ".engines.encoder"] = std::to_string(mig->encoders);
  labels[prefix + ".engines.jpeg"] = std::to_string(mig->jpeg_engines);
  labels[prefix + ".engines.ofa"] = std::to_string(mig->ofa_engines);
}

// mig.strategy single: nvidia.com/gpu.* describe the one MIG profile every GPU is cut into.
// No MIG-enabled GPU: the whole-GPU labels stand. A MIG-enabled GPU with no MIG devices, a GPU
// outside MIG mode beside MIG-enabled ones, or two profiles: GFD's "-MIG-INVALID" set.
void SingleStrategyLabels(Labels& labels, const GpuInventory& inventory, const device_plugin::DevicePluginState& plugin) {
  const GpuInfo* first_mig = nullptr;
  bool invalid = false;
  for (const auto& gpu : inventory.gpus) {
    if (gpu.mig_enabled && first_mig == nullptr) first_mig = &gpu;
    if (gpu.mig_enabled && gpu.mig_devices.empty()) invalid = true;
  }
  if (first_mig == nullptr) return;
  if (std::any_of(inventory.gpus.begin(), inventory.gpus.end(), [](const GpuInfo& g) { return !g.mig_enabled; })) {
    invalid = true;
  }
  const auto profiles = MigProfiles(inventory);
  if (invalid || profiles.size() != 1) {
    labels["nvidia.com/gpu.product"] = ProductName({first_mig->name, "MIG", "INVALID"});
    labels["nvidia.com/gpu.count"] = "0";
    labels["nvidia.com/gpu.replicas"] = "0";
    labels["nvidia.com/gpu.sharing-strategy"] = "";
    labels["nvidia.com/gpu.memory"] = "0";
    return;
  }
  const Sharing sharing{std::max(plugin.gpu_replicas, 1), plugin.gpu_shared_renamed};
  const auto& [profile, devices] = *profiles.begin();
  MigResourceLabels(labels, "nvidia.com/gpu", profile, devices, sharing, plugin.sharing_strategy);
}

void MixedStrategyLabels(Labels& labels, const GpuInventory& inventory, const device_plugin::DevicePluginState& plugin) {
  for (const auto& [profile, devices] : MigProfiles(inventory)) {
    const std::string resource = "nvidia.com/mig-" + profile;
    const auto& [gpu, mig] = devices.devices.front();
    MigResourceLabels(labels, resource, profile, devices, MigSharing(plugin, resource, *gpu, *mig),
                      plugin.sharing_strategy);
  }
}

void VersionLabels(Labels& labels, const GpuInventory& inventory) {
  std::vector<std::string> parts;
  std::stringstream version(inventory.driver_version);
  for (std::string part; std::getline(version, part, '.');) parts.push_back(part);
  const char* names[] = {"major", "minor", "rev"};
  const char* new_names[] = {"major", "minor", "revision"};
  for (std::size_t i = 0; i < 3 && i < parts.size(); ++i) {
    if (const auto v = LabelValue(parts[i]); !v.empty()) {
      labels[std::string("nvidia.com/cuda.driver.") + names[i]] = v;
      labels[std::string("nvidia.com/cuda.driver-version.") + new_names[i]] = v;
    }
  }
  if (const auto full = LabelValue(inventory.driver_version); !full.empty()) {
    labels["nvidia.com/cuda.driver-version.full"] = full;
  }
  // The highest CUDA version the driver supports (nvmlSystemGetCudaDriverVersion_v2, 12040 =
  // 12.4): GFD calls it the runtime version.
  if (inventory.cuda_driver_version > 0) {
    const std::string major = std::to_string(inventory.cuda_driver_version / 1000);
    const std::string minor = std::to_string(inventory.cuda_driver_version % 1000 / 10);
    labels["nvidia.com/cuda.runtime.major"] = major;
    labels["nvidia.com/cuda.runtime.minor"] = minor;
    labels["nvidia.com/cuda.runtime-version.major"] = major;
    labels["nvidia.com/cuda.runtime-version.minor"] = minor;
    labels["nvidia.com/cuda.runtime-version.full"] = major + "." + minor;
  }
}

}  // namespace

std::string LabelValue(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    out += ok ? c : '-';
  }
  if (out.size() > 63) out.resize(63);
  while (!out.empty() && !std::isalnum(static_cast<unsigned char>(out.back()))) out.pop_back();
  std::size_t start = 0;
  while (start < out.size() && !std::isalnum(static_cast<unsigned char>(out[start]))) ++start;
  return out.substr(start);
}

std::string ProductName(const std::vector<std::string>& parts) {
  std::string joined;
  for (const auto& part : parts) {
    if (const auto s = Sanitise(part); !s.empty()) joined += (joined.empty() ? "" : "-") + s;
  }
  return LabelValue(joined);
}

std::string ArchFamily(int cc_major, int cc_minor) {
  switch (cc_major) {
    case 1: return "tesla";
    case 2: return "fermi";
    case 3: return "kepler";
    case 5: return "maxwell";
    case 6: return "pascal";
    case 7: return cc_minor < 5 ? "volta" : "turing";
    case 8: return cc_minor < 9 ? "ampere" : "ada-lovelace";
    case 9: return "hopper";
    case 10:
    case 12: return "blackwell";
    case 13: return "rubin";
    default: return "undefined";
  }
}

Labels ComputeLabels(const gpu_inventory::GpuInventory* inventory, const gpu_inventory::NodeClique* clique,
                     const device_plugin::DevicePluginState* plugin) {
  Labels labels;
  if (inventory != nullptr && !inventory->driver_version.empty()) {
    labels["nvidia.com/gpu.count"] = std::to_string(inventory->gpus.size());
    if (!inventory->gpus.empty()) {
      const auto& first = inventory->gpus.front();
      // GFD labels a model's MIG-enabled GPUs without sharing (replicas 0) unless a GPU of the
      // same model is outside MIG mode: nvidia.com/gpu's sharing applies to whole GPUs only.
      const bool whole_gpus = std::any_of(inventory->gpus.begin(), inventory->gpus.end(),
                                          [&](const GpuInfo& g) { return g.name == first.name && !g.mig_enabled; });
      const bool shared = plugin != nullptr && whole_gpus && plugin->gpu_replicas > 1;
      std::vector<std::string> product = {first.name};
      if (shared && !plugin->gpu_shared_renamed) product.emplace_back("SHARED");
      labels["nvidia.com/gpu.product"] = ProductName(product);
      labels["nvidia.com/gpu.memory"] = MiB(first.memory_total_bytes);
      // Architecture labels only when NVML gave the compute capability (GFD's rule).
      if (first.cc_major != 0) {
        labels["nvidia.com/gpu.family"] = ArchFamily(first.cc_major, first.cc_minor);
        labels["nvidia.com/gpu.compute.major"] = std::to_string(first.cc_major);
        labels["nvidia.com/gpu.compute.minor"] = std::to_string(first.cc_minor);
      }
      if (plugin != nullptr && !plugin->mig_strategy.empty()) {
        labels["nvidia.com/gpu.replicas"] = whole_gpus ? std::to_string(std::max(plugin->gpu_replicas, 1)) : "0";
        labels["nvidia.com/gpu.sharing-strategy"] = shared ? plugin->sharing_strategy : "none";
      }
    }
    VersionLabels(labels, *inventory);
    if (plugin != nullptr && plugin->mig_strategy == "single") SingleStrategyLabels(labels, *inventory, *plugin);
    if (plugin != nullptr && plugin->mig_strategy == "mixed") MixedStrategyLabels(labels, *inventory, *plugin);
  }
  // GFD sets mig.strategy only when it is not none.
  if (plugin != nullptr && (plugin->mig_strategy == "single" || plugin->mig_strategy == "mixed")) {
    labels["nvidia.com/mig.strategy"] = plugin->mig_strategy;
  }
  if (clique != nullptr && clique->known && !clique->clique_id.empty()) {
    labels["nvidia.com/gpu.clique"] = LabelValue(clique->clique_id);
  }
  return labels;
}

}  // namespace gns::node_labels
