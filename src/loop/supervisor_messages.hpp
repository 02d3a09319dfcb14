#pragma once
// Bus messages the runtime itself publishes.

#include "loop/module.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace gns {

// kWaiting: not started (or stopped) because a module it uses (kUses) is not running.
enum class ModuleState { kStarting, kRunning, kStopping, kBackoff, kWaiting, kStopped };
std::string_view ToString(ModuleState state);

struct ModuleStatus {
  std::string name;
  ModuleState state = ModuleState::kStopped;
  ModuleHealth health = ModuleHealth::kOk;
  std::string detail;    // why it is not running / not ok
  int restarts = 0;
  bool Ready() const { return state == ModuleState::kRunning && health != ModuleHealth::kUnhealthy; }
};

// The state of every enabled module, republished on each change (retained).
struct ModuleStates {
  static constexpr std::string_view kTopic = "supervisor.module-states";
  static constexpr bool kRetained = true;
  std::vector<ModuleStatus> modules;

  std::vector<const ModuleStatus*> NotReady() const;
};

void to_json(nlohmann::json& j, const ModuleStatus& s);
void to_json(nlohmann::json& j, const ModuleStates& s);

}  // namespace gns
