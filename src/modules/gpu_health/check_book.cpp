// Held conditions and the combined verdict (see check_book.hpp).
#include "modules/gpu_health/check_book.hpp"

#include "modules/gpu_health/verdict_book.hpp"

namespace gns::gpu_health {

std::vector<CheckBook::Change> CheckBook::Apply(const std::string& uuid, const std::string& pci,
                                                const Findings& findings, int64_t now_unix_ms) {
  std::vector<Change> changes;
  for (const Finding& f : findings) {
    auto gpu = held_.find(uuid);
    if (f.holds) {
      if (gpu == held_.end()) gpu = held_.try_emplace(uuid).first;
      auto [it, fresh] = gpu->second.try_emplace(f.check);
      HeldCondition& h = it->second;
      h.clean_passes = 0;
      if (!pci.empty()) h.pci = pci;
      if (fresh) {
        h.condition = *f.holds;
        h.since_unix_ms = now_unix_ms;
        changes.push_back(Change{uuid, h.pci, h.condition, true, {}});
      } else if (h.condition.severity != Severity::kFatal) {
        // The numbers move while it holds; a latched fatal one keeps what made it fatal.
        h.condition.message = f.holds->message;
      }
      continue;
    }
    if (gpu == held_.end()) continue;
    const auto it = gpu->second.find(f.check);
    if (it == gpu->second.end()) continue;
    HeldCondition& h = it->second;
    if (h.condition.severity == Severity::kFatal) continue;  // latched until healed
    if (++h.clean_passes < clear_after_) continue;
    changes.push_back(Change{uuid, h.pci, h.condition, false,
                             "cleared after " + std::to_string(h.clean_passes) + " clean pass(es)"});
    gpu->second.erase(it);
    if (gpu->second.empty()) held_.erase(gpu);
  }
  return changes;
}

std::vector<CheckBook::Change> CheckBook::Heal(const std::string& uuid, std::string_view why) {
  std::vector<Change> changes;
  const auto gpu = held_.find(uuid);
  if (gpu == held_.end()) return changes;
  for (const auto& [check, h] : gpu->second) changes.push_back(Change{uuid, h.pci, h.condition, false, std::string(why)});
  held_.erase(gpu);
  return changes;
}

std::vector<CheckBook::Change> CheckBook::HealAll(std::string_view why) {
  std::vector<Change> changes;
  for (const auto& [uuid, checks] : held_) {
    for (const auto& [check, h] : checks) changes.push_back(Change{uuid, h.pci, h.condition, false, std::string(why)});
  }
  held_.clear();
  return changes;
}

bool CheckBook::Restore(const std::string& uuid, HeldCondition held) {
  if (held.condition.severity != Severity::kFatal || held.condition.check.empty()) return false;
  auto& checks = held_[uuid];
  const std::string check = held.condition.check;
  return checks.try_emplace(check, std::move(held)).second;
}

const std::map<std::string, HeldCondition, std::less<>>* CheckBook::Of(std::string_view uuid) const {
  const auto it = held_.find(uuid);
  return it == held_.end() ? nullptr : &it->second;
}

std::vector<std::pair<std::string, HeldCondition>> CheckBook::Fatal() const {
  std::vector<std::pair<std::string, HeldCondition>> out;
  for (const auto& [uuid, checks] : held_) {
    for (const auto& [check, h] : checks) {
      if (h.condition.severity == Severity::kFatal) out.emplace_back(uuid, h);
    }
  }
  return out;
}

std::size_t CheckBook::Count(Severity severity) const {
  std::size_t n = 0;
  for (const auto& [uuid, checks] : held_) {
    for (const auto& [check, h] : checks) n += h.condition.severity == severity ? 1 : 0;
  }
  return n;
}

std::string ConditionReason(const Condition& condition) { return condition.check + ": " + condition.message; }

std::optional<DeviceHealth> CombinedVerdict(const std::string& uuid, const DeviceHealth* xid,
                                            const std::map<std::string, HeldCondition, std::less<>>* held) {
  const bool xid_unhealthy = xid != nullptr && !xid->healthy;
  const HeldCondition* worst = nullptr;
  int64_t since = xid_unhealthy ? xid->since_unix_ms : 0;
  if (held != nullptr) {
    for (const auto& [check, h] : *held) {
      if (h.condition.severity == Severity::kWarning) continue;
      if (since == 0 || h.since_unix_ms < since) since = h.since_unix_ms;
      if (worst == nullptr) {
        worst = &h;
        continue;
      }
      const int a = ActionRank(h.condition.action);
      const int b = ActionRank(worst->condition.action);
      const bool fatal_first = h.condition.severity == Severity::kFatal && worst->condition.severity != Severity::kFatal;
      const bool same_weight = a == b && h.condition.severity == worst->condition.severity;
      if (a > b || (a == b && fatal_first) || (same_weight && h.since_unix_ms < worst->since_unix_ms)) worst = &h;
    }
  }
  if (!xid_unhealthy && worst == nullptr) return std::nullopt;
  DeviceHealth out;
  if (xid_unhealthy && (worst == nullptr || ActionRank(VerdictBook::ActionOf(*xid)) >= ActionRank(worst->condition.action))) {
    out = *xid;
  } else {
    out.uuid = uuid;
    out.healthy = false;
    out.reason = ConditionReason(worst->condition);
    out.xid = 0;
    out.sxid = 0;
    out.check = worst->condition.check;
    out.recommended_action = std::string(ActionName(worst->condition.action));
    out.pci = xid != nullptr && !xid->pci.empty() ? xid->pci : worst->pci;
  }
  out.since_unix_ms = since;
  return out;
}

}  // namespace gns::gpu_health
