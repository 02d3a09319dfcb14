// The eight steps of one GPU's reset (see reset_runner.hpp).
#include "modules/gpu_reset/reset_runner.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

namespace gns::gpu_reset {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {
// The steps during which an XID on the GPU counts against its reset: validation, and the settle
// window that follows the acknowledgement (the GPU back in service).
bool Watched(Step step) { return step == Step::kValidate || step == Step::kRestore; }
}  // namespace

std::vector<std::string> DescribeHolders(const NodeMaintenance::PodView& pods) {
  std::vector<std::string> out;
  for (const auto& holder : pods.holders) {
    out.push_back("pod " + holder.pod_namespace + "/" + holder.name + " (container " + holder.container +
                  (holder.via.empty() ? "" : ", " + holder.via) + ")");
  }
  out.insert(out.end(), pods.others.begin(), pods.others.end());
  return out;
}

std::string LastLine(const std::string& output) {
  const std::size_t end = output.find_last_not_of("\r\n \t");
  if (end == std::string::npos) return "";
  const std::size_t newline = output.rfind('\n', end);
  const std::size_t start = newline == std::string::npos ? 0 : newline + 1;
  return output.substr(start, end - start + 1);
}

ResetRunner::ResetRunner(boost::asio::any_io_executor executor, NodeMaintenance& node, RunnerSettings settings,
                         spdlog::logger& log)
    : node_(node), settings_(std::move(settings)), log_(log), wake_(std::move(executor)) {}

void ResetRunner::Stop() {
  stopping_ = true;
  wake_.cancel();
  node_.KillResetCommand();
}

void ResetRunner::NoteXid(const std::string& uuid, const std::string& what, std::optional<int64_t> judged_unix_ms) {
  if (current_ == nullptr || current_->uuid != uuid || !Watched(current_->step)) return;
  if (judged_unix_ms && *judged_unix_ms < validate_started_unix_ms_) return;  // released late: not this reset's
  xids_.push_back(what);
  wake_.cancel();
}

ResetRunner::Awaitable ResetRunner::Sleep(SteadyClock::time_point deadline) {
  if (stopping_) co_return;
  wake_.expires_at(deadline);
  boost::system::error_code ec;
  co_await wake_.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
}

ResetRunner::Awaitable ResetRunner::RunGpu(ResetJob& job, GpuReset& gpu) {
  current_ = &gpu;
  const auto started = SteadyClock::now();
  const bool after_command = gpu.step == Step::kValidate || gpu.step == Step::kRestore;
  if (gpu.step != Step::kQueued) {
    log_.warn("resuming the reset of {} at step {}{}", gpu.uuid, StepName(gpu.step),
              after_command ? " (the command ran: validating again)" : " (starting again from the hold)");
  }
  if (!after_command) {
    co_await StepHold(job, gpu);
    if (gpu.outcome.empty() && !stopping_) co_await StepHolders(job, gpu);
    if (gpu.outcome.empty() && !stopping_) co_await StepPersistence(job, gpu);
    if (gpu.outcome.empty() && !stopping_) co_await StepRelease(job, gpu);
    if (gpu.outcome.empty() && !stopping_) co_await StepReset(job, gpu);
  }
  if (gpu.outcome.empty() && !stopping_) co_await StepValidate(job, gpu);
  if (gpu.outcome.empty() && !stopping_) co_await StepRestore(job, gpu);
  if (!stopping_) {
    gpu.step = Step::kDone;
    gpu.total_ms = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - started).count();
    if (gpu.outcome == "succeeded") node_.GpuEnded(gpu);
    node_.Save();
  }
  current_ = nullptr;
}

ResetRunner::Awaitable ResetRunner::StepHold(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kHold);
  // The job must be on disk before anything outside changes (a restart resumes it and so ends
  // the hold); that it has reached this step need not be: a restart before the command starts
  // again from the hold anyway.
  const bool recorded = co_await node_.JobRecorded(job.id);
  if (stopping_) co_return;
  if (!recorded) {
    Fail(job, gpu, "StateNotPersisted",
         "the job cannot be recorded in " + node_.RecordPath() + " (" + node_.RecordProblem() +
             "): without the record a restart could not finish or undo the reset; nothing was touched",
         true);
    co_return;
  }
  if (!node_.HealthRunning()) {
    Fail(job, gpu, "HealthNotRunning", "gpu-health is not running: nothing would keep the GPU off the kubelet", true);
    co_return;
  }
  if (const std::string error = node_.WriteJournal("GPU reset started: " + gpu.uuid, 5, gpu.uuid); !error.empty()) {
    Fail(job, gpu, "JournalUnavailable", error, true);
    co_return;
  }
  const auto deadline = SteadyClock::now() + settings_.hold_timeout;
  while (!stopping_) {
    if (const auto verdict = node_.VerdictOf(gpu.uuid); verdict && !verdict->healthy) {
      EndStep(job, gpu, true, "Unhealthy at the kubelet (" + verdict->reason + ")");
      co_return;
    }
    if (SteadyClock::now() >= deadline) {
      Fail(job, gpu, "HoldTimeout",
           "the verdict did not turn Unhealthy within " + std::to_string(settings_.hold_timeout.count()) +
               " ms of the \"GPU reset started\" line (is journald reading " + settings_.ack_identifier + " lines?)",
           true);
      co_return;
    }
    co_await Sleep(deadline);
  }
}

ResetRunner::Awaitable ResetRunner::StepHolders(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kHolders);
  evicted_.clear();
  const auto deadline = SteadyClock::now() + settings_.holders_timeout;
  while (!stopping_) {
    const auto read = co_await node_.Inspect(gpu.uuid);
    if (stopping_) co_return;
    if (!read.Ok()) {
      Fail(job, gpu, "NvmlUnavailable", "cannot read the processes on the GPU: " + read.error, true);
      co_return;
    }
    const auto pods = node_.Pods(gpu.uuid);
    bool map_usable = true;
    std::string map_problem;
    if (!pods.known) {
      map_problem = "pods unknown (the pod-resources module is not running)";
    } else if (!pods.fresh) {
      map_usable = false;
      map_problem = "the kubelet's pod list is not fresh (" + (pods.error.empty() ? std::string("not listed yet") : pods.error) + ")";
    }
    std::vector<std::string> holders = DescribeHolders(pods);
    if (read.compute_processes) {
      for (const auto& p : *read.compute_processes) holders.push_back("process " + std::to_string(p.pid));
    }
    if (holders.empty() && map_usable) {
      EndStep(job, gpu, true, map_problem.empty() ? "nothing holds the GPU" : "no process holds the GPU; " + map_problem);
      co_return;
    }
    const std::string who = holders.empty() ? map_problem : "held by " + fmt::format("{}", fmt::join(holders, ", "));
    if (settings_.holders == HolderPolicy::kFail) {
      Fail(job, gpu, "GpuInUse", who + " (holders: fail)", true);
      co_return;
    }
    if (settings_.holders == HolderPolicy::kEvict) {
      for (const auto& holder : pods.holders) {
        const std::string key = holder.pod_namespace + "/" + holder.name;
        if (evicted_.insert(key).second) {
          node_.Progress(job, "evicting pod " + key + " from " + gpu.uuid);
          node_.Evict(holder.pod_namespace, holder.name);
        }
      }
    }
    if (SteadyClock::now() >= deadline) {
      Fail(job, gpu, "HoldersTimeout", who + " after waiting " + std::to_string(settings_.holders_timeout.count()) + " ms",
           true);
      co_return;
    }
    // Who it waits for, in the step's entry of the job's status and in the log, when that changes.
    if (!gpu.steps.empty() && gpu.steps.back().message != "waiting: " + who) {
      gpu.steps.back().message = "waiting: " + who;
      log_.info("reset of {} ({}): {}", gpu.uuid, job.id, gpu.steps.back().message);
      node_.StepChanged(job);
      node_.Progress(job, gpu.uuid + ": " + gpu.steps.back().message);
    }
    co_await Sleep(std::min(deadline, SteadyClock::now() + settings_.holders_recheck));
  }
}

ResetRunner::Awaitable ResetRunner::StepRelease(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kRelease);
  gpu.released = true;
  node_.RequestRelease(gpu.uuid, true, "GPU reset " + job.id);
  const auto deadline = SteadyClock::now() + settings_.release_timeout;
  // A holder that came after the holders step (a DRA claim prepared before dra-gpu saw the GPU
  // released, a device allocated meanwhile) refuses the reset: once released, no new claim is
  // prepared on it, so what the map shows now is the last word before the command.
  const auto came_meanwhile = [&]() -> bool {
    const auto holders = DescribeHolders(node_.Pods(gpu.uuid));
    if (holders.empty()) return false;
    Fail(job, gpu, "GpuInUse",
         "held by " + fmt::format("{}", fmt::join(holders, ", ")) + " since the holders step; the GPU was not reset",
         true);
    return true;
  };
  while (!stopping_) {
    const auto view = node_.Gpu(gpu.uuid);
    if (view.present && view.released) {
      if (came_meanwhile()) co_return;
      EndStep(job, gpu, true, "gpu-inventory let go of the GPU; the others stay served");
      co_return;
    }
    if (view.inventory_known && !view.available && view.error.rfind("released", 0) != 0) {
      if (came_meanwhile()) co_return;
      // NVML failed as a whole: nothing in the process holds any handle either.
      EndStep(job, gpu, true, "NVML is not in use (" + view.error + ")");
      co_return;
    }
    if (SteadyClock::now() >= deadline) {
      Fail(job, gpu, "ReleaseTimeout",
           "gpu-inventory did not let go of the GPU within " + std::to_string(settings_.release_timeout.count()) + " ms",
           true);
      co_return;
    }
    co_await Sleep(deadline);
  }
}

ResetRunner::Awaitable ResetRunner::StepPersistence(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kPersistence);
  const auto read = co_await node_.Inspect(gpu.uuid);
  if (stopping_) co_return;
  if (!read.Ok()) {
    Fail(job, gpu, "NvmlUnavailable", "cannot read persistence mode: " + read.error, true);
    co_return;
  }
  // The setting before we touched it, remembered once: a resumed job keeps the first reading.
  if (!gpu.persistence_was_on) {
    gpu.persistence_was_on = read.persistence.value_or(false);
    node_.Save();
    // Durable before we turn it off, so a restart still knows to turn it on again.
    if (*gpu.persistence_was_on) {
      const bool recorded = co_await node_.Persisted();
      if (stopping_) co_return;
      if (!recorded) {
        Fail(job, gpu, "StateNotPersisted",
             "persistence mode was on, and that cannot be recorded in " + node_.RecordPath() + " (" +
                 node_.RecordProblem() + "): it is left on and the GPU is not reset",
             true);
        co_return;
      }
    }
  }
  if (read.persistence.value_or(false)) {
    const std::string error = co_await node_.SetPersistence(gpu.uuid, false);
    if (stopping_) co_return;
    if (!error.empty()) {
      Fail(job, gpu, "PersistenceModeFailed", error, true);
      co_return;
    }
    EndStep(job, gpu, true, "persistence mode was on: turned off (restored after the reset)");
    co_return;
  }
  EndStep(job, gpu, true, read.persistence ? "persistence mode is off" : "persistence mode is not supported");
}

ResetRunner::Awaitable ResetRunner::StepReset(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kReset);
  const auto view = node_.Gpu(gpu.uuid);
  const std::vector<std::string> argv = ExpandCommand(settings_.command, {{"{uuid}", gpu.uuid}, {"{pci}", view.pci_bus_id}});
  node_.Progress(job, "running " + fmt::format("{}", fmt::join(argv, " ")));
  const CommandResult result = co_await node_.RunResetCommand(argv);
  if (stopping_) co_return;
  gpu.command_output = result.out + result.err;
  gpu.command_ms = result.elapsed.count();
  const std::string tail = LastLine(result.err.empty() ? result.out : result.err);
  if (!result.Ok()) {
    Fail(job, gpu, "ResetCommandFailed", argv.front() + ": " + result.Describe() + (tail.empty() ? "" : ": " + tail),
         false);
    co_return;
  }
  EndStep(job, gpu, true, tail.empty() ? "the command succeeded" : tail);
}

ResetRunner::Awaitable ResetRunner::StepValidate(ResetJob& job, GpuReset& gpu) {
  // Made durable while NVML takes the GPU back (awaited before the step ends): a restart from
  // here on validates again instead of resetting again.
  BeginStep(job, gpu, Step::kValidate);
  xids_.clear();
  validate_started_unix_ms_ = node_.NowMs();
  // NVML back for this GPU: gpu-inventory re-reads it.
  node_.RequestRelease(gpu.uuid, false, "GPU reset " + job.id + " done");
  const auto back_deadline = SteadyClock::now() + settings_.release_timeout;
  while (!stopping_) {
    const auto view = node_.Gpu(gpu.uuid);
    if (view.available && view.present && !view.released) break;
    if (SteadyClock::now() >= back_deadline) {
      Fail(job, gpu, "GpuMissing",
           "NVML does not show " + gpu.uuid + " again within " + std::to_string(settings_.release_timeout.count()) +
               " ms of the reset" + (view.inventory_known && !view.error.empty() ? " (" + view.error + ")" : ""),
           false);
      co_return;
    }
    co_await Sleep(back_deadline);
  }
  if (stopping_) co_return;
  gpu.released = false;
  const auto read = co_await node_.Inspect(gpu.uuid);
  if (stopping_) co_return;
  if (!read.Ok()) {
    Fail(job, gpu, "ValidationFailed", "cannot read the GPU after the reset: " + read.error, false);
    co_return;
  }
  if (read.retired_pages_pending.value_or(false)) {
    Fail(job, gpu, "PendingPageRetirement", "a page retirement is still pending after the reset", false);
    co_return;
  }
  if (read.remap_pending.value_or(false)) {
    Fail(job, gpu, "PendingRowRemap", "a row remap is still pending after the reset", false);
    co_return;
  }
  if (read.remap_failure.value_or(false)) {
    Fail(job, gpu, "RowRemapFailure", "the GPU reports a failed row remap", false);
    co_return;
  }
  // An XID since validation began fails it now; the settle window (StepRestore) watches the GPU
  // once it is back in service instead of keeping it out.
  if (!xids_.empty()) {
    Fail(job, gpu, "XidAfterReset", xids_.front() + " after the reset, before it validated", false);
    co_return;
  }
  const auto view = node_.Gpu(gpu.uuid);
  if (!view.present) {
    Fail(job, gpu, "GpuMissing", gpu.uuid + " left the inventory while it was validated", false);
    co_return;
  }
  if (view.fabric_state && *view.fabric_state != 3) {
    Fail(job, gpu, "FabricIncomplete",
         "fabric registration is not complete after the reset (state " + std::to_string(*view.fabric_state) + ")", false);
    co_return;
  }
  // So that a restart validates instead of resetting again. Not recorded (read-only or full
  // state dir): validation is done anyway, and a second reset of an idle GPU is harmless.
  const bool recorded = co_await node_.Persisted();
  if (!recorded && !stopping_) {
    log_.warn("{}: the end of the reset cannot be recorded ({}); a restart now would reset it again", gpu.uuid,
              node_.RecordProblem());
  }
  if (stopping_) co_return;
  EndStep(job, gpu, true,
          std::string("same UUID present, nothing pending, no XID") + (view.fabric_state ? ", fabric complete" : ""));
}

ResetRunner::Awaitable ResetRunner::StepRestore(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kRestore);
  std::string note;
  if (gpu.persistence_was_on.value_or(false)) {
    const std::string error = co_await node_.SetPersistence(gpu.uuid, true);
    if (stopping_) co_return;
    note = error.empty() ? "persistence mode on again; " : "persistence mode NOT restored (" + error + "); ";
    if (!error.empty()) log_.warn("{}: {}", gpu.uuid, note);
  }
  if (const std::string error = node_.WriteJournal("GPU reset occurred: " + gpu.uuid, 6, gpu.uuid); !error.empty()) {
    Fail(job, gpu, "JournalUnavailable", "the reset validated but the acknowledgement could not be written: " + error,
         false);
    co_return;
  }
  // The GPU is back in service from here on. The settle window watches it there: an XID within
  // `settle` of the acknowledgement fails the reset (gpu-health then turns it Unhealthy again with
  // RESTART_BM), so a GPU that only looked fine is not trusted, without keeping a good one out.
  const auto back = SteadyClock::now();
  const auto healthy_deadline = back + settings_.healthy_timeout;
  const auto settle_deadline = back + settings_.settle;
  bool healthy = false;
  bool announced = false;
  while (!stopping_) {
    if (!xids_.empty()) {
      Fail(job, gpu, "XidAfterReset",
           xids_.front() + " within the settle window (" + std::to_string(settings_.settle.count()) +
               " ms) after the GPU was back in service",
           false);
      co_return;
    }
    const auto verdict = node_.VerdictOf(gpu.uuid);
    healthy = healthy || (verdict && verdict->healthy);
    const auto now = SteadyClock::now();
    if (healthy && !announced && now < settle_deadline) {
      announced = true;
      node_.Progress(job, fmt::format("{}: Healthy at the kubelet; watching for XIDs until the settle window ({} ms) ends",
                                      gpu.uuid, settings_.settle.count()));
    }
    const bool healthy_wait_over = healthy || now >= healthy_deadline;
    if (healthy_wait_over && now >= settle_deadline) break;
    co_await Sleep(healthy_wait_over ? settle_deadline : healthy_deadline);
  }
  if (stopping_) co_return;
  gpu.outcome = "succeeded";
  EndStep(job, gpu, true,
          note + "\"GPU reset occurred\" written; " +
              (healthy ? "Healthy at the kubelet" : "the verdict was not Healthy yet when the wait ended") +
              "; no XID within the settle window (" + std::to_string(settings_.settle.count()) + " ms)");
}

void ResetRunner::Fail(ResetJob& job, GpuReset& gpu, std::string reason, std::string message, bool refused) {
  gpu.outcome = refused ? "refused" : "failed";
  gpu.reason = reason;
  gpu.message = message;
  EndStep(job, gpu, false, reason + ": " + message);
  if (gpu.released) {
    // NVML back for this GPU whatever happened: the GPU stays Unhealthy by its verdict.
    node_.RequestRelease(gpu.uuid, false, "GPU reset " + job.id + " ended");
    gpu.released = false;
  }
  if (gpu.persistence_was_on.value_or(false) && gpu.step >= Step::kPersistence) node_.RestorePersistence(gpu.uuid);
  node_.GpuEnded(gpu);
  if (refused) {
    log_.warn("reset of {} refused ({}): {}; the GPU stays as gpu-health judges it{}", gpu.uuid, reason, message,
              gpu.step >= Step::kHolders ? " (held Unhealthy)" : "");
  } else {
    // The GPU was reset and did not come back as it should: only a reboot is left.
    const std::string error = node_.WriteJournal("GPU reset executed: " + gpu.uuid + ", success: false", 3, gpu.uuid);
    log_.error("reset of {} failed ({}): {}{}", gpu.uuid, reason, message,
               error.empty() ? "" : "; and the failure line could not be written: " + error);
  }
  node_.Save();
}

void ResetRunner::BeginStep(ResetJob& job, GpuReset& gpu, Step step) {
  gpu.step = step;
  gpu.steps.push_back(StepLog{std::string(StepName(step)), "running", node_.NowMs(), 0, ""});
  if (gpu.steps.size() > 64) gpu.steps.erase(gpu.steps.begin());
  step_started_ = SteadyClock::now();
  log_.info("reset of {} ({}): step {}", gpu.uuid, job.id, StepName(step));
  node_.Save();
  node_.StepChanged(job);
  node_.Progress(job, fmt::format("{} {}: {} ...", gpu.uuid, static_cast<int>(step), StepName(step)));
}

void ResetRunner::EndStep(ResetJob& job, GpuReset& gpu, bool ok, std::string message) {
  const int64_t took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - step_started_).count();
  if (!gpu.steps.empty()) {
    StepLog& entry = gpu.steps.back();
    entry.result = ok ? "ok" : "failed";
    entry.duration_ms = took;
    entry.message = message;
  }
  if (ok) log_.info("reset of {}: {} ok in {} ms: {}", gpu.uuid, StepName(gpu.step), took, message);
  // Not saved here: what a restart needs is saved by the next step's start, Fail or the GPU's
  // end, each right after this; one save fewer per step on the reset's critical path.
  node_.StepChanged(job);
  node_.Progress(job, fmt::format("{} {}: {} {} ({} ms): {}", gpu.uuid, static_cast<int>(gpu.step), StepName(gpu.step),
                                  ok ? "ok" : "FAILED", took, message));
}

}  // namespace gns::gpu_reset
