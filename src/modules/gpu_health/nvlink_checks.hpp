// The NVLink checks of one GPU (HealthGroup kHealthNvLink). Anchors: gpud's nvlink component,
// DCGM's NVLink health watch (DCGM_HEALTH_WATCH_NVLINK).
//
// | check            | holds when                                                  | severity  | action          |
// |------------------|-------------------------------------------------------------|-----------|-----------------|
// | NvLinkDown       | a link the GPU has (and had up) is not active               | non-fatal | COMPONENT_RESET |
// | NvLinkErrorRate  | replay + recovery + CRC counters grew ≥ rate over a window  | warning   | NONE            |
//
// NvLinkDown judges only links this process has seen active on the GPU, or any inactive link
// while another link of the GPU is active: a GPU whose links are all inactive since it was first
// read (a PCIe-only system, an NVLink bridge not fitted) has no NVLink to lose. DCGM calls a
// downed link a failure; a GPU reset retrains the links (NVSentinel: COMPONENT_RESET).
// Pure; keeps per GPU the links seen active and a counter window. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

#include <map>
#include <set>
#include <string>

namespace gns::gpu_health {

class NvLinkChecks {
 public:
  struct Settings {
    bool nvlink_down = true;
    // DCGM reports NVLink error counters over its threshold as a warning.
    RateSetting error_rate{true, 10.0, std::chrono::minutes(10)};
  };

  explicit NvLinkChecks(Settings settings) : settings_(settings) {}

  Findings Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms);
  void Forget(const std::string& uuid) { gpus_.erase(uuid); }

 private:
  struct State {
    std::set<uint32_t> seen_active;
    CounterWindow errors;  // the sum of every link's replay, recovery and CRC counters
  };
  Settings settings_;
  std::map<std::string, State, std::less<>> gpus_;
};

}  // namespace gns::gpu_health
