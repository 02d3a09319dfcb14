#pragma once
// Bus messages of the `gpu-health` module that other modules consume. Per-device health is
// retained state keyed by GPU UUID: the device plugin advertises exactly this.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::gpu_health {

struct DeviceHealth {
  static constexpr std::string_view kTopic = "gpu-health.device";
  static constexpr bool kRetained = true;
  std::string uuid;
  bool healthy = true;
  std::string reason;  // why unhealthy, or what made it healthy again
  uint64_t xid = 0;    // the XID that made it unhealthy (0 if none)
  std::string recommended_action;  // NVSentinel vocabulary, e.g. COMPONENT_RESET
  int64_t since_unix_ms = 0;
  std::string RetainKey() const { return uuid; }
};

inline void to_json(nlohmann::json& j, const DeviceHealth& h) {
  j = nlohmann::json{{"healthy", h.healthy}, {"since_unix_ms", h.since_unix_ms}};
  if (!h.reason.empty()) j["reason"] = h.reason;
  if (h.xid != 0) j["xid"] = h.xid;
  if (!h.recommended_action.empty()) j["recommendedAction"] = h.recommended_action;
}

}  // namespace gns::gpu_health
