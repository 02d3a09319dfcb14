// Host services the GPUs depend on, as systemd reports them over D-Bus (the module follows
// each unit with the preflight library's unit watcher: no polling, an idle unit costs no
// wake-ups). Conditions of the node, not of a GPU: reported as HealthEvents without a GPU
// entity, in /debug/state and the metrics; no GPU's verdict changes for them (the faults they
// cause show on the GPUs themselves: FabricNotRegistered, PersistenceModeOff). Anchors: gpud's
// fabric-manager and persistence-mode components, DCGM's host engine checks.
//
// | check                    | holds when                                                   | severity  | action     |
// |--------------------------|--------------------------------------------------------------|-----------|------------|
// | PersistencedNotRunning   | nvidia-persistenced.service is expected and not running       | warning   | NONE       |
// | FabricManagerNotRunning  | nvidia-fabricmanager.service is expected and not running      | non-fatal | RESTART_BM |
//
// "Expected": the unit exists and is enabled (unit file state enabled, enabled-runtime,
// static, linked, generated…). A unit that does not exist (LoadState not-found), is masked or
// is disabled is not expected on this node: judged clear. "Not running": ActiveState failed or
// inactive, or caught in systemd's restart loop (SubState auto-restart). A unit in another
// transition (activating, deactivating) and a unit whose state is not known (the bus is down,
// systemd did not answer) are not judged: what holds stays, nothing clears.
//
// Without nvidia-fabricmanager an NVSwitch system (HGX/DGX A100, H100, H200) cannot start CUDA
// work ("system not yet initialized"); a reboot starts it again in order with the driver, so
// RESTART_BM. Without nvidia-persistenced the driver tears a GPU's state down when its last
// client leaves: slower jobs, nothing broken, so a warning.
// Pure. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"
#include "preflight/unit_state.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

struct HostServicesSettings {
  bool persistenced = true;
  std::string persistenced_unit = "nvidia-persistenced.service";
  bool fabric_manager = true;
  std::string fabric_manager_unit = "nvidia-fabricmanager.service";
  std::string bus_address;  // "": $DBUS_SYSTEM_BUS_ADDRESS, else the system bus's well-known socket
};

// One followed unit and what its absence means.
struct HostService {
  std::string check;  // PersistencedNotRunning, FabricManagerNotRunning
  std::string unit;
  Severity severity = Severity::kWarning;
  RecommendedAction action = RecommendedAction::kNone;
  std::string consequence;  // appended to the message: what the node cannot do without it
};

// The units the settings switch on.
[[nodiscard]] std::vector<HostService> HostServices(const HostServicesSettings& settings);

// The service's finding from what systemd says of its unit; nullopt: not judged.
[[nodiscard]] std::optional<Finding> JudgeHostService(const HostService& service, const imex_health::UnitState& unit);

}  // namespace gns::gpu_health
