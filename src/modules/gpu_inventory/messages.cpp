// Out-of-line parts of the gpu-inventory bus messages: look-ups,
// and the JSON shown in /debug/state.
#include "modules/gpu_inventory/messages.hpp"

#include <charconv>
#include <cstdio>

namespace gns::gpu_inventory {

const GpuInfo* GpuInventory::FindByUuid(std::string_view uuid) const {
  for (const auto& gpu : gpus) {
    if (gpu.uuid == uuid) return &gpu;
  }
  return nullptr;
}

const GpuInfo* GpuInventory::FindByPci(const PciAddress& pci) const {
  for (const auto& gpu : gpus) {
    if (gpu.pci.domain == pci.domain && gpu.pci.bus == pci.bus && gpu.pci.device == pci.device) return &gpu;
  }
  return nullptr;
}



std::string MigProfileName(uint32_t gpu_instance_slices, uint32_t compute_instance_slices, uint64_t memory_size_mib,
                           uint64_t parent_memory_bytes) {
  constexpr uint64_t kMiB = 1024ULL * 1024;
  constexpr uint64_t kGiB = 1024ULL * kMiB;
  uint64_t gb = 0;
  if (parent_memory_bytes > 0) {
    // Integer form of ceil(mem / total * 8) / 8 * ceil(total / GiB), rounded half up.
    const uint64_t mem = memory_size_mib * kMiB;
    const uint64_t eighths = (mem * 8 + parent_memory_bytes - 1) / parent_memory_bytes;
    const uint64_t total_gb = (parent_memory_bytes + kGiB - 1) / kGiB;
    gb = (eighths * total_gb * 2 + 8) / 16;
  } else {
    gb = (memory_size_mib + 1023) / 1024;
  }
  std::string name;
  if (compute_instance_slices != gpu_instance_slices) name = std::to_string(compute_instance_slices) + "c.";
  return name + std::to_string(gpu_instance_slices) + "g." + std::to_string(gb) + "gb";
}

void to_json(nlohmann::json& j, const MigDeviceInfo& m) {
  j = nlohmann::json{{"index", m.index},     {"uuid", m.uuid},           {"gpuInstance", m.gpu_instance},
                     {"computeInstance", m.compute_instance}, {"profile", m.profile}, {"memoryBytes", m.memory_bytes}};
  j["multiprocessors"] = m.multiprocessors;
  j["slices"] = nlohmann::json{{"gi", m.gpu_instance_slices}, {"ci", m.compute_instance_slices}};
  j["engines"] = nlohmann::json{{"copy", m.copy_engines}, {"decoder", m.decoders}, {"encoder", m.encoders},
                                {"jpeg", m.jpeg_engines},  {"ofa", m.ofa_engines}};
  if (m.placement_known) {
    j["gpuInstanceProfileId"] = m.gi_profile_id;
    j["placement"] = nlohmann::json{{"start", m.placement_start}, {"size", m.placement_size}};
  }
}

void to_json(nlohmann::json& j, const FabricInfo& f) {
  j = nlohmann::json{{"clusterUuid", f.cluster_uuid},
                     {"cliqueId", f.clique_id},
                     {"state", f.state},
                     {"status", f.status},
                     {"attached", f.Attached()}};
}

void to_json(nlohmann::json& j, const NvSwitchLink& l) {
  j = nlohmann::json{{"link", l.link}, {"nvswitch", l.nvswitch.ToString()}, {"port", l.port}};
}

void to_json(nlohmann::json& j, const GpuInfo& g) {
  j = nlohmann::json{{"index", g.index},
                     {"uuid", g.uuid},
                     {"name", g.name},
                     {"pciBusId", g.pci_bus_id},
                     {"pci", g.pci.ToString()},
                     {"minor", g.minor},
                     {"memoryTotalBytes", g.memory_total_bytes},
                     {"numaNode", g.numa_node},
                     {"nvlinkPeers", g.nvlink_peers}};
  if (g.fabric) j["fabric"] = *g.fabric;
  if (!g.nvswitch_links.empty()) j["nvswitchLinks"] = g.nvswitch_links;
  if (g.released) j["released"] = g.release_reason.empty() ? "released" : g.release_reason;
  if (g.mig_enabled) j["migDevices"] = g.mig_devices;
  if (g.cc_major > 0) j["computeCapability"] = std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor);
  if (g.brand) j["brand"] = *g.brand;  // nvmlBrandType_t
}

void to_json(nlohmann::json& j, const GpuInventory& inv) {
  j = nlohmann::json{{"available", inv.available}, {"driverVersion", inv.driver_version}, {"gpus", inv.gpus}};
  if (!inv.error.empty()) j["error"] = inv.error;
  if (inv.cuda_driver_version > 0) j["cudaDriverVersion"] = inv.cuda_driver_version;
}

void to_json(nlohmann::json& j, const NodeClique& c) {
  j = nlohmann::json{{"cliqueId", c.clique_id}, {"known", c.known}};
  if (!c.reason.empty()) j["reason"] = c.reason;
}

void to_json(nlohmann::json& j, const XidObservation& x) {
  j = nlohmann::json{{"uuid", x.uuid}, {"xid", x.xid}, {"observedUnixMs", x.observed_unix_ms}};
  if (x.gpu_instance != 0xFFFFFFFFu) j["gpuInstance"] = x.gpu_instance;
  if (x.compute_instance != 0xFFFFFFFFu) j["computeInstance"] = x.compute_instance;
}

void to_json(nlohmann::json& j, const NvmlReleaseAhead& a) { j = nlohmann::json{{"gpu", a.gpu_uuid}, {"ahead", a.ahead}}; }

}  // namespace gns::gpu_inventory
