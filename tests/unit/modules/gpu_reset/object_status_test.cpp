// A GPUReset object's status from the record (object_status.hpp): what `kubectl get gpureset -o
// yaml` shows while a job waits, runs and ends.
#include "modules/gpu_reset/object_status.hpp"

#include <gtest/gtest.h>

namespace gns::gpu_reset {
namespace {

constexpr int64_t kCreated = 1767225600000;  // 2026-01-01T00:00:00Z

ResetJob Job() {
  ResetJob job;
  job.id = "GPUReset/r1/u-1";
  job.source = "GPUReset";
  job.object_name = "r1";
  job.generation = 3;
  job.created_unix_ms = kCreated;
  job.gpus.push_back(NewGpuReset("GPU-0"));
  return job;
}

TEST(GpuResetObjectStatus, AQueuedJobWaitsForTheSlot) {
  const auto status = ObjectStatus(Job(), nullptr);
  EXPECT_EQ(status["phase"], "Pending");
  const auto& c = status["conditions"][0];
  EXPECT_EQ(c["type"], "Complete");
  EXPECT_EQ(c["status"], "Unknown");
  EXPECT_EQ(c["reason"], "Queued");
  EXPECT_EQ(c["message"], "waiting for the node's maintenance slot");
  EXPECT_EQ(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
  EXPECT_EQ(c["observedGeneration"], 3);
  EXPECT_FALSE(status.contains("startTime"));
  EXPECT_EQ(status["gpus"][0]["step"], "queued");
}

TEST(GpuResetObjectStatus, ARunningJobNamesTheGpuAndStep) {
  ResetJob job = Job();
  job.phase = "InProgress";
  job.started_unix_ms = kCreated + 61000;
  job.gpus[0].step = Step::kReset;
  job.gpus[0].steps.push_back({"hold", "ok", kCreated, 12, "Unhealthy at the kubelet"});
  job.gpus[0].steps.push_back({"reset", "running", kCreated, 0, ""});
  const auto status = ObjectStatus(job, &job.gpus[0]);
  const auto& c = status["conditions"][0];
  EXPECT_EQ(c["reason"], "InProgress");
  EXPECT_EQ(c["message"], "resetting GPU-0: step reset");
  EXPECT_EQ(c["lastTransitionTime"], "2026-01-01T00:01:01Z");
  EXPECT_EQ(status["startTime"], "2026-01-01T00:01:01Z");
  const auto& steps = status["gpus"][0]["steps"];
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0], (nlohmann::json{{"name", "hold"}, {"result", "ok"}, {"durationMs", 12}, {"message", "Unhealthy at the kubelet"}}));
  EXPECT_FALSE(steps[1].contains("message"));
  EXPECT_EQ(ObjectStatus(job, nullptr)["conditions"][0]["message"], "resetting");
}

TEST(GpuResetObjectStatus, AFinishedJobSaysHowItEndedAndBoundsTheCommandOutput) {
  ResetJob job = Job();
  job.phase = "Failed";
  job.reason = "ResetCommandFailed";
  job.message = "GPU-0: nvidia-smi: exit 3";
  job.started_unix_ms = kCreated;
  job.completed_unix_ms = kCreated + 3600000;
  job.gpus[0].step = Step::kDone;
  job.gpus[0].outcome = "failed";
  job.gpus[0].command_output = std::string(5000, 'x');
  const auto status = ObjectStatus(job, nullptr);
  const auto& c = status["conditions"][0];
  EXPECT_EQ(c["status"], "False");
  EXPECT_EQ(c["reason"], "ResetCommandFailed");
  EXPECT_EQ(c["message"], "GPU-0: nvidia-smi: exit 3");
  EXPECT_EQ(c["lastTransitionTime"], "2026-01-01T01:00:00Z");
  EXPECT_EQ(status["completionTime"], "2026-01-01T01:00:00Z");
  EXPECT_EQ(status["gpus"][0]["outcome"], "failed");
  EXPECT_EQ(status["gpus"][0]["commandOutput"].get<std::string>().size(), 2048u);
  job.phase = "Succeeded";
  EXPECT_EQ(ObjectStatus(job, nullptr)["conditions"][0]["status"], "True");
}

}  // namespace
}  // namespace gns::gpu_reset
