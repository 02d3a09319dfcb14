#pragma once
// Bus messages of the `gpu-reset` module: where the node's maintenance stands (retained, shown
// in /debug/state), so an operator sees the running reset, the queue and the last outcomes.

#include "modules/gpu_reset/reset_book.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_reset {

struct GpuResetState {
  static constexpr std::string_view kTopic = "gpu-reset.state";
  static constexpr bool kRetained = true;
  std::string running;               // the job id running now, "" when idle
  std::string running_gpu;           // its GPU
  std::string running_step;          // its step
  std::list<ResetJob> jobs;          // queued, running and recently finished
};

inline void to_json(nlohmann::json& j, const GpuResetState& s) {
  j = nlohmann::json{{"running", s.running}, {"runningGpu", s.running_gpu}, {"runningStep", s.running_step},
                     {"jobs", s.jobs}};
}

}  // namespace gns::gpu_reset
