#pragma once
// The status of a GPUReset object (janitor.dgxc.nvidia.com/v1alpha1) as the record says it is:
// phase, the Complete condition, each GPU's steps and outcome, start and completion times. Pure:
// the module sends it (one write in flight per object, the latest wins).

#include "modules/gpu_reset/reset_book.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace gns::gpu_reset {

// `running`: the GPU of this job being reset now, if any (named in the condition's message).
nlohmann::json ObjectStatus(const ResetJob& job, const GpuReset* running);

// "2026-01-01T00:00:00Z" (seconds, UTC).
std::string Rfc3339(int64_t unix_ms);

}  // namespace gns::gpu_reset
