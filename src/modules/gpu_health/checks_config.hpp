// The `checks:` section of gpu-health's config: each polled check's key (enabled, thresholds)
// and each group's interval, read with errors that name the key (ConfigMap). Documented in
// config/example.yaml and the README's table.
#pragma once

#include "loop/config.hpp"
#include "modules/gpu_health/health_checks.hpp"

namespace gns::gpu_health {

// Reads `checks` of the gpu-health section (missing: every default). Throws ConfigError.
ChecksConfig ParseChecksConfig(ConfigMap& section);

}  // namespace gns::gpu_health
