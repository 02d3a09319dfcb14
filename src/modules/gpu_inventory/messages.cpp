// Out-of-line parts of the gpu-inventory bus messages: PCI address parsing and printing, look-ups,
// and the JSON shown in /debug/state.
#include "modules/gpu_inventory/messages.hpp"

#include <charconv>
#include <cstdio>

namespace gns::gpu_inventory {

namespace {

// A whole field of 1..max_digits hex digits (any case); nothing else.
bool ParseHexField(std::string_view text, std::size_t max_digits, uint32_t max_value, uint32_t& out) {
  if (text.empty() || text.size() > max_digits) return false;
  uint32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (ec != std::errc() || end != text.data() + text.size() || value > max_value) return false;
  out = value;
  return true;
}

}  // namespace

std::string PciAddress::ToString() const {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%04x:%02x:%02x.%x", domain, bus, device, function);
  return buffer;
}

std::optional<PciAddress> PciAddress::Parse(std::string_view text) {
  // Split on ':' into 2 (bus:device[.function]) or 3 (domain:bus:device[.function]) fields.
  std::string_view fields[3];
  std::size_t count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t colon = text.find(':', start);
    if (count == 3) return std::nullopt;
    fields[count++] = text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start);
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (count < 2) return std::nullopt;

  PciAddress address;
  std::size_t i = 0;
  if (count == 3 && !ParseHexField(fields[i++], 8, 0xFFFFFFFFu, address.domain)) return std::nullopt;
  if (!ParseHexField(fields[i++], 2, 0xFFu, address.bus)) return std::nullopt;
  std::string_view device = fields[i];
  if (const std::size_t dot = device.find('.'); dot != std::string_view::npos) {
    if (!ParseHexField(device.substr(dot + 1), 1, 7u, address.function)) return std::nullopt;
    device = device.substr(0, dot);
  }
  if (!ParseHexField(device, 2, 0x1Fu, address.device)) return std::nullopt;
  return address;
}

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

void to_json(nlohmann::json& j, const PciAddress& p) { j = p.ToString(); }

void to_json(nlohmann::json& j, const FabricInfo& f) {
  j = nlohmann::json{{"clusterUuid", f.cluster_uuid},
                     {"cliqueId", f.clique_id},
                     {"state", f.state},
                     {"status", f.status},
                     {"attached", f.Attached()}};
}

void to_json(nlohmann::json& j, const GpuInfo& g) {
  j = nlohmann::json{{"index", g.index},
                     {"uuid", g.uuid},
                     {"name", g.name},
                     {"pciBusId", g.pci_bus_id},
                     {"pci", g.pci},
                     {"minor", g.minor},
                     {"memoryTotalBytes", g.memory_total_bytes},
                     {"numaNode", g.numa_node},
                     {"nvlinkPeers", g.nvlink_peers}};
  if (g.fabric) j["fabric"] = *g.fabric;
  if (g.cc_major > 0) j["computeCapability"] = std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor);
}

void to_json(nlohmann::json& j, const GpuInventory& inv) {
  j = nlohmann::json{{"available", inv.available}, {"driverVersion", inv.driver_version}, {"gpus", inv.gpus}};
  if (!inv.error.empty()) j["error"] = inv.error;
  if (inv.cuda_driver_version > 0) j["cudaDriverVersion"] = inv.cuda_driver_version;
}

void to_json(nlohmann::json& j, const NodeClique& c) {
  j = nlohmann::json{{"cliqueId", c.clique_id}};
  if (!c.reason.empty()) j["reason"] = c.reason;
}

void to_json(nlohmann::json& j, const XidObservation& x) {
  j = nlohmann::json{{"uuid", x.uuid}, {"xid", x.xid}, {"observedUnixMs", x.observed_unix_ms}};
  if (x.gpu_instance != 0xFFFFFFFFu) j["gpuInstance"] = x.gpu_instance;
  if (x.compute_instance != 0xFFFFFFFFu) j["computeInstance"] = x.compute_instance;
}

}  // namespace gns::gpu_inventory
