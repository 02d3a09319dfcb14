#pragma once
// Bus messages of the `gpu-reset` module: where the node's maintenance stands (retained, shown
// in /debug/state), so an operator sees the running reset, the queue and the last outcomes.
// Only what crosses the module's wall: the jobs travel as the JSON the record holds, so no
// reader depends on the module's own record types (reset_book.hpp).

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace gns::gpu_reset {

struct GpuResetState {
  static constexpr std::string_view kTopic = "gpu-reset.state";
  static constexpr bool kRetained = true;
  std::string running;               // the job id running now, "" when idle
  std::string running_gpu;           // its GPU
  std::string running_step;          // its step
  // Queued, running and recently finished jobs, oldest first, as in gpu-reset.json ("id",
  // "source", "phase", "reason", "message", "gpus": [...]).
  nlohmann::json jobs = nlohmann::json::array();
};

inline void to_json(nlohmann::json& j, const GpuResetState& s) {
  j = nlohmann::json{{"running", s.running}, {"runningGpu", s.running_gpu}, {"runningStep", s.running_step},
                     {"jobs", s.jobs}};
}

}  // namespace gns::gpu_reset
