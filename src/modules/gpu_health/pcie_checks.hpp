// The PCIe checks of one GPU (HealthGroup kHealthPcie). Anchors: DCGM's PCIe health watch
// (DCGM_HEALTH_WATCH_PCIE: the replay rate) and the link-width check of DCGM's diagnostics.
//
// | check             | holds when                                                      | severity  | action     |
// |-------------------|-----------------------------------------------------------------|-----------|------------|
// | PcieLinkDegraded  | current width below the widest this link had (or its maximum)   | non-fatal | RESTART_BM |
// | PcieReplayRate    | the replay counter grew ≥ rate over a window (DCGM: 8/min)      | warning   | NONE       |
//
// The generation is not judged: GPUs lower their link generation at idle to save power (it
// comes back under load), so a lower generation is no fault; a narrower link is. Our choice of
// action: a link that trained narrower is retrained by a reboot (a GPU reset does not always
// retrain the upstream port); if it persists the slot or riser needs inspection.
// Pure; keeps per GPU the widest width seen and a replay window. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

#include <map>
#include <string>

namespace gns::gpu_health {

class PcieChecks {
 public:
  struct Settings {
    bool link_degraded = true;
    RateSetting replay_rate{true, 8.0, std::chrono::minutes(10)};
  };

  explicit PcieChecks(Settings settings) : settings_(settings) {}

  Findings Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms);
  void Forget(const std::string& uuid) { gpus_.erase(uuid); }

 private:
  struct State {
    uint32_t widest = 0;
    CounterWindow replays;
  };
  Settings settings_;
  std::map<std::string, State, std::less<>> gpus_;
};

}  // namespace gns::gpu_health
