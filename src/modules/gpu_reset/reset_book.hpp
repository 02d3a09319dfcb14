#pragma once
// The gpu-reset module's durable record (<stateDir>/gpu-reset.json, written atomically before
// each step starts and when a job ends): the jobs queued and running, where each GPU's reset
// stands, what persistence mode was before we turned it off, and the finished jobs (bounded) so
// a GPUReset object is acted on once and its final status is written even after a restart.
// Plain data and JSON; no I/O here but Load/Save.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_reset {

// The steps of one GPU's reset, in order (issue #12 / seed 003 Part 1).
enum class Step {
  kQueued,       // waiting for the node's maintenance slot
  kHold,         // 1. Unhealthy at the kubelet (the "GPU reset started" line, then the verdict)
  kHolders,      // 2. no pod or process holds the GPU (wait, evict or fail)
  // 3. persistence mode off (remembered). Before the release: any NVML call on the GPU attaches
  // it again (nvmlInit_v2 attaches GPUs lazily, at the handle lookup), so nothing may touch it
  // through NVML between the release and the reset.
  kPersistence,
  kRelease,      // 4. our NVML handles on that GPU let go
  kReset,        // 5. the reset command
  kValidate,     // 6. NVML back; same UUID, nothing pending, no new XID, fabric complete
  kRestore,      // 7. persistence mode back; "GPU reset occurred" in the journal
  kDone,         // 8. outcome known
};

std::string_view StepName(Step step);
std::optional<Step> ParseStep(std::string_view name);

struct StepLog {
  std::string name;
  std::string result;  // "running", "ok", "failed"
  int64_t started_unix_ms = 0;
  int64_t duration_ms = 0;
  std::string message;
};

struct GpuReset {
  std::string uuid;
  Step step = Step::kQueued;
  std::optional<bool> persistence_was_on;  // read at step 4, before we changed it
  bool released = false;                   // we asked gpu-inventory to let go (step 3)
  std::string outcome;                     // "", "succeeded", "failed", "refused"
  std::string reason;                      // condition reason when it did not succeed
  std::string message;
  std::string command_output;              // the reset command's output (bounded)
  std::vector<StepLog> steps;
  int64_t command_ms = 0;                  // the reset command's own time
  int64_t total_ms = 0;                    // from hold to outcome
};

inline GpuReset NewGpuReset(std::string uuid) {
  GpuReset gpu;
  gpu.uuid = std::move(uuid);
  return gpu;
}

struct ResetJob {
  std::string id;      // "GPUReset/<name>/<uid>", "cli/<n>", "auto/<uuid>/<since>"
  std::string source;  // "GPUReset", "cli", "auto"
  std::string object_name;
  std::string object_uid;
  int64_t generation = 0;
  std::vector<GpuReset> gpus;  // reset one after another
  int64_t created_unix_ms = 0;
  int64_t started_unix_ms = 0;
  int64_t completed_unix_ms = 0;
  std::string phase = "Pending";  // Pending, InProgress, Succeeded, Failed
  std::string reason;             // of the Complete condition
  std::string message;
  bool final_status_written = false;  // GPUReset jobs: the terminal status reached the API
  bool Finished() const { return phase == "Succeeded" || phase == "Failed"; }
};

struct ResetBook {
  // In order of arrival; a list, so a job being run keeps its address while others come and go.
  std::list<ResetJob> jobs;
  uint64_t next_cli = 1;
  static constexpr std::size_t kMaxFinished = 64;

  ResetJob* Find(std::string_view id);
  // The unfinished job that holds `uuid` (queued or running), if any.
  ResetJob* FindActiveFor(std::string_view uuid);
  // Drops the oldest finished jobs beyond kMaxFinished (those whose final status is written first).
  void Trim();
};

void to_json(nlohmann::json& j, const StepLog& s);
void to_json(nlohmann::json& j, const GpuReset& g);
void to_json(nlohmann::json& j, const ResetJob& job);
void to_json(nlohmann::json& j, const ResetBook& book);

// Parses the file's content; throws std::runtime_error naming the field that is wrong.
ResetBook ParseResetBook(std::string_view text);

}  // namespace gns::gpu_reset
