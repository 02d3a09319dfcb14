// A GPUReset object's status from the record (see object_status.hpp).
#include "modules/gpu_reset/object_status.hpp"

#include <fmt/format.h>

#include <ctime>

namespace gns::gpu_reset {

std::string Rfc3339(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

nlohmann::json ObjectStatus(const ResetJob& job, const GpuReset* running) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& gpu : job.gpus) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : gpu.steps) {
      nlohmann::json step{{"name", s.name}, {"result", s.result}, {"durationMs", s.duration_ms}};
      if (!s.message.empty()) step["message"] = s.message;
      steps.push_back(std::move(step));
    }
    nlohmann::json g{{"uuid", gpu.uuid}, {"step", StepName(gpu.step)}, {"steps", steps}};
    if (!gpu.outcome.empty()) g["outcome"] = gpu.outcome;
    if (!gpu.command_output.empty()) g["commandOutput"] = gpu.command_output.substr(0, 2048);
    gpus.push_back(std::move(g));
  }
  std::string condition_status = "Unknown";
  std::string reason = job.phase == "Pending" ? "Queued" : "InProgress";
  std::string message = job.phase == "Pending" ? "waiting for the node's maintenance slot" : "resetting";
  if (job.Finished()) {
    condition_status = job.phase == "Succeeded" ? "True" : "False";
    reason = job.reason;
    message = job.message;
  } else if (running != nullptr) {
    message = "resetting " + running->uuid + ": step " + std::string(StepName(running->step));
  }
  nlohmann::json condition{{"type", "Complete"},
                           {"status", condition_status},
                           {"reason", reason},
                           {"message", message},
                           {"lastTransitionTime", Rfc3339(job.Finished() ? job.completed_unix_ms
                                                                        : (job.started_unix_ms ? job.started_unix_ms : job.created_unix_ms))}};
  if (job.generation != 0) condition["observedGeneration"] = job.generation;
  nlohmann::json status{{"phase", job.phase}, {"conditions", nlohmann::json::array({condition})}, {"gpus", gpus}};
  if (job.started_unix_ms != 0) status["startTime"] = Rfc3339(job.started_unix_ms);
  if (job.completed_unix_ms != 0) status["completionTime"] = Rfc3339(job.completed_unix_ms);
  return status;
}

}  // namespace gns::gpu_reset
