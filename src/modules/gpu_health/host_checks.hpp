// Host checks of one GPU (HealthGroup kHealthHost). Anchor: gpud's persistence-mode component.
//
// | check               | holds when                                        | severity | action |
// |---------------------|---------------------------------------------------|----------|--------|
// | PersistenceModeOff  | persistence mode off on a node that expects it on | warning  | NONE   |
//
// Without persistence mode (or nvidia-persistenced) the driver tears the GPU's state down when
// its last client leaves, so every job pays the initialisation again and ECC/remap state may be
// read from a cold GPU; nothing is broken, so it is a warning.
// Pure. Loop thread only.
#pragma once

#include "modules/gpu_health/health_check.hpp"

namespace gns::gpu_health {

struct HostSettings {
  bool persistence_mode_off = true;  // the node expects persistence mode on
};

Findings JudgeHost(const gpu_inventory::GpuHealthReading& gpu, const HostSettings& settings);

}  // namespace gns::gpu_health
