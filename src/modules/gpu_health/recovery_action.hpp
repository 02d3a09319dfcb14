// XID 154: "NVRM: Xid (PCI:…): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain
// and Reset)". The driver names what the GPU needs now, often after a cause that is itself
// not fatal (Xid 63, 31), so the line decides, not the catalog's entry for 154. The codes are
// the driver's (NVML's nvmlDeviceGpuRecoveryAction_t, read by nvidia-smi as "GPU Recovery
// Action"); the driver's wording has changed between releases ("Node Reboot Required" and
// "OS Reboot" for 0x2, "GPU Reset Required" and "PF FLR" for 0x1), so the code decides and
// the name is only the fallback when no code could be read.
//
// Pure, no allocation beyond the returned name; used by the gpu-health module's XID judge.
#pragma once

#include "modules/gpu_health/xid_catalog.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gns::gpu_health {

inline constexpr uint32_t kRecoveryActionXid = 154;

// The driver's recovery action codes.
enum class DriverRecoveryAction : uint32_t {
  kNone = 0x0,
  kGpuReset = 0x1,       // "GPU Reset Required"
  kNodeReboot = 0x2,     // "Node Reboot Required"
  kDrainP2p = 0x3,       // "Drain P2P"
  kDrainAndReset = 0x4,  // "Drain and Reset"
};

struct RecoveryActionChange {
  std::optional<uint32_t> code;  // the new action's code, when the line printed one
  std::string name;              // the driver's name for it, as printed (sanitised, ≤ 64 bytes)
  // What it means for the device: kNone leaves it as it is; anything else makes it Unhealthy.
  RecommendedAction action = RecommendedAction::kNone;
  bool known = true;  // false: a code and name this build does not know (acted on as fatal)
};

// The driver's name for a code ("Drain and Reset"), empty for codes this build does not know.
[[nodiscard]] std::string_view DriverRecoveryActionName(uint32_t code) noexcept;

// Reads the new action from the detail of an Xid 154 line ("GPU recovery action changed from
// 0x0 (None) to 0x4 (Drain and Reset)"): the part after the last " to ". Returns nullopt when
// the detail does not say what it changed to.
//  0x0 None → kNone; 0x1 GPU Reset Required, 0x3 Drain P2P, 0x4 Drain and Reset → COMPONENT_RESET
//  (the GPU, not the node, must be drained and reset); 0x2 Node Reboot Required → RESTART_BM;
//  any other code → CONTACT_SUPPORT, known = false.
[[nodiscard]] std::optional<RecoveryActionChange> ParseRecoveryActionChange(std::string_view detail);

}  // namespace gns::gpu_health
