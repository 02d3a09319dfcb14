// Per-GPU health verdicts (see verdict_book.hpp).
#include "modules/gpu_health/verdict_book.hpp"

namespace gns::gpu_health {

const DeviceHealth* VerdictBook::MarkUnhealthy(const std::string& uuid, const std::string& pci,
                                               const std::string& reason, uint32_t xid, RecommendedAction action,
                                               int64_t now_unix_ms) {
  const std::string action_name(ActionName(action));
  auto [it, fresh] = devices_.try_emplace(uuid);
  DeviceHealth& h = it->second;
  if (!fresh && !h.healthy && h.xid == xid && h.recommended_action == action_name) return nullptr;
  const bool was_healthy = fresh || h.healthy;
  h.uuid = uuid;
  h.healthy = false;
  h.reason = reason;
  h.xid = xid;
  h.recommended_action = action_name;
  if (!pci.empty()) h.pci = pci;
  if (was_healthy) h.since_unix_ms = now_unix_ms;
  return &h;
}

const DeviceHealth* VerdictBook::MarkHealthy(const std::string& uuid, const std::string& reason, int64_t now_unix_ms) {
  const auto it = devices_.find(uuid);
  if (it == devices_.end() || it->second.healthy) return nullptr;
  DeviceHealth& h = it->second;
  h.healthy = true;
  h.reason = reason;
  h.xid = 0;
  h.recommended_action.clear();
  h.since_unix_ms = now_unix_ms;
  return &h;
}

bool VerdictBook::Restore(const DeviceHealth& saved) {
  if (saved.healthy) return false;  // Healthy is where every device starts
  const auto [it, fresh] = devices_.try_emplace(saved.uuid, saved);
  return fresh;
}

const DeviceHealth* VerdictBook::Find(std::string_view uuid) const {
  const auto it = devices_.find(uuid);
  return it == devices_.end() ? nullptr : &it->second;
}

bool VerdictBook::IsUnhealthy(std::string_view uuid) const {
  const DeviceHealth* h = Find(uuid);
  return h != nullptr && !h->healthy;
}

std::vector<DeviceHealth> VerdictBook::All() const {
  std::vector<DeviceHealth> out;
  out.reserve(devices_.size());
  for (const auto& [uuid, h] : devices_) out.push_back(h);
  return out;
}

std::vector<std::string> VerdictBook::UnhealthyUuids() const {
  std::vector<std::string> out;
  for (const auto& [uuid, h] : devices_) {
    if (!h.healthy) out.push_back(uuid);
  }
  return out;
}

std::size_t VerdictBook::UnhealthyCount() const {
  std::size_t n = 0;
  for (const auto& [uuid, h] : devices_) n += h.healthy ? 0 : 1;
  return n;
}

}  // namespace gns::gpu_health
