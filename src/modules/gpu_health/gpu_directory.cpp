// GpuDirectory and XidSubject: see gpu_directory.hpp.
#include "modules/gpu_health/gpu_directory.hpp"

namespace gns::gpu_health {
namespace {

constexpr std::string_view kPciIdPrefix = "PCI:";

PciAddress FromInventory(const gpu_inventory::PciAddress& p) {
  PciAddress out;
  out.domain = p.domain;
  out.bus = static_cast<uint8_t>(p.bus);
  out.device = static_cast<uint8_t>(p.device);
  return out;
}

}  // namespace

std::string PciPolicyId(std::string_view pci_text) {
  std::string out;
  out.reserve(kPciIdPrefix.size() + pci_text.size());
  out.append(kPciIdPrefix);
  out.append(pci_text);
  return out;
}

XidSubject::XidSubject(std::string_view uuid, const std::optional<PciAddress>& pci) : uuid_(uuid), address_(pci) {
  if (uuid_.empty()) pci_id_ = PciPolicyId(pci ? pci->DeviceString() : std::string());
}

std::string_view XidSubject::policy_id() const noexcept { return uuid_.empty() ? std::string_view(pci_id_) : uuid_; }

void GpuDirectory::SetInventory(const std::vector<gpu_inventory::GpuInfo>& gpus) {
  inventory_.clear();
  inventory_.reserve(gpus.size());
  for (const auto& gpu : gpus) {
    const PciAddress pci = FromInventory(gpu.pci);
    inventory_.emplace_back(pci.DeviceKey(), Known{gpu.uuid, pci.DeviceString()});
  }
}

std::string_view GpuDirectory::UuidForPci(const PciAddress& pci) const noexcept {
  const uint64_t key = pci.DeviceKey();
  for (const auto& [gpu_key, gpu] : inventory_) {
    if (gpu_key == key) return gpu.uuid;
  }
  const auto it = learned_.find(key);
  return it == learned_.end() ? std::string_view() : std::string_view(it->second.uuid);
}

std::string GpuDirectory::PciForUuid(std::string_view uuid) const {
  for (const auto& [key, gpu] : inventory_) {
    if (gpu.uuid == uuid) return gpu.pci;
  }
  for (const auto& [key, gpu] : learned_) {
    if (gpu.uuid == uuid) return gpu.pci;
  }
  return {};
}

GpuDirectory::LearnResult GpuDirectory::Learn(const PciAddress& pci, std::string_view uuid) {
  const uint64_t key = pci.DeviceKey();
  const auto it = learned_.find(key);
  if (it != learned_.end() && it->second.uuid == uuid) return LearnResult::kKnown;
  if (it == learned_.end() && learned_.size() >= kMaxLearned) return LearnResult::kFull;
  learned_[key] = Known{std::string(uuid), pci.DeviceString()};
  return LearnResult::kLearned;
}

std::vector<std::pair<std::string, std::string>> GpuDirectory::Learned() const {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(learned_.size());
  for (const auto& [key, gpu] : learned_) out.emplace_back(gpu.pci, gpu.uuid);
  return out;
}

}  // namespace gns::gpu_health
