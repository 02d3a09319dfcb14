// GPU node labels.
#include "modules/node_labels/labels.hpp"

#include <cctype>
#include <sstream>
#include <vector>

namespace gns::node_labels {

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
      std::string product = first.name;
      if (plugin != nullptr && plugin->gpu_replicas > 1 && !plugin->gpu_shared_renamed) product += "-SHARED";
      labels["nvidia.com/gpu.product"] = LabelValue(product);
      labels["nvidia.com/gpu.memory"] = std::to_string(first.memory_total_bytes / (1024 * 1024));
      labels["nvidia.com/gpu.family"] = ArchFamily(first.cc_major, first.cc_minor);
    }
    std::vector<std::string> parts;
    std::stringstream version(inventory->driver_version);
    for (std::string part; std::getline(version, part, '.');) parts.push_back(part);
    const char* names[] = {"nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"};
    for (std::size_t i = 0; i < 3 && i < parts.size(); ++i) {
      if (const auto v = LabelValue(parts[i]); !v.empty()) labels[names[i]] = v;
    }
  }
  if (plugin != nullptr && !plugin->mig_strategy.empty()) {
    labels["nvidia.com/mig.strategy"] = plugin->mig_strategy;
    labels["nvidia.com/gpu.replicas"] = std::to_string(plugin->gpu_replicas);
    labels["nvidia.com/gpu.sharing-strategy"] = plugin->sharing_strategy;
  }
  if (clique != nullptr && clique->known && !clique->clique_id.empty()) {
    labels["nvidia.com/gpu.clique"] = LabelValue(clique->clique_id);
  }
  return labels;
}

}  // namespace gns::node_labels
