// Host services (see host_services.hpp).
#include "modules/gpu_health/host_services.hpp"

#include <array>
#include <algorithm>

namespace gns::gpu_health {
namespace {

// Unit file states of a unit that is meant to run on this node (systemctl(1), is-enabled).
bool Expected(const imex_health::UnitState& unit) {
  static constexpr std::array<std::string_view, 7> kExpected = {
      "enabled", "enabled-runtime", "static", "linked", "linked-runtime", "generated", "alias"};
  return std::find(kExpected.begin(), kExpected.end(), unit.unit_file_state) != kExpected.end();
}

std::string Describe(const HostService& service, const imex_health::UnitState& unit) {
  std::string what = service.unit + " is " + unit.active_state;
  if (!unit.sub_state.empty() && unit.sub_state != unit.active_state) what += " (" + unit.sub_state + ")";
  std::string details;
  auto add = [&](const std::string& part) { details += (details.empty() ? "" : ", ") + part; };
  if (!unit.result.empty() && unit.result != "success") add("result " + unit.result);
  if (unit.exec_main_code != 0) add("exit status " + std::to_string(unit.exec_main_status));
  if (unit.n_restarts != 0) add(std::to_string(unit.n_restarts) + " automatic restart(s)");
  if (!details.empty()) what += ": " + details;
  return what + "; " + service.consequence;
}

}  // namespace

std::vector<HostService> HostServices(const HostServicesSettings& settings) {
  std::vector<HostService> out;
  if (settings.persistenced) {
    out.push_back({"PersistencedNotRunning", settings.persistenced_unit, Severity::kWarning, RecommendedAction::kNone,
                   "the driver tears each GPU's state down when its last client leaves (persistence mode "
                   "is kept only while the daemon runs)"});
  }
  if (settings.fabric_manager) {
    out.push_back({"FabricManagerNotRunning", settings.fabric_manager_unit, Severity::kNonFatal,
                   RecommendedAction::kRestartBm,
                   "on an NVSwitch system CUDA work cannot start until the fabric manager runs again"});
  }
  return out;
}

std::optional<Finding> JudgeHostService(const HostService& service, const imex_health::UnitState& unit) {
  if (!unit.known) return std::nullopt;
  Finding finding{service.check, std::nullopt};
  if (unit.load_state != "loaded" || !Expected(unit)) return finding;  // not meant to run here
  const bool restarting = unit.sub_state == "auto-restart";
  const bool stopped = unit.active_state == "failed" || unit.active_state == "inactive";
  if (!restarting && !stopped) {
    if (unit.active_state == "active" || unit.active_state == "reloading") return finding;
    return std::nullopt;  // activating, deactivating: wait for where it lands
  }
  finding.holds = Condition{service.check, Component::kHost, service.severity, service.action,
                            Describe(service, unit), ""};
  return finding;
}

}  // namespace gns::gpu_health
