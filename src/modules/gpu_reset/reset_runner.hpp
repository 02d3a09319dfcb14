#pragma once
// The eight steps of one GPU's reset (reset_book.hpp: hold, holders, persistence, release, reset,
// validate, restore, done), as one coroutine per GPU. The runner decides; everything it needs
// from the node (verdicts, the inventory, the pod map, NVML through gpu-inventory, the reset
// command, the journal, evictions) and the record's durability come through NodeMaintenance,
// which the module wires to the real ones and tests to a fake. It changes only the GpuReset
// it runs (and its job's step log through it), and says so through NodeMaintenance.
//
// A resumed GPU (step past kQueued) starts again from the hold if the command had not run, and
// validates again if it had: never Healthy without validation. Loop thread only.

#include "loop/run_command.hpp"
#include "modules/gpu_inventory/api/maintenance.hpp"
#include "modules/gpu_reset/reset_book.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gns::gpu_reset {

enum class HolderPolicy { kFail, kWait, kEvict };

struct RunnerSettings {
  HolderPolicy holders = HolderPolicy::kWait;
  std::chrono::milliseconds holders_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds holders_recheck{std::chrono::seconds(2)};
  std::chrono::milliseconds hold_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds release_timeout{std::chrono::seconds(30)};
  std::vector<std::string> command{"nvidia-smi", "--gpu-reset", "-i", "{uuid}"};  // {uuid}, {pci}
  std::chrono::milliseconds settle{std::chrono::seconds(10)};
  std::chrono::milliseconds healthy_timeout{std::chrono::seconds(30)};
  std::string ack_identifier;  // named in the hold timeout's message
};

// What the runner asks of the node and of the module's record. Facts are read when asked (the
// latest state); a change of any of them must be followed by ResetRunner::Wake.
class NodeMaintenance {
 public:
  virtual ~NodeMaintenance() = default;

  struct Verdict {
    bool healthy = true;
    std::string reason;
  };
  struct GpuView {
    bool inventory_known = false;  // gpu-inventory published an inventory
    bool available = false;        // NVML usable as a whole
    std::string error;             // why not available ("released …" while a GPU is released)
    bool present = false;          // the GPU is in it
    bool released = false;         // gpu-inventory let go of it
    std::string pci_bus_id;
    std::optional<int> fabric_state;  // set when the GPU reports fabric info (3: complete)
  };
  struct PodHolder {
    std::string pod_namespace;
    std::string name;
    std::string container;
    // How it holds the GPU when not by the GPU's own device ID: "MIG device MIG-…", "claim
    // ml/gpus (gpu.nvidia.com node-1/gpu-3)"; "" otherwise.
    std::string via = {};
  };
  struct PodView {
    bool known = false;  // the pod-resources module publishes its map
    bool fresh = false;  // the kubelet's list is current
    std::string error;
    std::vector<PodHolder> holders;  // pods: evicted under `holders: evict`
    // Holders that are no listed pod on this GPU (a DRA claim prepared before the kubelet lists
    // its pod, a holder whose GPU cannot be told), each described: waited for or failed on, never
    // evicted.
    std::vector<std::string> others = {};
  };

  // gpu-health (the judge that holds the GPU Unhealthy) is running.
  virtual bool HealthRunning() const = 0;
  virtual std::optional<Verdict> VerdictOf(const std::string& uuid) const = 0;
  virtual GpuView Gpu(const std::string& uuid) const = 0;
  virtual PodView Pods(const std::string& uuid) const = 0;

  // A journal line for gpu-health (SYSLOG_IDENTIFIER: the ack identifier); "" or why not.
  virtual std::string WriteJournal(const std::string& message, int priority, const std::string& uuid) = 0;
  // gpu-inventory lets go of the GPU (`release`) or takes it back; `why` for its log.
  virtual void RequestRelease(const std::string& uuid, bool release, const std::string& why) = 0;
  virtual void Evict(const std::string& pod_namespace, const std::string& name) = 0;
  virtual boost::asio::awaitable<gpu_inventory::GpuMaintenanceRead> Inspect(const std::string& uuid) = 0;
  virtual boost::asio::awaitable<std::string> SetPersistence(const std::string& uuid, bool enabled) = 0;
  // Fire and forget (a failed reset gives persistence back whatever happens next).
  virtual void RestorePersistence(const std::string& uuid) = 0;
  virtual boost::asio::awaitable<CommandResult> RunResetCommand(const std::vector<std::string>& argv) = 0;
  virtual void KillResetCommand() = 0;

  // The record: Save after every change that a restart needs; Persisted until the record is on
  // disk as it is now (false: a save that covers it failed, RecordProblem says why; or the
  // module stops); JobRecorded until the job as accepted is on disk.
  virtual void Save() = 0;
  virtual boost::asio::awaitable<bool> Persisted() = 0;
  virtual boost::asio::awaitable<bool> JobRecorded(const std::string& job_id) = 0;
  virtual std::string RecordPath() const = 0;
  virtual std::string RecordProblem() const = 0;

  // Outputs: the job's step changed (status, state); a line for reset-gpu callers following it;
  // a GPU's reset ended with gpu.outcome (metrics).
  virtual void StepChanged(ResetJob& job) = 0;
  virtual void Progress(const ResetJob& job, const std::string& line) = 0;
  virtual void GpuEnded(const GpuReset& gpu) = 0;

  virtual int64_t NowMs() const = 0;
};

class ResetRunner {
 public:
  ResetRunner(boost::asio::any_io_executor executor, NodeMaintenance& node, RunnerSettings settings,
              spdlog::logger& log);

  // Runs the GPU's steps from where it stands until it has an outcome (gpu.step kDone), or the
  // runner stops (the GPU stays at its step for the next start).
  boost::asio::awaitable<void> RunGpu(ResetJob& job, GpuReset& gpu);

  // Something a waiting step may wait for changed: it checks again now.
  void Wake() { wake_.cancel(); }
  // An XID on a GPU: counts against the reset being validated or settling. `judged_unix_ms`: when
  // it was judged, if known (an event judged before validation began is not a sign of this reset).
  void NoteXid(const std::string& uuid, const std::string& what, std::optional<int64_t> judged_unix_ms);
  // An eviction asked for in this holders step was refused (a PodDisruptionBudget): the next
  // recheck asks again.
  void EvictionRefused(const std::string& pod_namespace, const std::string& name) {
    evicted_.erase(pod_namespace + "/" + name);
  }
  // Ends every wait and kills the reset command; RunGpu returns soon after.
  void Stop();

  bool Stopping() const { return stopping_; }
  const GpuReset* Current() const { return current_; }

 private:
  using Awaitable = boost::asio::awaitable<void>;
  Awaitable StepHold(ResetJob& job, GpuReset& gpu);
  Awaitable StepHolders(ResetJob& job, GpuReset& gpu);
  Awaitable StepPersistence(ResetJob& job, GpuReset& gpu);
  Awaitable StepRelease(ResetJob& job, GpuReset& gpu);
  Awaitable StepReset(ResetJob& job, GpuReset& gpu);
  Awaitable StepValidate(ResetJob& job, GpuReset& gpu);
  Awaitable StepRestore(ResetJob& job, GpuReset& gpu);
  // The GPU's reset ends without success; `refused`: before the command ran (GPU untouched).
  void Fail(ResetJob& job, GpuReset& gpu, std::string reason, std::string message, bool refused);
  void BeginStep(ResetJob& job, GpuReset& gpu, Step step);
  void EndStep(ResetJob& job, GpuReset& gpu, bool ok, std::string message);
  // Sleeps until Wake, the deadline or Stop.
  Awaitable Sleep(std::chrono::steady_clock::time_point deadline);

  NodeMaintenance& node_;
  RunnerSettings settings_;
  spdlog::logger& log_;
  boost::asio::steady_timer wake_;
  bool stopping_ = false;
  GpuReset* current_ = nullptr;
  std::chrono::steady_clock::time_point step_started_{};
  std::vector<std::string> xids_;  // XIDs seen on the current GPU while watched
  int64_t validate_started_unix_ms_ = 0;
  std::set<std::string> evicted_;  // namespace/name asked in this holders step
};

// Each holder in `pods` as the step log and the job's status name it: "pod ml/a (container main)",
// "pod ml/b (container main, claim ml/gpus (gpu.nvidia.com node-1/gpu-3))", then the others.
std::vector<std::string> DescribeHolders(const NodeMaintenance::PodView& pods);

// The last non-empty line of a command's output, for a one-line reason.
std::string LastLine(const std::string& output);

}  // namespace gns::gpu_reset
