// The gpu-reset module: requests, the node's maintenance slot, and the eight steps of one
// GPU's reset as a coroutine (see gpu_reset_module.hpp).
#include "modules/gpu_reset/gpu_reset_module.hpp"

#include "loop/atomic_file.hpp"
#include "loop/config_checks.hpp"
#include "loop/state_file.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/maintenance.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_reset/journal_sender.hpp"
#include "modules/gpu_reset/reset_request.hpp"
#include "modules/journald/messages.hpp"
#include "modules/kube/client.hpp"
#include "modules/kube/events.hpp"
#include "modules/kube/informer.hpp"
#include "modules/kube/messages.hpp"
#include "modules/pod_resources/messages.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <utility>

namespace gns::gpu_reset {

namespace {
// gpu-reset.json: finished jobs are trimmed and each step log is bounded; a few MiB at most.
constexpr std::size_t kMaxBookBytes = 8u << 20;
}  // namespace

namespace asio = boost::asio;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {

// The steps during which an XID on the GPU counts against its reset: validation, and the settle
// window that follows the acknowledgement (the GPU back in service).
bool Watched(Step step) { return step == Step::kValidate || step == Step::kRestore; }

constexpr std::string_view kGroup = "janitor.dgxc.nvidia.com";
constexpr std::string_view kVersion = "v1alpha1";
constexpr std::string_view kResource = "gpuresets";

kube::ResourcePath ObjectsPath() {
  return kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kResource));
}

std::string Rfc3339(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

// The last non-empty line of a command's output, for a one-line reason.
std::string LastLine(const std::string& output) {
  std::size_t end = output.find_last_not_of("\r\n \t");
  if (end == std::string::npos) return "";
  const std::size_t start = output.rfind('\n', end);
  return output.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// The handler of use_awaitable is move-only; std::function needs a copyable callable.
template <typename Handler>
auto Shared(Handler&& handler) {
  return std::make_shared<std::decay_t<Handler>>(std::forward<Handler>(handler));
}

}  // namespace

// ------------------------------------------------------------------------------------ config

GpuResetModule::Config GpuResetModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  const std::string holders = section.Enum("holders", {"fail", "wait", "evict"}, "wait");
  config.holders = holders == "fail" ? HolderPolicy::kFail : holders == "evict" ? HolderPolicy::kEvict : HolderPolicy::kWait;
  config.holders_timeout = section.Duration("holdersTimeout", milliseconds(0), milliseconds(86400000), config.holders_timeout);
  config.holders_recheck = section.Duration("holdersRecheck", milliseconds(100), milliseconds(600000), config.holders_recheck);
  config.hold_timeout = section.Duration("holdTimeout", milliseconds(100), milliseconds(600000), config.hold_timeout);
  config.release_timeout = section.Duration("releaseTimeout", milliseconds(100), milliseconds(600000), config.release_timeout);
  config.command = section.StringList("command", config.command);
  if (config.command.empty() || config.command.front().empty()) section.Fail("command", "must name a program");
  config.command_timeout = section.Duration("commandTimeout", milliseconds(100), milliseconds(3600000), config.command_timeout);
  config.settle = section.Duration("settle", milliseconds(0), milliseconds(600000), config.settle);
  config.healthy_timeout = section.Duration("healthyTimeout", milliseconds(0), milliseconds(600000), config.healthy_timeout);
  config.auto_reset = section.Bool("autoReset", config.auto_reset);
  config.watch_objects = section.Bool("watchObjects", config.watch_objects);
  config.journal_socket = ReadSocketPath(section, "journalSocket", "", /*allow_empty=*/true);
  if (config.journal_socket.empty()) {
    config.journal_socket = (std::filesystem::path(site.paths.host_root.empty() ? "/" : site.paths.host_root) /
                             "run/systemd/journal/socket").string();
    if (const auto problem = SocketPathProblem(config.journal_socket); !problem.empty()) {
      section.Fail("journalSocket", "the default under paths.hostRoot: " + problem);
    }
  }
  config.ack_identifier = section.String("ackIdentifier", std::string(journald::kDefaultAckIdentifier));
  if (config.ack_identifier.empty() || config.ack_identifier.find('\n') != std::string::npos) {
    section.Fail("ackIdentifier", "must be one non-empty line");
  }
  config.admin_socket = section.Bool("adminSocket", config.admin_socket);
  if (config.admin_socket) {
    if (const auto problem = SocketPathProblem(site.paths.state_dir + "/reset.sock"); !problem.empty()) {
      section.Fail("adminSocket", "reset.sock in paths.stateDir: " + problem);
    }
  }
  return config;
}

GpuResetModule::GpuResetModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      node_name_(context.Site().node_name),
      wake_(context.GetLoop().Io()),
      status_retry_(context.GetLoop().Io()) {
  const std::string& state_dir = context.Site().paths.state_dir;
  if (!state_dir.empty()) {
    book_path_ = state_dir + "/gpu-reset.json";
    if (config_.admin_socket) socket_path_ = state_dir + "/reset.sock";
  }
  auto& m = context.Metrics();
  constexpr std::string_view kResets = "gpu_node_supervisor_gpu_resets_total";
  constexpr std::string_view kResetsHelp = "GPU resets by outcome (refused: the GPU was never touched)";
  resets_ok_ = &m.Counter(kResets, kResetsHelp, {{"outcome", "succeeded"}});
  resets_failed_ = &m.Counter(kResets, kResetsHelp, {{"outcome", "failed"}});
  resets_refused_ = &m.Counter(kResets, kResetsHelp, {{"outcome", "refused"}});
  queue_gauge_ = &m.Gauge("gpu_node_supervisor_gpu_reset_queue", "GPU reset jobs queued or running on this node");
  last_overhead_ms_ = &m.Gauge("gpu_node_supervisor_gpu_reset_last_overhead_ms",
                               "The last successful reset's time outside the reset command, hold to Healthy");
  last_command_ms_ = &m.Gauge("gpu_node_supervisor_gpu_reset_last_command_ms",
                              "The last reset command's own run time");
}

GpuResetModule::~GpuResetModule() { *alive_ = false; }

// -------------------------------------------------------------------------------- start/stop

void GpuResetModule::Start() {
  auto& services = context_.GetServices();
  maintenance_ = services.Find<gpu_inventory::GpuMaintenance>();
  if (!maintenance_) throw std::runtime_error("gpu-inventory's GpuMaintenance service is not available");
  kube_ = services.Find<kube::KubeClient>();
  events_ = services.Find<kube::EventRecorder>();

  auto& bus = context_.GetBus();
  // Every change a waiting step may be waiting for wakes the runner; the step checks again.
  subs_.push_back(bus.Subscribe<gpu_health::DeviceHealth>([this](const gpu_health::DeviceHealth& h) {
    wake_.cancel();
    if (config_.auto_reset && !h.healthy && h.recommended_action == "COMPONENT_RESET") {
      Intake([this, uuid = h.uuid] { OnVerdictForAutoReset(uuid); });
    }
  }));
  subs_.push_back(bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory&) { wake_.cancel(); }));
  subs_.push_back(bus.Subscribe<pod_resources::GpuPodMap>([this](const pod_resources::GpuPodMap&) { wake_.cancel(); }));
  subs_.push_back(bus.Subscribe<gpu_inventory::XidObservation>([this](const gpu_inventory::XidObservation& x) {
    if (current_gpu_ != nullptr && x.uuid == current_gpu_->uuid && Watched(current_gpu_->step)) {
      recent_xids_[x.uuid].push_back("XID " + std::to_string(x.xid) + " (NVML)");
      wake_.cancel();
    }
  }));
  subs_.push_back(bus.Subscribe<gpu_health::HealthEvent>([this](const gpu_health::HealthEvent& e) {
    if (current_gpu_ == nullptr || !Watched(current_gpu_->step) || e.is_healthy || e.error_code.empty()) return;
    if (e.source != "kernel" && e.source != "nvml") return;
    // Judged before validation began (an event released late): not a sign of this reset.
    if (e.generated_seconds * 1000 + e.generated_nanos / 1'000'000 < validate_started_unix_ms_) return;
    for (const auto& entity : e.entities_impacted) {
      if (entity.type == "GPU_UUID" && entity.value == current_gpu_->uuid) {
        recent_xids_[entity.value].push_back("XID " + e.error_code.front() + " (" + e.source + ")");
        wake_.cancel();
      }
    }
  }));

  if (kube_ && config_.watch_objects) {
    if (node_name_.empty()) throw std::runtime_error("the node name is not set; GPUReset objects are matched to it");
    const auto informers = services.Find<kube::InformerRegistry>();
    if (informers) {
      // A CRD serves no field selector on spec.nodeName unless it declares it selectable: the
      // objects are few and cluster-wide, so they are filtered here.
      const kube::InformerSpec spec{ObjectsPath().Collection(), "", ""};
      objects_key_ = spec.Key();
      subs_.push_back(bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& event) {
        if (event.informer_key == objects_key_ && event.object) Intake([this, event] { OnObjectEvent(event); });
      }));
      subs_.push_back(bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced& synced) {
        if (synced.informer_key != objects_key_ || !synced.synced || !objects_) return;
        for (const auto& [key, object] : objects_->Items()) Intake([this, object = object] { OnObject(*object); });
      }));
      objects_ = informers->Acquire(spec);
    }
  }
  if (!kube_) context_.Log().info("no API server: GPUReset objects are not watched; reset-gpu and autoReset still work");

  if (!socket_path_.empty()) {
    socket_ = std::make_unique<AdminSocket>(
        context_.GetLoop().Io(), socket_path_,
        [this](std::string_view line, std::shared_ptr<AdminSocket::Reply> reply) {
          Intake([this, line = std::string(line), reply]() mutable { OnCliLine(line, std::move(reply)); }, reply);
        });
    try {
      socket_->Start();
    } catch (const std::exception& e) {
      // Optional: GPUReset objects and autoReset do without it. A state directory that cannot
      // take it (read-only, full) must not keep the module from running.
      socket_.reset();
      socket_problem_ = e.what();
      context_.Log().error("{} unavailable ({}): reset-gpu cannot reach this supervisor; GPUReset objects and "
                           "autoReset still work",
                           socket_path_, socket_problem_);
    }
  }
  LoadBook();
}

void GpuResetModule::Resume() {
  // Final statuses that did not reach the API before a restart.
  for (auto& job : book_.jobs) {
    if (job.source == "GPUReset" && job.Finished() && !job.final_status_written) WriteStatus(job);
  }
  context_.Log().info("resets by {} (holders: {}, autoReset {}), acknowledgements to {} as {}",
                      fmt::join(config_.command, " "),
                      config_.holders == HolderPolicy::kFail ? "fail" : config_.holders == HolderPolicy::kEvict ? "evict" : "wait",
                      config_.auto_reset ? "on" : "off", config_.journal_socket, config_.ack_identifier);
  PublishState();
  // Requests that came while the record was read, in their order: each sees the restored jobs
  // (a request for a GPU a resumed job holds joins it; a verdict already acted on is not again).
  auto held = std::move(held_);
  held_.clear();
  for (auto& request : held) request.run();
  Kick();
}

void GpuResetModule::Intake(std::function<void()> request, std::shared_ptr<AdminSocket::Reply> caller) {
  if (stopping_) return;
  if (loading_) {
    held_.push_back(HeldRequest{std::move(request), std::move(caller)});
    return;
  }
  request();
}

void GpuResetModule::Stop(std::function<void()> done) {
  stopping_ = true;
  subs_.clear();
  if (socket_) socket_->Stop();
  // Requests held while the record was read: a CLI caller is told; the others come again when
  // the module starts again (objects are listed again, verdicts are retained).
  for (auto& request : held_) {
    if (request.caller) request.caller->Finish("error: the supervisor's gpu-reset module stopped before it took the request");
  }
  held_.clear();
  for (auto& [id, reply] : followers_) reply->Finish("error: the supervisor's gpu-reset module stopped; the reset resumes when it starts again");
  followers_.clear();
  status_retry_.cancel();
  wake_.cancel();
  if (child_) child_->Kill();
  if (!running_) {
    maintenance_.reset();  // gpu-inventory's service (and the NVML library it keeps) goes with it
    done();
    return;
  }
  stop_done_ = std::move(done);
}

// ---------------------------------------------------------------------------------- requests

void GpuResetModule::OnObjectEvent(const kube::ResourceEvent& event) {
  if (event.type == kube::ResourceEvent::Type::kDeleted) return;  // a running reset finishes anyway
  OnObject(*event.object);
}

void GpuResetModule::OnObject(const nlohmann::json& object) {
  const auto meta = kube::ObjectMeta::From(object);
  if (!meta) return;
  const auto spec = object.find("spec");
  if (spec == object.end() || !spec->is_object()) return;
  const auto node = spec->find("nodeName");
  if (node == spec->end() || !node->is_string() || node->get<std::string>() != node_name_) return;  // another node's
  // Terminal in the API (Complete True/False): done before, by us or someone else.
  if (const auto status = object.find("status"); status != object.end() && status->is_object()) {
    if (const auto conditions = status->find("conditions"); conditions != status->end() && conditions->is_array()) {
      for (const auto& c : *conditions) {
        if (c.value("type", "") == "Complete" && (c.value("status", "") == "True" || c.value("status", "") == "False")) return;
      }
    }
  }
  const std::string id = "GPUReset/" + meta->name + "/" + meta->uid;
  if (ResetJob* known = book_.Find(id)) {
    if (known->Finished() && !known->final_status_written) WriteStatus(*known);
    return;
  }
  ResetJob job;
  job.id = id;
  job.source = "GPUReset";
  job.object_name = meta->name;
  job.object_uid = meta->uid;
  job.generation = object.value(nlohmann::json::json_pointer("/metadata/generation"), int64_t{0});
  job.created_unix_ms = NowMs();
  // Only a selector that names GPUs, or says all: true, selects any; anything else (missing,
  // empty, a misspelt key, a wrong type) is refused with the field it is about, nothing touched.
  const GpuSelection selection = ParseGpuSelector(*spec);
  std::vector<std::string> uuids;
  std::string problem = selection.error;
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  if (problem.empty() && selection.all && inventory != nullptr) {
    for (const auto& gpu : inventory->gpus) uuids.push_back(gpu.uuid);
  }
  for (std::size_t i = 0; problem.empty() && i < selection.uuids.size(); ++i) {
    const std::string& uuid = selection.uuids[i];
    if (inventory == nullptr || inventory->FindByUuid(uuid) == nullptr) {
      problem = "spec.selector.uuids[" + std::to_string(i) + "]: GPU " + uuid + " is not on node " + node_name_;
    } else {
      uuids.push_back(uuid);
    }
  }
  for (std::size_t i = 0; problem.empty() && i < selection.pci_bus_ids.size(); ++i) {
    const auto pci = ParsePciAddress(selection.pci_bus_ids[i]);
    const auto* gpu = pci && inventory != nullptr ? inventory->FindByPci(*pci) : nullptr;
    if (gpu == nullptr) {
      problem = "spec.selector.pciBusIDs[" + std::to_string(i) + "]: " + selection.pci_bus_ids[i] +
                " is no GPU of node " + node_name_;
    } else {
      uuids.push_back(gpu->uuid);
    }
  }
  std::sort(uuids.begin(), uuids.end());
  uuids.erase(std::unique(uuids.begin(), uuids.end()), uuids.end());
  if (uuids.empty() && problem.empty()) problem = "no GPU is known on node " + node_name_ + " yet";
  for (const auto& uuid : uuids) job.gpus.push_back(NewGpuReset(uuid));
  if (!problem.empty()) {
    // Bad input: the whole object is refused with the reason; nothing is touched.
    context_.Log().warn("GPUReset {}: {}", meta->name, problem);
    job.gpus.clear();
    job.gpus.push_back(NewGpuReset(uuids.empty() ? "unknown" : uuids.front()));
    job.gpus.front().outcome = "refused";
    job.gpus.front().reason = "InvalidRequest";
    job.gpus.front().message = problem;
    job.gpus.front().step = Step::kDone;
    job.phase = "Failed";
    job.reason = "InvalidRequest";
    job.message = problem;
    job.completed_unix_ms = NowMs();
    book_.jobs.push_back(std::move(job));
    ResetJob& stored = book_.jobs.back();
    SaveBook();
    resets_refused_->Inc();
    WriteStatus(stored);
    PublishState();
    return;
  }
  const std::string joined = Enqueue(std::move(job));
  context_.Log().info("GPUReset {} for {}: job {}", meta->name, fmt::join(uuids, ","), joined);
}

void GpuResetModule::OnCliLine(std::string_view line, std::shared_ptr<AdminSocket::Reply> reply) {
  constexpr std::string_view kVerb = "reset-gpu ";
  if (line.substr(0, kVerb.size()) != kVerb) {
    reply->Finish("error: unknown request (expected: reset-gpu GPU-…)");
    return;
  }
  const std::string uuid(line.substr(kVerb.size()));
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  if (!LooksLikeGpuUuid(uuid)) {
    reply->Finish("error: \"" + uuid + "\" is not a GPU UUID (GPU-…)");
    return;
  }
  if (inventory == nullptr || inventory->FindByUuid(uuid) == nullptr) {
    reply->Finish("error: GPU " + uuid + " is not on this node (gpu-inventory does not list it)");
    return;
  }
  ResetJob job;
  job.id = "cli/" + std::to_string(book_.next_cli++);
  job.source = "cli";
  job.created_unix_ms = NowMs();
  job.gpus.push_back(NewGpuReset(uuid));
  const std::string id = Enqueue(std::move(job));
  reply->Line("job " + id + ": reset of " + DescribeGpu(uuid) + (current_job_ != nullptr && current_job_->id != id ? " (queued behind " + current_job_->id + ")" : ""));
  followers_.emplace(id, std::move(reply));
}

void GpuResetModule::OnVerdictForAutoReset(const std::string& uuid) {
  const auto& verdicts = context_.GetBus().LatestByKey<gpu_health::DeviceHealth>();
  const auto it = verdicts.find(uuid);
  if (it == verdicts.end() || it->second.healthy) return;
  const int64_t since = it->second.since_unix_ms;
  if (auto seen = auto_seen_.find(uuid); seen != auto_seen_.end() && seen->second == since) return;
  const std::string id = "auto/" + uuid + "/" + std::to_string(since);
  if (book_.Find(id) != nullptr || book_.FindActiveFor(uuid) != nullptr) return;
  // Only a GPU nothing holds: with holders, the drainer (or the operator) decides. Without the
  // pod-resources module the processes NVML sees are all we know (step 2 checks them).
  if (const auto* map = context_.GetBus().Latest<pod_resources::GpuPodMap>(); map != nullptr && !map->fresh) {
    context_.Log().info("autoReset: {} wants COMPONENT_RESET, but the pod map is not fresh; not resetting", uuid);
    return;
  } else if (map != nullptr && !map->Holders(uuid).empty()) {
    context_.Log().info("autoReset: {} wants COMPONENT_RESET but pods hold it; left to the drainer", uuid);
    auto_seen_[uuid] = since;
    return;
  }
  auto_seen_[uuid] = since;
  ResetJob job;
  job.id = id;
  job.source = "auto";
  job.created_unix_ms = NowMs();
  job.gpus.push_back(NewGpuReset(uuid));
  context_.Log().warn("autoReset: {} is Unhealthy with COMPONENT_RESET and no pod holds it: resetting it", uuid);
  Enqueue(std::move(job));
}

std::string GpuResetModule::Enqueue(ResetJob job) {
  // A GPU already queued or resetting: the request joins that job.
  for (const auto& gpu : job.gpus) {
    if (ResetJob* active = book_.FindActiveFor(gpu.uuid); active != nullptr && job.gpus.size() == 1) {
      context_.Log().info("{} joins job {} (it already resets {})", job.id, active->id, gpu.uuid);
      return active->id;
    }
  }
  const std::string id = job.id;
  book_.jobs.push_back(std::move(job));
  SaveBook();
  accepted_version_[id] = book_version_;
  WriteStatus(book_.jobs.back());
  PublishState();
  Kick();
  return id;
}

void GpuResetModule::Kick() {
  if (running_ || stopping_) return;
  const bool any = std::any_of(book_.jobs.begin(), book_.jobs.end(), [](const ResetJob& j) { return !j.Finished(); });
  if (!any) return;
  running_ = true;
  asio::co_spawn(context_.GetLoop().Io(), RunJobs(), [this, alive = alive_](std::exception_ptr error) {
    if (!*alive) return;
    running_ = false;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        context_.Log().error("the reset runner failed: {}", e.what());
        context_.ReportFailure(std::string("reset runner: ") + e.what());
      }
    }
    if (stop_done_) {
      maintenance_.reset();
      auto done = std::move(stop_done_);
      done();
    }
  });
}

// ------------------------------------------------------------------------------------- runner

GpuResetModule::Awaitable GpuResetModule::RunJobs() {
  while (!stopping_) {
    ResetJob* next = nullptr;
    for (auto& job : book_.jobs) {
      if (!job.Finished()) {
        next = &job;
        break;
      }
    }
    if (next == nullptr) break;
    co_await RunJob(*next);
  }
}

GpuResetModule::Awaitable GpuResetModule::RunJob(ResetJob& job) {
  current_job_ = &job;
  if (job.started_unix_ms == 0) job.started_unix_ms = NowMs();
  const bool resumed = job.phase == "InProgress";
  job.phase = "InProgress";
  SaveBook();
  WriteStatus(job);
  RecordEvent("Normal", resumed ? "GpuResetResumed" : "GpuResetStarted",
              "job " + job.id + (resumed ? " resumed after a restart" : " started"));
  for (auto& gpu : job.gpus) {
    if (!gpu.outcome.empty()) continue;
    co_await RunGpu(job, gpu);
    if (stopping_) {
      current_job_ = nullptr;
      co_return;
    }
  }
  FinishJob(job);
  current_job_ = nullptr;
}

GpuResetModule::Awaitable GpuResetModule::RunGpu(ResetJob& job, GpuReset& gpu) {
  current_gpu_ = &gpu;
  const auto started = SteadyClock::now();
  const bool after_command = gpu.step == Step::kValidate || gpu.step == Step::kRestore;
  if (gpu.step != Step::kQueued) {
    context_.Log().warn("resuming the reset of {} at step {}{}", gpu.uuid, StepName(gpu.step),
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
    if (gpu.outcome == "succeeded") {
      resets_ok_->Inc();
      last_command_ms_->Set(static_cast<double>(gpu.command_ms));
      last_overhead_ms_->Set(static_cast<double>(gpu.total_ms - gpu.command_ms));
    }
    SaveBook();
  }
  current_gpu_ = nullptr;
}

GpuResetModule::Awaitable GpuResetModule::StepHold(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kHold);
  // The job must be on disk before anything outside changes (a restart resumes it and so ends
  // the hold); that it has reached this step need not be: a restart before the command starts
  // again from the hold anyway.
  const auto accepted = accepted_version_.find(job.id);
  const bool recorded = co_await Persisted(accepted != accepted_version_.end() ? accepted->second : 0);
  if (stopping_) co_return;
  if (!recorded) {
    FailGpu(job, gpu, "StateNotPersisted",
            "the job cannot be recorded in " + book_path_ + " (" + save_problem_ +
                "): without the record a restart could not finish or undo the reset; nothing was touched",
            true);
    co_return;
  }
  if (context_.GetBus().Latest<gpu_health::GpuHealthState>() == nullptr) {
    FailGpu(job, gpu, "HealthNotRunning", "gpu-health is not running: nothing would keep the GPU off the kubelet", true);
    co_return;
  }
  if (const std::string error = WriteJournal("GPU reset started: " + gpu.uuid, 5, gpu.uuid); !error.empty()) {
    FailGpu(job, gpu, "JournalUnavailable", error, true);
    co_return;
  }
  const auto deadline = SteadyClock::now() + config_.hold_timeout;
  while (!stopping_) {
    const auto& verdicts = context_.GetBus().LatestByKey<gpu_health::DeviceHealth>();
    const auto it = verdicts.find(gpu.uuid);
    if (it != verdicts.end() && !it->second.healthy) {
      EndStep(job, gpu, true, "Unhealthy at the kubelet (" + it->second.reason + ")");
      co_return;
    }
    if (SteadyClock::now() >= deadline) {
      FailGpu(job, gpu, "HoldTimeout",
              "the verdict did not turn Unhealthy within " + std::to_string(config_.hold_timeout.count()) +
                  " ms of the \"GPU reset started\" line (is journald reading " + config_.ack_identifier + " lines?)",
              true);
      co_return;
    }
    co_await Wake(deadline);
  }
}

GpuResetModule::Awaitable GpuResetModule::StepHolders(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kHolders);
  evicted_.clear();
  const auto deadline = SteadyClock::now() + config_.holders_timeout;
  while (!stopping_) {
    const auto read = co_await Inspect(gpu.uuid);
    if (stopping_) co_return;
    if (!read.Ok()) {
      FailGpu(job, gpu, "NvmlUnavailable", "cannot read the processes on the GPU: " + read.error, true);
      co_return;
    }
    bool map_usable = true;
    std::string map_problem;
    const auto holders = Holders(gpu.uuid, read, map_usable, map_problem);
    if (holders.empty() && map_usable) {
      EndStep(job, gpu, true, map_problem.empty() ? "nothing holds the GPU" : "no process holds the GPU; " + map_problem);
      co_return;
    }
    const std::string who = holders.empty() ? map_problem : "held by " + fmt::format("{}", fmt::join(holders, ", "));
    if (config_.holders == HolderPolicy::kFail) {
      FailGpu(job, gpu, "GpuInUse", who + " (holders: fail)", true);
      co_return;
    }
    if (config_.holders == HolderPolicy::kEvict) {
      const auto* map = context_.GetBus().Latest<pod_resources::GpuPodMap>();
      if (map != nullptr) {
        for (const auto& holder : map->Holders(gpu.uuid)) {
          const std::string key = holder.namespace_name + "/" + holder.name;
          if (evicted_.insert(key).second) {
            Progress(job, "evicting pod " + key + " from " + gpu.uuid);
            Evict(holder.namespace_name, holder.name);
          }
        }
      }
    }
    if (SteadyClock::now() >= deadline) {
      FailGpu(job, gpu, "HoldersTimeout",
              who + " after waiting " + std::to_string(config_.holders_timeout.count()) + " ms", true);
      co_return;
    }
    co_await Wake(std::min(deadline, SteadyClock::now() + config_.holders_recheck));
  }
}

GpuResetModule::Awaitable GpuResetModule::StepRelease(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kRelease);
  gpu.released = true;
  context_.GetBus().Publish(gpu_inventory::NvmlReleaseRequest{true, "GPU reset " + job.id, gpu.uuid});
  const auto deadline = SteadyClock::now() + config_.release_timeout;
  while (!stopping_) {
    const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
    const auto* info = inventory != nullptr ? inventory->FindByUuid(gpu.uuid) : nullptr;
    if (info != nullptr && info->released) {
      EndStep(job, gpu, true, "gpu-inventory let go of the GPU; the others stay served");
      co_return;
    }
    if (inventory != nullptr && !inventory->available && inventory->error.rfind("released", 0) != 0) {
      // NVML failed as a whole: nothing in the process holds any handle either.
      EndStep(job, gpu, true, "NVML is not in use (" + inventory->error + ")");
      co_return;
    }
    if (SteadyClock::now() >= deadline) {
      FailGpu(job, gpu, "ReleaseTimeout", "gpu-inventory did not let go of the GPU within " +
                                              std::to_string(config_.release_timeout.count()) + " ms", true);
      co_return;
    }
    co_await Wake(deadline);
  }
}

GpuResetModule::Awaitable GpuResetModule::StepPersistence(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kPersistence);
  const auto read = co_await Inspect(gpu.uuid);
  if (stopping_) co_return;
  if (!read.Ok()) {
    FailGpu(job, gpu, "NvmlUnavailable", "cannot read persistence mode: " + read.error, true);
    co_return;
  }
  // The setting before we touched it, remembered once: a resumed job keeps the first reading.
  if (!gpu.persistence_was_on) {
    gpu.persistence_was_on = read.persistence.value_or(false);
    SaveBook();
    // Durable before we turn it off, so a restart still knows to turn it on again.
    if (*gpu.persistence_was_on) {
      const bool recorded = co_await Persisted();
      if (stopping_) co_return;
      if (!recorded) {
        FailGpu(job, gpu, "StateNotPersisted",
                "persistence mode was on, and that cannot be recorded in " + book_path_ + " (" + save_problem_ +
                    "): it is left on and the GPU is not reset",
                true);
        co_return;
      }
    }
  }
  if (read.persistence.value_or(false)) {
    const std::string error = co_await SetPersistence(gpu.uuid, false);
    if (stopping_) co_return;
    if (!error.empty()) {
      FailGpu(job, gpu, "PersistenceModeFailed", error, true);
      co_return;
    }
    EndStep(job, gpu, true, "persistence mode was on: turned off (restored after the reset)");
    co_return;
  }
  EndStep(job, gpu, true, read.persistence ? "persistence mode is off" : "persistence mode is not supported");
}

GpuResetModule::Awaitable GpuResetModule::StepReset(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kReset);
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  const auto* info = inventory != nullptr ? inventory->FindByUuid(gpu.uuid) : nullptr;
  std::vector<std::string> argv;
  for (std::string arg : config_.command) {
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"{uuid}", gpu.uuid},
                                     {"{pci}", info != nullptr ? info->pci_bus_id : std::string()}}) {
      for (std::size_t p = arg.find(key); p != std::string::npos; p = arg.find(key, p + value.size())) {
        arg.replace(p, key.size(), value);
      }
    }
    argv.push_back(std::move(arg));
  }
  Progress(job, "running " + fmt::format("{}", fmt::join(argv, " ")));
  const CommandResult result = co_await RunResetCommand(argv);
  if (stopping_) co_return;
  gpu.command_output = result.out + result.err;
  gpu.command_ms = result.elapsed.count();
  const std::string tail = LastLine(result.err.empty() ? result.out : result.err);
  if (!result.Ok()) {
    FailGpu(job, gpu, "ResetCommandFailed", argv.front() + ": " + result.Describe() + (tail.empty() ? "" : ": " + tail),
            false);
    co_return;
  }
  EndStep(job, gpu, true, tail.empty() ? "the command succeeded" : tail);
}

GpuResetModule::Awaitable GpuResetModule::StepValidate(ResetJob& job, GpuReset& gpu) {
  // Made durable while NVML takes the GPU back (awaited before the step ends): a restart from
  // here on validates again instead of resetting again.
  BeginStep(job, gpu, Step::kValidate);
  recent_xids_[gpu.uuid].clear();
  validate_started_unix_ms_ = NowMs();
  // NVML back for this GPU: gpu-inventory re-reads it.
  context_.GetBus().Publish(gpu_inventory::NvmlReleaseRequest{false, "GPU reset " + job.id + " done", gpu.uuid});
  const auto back_deadline = SteadyClock::now() + config_.release_timeout;
  const gpu_inventory::GpuInfo* info = nullptr;
  while (!stopping_) {
    const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
    info = inventory != nullptr && inventory->available ? inventory->FindByUuid(gpu.uuid) : nullptr;
    if (info != nullptr && !info->released) break;
    if (SteadyClock::now() >= back_deadline) {
      FailGpu(job, gpu, "GpuMissing",
              "NVML does not show " + gpu.uuid + " again within " + std::to_string(config_.release_timeout.count()) +
                  " ms of the reset" + (inventory != nullptr && !inventory->error.empty() ? " (" + inventory->error + ")" : ""),
              false);
      co_return;
    }
    co_await Wake(back_deadline);
  }
  if (stopping_) co_return;
  gpu.released = false;
  const auto read = co_await Inspect(gpu.uuid);
  if (stopping_) co_return;
  if (!read.Ok()) {
    FailGpu(job, gpu, "ValidationFailed", "cannot read the GPU after the reset: " + read.error, false);
    co_return;
  }
  if (read.retired_pages_pending.value_or(false)) {
    FailGpu(job, gpu, "PendingPageRetirement", "a page retirement is still pending after the reset", false);
    co_return;
  }
  if (read.remap_pending.value_or(false)) {
    FailGpu(job, gpu, "PendingRowRemap", "a row remap is still pending after the reset", false);
    co_return;
  }
  if (read.remap_failure.value_or(false)) {
    FailGpu(job, gpu, "RowRemapFailure", "the GPU reports a failed row remap", false);
    co_return;
  }
  // An XID since validation began fails it now; the settle window (StepRestore) watches the GPU
  // once it is back in service instead of keeping it out.
  if (const auto& xids = recent_xids_[gpu.uuid]; !xids.empty()) {
    FailGpu(job, gpu, "XidAfterReset", xids.front() + " after the reset, before it validated", false);
    co_return;
  }
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  info = inventory != nullptr ? inventory->FindByUuid(gpu.uuid) : nullptr;
  if (info == nullptr) {
    FailGpu(job, gpu, "GpuMissing", gpu.uuid + " left the inventory while it was validated", false);
    co_return;
  }
  if (info->fabric && info->fabric->state != 3) {
    FailGpu(job, gpu, "FabricIncomplete",
            "fabric registration is not complete after the reset (state " + std::to_string(info->fabric->state) + ")",
            false);
    co_return;
  }
  // So that a restart validates instead of resetting again. Not recorded (read-only or full
  // state dir): validation is done anyway, and a second reset of an idle GPU is harmless.
  const bool recorded = co_await Persisted();
  if (!recorded && !stopping_) {
    context_.Log().warn("{}: the end of the reset cannot be recorded ({}); a restart now would reset it again",
                        gpu.uuid, save_problem_);
  }
  if (stopping_) co_return;
  EndStep(job, gpu, true,
          std::string("same UUID present, nothing pending, no XID") + (info->fabric ? ", fabric complete" : ""));
}

GpuResetModule::Awaitable GpuResetModule::StepRestore(ResetJob& job, GpuReset& gpu) {
  BeginStep(job, gpu, Step::kRestore);
  std::string note;
  if (gpu.persistence_was_on.value_or(false)) {
    const std::string error = co_await SetPersistence(gpu.uuid, true);
    if (stopping_) co_return;
    note = error.empty() ? "persistence mode on again; " : "persistence mode NOT restored (" + error + "); ";
    if (!error.empty()) context_.Log().warn("{}: {}", gpu.uuid, note);
  }
  if (const std::string error = WriteJournal("GPU reset occurred: " + gpu.uuid, 6, gpu.uuid); !error.empty()) {
    FailGpu(job, gpu, "JournalUnavailable", "the reset validated but the acknowledgement could not be written: " + error,
            false);
    co_return;
  }
  // The GPU is back in service from here on. The settle window watches it there: an XID within
  // `settle` of the acknowledgement fails the reset (gpu-health then turns it Unhealthy again with
  // RESTART_BM), so a GPU that only looked fine is not trusted, without keeping a good one out.
  const auto back = SteadyClock::now();
  const auto healthy_deadline = back + config_.healthy_timeout;
  const auto settle_deadline = back + config_.settle;
  bool healthy = false;
  bool announced = false;
  while (!stopping_) {
    if (const auto& xids = recent_xids_[gpu.uuid]; !xids.empty()) {
      FailGpu(job, gpu, "XidAfterReset",
              xids.front() + " within the settle window (" + std::to_string(config_.settle.count()) +
                  " ms) after the GPU was back in service",
              false);
      co_return;
    }
    const auto& verdicts = context_.GetBus().LatestByKey<gpu_health::DeviceHealth>();
    const auto it = verdicts.find(gpu.uuid);
    healthy = healthy || (it != verdicts.end() && it->second.healthy);
    const auto now = SteadyClock::now();
    if (healthy && !announced && now < settle_deadline) {
      announced = true;
      Progress(job, fmt::format("{}: Healthy at the kubelet; watching for XIDs until the settle window ({} ms) ends",
                                gpu.uuid, config_.settle.count()));
    }
    const bool healthy_wait_over = healthy || now >= healthy_deadline;
    if (healthy_wait_over && now >= settle_deadline) break;
    co_await Wake(healthy_wait_over ? settle_deadline : healthy_deadline);
  }
  if (stopping_) co_return;
  gpu.outcome = "succeeded";
  EndStep(job, gpu, true,
          note + "\"GPU reset occurred\" written; " +
              (healthy ? "Healthy at the kubelet" : "the verdict was not Healthy yet when the wait ended") +
              "; no XID within the settle window (" + std::to_string(config_.settle.count()) + " ms)");
}

void GpuResetModule::FailGpu(ResetJob& job, GpuReset& gpu, std::string reason, std::string message, bool refused) {
  gpu.outcome = refused ? "refused" : "failed";
  gpu.reason = reason;
  gpu.message = message;
  EndStep(job, gpu, false, reason + ": " + message);
  if (gpu.released) {
    // NVML back for this GPU whatever happened: the GPU stays Unhealthy by its verdict.
    context_.GetBus().Publish(gpu_inventory::NvmlReleaseRequest{false, "GPU reset " + job.id + " ended", gpu.uuid});
    gpu.released = false;
  }
  if (gpu.persistence_was_on.value_or(false) && gpu.step >= Step::kPersistence && maintenance_) {
    maintenance_->SetPersistence(gpu.uuid, true, [](std::string) {});
  }
  if (refused) {
    resets_refused_->Inc();
    context_.Log().warn("reset of {} refused ({}): {}; the GPU stays as gpu-health judges it{}", gpu.uuid, reason,
                        message, gpu.step >= Step::kHolders ? " (held Unhealthy)" : "");
  } else {
    resets_failed_->Inc();
    // The GPU was reset and did not come back as it should: only a reboot is left.
    const std::string error = WriteJournal("GPU reset executed: " + gpu.uuid + ", success: false", 3, gpu.uuid);
    context_.Log().error("reset of {} failed ({}): {}{}", gpu.uuid, reason, message,
                         error.empty() ? "" : "; and the failure line could not be written: " + error);
  }
  SaveBook();
}

void GpuResetModule::FinishJob(ResetJob& job) {
  const GpuReset* first_bad = nullptr;
  for (const auto& gpu : job.gpus) {
    if (gpu.outcome != "succeeded") {
      first_bad = &gpu;
      break;
    }
  }
  job.phase = first_bad == nullptr ? "Succeeded" : "Failed";
  job.reason = first_bad == nullptr ? "ResetSucceeded" : first_bad->reason;
  job.message = first_bad == nullptr ? "every GPU reset and validated" : first_bad->uuid + ": " + first_bad->message;
  job.completed_unix_ms = NowMs();
  accepted_version_.erase(job.id);
  book_.Trim();
  SaveBook();
  WriteStatus(job);
  PublishState();
  RecordEvent(first_bad == nullptr ? "Normal" : "Warning", first_bad == nullptr ? "GpuResetSucceeded" : "GpuResetFailed",
              "job " + job.id + ": " + job.message);
  const auto [begin, end] = followers_.equal_range(job.id);
  for (auto it = begin; it != end; ++it) {
    it->second->Finish((first_bad == nullptr ? "ok: " : "error: ") + job.message);
  }
  followers_.erase(job.id);
}

// ---------------------------------------------------------------------------------- awaiting

GpuResetModule::Awaitable GpuResetModule::Wake(SteadyClock::time_point deadline) {
  if (stopping_) co_return;
  wake_.expires_at(deadline);
  boost::system::error_code ec;
  co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

asio::awaitable<gpu_inventory::GpuMaintenanceRead> GpuResetModule::Inspect(const std::string& uuid) {
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(boost::system::error_code, gpu_inventory::GpuMaintenanceRead)>(
      [maintenance = maintenance_, uuid](auto handler) {
        auto shared = Shared(std::move(handler));
        maintenance->Inspect(uuid, [shared](gpu_inventory::GpuMaintenanceRead read) {
          std::move (*shared)(boost::system::error_code{}, std::move(read));
        });
      },
      asio::use_awaitable);
}

asio::awaitable<std::string> GpuResetModule::SetPersistence(const std::string& uuid, bool enabled) {
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(boost::system::error_code, std::string)>(
      [maintenance = maintenance_, uuid, enabled](auto handler) {
        auto shared = Shared(std::move(handler));
        maintenance->SetPersistence(uuid, enabled, [shared](std::string error) {
          std::move (*shared)(boost::system::error_code{}, std::move(error));
        });
      },
      asio::use_awaitable);
}

asio::awaitable<CommandResult> GpuResetModule::RunResetCommand(const std::vector<std::string>& argv) {
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(boost::system::error_code, CommandResult)>(
      [this, argv](auto handler) {
        auto shared = Shared(std::move(handler));
        CommandSpec spec;
        spec.argv = argv;
        spec.timeout = config_.command_timeout;
        spec.max_output = config_.command_output_bytes;
        // The reset tool runs with our environment (the container's PATH, LD_LIBRARY_PATH, …).
        spec.env.clear();
        for (char** e = environ; e != nullptr && *e != nullptr; ++e) spec.env.emplace_back(*e);
        child_ = gns::RunCommand(context_.GetLoop().Io(), std::move(spec),
                                 [this, shared, alive = alive_](CommandResult result) {
                                   if (*alive) child_.reset();
                                   std::move (*shared)(boost::system::error_code{}, std::move(result));
                                 });
      },
      asio::use_awaitable);
}

// ------------------------------------------------------------------------------ bookkeeping

void GpuResetModule::BeginStep(ResetJob& job, GpuReset& gpu, Step step) {
  gpu.step = step;
  gpu.steps.push_back(StepLog{std::string(StepName(step)), "running", NowMs(), 0, ""});
  if (gpu.steps.size() > 64) gpu.steps.erase(gpu.steps.begin());
  step_started_ = SteadyClock::now();
  context_.Log().info("reset of {} ({}): step {}", gpu.uuid, job.id, StepName(step));
  SaveBook();
  WriteStatus(job);
  PublishState();
  Progress(job, fmt::format("{} {}: {} ...", gpu.uuid, static_cast<int>(step), StepName(step)));
}

void GpuResetModule::EndStep(ResetJob& job, GpuReset& gpu, bool ok, std::string message) {
  const int64_t took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - step_started_).count();
  if (!gpu.steps.empty()) {
    StepLog& log = gpu.steps.back();
    log.result = ok ? "ok" : "failed";
    log.duration_ms = took;
    log.message = message;
  }
  if (ok) {
    context_.Log().info("reset of {}: {} ok in {} ms: {}", gpu.uuid, StepName(gpu.step), took, message);
  }
  // Not saved here: what a restart needs is saved by the next step's start, FailGpu or the
  // GPU's end, each right after this; one save fewer per step on the reset's critical path.
  WriteStatus(job);
  PublishState();
  Progress(job, fmt::format("{} {}: {} {} ({} ms): {}", gpu.uuid, static_cast<int>(gpu.step), StepName(gpu.step),
                            ok ? "ok" : "FAILED", took, message));
}

void GpuResetModule::Progress(const ResetJob& job, const std::string& line) {
  const auto [begin, end] = followers_.equal_range(job.id);
  for (auto it = begin; it != end; ++it) it->second->Line(line);
}

void GpuResetModule::LoadBook() {
  if (book_path_.empty()) {
    UpdateModuleHealth();
    Resume();
    return;
  }
  // Bounded and type-checked (loop/state_file.hpp): a FIFO, a device or a huge file here is
  // refused without being read, and moved aside like a corrupt one. Read on the pool: a slow
  // disk holds a pool thread, never the loop; nothing is taken or run until it is back.
  loading_ = true;
  UpdateModuleHealth();
  ReadStateFileOnPool(context_.Pool(), book_path_, kMaxBookBytes, [this, alive = alive_](StateFileRead read) {
    if (!*alive || stopping_) return;
    ApplyBook(std::move(read));
    loading_ = false;
    UpdateModuleHealth();
    Resume();
  });
}

void GpuResetModule::ApplyBook(StateFileRead read) {
  if (read.status == StateFileRead::Status::kMissing) return;
  if (read.status == StateFileRead::Status::kUnreadable) {
    context_.Log().error("cannot read {}: {}", book_path_, read.error);
    return;
  }
  try {
    if (read.status == StateFileRead::Status::kRejected) throw std::runtime_error(read.error);
    book_ = ParseResetBook(read.content);
  } catch (const std::exception& e) {
    // A corrupt record must not crash-loop us: it is kept aside for a human and we start empty.
    // GPUs it held stay Unhealthy through gpu-health's own verdicts (never Healthy unvalidated).
    const auto moved = MoveStateFileAside(book_path_, NowMs() / 1000);
    const std::string note = book_path_ + " is unusable (" + e.what() + "); " +
                             (moved.ok ? "moved to " + moved.moved_to : "not moved aside: " + moved.error) +
                             ", starting with no reset in progress";
    context_.Log().error("{}", note);
    RecordEvent("Warning", "CorruptStateFile", note);
    book_ = ResetBook{};
    return;
  }
  std::size_t open = 0;
  for (const auto& job : book_.jobs) open += job.Finished() ? 0 : 1;
  if (open > 0) context_.Log().warn("{} reset job(s) from before the restart: resuming", open);
}

void GpuResetModule::SaveBook() {
  if (book_path_.empty()) return;
  ++book_version_;
  if (save_in_flight_) return;
  save_in_flight_ = true;
  const uint64_t version = book_version_;
  nlohmann::json j = book_;
  context_.Pool().Run(
      [path = book_path_, text = j.dump(1)] { return WriteFileAtomically(path, text, 0600); },
      [this, alive = alive_, version](FileWriteResult result, std::exception_ptr error) {
        if (!*alive) return;
        save_in_flight_ = false;
        const std::string problem = error ? "exception writing " + book_path_ : result ? std::string() : result.error;
        if (!problem.empty()) {
          context_.Log().error("cannot write {}: {}", book_path_, problem);
        } else {
          saved_version_ = version;
        }
        if (problem != save_problem_) {
          save_problem_ = problem;
          UpdateModuleHealth();
        }
        if (book_version_ > saved_version_ && !(error || !result)) {
          --book_version_;  // SaveBook counts again
          SaveBook();
        }
        wake_.cancel();
      });
}

asio::awaitable<bool> GpuResetModule::Persisted(std::optional<uint64_t> wanted_version) {
  if (book_path_.empty()) co_return true;
  const uint64_t wanted = wanted_version.value_or(book_version_);
  bool asked = false;
  while (saved_version_ < wanted && !stopping_) {
    if (!save_in_flight_) {
      // A save of ours that covers `wanted` failed (read-only or full state dir): no waiting
      // for a disk that may never take it; the caller decides.
      if (asked && !save_problem_.empty()) co_return false;
      SaveBook();
      asked = true;
    }
    co_await Wake(SteadyClock::now() + std::chrono::seconds(5));
  }
  co_return saved_version_ >= wanted;
}

void GpuResetModule::UpdateModuleHealth() {
  if (loading_) {
    // Not ready: no request is taken until the record is restored.
    context_.GetLoop().Post([this, alive = alive_, path = book_path_] {
      if (*alive) context_.SetHealth(ModuleHealth::kUnhealthy, "restoring " + path + ": requests wait");
    });
    return;
  }
  std::string detail;
  if (!save_problem_.empty()) detail = "GPU resets are refused: " + book_path_ + " cannot be written (" + save_problem_ + ")";
  if (!socket_problem_.empty()) {
    detail += (detail.empty() ? "" : "; ") + std::string("reset-gpu unavailable: ") + socket_problem_;
  }
  // Posted: the supervisor clears the detail of a module it marks running after Start.
  context_.GetLoop().Post([this, alive = alive_, detail] {
    if (*alive) context_.SetHealth(detail.empty() ? ModuleHealth::kOk : ModuleHealth::kDegraded, detail);
  });
}

void GpuResetModule::PublishState() {
  // Coalesced: one message per loop turn, made when it is sent. Every change of a burst (a
  // resumed book of N jobs, each refused at once) publishing its own copy of every job would
  // queue N copies of N jobs.
  if (publish_pending_) return;
  publish_pending_ = true;
  context_.GetLoop().Post([this, alive = alive_] {
    if (!*alive) return;
    publish_pending_ = false;
    PublishStateNow();
  });
}

void GpuResetModule::PublishStateNow() {
  GpuResetState state;
  std::size_t open = 0;
  for (const auto& job : book_.jobs) open += job.Finished() ? 0 : 1;
  queue_gauge_->Set(static_cast<double>(open));
  if (current_job_ != nullptr) state.running = current_job_->id;
  if (current_gpu_ != nullptr) {
    state.running_gpu = current_gpu_->uuid;
    state.running_step = std::string(StepName(current_gpu_->step));
  }
  state.jobs = book_.jobs;  // once per published message (coalesced): O(N) per turn, not per change
  context_.GetBus().Publish(std::move(state));
  AnnounceReleases();
}

void GpuResetModule::AnnounceReleases() {
  // Every GPU still to be reset in an open job: its release is coming, so gpu-inventory's NVML
  // event waits turn short now and the release step does not sit out a long one.
  std::set<std::string> ahead;
  for (const auto& job : book_.jobs) {
    if (job.Finished()) continue;
    for (const auto& gpu : job.gpus) {
      if (gpu.outcome.empty()) ahead.insert(gpu.uuid);
    }
  }
  auto& bus = context_.GetBus();
  std::vector<gpu_inventory::NvmlReleaseAhead> changes;
  const auto& announced = bus.LatestByKey<gpu_inventory::NvmlReleaseAhead>();
  for (const auto& [uuid, message] : announced) {
    if (message.ahead && ahead.count(uuid) == 0) changes.push_back({uuid, false});
  }
  for (const auto& uuid : ahead) {
    const auto it = announced.find(uuid);
    if (it == announced.end() || !it->second.ahead) changes.push_back({uuid, true});
  }
  for (auto& change : changes) bus.Publish(std::move(change));
}

// ------------------------------------------------------------------------------- API outputs

void GpuResetModule::WriteStatus(ResetJob& job) {
  if (job.source != "GPUReset" || !kube_) return;
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
  } else if (current_gpu_ != nullptr && current_job_ == &job) {
    message = "resetting " + current_gpu_->uuid + ": step " + std::string(StepName(current_gpu_->step));
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
  StatusSlot& slot = status_[job.object_name];
  slot.job_id = job.id;
  slot.status = std::move(status);
  slot.dirty = true;
  if (!slot.in_flight) SendStatus(job.object_name);
}

void GpuResetModule::SendStatus(const std::string& name) {
  StatusSlot& slot = status_[name];
  if (!kube_ || slot.in_flight || !slot.dirty) return;
  slot.in_flight = true;
  slot.dirty = false;
  kube_->PatchStatus(ObjectsPath().Object(name), kube::PatchType::kMerge, {{"status", slot.status}},
                     std::string(kName), [this, alive = alive_, name](kube::Result result) {
                       if (*alive) OnStatusWritten(name, result);
                     });
}

void GpuResetModule::OnStatusWritten(const std::string& name, const kube::Result& result) {
  StatusSlot& slot = status_[name];
  slot.in_flight = false;
  ResetJob* job = book_.Find(slot.job_id);
  if (result.Ok() || result.http_status == 404) {
    if (result.http_status == 404) context_.Log().info("GPUReset {} is gone; its status is not written", name);
    slot.failures = 0;
    if (!slot.dirty) {
      if (job != nullptr && job->Finished() && !job->final_status_written) {
        job->final_status_written = true;
        SaveBook();
      }
      status_.erase(name);
      return;
    }
    SendStatus(name);
    return;
  }
  ++slot.failures;
  slot.dirty = true;
  context_.Log().warn("writing the status of GPUReset {} failed ({}): retrying", name, result.error);
  status_retry_.expires_after(std::min(milliseconds(30000), milliseconds(250) * (1 << std::min(slot.failures, 7))));
  status_retry_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive || stopping_) return;
    for (auto& [n, s] : status_) {
      if (!s.in_flight && s.dirty) SendStatus(n);
    }
  });
}

void GpuResetModule::Evict(const std::string& pod_namespace, const std::string& pod_name) {
  if (!kube_) {
    context_.Log().warn("cannot evict {}/{}: no API server", pod_namespace, pod_name);
    return;
  }
  const nlohmann::json eviction{{"apiVersion", "policy/v1"},
                                {"kind", "Eviction"},
                                {"metadata", {{"name", pod_name}, {"namespace", pod_namespace}}}};
  kube_->Create(kube::ResourcePath::Core("pods", pod_namespace).Object(pod_name, "eviction"), eviction,
                [this, alive = alive_, pod_namespace, pod_name](kube::Result result) {
                  if (!*alive) return;
                  if (result.Ok()) {
                    context_.Log().info("evicted pod {}/{} for a GPU reset", pod_namespace, pod_name);
                  } else {
                    // 429: a PodDisruptionBudget says not now; the next recheck asks again.
                    context_.Log().warn("eviction of {}/{} refused ({}): {}", pod_namespace, pod_name,
                                        result.http_status, result.error);
                    evicted_.erase(pod_namespace + "/" + pod_name);
                  }
                });
}

void GpuResetModule::RecordEvent(std::string_view type, std::string_view reason, const std::string& note) {
  if (!events_ || node_name_.empty()) return;
  kube::ObjectReference node;
  node.name = node_name_;
  events_->Record(node, type, reason, "GpuReset", note);
}

std::string GpuResetModule::WriteJournal(const std::string& message, int priority, const std::string& uuid) {
  return SendJournalEntry(config_.journal_socket, {{"MESSAGE", message},
                                                   {"PRIORITY", std::to_string(priority)},
                                                   {"SYSLOG_IDENTIFIER", config_.ack_identifier},
                                                   {"GPU_UUID", uuid},
                                                   {"GNS_NODE", node_name_}});
}

std::string GpuResetModule::DescribeGpu(const std::string& uuid) const {
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  const auto* info = inventory != nullptr ? inventory->FindByUuid(uuid) : nullptr;
  return info == nullptr ? uuid : uuid + " (index " + std::to_string(info->index) + ", " + info->pci_bus_id + ")";
}

std::vector<std::string> GpuResetModule::Holders(const std::string& uuid, const gpu_inventory::GpuMaintenanceRead& read,
                                                 bool& map_usable, std::string& map_problem) const {
  std::vector<std::string> holders;
  const auto* map = context_.GetBus().Latest<pod_resources::GpuPodMap>();
  if (map == nullptr) {
    map_problem = "pods unknown (the pod-resources module is not running)";
  } else if (!map->fresh) {
    map_usable = false;
    map_problem = "the kubelet's pod list is not fresh (" + (map->error.empty() ? std::string("not listed yet") : map->error) + ")";
  }
  if (map != nullptr) {
    for (const auto& holder : map->Holders(uuid)) {
      holders.push_back("pod " + holder.namespace_name + "/" + holder.name + " (container " + holder.container + ")");
    }
  }
  if (read.compute_processes) {
    for (const auto& p : *read.compute_processes) holders.push_back("process " + std::to_string(p.pid));
  }
  return holders;
}

int64_t GpuResetModule::NowMs() const {
  return std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
}

}  // namespace gns::gpu_reset
