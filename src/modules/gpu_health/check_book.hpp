// The conditions of the polled checks that hold on each GPU (and on the node), with their
// recovery rules: a non-fatal condition or a warning clears after `clear_after` passes in a row
// that judged it clear (hysteresis: a flapping link does not flap the verdict); a fatal one is
// latched until the GPU is healed (a validated reset, a new boot, set-healthy), as a fatal XID
// is. A check that did not judge (a missing reading) neither holds nor clears its condition.
//
// And the verdict the module publishes: CombinedVerdict lays the conditions over the GPU's XID
// verdict (VerdictBook, unchanged): Unhealthy if either says so, the recommended action the
// highest ranked (ActionRank) of what holds, the reason the worst's.
//
// Pure state, no I/O, no clock. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"
#include "modules/gpu_health/messages.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

// The key of the node's own conditions (GpuMissingFromNvml): not a GPU.
inline constexpr std::string_view kNodeKey = "node";

struct HeldCondition {
  Condition condition;
  std::string pci;           // the GPU's PCI address when known
  int64_t since_unix_ms = 0;
  uint32_t clean_passes = 0;  // passes in a row that judged it clear (non-fatal, warning)
};

class CheckBook {
 public:
  // A condition that appeared, or one that cleared (and why).
  struct Change {
    std::string uuid;  // or kNodeKey
    std::string pci;
    Condition condition;
    bool appeared = false;
    std::string why;  // cleared: "cleared after 3 clean passes", "GPU reset occurred", …
  };

  explicit CheckBook(uint32_t clear_after = 3) : clear_after_(clear_after == 0 ? 1 : clear_after) {}

  // One pass's findings for `uuid` (or kNodeKey); returns what appeared or cleared.
  std::vector<Change> Apply(const std::string& uuid, const std::string& pci, const Findings& findings,
                            int64_t now_unix_ms);
  // Every condition of the GPU is gone, fatal ones included (a validated reset, set-healthy);
  // a fault still there is found again by the next pass.
  std::vector<Change> Heal(const std::string& uuid, std::string_view why);
  // Every condition of every GPU and of the node (a new boot).
  std::vector<Change> HealAll(std::string_view why);
  // A fatal condition restored from the checkpoint of this boot; false when this run already
  // holds that check on that GPU (its condition is newer) or it is not fatal.
  bool Restore(const std::string& uuid, HeldCondition held);

  // The conditions that hold on `uuid`, by check name (nullptr: none).
  [[nodiscard]] const std::map<std::string, HeldCondition, std::less<>>* Of(std::string_view uuid) const;
  // Fatal conditions, for the checkpoint: (uuid, condition).
  [[nodiscard]] std::vector<std::pair<std::string, HeldCondition>> Fatal() const;
  [[nodiscard]] const std::map<std::string, std::map<std::string, HeldCondition, std::less<>>, std::less<>>& All() const {
    return held_;
  }
  // Conditions that hold, by severity (for the gauges).
  [[nodiscard]] std::size_t Count(Severity severity) const;

 private:
  uint32_t clear_after_;
  std::map<std::string, std::map<std::string, HeldCondition, std::less<>>, std::less<>> held_;  // uuid → check → held
};

// The verdict of the whole GPU `uuid`: its XID verdict (`xid`, may be null) with the
// Unhealthy-making conditions (`held`, may be null; warnings do not count) laid over it.
// Unhealthy if either is; the action the highest ranked (an XID wins a tie, then a fatal
// condition, then the older); the reason and XID the worst's; since: the earliest of what makes
// it Unhealthy. nullopt when neither says Unhealthy (the caller keeps the XID verdict or says
// why it turned Healthy).
[[nodiscard]] std::optional<DeviceHealth> CombinedVerdict(const std::string& uuid, const DeviceHealth* xid,
                                                          const std::map<std::string, HeldCondition, std::less<>>* held);

// "RowRemapPending: GPU 0 (…): a row remap is pending …": the reason of a verdict a condition made.
[[nodiscard]] std::string ConditionReason(const Condition& condition);

}  // namespace gns::gpu_health
