// The fabric checks of one GPU (HealthGroup kHealthFabric: nvmlDeviceGetGpuFabricInfoV, GB200
// and NVSwitch systems). Anchors: gpud's fabric-manager component, DCGM's NVSwitch watch as
// NVSentinel's gpu-health-monitor reports it.
//
// | check                | holds when                                                        | severity  | action          |
// |----------------------|-------------------------------------------------------------------|-----------|-----------------|
// | FabricNotRegistered  | registration completed with an error, or not completed after a grace | non-fatal | COMPONENT_RESET |
// | FabricDegraded       | health mask: degraded bandwidth, unhealthy route, incorrect configuration | non-fatal | RESTART_BM |
// | FabricRecovery       | health mask: route recovery or access-timeout recovery under way  | warning   | NONE            |
//
// A GPU that does not take part in a fabric (state NOT_SUPPORTED) has nothing to judge. Our
// choices where the anchors are silent: a failed registration is retried when the GPU is reset
// (the driver registers at GPU init), so COMPONENT_RESET; a degraded fabric is the NVSwitch
// tray's or the fabric manager's, which a node reboot re-trains, so RESTART_BM; a recovery the
// fabric is doing by itself is reported, not acted on.
// Pure; keeps per GPU when an unfinished registration was first seen. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

#include <map>
#include <string>

namespace gns::gpu_health {

// NVML_GPU_FABRIC_HEALTH_MASK_* (nvml.h): 2-bit fields (4 bits for the configuration), 1 = TRUE.
namespace fabric_mask {
inline constexpr uint32_t kDegradedBwShift = 0;
inline constexpr uint32_t kRouteRecoveryShift = 2;
inline constexpr uint32_t kRouteUnhealthyShift = 4;
inline constexpr uint32_t kAccessTimeoutRecoveryShift = 6;
inline constexpr uint32_t kIncorrectConfigurationShift = 8;  // 4 bits: 0 not supported, 1 none, ≥ 2 a problem
inline constexpr uint32_t kTrue = 1;
}  // namespace fabric_mask

class FabricChecks {
 public:
  struct Settings {
    bool not_registered = true;
    // How long a registration may stay NOT_STARTED / IN_PROGRESS (the fabric manager starts
    // after the driver at boot) before it counts as not registered.
    std::chrono::milliseconds registration_grace{std::chrono::minutes(5)};
    bool degraded = true;
    bool recovery = true;
  };

  explicit FabricChecks(Settings settings) : settings_(settings) {}

  Findings Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms);
  void Forget(const std::string& uuid) { unfinished_since_.erase(uuid); }

 private:
  Settings settings_;
  std::map<std::string, int64_t, std::less<>> unfinished_since_;  // at_ms of the first unfinished reading
};

}  // namespace gns::gpu_health
