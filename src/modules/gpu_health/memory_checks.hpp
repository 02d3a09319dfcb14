// The memory checks of one GPU (HealthGroup kHealthMemory): row remapping (Ampere and later),
// retired pages (before Ampere) and ECC counters. Anchors: gpud's remapped-rows and ecc
// components, DCGM's memory health watch (DCGM_HEALTH_WATCH_MEM) as NVSentinel's
// gpu-health-monitor reports it.
//
// | check                     | holds when                                   | severity  | action          |
// |---------------------------|----------------------------------------------|-----------|-----------------|
// | RowRemapFailed            | a remap found no spare row                   | fatal     | CONTACT_SUPPORT |
// | RowRemapPending           | a remap waits for a GPU reset                | fatal     | COMPONENT_RESET |
// | RowRemapSparesExhausted   | a bank has no spare row left (histogram)     | warning   | NONE            |
// | RetiredPagesPending       | a page retirement waits for a reset          | fatal     | COMPONENT_RESET |
// | RetiredPagesLimit         | retired pages (lifetime) ≥ limit (64)        | fatal     | CONTACT_SUPPORT |
// | EccUncorrectableVolatile  | the volatile DBE counter grew                | fatal     | COMPONENT_RESET |
// | EccCorrectableRate        | volatile SBE growth over a window            | warning   | NONE            |
//
// Pure; keeps per GPU only the SBE counter window. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

#include <map>
#include <string>

namespace gns::gpu_health {

class MemoryChecks {
 public:
  struct Settings {
    bool row_remap_failed = true;
    bool row_remap_pending = true;
    bool row_remap_spares_exhausted = true;
    bool retired_pages_pending = true;
    bool retired_pages_limit = true;
    uint32_t retired_pages_max = 64;  // DCGM's limit: 64 retired pages (SBE + DBE) over the GPU's life
    bool ecc_uncorrectable_volatile = true;
    RateSetting ecc_correctable_rate{true, 1.0, std::chrono::hours(1)};
  };

  explicit MemoryChecks(Settings settings) : settings_(settings) {}

  // One pass's memory readings of `gpu`, taken at `at_ms`.
  Findings Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms);
  // The GPU was reset or the node rebooted: its counters start again.
  void Forget(const std::string& uuid) { gpus_.erase(uuid); }

 private:
  struct State {
    std::optional<uint64_t> uncorrected_volatile;  // the last reading
    CounterWindow corrected;
  };
  Settings settings_;
  std::map<std::string, State, std::less<>> gpus_;
};

}  // namespace gns::gpu_health
