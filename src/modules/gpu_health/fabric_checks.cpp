// Fabric checks (see fabric_checks.hpp).
#include "modules/gpu_health/fabric_checks.hpp"

#include "modules/gpu_inventory/api/nvml_abi.hpp"

#include <cstdio>

namespace gns::gpu_health {
namespace {

uint32_t Field(uint32_t mask, uint32_t shift, uint32_t width) { return (mask >> shift) & width; }

std::string Hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", value);
  return text;
}

}  // namespace

Findings FabricChecks::Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms) {
  Findings out;
  const auto& fabric = gpu.fabric;
  if (!fabric || fabric->state == nvml::kGpuFabricStateNotSupported) return out;
  const std::string who = GpuName(gpu);
  const bool completed = fabric->state == nvml::kGpuFabricStateCompleted;
  if (completed) {
    unfinished_since_.erase(gpu.uuid);
  } else {
    unfinished_since_.try_emplace(gpu.uuid, at_ms);
  }
  if (settings_.not_registered) {
    Finding f{"FabricNotRegistered", std::nullopt};
    std::string what;
    if (completed && fabric->status != 0) {
      what = "fabric registration failed (NVML status " + std::to_string(fabric->status) + ")";
    } else if (!completed && at_ms - unfinished_since_[gpu.uuid] >= settings_.registration_grace.count()) {
      what = std::string("fabric registration ") +
             (fabric->state == nvml::kGpuFabricStateInProgress ? "still in progress" : "not started") + " after " +
             std::to_string((at_ms - unfinished_since_[gpu.uuid]) / 1000) + " s";
    } else if (!completed) {
      return out;  // within the grace: no judgement yet
    }
    if (!what.empty()) {
      f.holds = Condition{"FabricNotRegistered", Component::kFabric, Severity::kNonFatal,
                          RecommendedAction::kComponentReset, who + ": " + what, ""};
    }
    out.push_back(std::move(f));
  }
  // The health mask means something only once registered.
  if (!completed || fabric->status != 0) return out;
  const uint32_t mask = fabric->health_mask;
  if (settings_.degraded) {
    std::string what;
    auto note = [&what](std::string_view text) { what += (what.empty() ? "" : ", ") + std::string(text); };
    if (Field(mask, fabric_mask::kDegradedBwShift, 0x3) == fabric_mask::kTrue) note("degraded bandwidth");
    if (Field(mask, fabric_mask::kRouteUnhealthyShift, 0x3) == fabric_mask::kTrue) note("unhealthy route");
    if (Field(mask, fabric_mask::kIncorrectConfigurationShift, 0xf) >= 2) {
      note("incorrect configuration (" + std::to_string(Field(mask, fabric_mask::kIncorrectConfigurationShift, 0xf)) + ")");
    }
    Finding f{"FabricDegraded", std::nullopt};
    if (!what.empty()) {
      f.holds = Condition{"FabricDegraded", Component::kFabric, Severity::kNonFatal, RecommendedAction::kRestartBm,
                          who + ": fabric " + what + " (health mask " + Hex(mask) + ")", ""};
    }
    out.push_back(std::move(f));
  }
  if (settings_.recovery) {
    std::string what;
    if (Field(mask, fabric_mask::kRouteRecoveryShift, 0x3) == fabric_mask::kTrue) what = "route recovery";
    if (Field(mask, fabric_mask::kAccessTimeoutRecoveryShift, 0x3) == fabric_mask::kTrue) {
      what += (what.empty() ? "" : ", ") + std::string("access-timeout recovery");
    }
    Finding f{"FabricRecovery", std::nullopt};
    if (!what.empty()) {
      f.holds = Condition{"FabricRecovery", Component::kFabric, Severity::kWarning, RecommendedAction::kNone,
                          who + ": fabric " + what + " under way (health mask " + Hex(mask) + ")", ""};
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace gns::gpu_health
