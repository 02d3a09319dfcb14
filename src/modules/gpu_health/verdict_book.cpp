// Per-GPU health verdicts (see verdict_book.hpp).
#include "modules/gpu_health/verdict_book.hpp"

#include <algorithm>

namespace gns::gpu_health {

const DeviceHealth* VerdictBook::MarkUnhealthy(const std::string& uuid, const std::string& pci,
                                               const std::string& reason, uint32_t xid, RecommendedAction action,
                                               int64_t now_unix_ms, uint32_t gpu_instance, uint32_t sxid) {
  const std::string action_name(ActionName(action));
  auto [it, fresh] = devices_.try_emplace(DeviceHealth::KeyOf(uuid, gpu_instance));
  DeviceHealth& h = it->second;
  // Held by this XID too, whether or not it changes the verdict: a later clearing XID must not
  // heal a GPU that another fault still holds.
  auto& holders = held_by_[it->first];
  if (fresh || h.healthy) holders.clear();
  if (auto at = std::lower_bound(holders.begin(), holders.end(), xid);
      (at == holders.end() || *at != xid) && holders.size() < kMaxHolders) {
    holders.insert(at, xid);
  }
  if (!fresh && !h.healthy) {
    // Unhealthy already: the recommended action only escalates until the device is recovered. A
    // milder report changes nothing: the verdict keeps the XID and reason its action is for.
    if (ActionRank(action) < ActionRank(ActionOf(h))) return nullptr;
    if (h.xid == xid && h.sxid == sxid && h.recommended_action == action_name) return nullptr;
  }
  const bool was_healthy = fresh || h.healthy;
  h.uuid = uuid;
  h.gpu_instance = gpu_instance;
  h.healthy = false;
  h.reason = reason;
  h.xid = xid;
  h.sxid = sxid;
  h.recommended_action = action_name;
  if (!pci.empty()) h.pci = pci;
  if (was_healthy) h.since_unix_ms = now_unix_ms;
  return &h;
}

std::vector<DeviceHealth> VerdictBook::MarkHealthy(const std::string& uuid, const std::string& reason,
                                                   int64_t now_unix_ms) {
  std::vector<DeviceHealth> changed;
  // The GPU's key, then "<uuid>/gi…": keys that begin with the UUID, the GPU first.
  for (auto it = devices_.lower_bound(uuid); it != devices_.end() && it->first.starts_with(uuid); ++it) {
    DeviceHealth& h = it->second;
    if (h.uuid != uuid || h.healthy) continue;
    held_by_.erase(it->first);
    h.healthy = true;
    h.reason = reason;
    h.xid = 0;
    h.sxid = 0;
    h.check.clear();
    h.recommended_action.clear();
    h.since_unix_ms = now_unix_ms;
    changed.push_back(h);
  }
  return changed;
}

RecommendedAction VerdictBook::ActionOf(const DeviceHealth& health) {
  // A name this build does not know (a checkpoint of another version) ranks as UNKNOWN.
  return ParseActionName(health.recommended_action).value_or(RecommendedAction::kUnknown);
}

bool VerdictBook::Restore(const DeviceHealth& saved, const std::vector<uint32_t>* held_by) {
  if (saved.healthy) return false;  // Healthy is where every device starts
  const auto [it, fresh] = devices_.try_emplace(saved.RetainKey(), saved);
  if (!fresh) return false;
  std::vector<uint32_t> holders;
  if (held_by != nullptr && !held_by->empty()) {
    holders = *held_by;
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    if (holders.size() > kMaxHolders) holders.resize(kMaxHolders);
  } else {
    holders.push_back(static_cast<uint32_t>(saved.xid));
  }
  held_by_[it->first] = std::move(holders);
  return true;
}

std::vector<DeviceHealth> VerdictBook::Clear(const std::string& uuid, uint32_t gpu_instance, uint32_t xid,
                                             const std::string& reason, int64_t now_unix_ms) {
  std::vector<DeviceHealth> changed;
  if (xid == 0) return changed;  // 0 stands for holds that are no XID: nothing clears them
  for (auto it = devices_.lower_bound(uuid); it != devices_.end() && it->first.starts_with(uuid); ++it) {
    DeviceHealth& h = it->second;
    if (h.uuid != uuid || h.healthy) continue;
    if (gpu_instance != kWholeGpu && h.gpu_instance != gpu_instance) continue;
    const auto held = held_by_.find(it->first);
    if (held == held_by_.end()) continue;
    auto& holders = held->second;
    const auto at = std::lower_bound(holders.begin(), holders.end(), xid);
    if (at == holders.end() || *at != xid) continue;
    holders.erase(at);
    if (!holders.empty()) continue;  // another fault still holds it
    held_by_.erase(held);
    h.healthy = true;
    h.reason = reason;
    h.xid = 0;
    h.recommended_action.clear();
    h.since_unix_ms = now_unix_ms;
    changed.push_back(h);
  }
  return changed;
}

const std::vector<uint32_t>& VerdictBook::HeldBy(std::string_view retain_key) const {
  static const std::vector<uint32_t> kNone;
  const auto it = held_by_.find(retain_key);
  return it == held_by_.end() ? kNone : it->second;
}

const DeviceHealth* VerdictBook::Find(std::string_view uuid, uint32_t gpu_instance) const {
  const auto it = devices_.find(DeviceHealth::KeyOf(uuid, gpu_instance));
  return it == devices_.end() ? nullptr : &it->second;
}

bool VerdictBook::IsUnhealthy(std::string_view uuid, uint32_t gpu_instance) const {
  const DeviceHealth* h = Find(uuid, gpu_instance);
  return h != nullptr && !h->healthy;
}

std::vector<DeviceHealth> VerdictBook::All() const {
  std::vector<DeviceHealth> out;
  out.reserve(devices_.size());
  for (const auto& [key, h] : devices_) out.push_back(h);
  return out;
}

std::vector<std::string> VerdictBook::UnhealthyUuids() const {
  std::vector<std::string> out;
  for (const auto& [key, h] : devices_) {
    if (!h.healthy && std::find(out.begin(), out.end(), h.uuid) == out.end()) out.push_back(h.uuid);
  }
  return out;
}

std::size_t VerdictBook::UnhealthyCount() const {
  std::size_t n = 0;
  for (const auto& [key, h] : devices_) n += h.healthy ? 0 : 1;
  return n;
}

}  // namespace gns::gpu_health
