// The gpu-reset module: requests, the node's maintenance slot, and the eight steps of one
// GPU's reset as a coroutine (see gpu_reset_module.hpp).
#include "modules/gpu_reset/gpu_reset_module.hpp"

#include "loop/atomic_file.hpp"
#include "loop/awaitables.hpp"
#include "loop/config_checks.hpp"
#include "loop/exception_text.hpp"
#include "loop/state_file.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/api/maintenance.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_reset/intake.hpp"
#include "modules/gpu_reset/journal_sender.hpp"
#include "modules/gpu_reset/object_status.hpp"
#include "modules/journald/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"
#include "modules/pod_resources/messages.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

constexpr std::string_view kGroup = "janitor.dgxc.nvidia.com";
constexpr std::string_view kVersion = "v1alpha1";
constexpr std::string_view kResource = "gpuresets";

kube::ResourcePath ObjectsPath() {
  return kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kResource));
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
      status_retry_(context.GetLoop().Io()),
      saved_wake_(context.GetLoop().Io()) {
  RunnerSettings settings;
  settings.holders = config_.holders;
  settings.holders_timeout = config_.holders_timeout;
  settings.holders_recheck = config_.holders_recheck;
  settings.hold_timeout = config_.hold_timeout;
  settings.release_timeout = config_.release_timeout;
  settings.command = config_.command;
  settings.settle = config_.settle;
  settings.healthy_timeout = config_.healthy_timeout;
  settings.ack_identifier = config_.ack_identifier;
  runner_ = std::make_unique<ResetRunner>(context.GetLoop().Io().get_executor(), static_cast<NodeMaintenance&>(*this),
                                          std::move(settings), context.Log());
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
  objects_other_executor_ = &m.Counter(
      "gpu_node_supervisor_gpu_reset_objects_other_executor_total",
      "GPUReset objects of this node left alone because another controller (NVSentinel's janitor) writes their status");
  queue_gauge_ = &m.Gauge("gpu_node_supervisor_gpu_reset_queue", "GPU reset jobs queued or running on this node");
  last_overhead_seconds_ = &m.Gauge("gpu_node_supervisor_gpu_reset_last_overhead_seconds",
                                    "The last successful reset's time outside the reset command, hold to Healthy");
  last_command_seconds_ = &m.Gauge("gpu_node_supervisor_gpu_reset_last_command_seconds",
                                   "The last reset command's own run time");
}

GpuResetModule::~GpuResetModule() { lifetime_.Close(); }

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
    runner_->Wake();
    if (config_.auto_reset && !h.healthy && h.recommended_action == "COMPONENT_RESET") {
      Intake([this, uuid = h.uuid] { OnVerdictForAutoReset(uuid); });
    }
  }));
  subs_.push_back(bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory&) { runner_->Wake(); }));
  subs_.push_back(bus.Subscribe<pod_resources::GpuPodMap>([this](const pod_resources::GpuPodMap&) { runner_->Wake(); }));
  subs_.push_back(bus.Subscribe<gpu_inventory::XidObservation>([this](const gpu_inventory::XidObservation& x) {
    runner_->NoteXid(x.uuid, "XID " + std::to_string(x.xid) + " (NVML)", std::nullopt);
  }));
  subs_.push_back(bus.Subscribe<gpu_health::HealthEvent>([this](const gpu_health::HealthEvent& e) {
    if (e.is_healthy || e.error_code.empty()) return;
    if (e.source != "kernel" && e.source != "nvml") return;
    // The runner counts it only against the GPU it validates, and only if judged since then.
    const int64_t judged = e.generated_seconds * 1000 + e.generated_nanos / 1'000'000;
    for (const auto& entity : e.entities_impacted) {
      if (entity.type == "GPU_UUID") runner_->NoteXid(entity.value, "XID " + e.error_code.front() + " (" + e.source + ")", judged);
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
  saved_wake_.cancel();
  runner_->Stop();  // ends its waits and kills the reset command
  if (!running_) {
    maintenance_.reset();  // gpu-inventory's service (and the NVML library it keeps) goes with it
    done();
    return;
  }
  stop_done_ = std::move(done);
}

// ---------------------------------------------------------------------------------- requests

void GpuResetModule::OnObjectEvent(const kube::ResourceEvent& event) {
  if (event.type == kube::ResourceEvent::Type::kDeleted) {  // a running reset finishes anyway
    if (const auto meta = kube::ObjectMeta::From(*event.object)) other_executor_.erase("GPUReset/" + meta->name + "/" + meta->uid);
    return;
  }
  OnObject(*event.object);
}

void GpuResetModule::OnObject(const nlohmann::json& object) {
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  ObjectIntake intake = ReadGpuResetObject(object, node_name_, inventory, NowMs(), kName);
  if (!intake.other_executor.empty()) {
    LeaveToOtherExecutor(intake, object.value(nlohmann::json::json_pointer("/metadata/name"), std::string()));
    return;
  }
  if (!intake.ours) return;
  if (ResetJob* known = book_.Find(intake.job.id)) {
    if (known->Finished() && !known->final_status_written) WriteStatus(*known);
    return;
  }
  const std::string name = intake.job.object_name;
  if (!intake.problem.empty()) {
    context_.Log().warn("GPUReset {}: {}", name, intake.problem);
    book_.jobs.push_back(std::move(intake.job));
    ResetJob& stored = book_.jobs.back();
    SaveBook();
    resets_refused_->Inc();
    WriteStatus(stored);
    PublishState();
    return;
  }
  const std::string joined = Enqueue(std::move(intake.job));
  context_.Log().info("GPUReset {} for {}: job {}", name, fmt::join(intake.uuids, ","), joined);
}

void GpuResetModule::LeaveToOtherExecutor(const ObjectIntake& intake, const std::string& name) {
  if (!other_executor_.insert(intake.id).second) return;  // said once per object
  objects_other_executor_->Inc();
  ResetJob* known = book_.Find(intake.id);
  if (known == nullptr || known->Finished()) {
    context_.Log().warn("GPUReset {} left alone: {}. One controller resets a node's GPUs: set gpu-reset's "
                        "watchObjects: false on nodes where NVSentinel's janitor resets GPUs, or turn janitor's "
                        "GPU reset off (gpu_reset README)",
                        name, intake.other_executor);
    return;
  }
  // We took it first and another controller acts on it too: ours finishes (a reset stopped
  // halfway is worse than one done twice), and writes no status over theirs.
  context_.Log().error("GPUReset {}: {} while our job {} is {}: two executors; ours finishes without writing "
                       "the object's status. Set watchObjects: false here or turn janitor's GPU reset off",
                       name, intake.other_executor, known->id, known->phase);
  status_.erase(name);
}

void GpuResetModule::OnCliLine(std::string_view line, std::shared_ptr<AdminSocket::Reply> reply) {
  const CliIntake intake = ReadResetGpuLine(line, context_.GetBus().Latest<gpu_inventory::GpuInventory>());
  if (!intake.error.empty()) {
    reply->Finish(intake.error);
    return;
  }
  ResetJob job;
  job.id = "cli/" + std::to_string(book_.next_cli++);
  job.source = "cli";
  job.created_unix_ms = NowMs();
  job.gpus.push_back(NewGpuReset(intake.uuid));
  const std::string id = Enqueue(std::move(job));
  reply->Line("job " + id + ": reset of " + DescribeGpu(intake.uuid) +
              (current_job_ != nullptr && current_job_->id != id ? " (queued behind " + current_job_->id + ")" : ""));
  followers_.emplace(id, std::move(reply));
}

void GpuResetModule::OnVerdictForAutoReset(const std::string& uuid) {
  const auto& verdicts = context_.GetBus().LatestByKey<gpu_health::DeviceHealth>();
  const auto it = verdicts.find(uuid);
  if (it == verdicts.end() || it->second.healthy) return;
  const int64_t since = it->second.since_unix_ms;
  if (auto seen = auto_seen_.find(uuid); seen != auto_seen_.end() && seen->second == since) return;
  const std::string id = AutoResetJobId(uuid, since);
  if (book_.Find(id) != nullptr || book_.FindActiveFor(uuid) != nullptr) return;
  // Only a GPU nothing holds: with holders, the drainer (or the operator) decides.
  switch (CheckAutoReset(uuid, context_.GetBus().Latest<pod_resources::GpuPodMap>())) {
    case AutoReset::kPodMapNotFresh:
      context_.Log().info("autoReset: {} wants COMPONENT_RESET, but the pod map is not fresh; not resetting", uuid);
      return;
    case AutoReset::kHeldByPods:
      context_.Log().info("autoReset: {} wants COMPONENT_RESET but pods or DRA claims hold it (on it, its MIG devices or "
                          "through a claim); left to the drainer",
                          uuid);
      auto_seen_[uuid] = since;
      return;
    case AutoReset::kReset:
      break;
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
  asio::co_spawn(context_.GetLoop().Io(), RunJobs(), lifetime_.Guard([this](std::exception_ptr error) {
    running_ = false;
    if (error) {
      const std::string what = DescribeException(error);
      context_.Log().error("the reset runner failed: {}", what);
      context_.ReportFailure("reset runner: " + what);
    }
    if (stop_done_) {
      maintenance_.reset();
      auto done = std::move(stop_done_);
      done();
    }
  }));
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
    co_await runner_->RunGpu(job, gpu);
    if (stopping_) {
      current_job_ = nullptr;
      co_return;
    }
  }
  FinishJob(job);
  current_job_ = nullptr;
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

// The runner's callback APIs, awaited (loop/awaitables.hpp); ungated, as they were before.
asio::awaitable<gpu_inventory::GpuMaintenanceRead> GpuResetModule::Inspect(const std::string& uuid) {
  auto start = [maintenance = maintenance_, uuid](auto resume) { maintenance->Inspect(uuid, std::move(resume)); };
  return AwaitCallback<gpu_inventory::GpuMaintenanceRead>(std::move(start));
}

asio::awaitable<std::string> GpuResetModule::SetPersistence(const std::string& uuid, bool enabled) {
  auto start = [maintenance = maintenance_, uuid, enabled](auto resume) {
    maintenance->SetPersistence(uuid, enabled, std::move(resume));
  };
  return AwaitCallback<std::string>(std::move(start));
}

asio::awaitable<CommandResult> GpuResetModule::RunResetCommand(const std::vector<std::string>& argv) {
  auto start = [this, argv](auto resume) {
    CommandSpec spec;
    spec.argv = argv;
    spec.timeout = config_.command_timeout;
    spec.max_output = config_.command_output_bytes;
    // The reset tool runs with our environment (the container's PATH, LD_LIBRARY_PATH, …).
    spec.env = InheritedEnvironment();
    child_ = gns::RunCommand(context_.GetLoop().Io(), std::move(spec),
                             [this, resume, alive = lifetime_.Watch()](CommandResult result) {
                               if (alive) child_.reset();
                               resume(std::move(result));
                             });
  };
  return AwaitCallback<CommandResult>(std::move(start));
}

// ------------------------------------------------------------------------------ bookkeeping

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
  ReadStateFileOnPool(context_.Pool(), book_path_, kMaxBookBytes, lifetime_.Guard([this](StateFileRead read) {
    if (stopping_) return;
    ApplyBook(std::move(read));
    loading_ = false;
    UpdateModuleHealth();
    Resume();
  }));
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
      lifetime_.Guard([this, version](FileWriteResult result, std::exception_ptr error) {
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
        saved_wake_.cancel();  // SavedAtLeast checks again
      }));
}

asio::awaitable<bool> GpuResetModule::SavedAtLeast(std::optional<uint64_t> wanted_version) {
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
    saved_wake_.expires_after(std::chrono::seconds(5));
    boost::system::error_code ec;
    co_await saved_wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return saved_version_ >= wanted;
}

void GpuResetModule::UpdateModuleHealth() {
  if (loading_) {
    // Not ready: no request is taken until the record is restored.
    context_.GetLoop().Post(lifetime_.Guard([this, path = book_path_] {
      context_.SetHealth(ModuleHealth::kUnhealthy, "restoring " + path + ": requests wait");
    }));
    return;
  }
  std::string detail;
  if (!save_problem_.empty()) detail = "GPU resets are refused: " + book_path_ + " cannot be written (" + save_problem_ + ")";
  if (!socket_problem_.empty()) {
    detail += (detail.empty() ? "" : "; ") + std::string("reset-gpu unavailable: ") + socket_problem_;
  }
  // Posted: the supervisor clears the detail of a module it marks running after Start.
  context_.GetLoop().Post(lifetime_.Guard([this, detail] {
    context_.SetHealth(detail.empty() ? ModuleHealth::kOk : ModuleHealth::kDegraded, detail);
  }));
}

void GpuResetModule::PublishState() {
  // Coalesced: one message per loop turn, made when it is sent. Every change of a burst (a
  // resumed book of N jobs, each refused at once) publishing its own copy of every job would
  // queue N copies of N jobs.
  if (publish_pending_) return;
  publish_pending_ = true;
  context_.GetLoop().Post(lifetime_.Guard([this] {
    publish_pending_ = false;
    PublishStateNow();
  }));
}

void GpuResetModule::PublishStateNow() {
  GpuResetState state;
  std::size_t open = 0;
  for (const auto& job : book_.jobs) open += job.Finished() ? 0 : 1;
  queue_gauge_->Set(static_cast<double>(open));
  if (current_job_ != nullptr) state.running = current_job_->id;
  if (const GpuReset* gpu = runner_->Current(); gpu != nullptr) {
    state.running_gpu = gpu->uuid;
    state.running_step = std::string(StepName(gpu->step));
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
  if (other_executor_.count(job.id) != 0) {
    // Another controller writes this object's status: ours would overwrite it.
    if (job.Finished() && !job.final_status_written) {
      job.final_status_written = true;
      SaveBook();
    }
    return;
  }
  const GpuReset* running = current_job_ == &job ? runner_->Current() : nullptr;
  nlohmann::json status = ObjectStatus(job, running);
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
                     std::string(kName), lifetime_.Guard([this, name](kube::Result result) {
                       OnStatusWritten(name, result);
                     }));
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
  status_retry_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    for (auto& [n, s] : status_) {
      if (!s.in_flight && s.dirty) SendStatus(n);
    }
  }));
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
                lifetime_.Guard([this, pod_namespace, pod_name](kube::Result result) {
                  if (result.Ok()) {
                    context_.Log().info("evicted pod {}/{} for a GPU reset", pod_namespace, pod_name);
                  } else {
                    // 429: a PodDisruptionBudget says not now; the next recheck asks again.
                    context_.Log().warn("eviction of {}/{} refused ({}): {}", pod_namespace, pod_name,
                                        result.http_status, result.error);
                    runner_->EvictionRefused(pod_namespace, pod_name);
                  }
                }));
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

// ------------------------------------------------------------- the runner's node (NodeMaintenance)

bool GpuResetModule::HealthRunning() const { return context_.GetBus().Latest<gpu_health::GpuHealthState>() != nullptr; }

std::optional<NodeMaintenance::Verdict> GpuResetModule::VerdictOf(const std::string& uuid) const {
  const auto& verdicts = context_.GetBus().LatestByKey<gpu_health::DeviceHealth>();
  const auto it = verdicts.find(uuid);
  if (it == verdicts.end()) return std::nullopt;
  return Verdict{it->second.healthy, it->second.reason};
}

NodeMaintenance::GpuView GpuResetModule::Gpu(const std::string& uuid) const {
  GpuView view;
  const auto* inventory = context_.GetBus().Latest<gpu_inventory::GpuInventory>();
  if (inventory == nullptr) return view;
  view.inventory_known = true;
  view.available = inventory->available;
  view.error = inventory->error;
  if (const auto* info = inventory->FindByUuid(uuid); info != nullptr) {
    view.present = true;
    view.released = info->released;
    view.pci_bus_id = info->pci_bus_id;
    if (info->fabric) view.fabric_state = static_cast<int>(info->fabric->state);
  }
  return view;
}

NodeMaintenance::PodView GpuResetModule::Pods(const std::string& uuid) const {
  return PodHoldersOf(uuid, context_.GetBus().Latest<pod_resources::GpuPodMap>());
}

void GpuResetModule::RequestRelease(const std::string& uuid, bool release, const std::string& why) {
  context_.GetBus().Publish(gpu_inventory::NvmlReleaseRequest{release, why, uuid});
}

void GpuResetModule::RestorePersistence(const std::string& uuid) {
  if (maintenance_) maintenance_->SetPersistence(uuid, true, [](std::string) {});
}

void GpuResetModule::KillResetCommand() {
  if (child_) child_->Kill();
}

asio::awaitable<bool> GpuResetModule::Persisted() { return SavedAtLeast(std::nullopt); }

asio::awaitable<bool> GpuResetModule::JobRecorded(const std::string& job_id) {
  const auto accepted = accepted_version_.find(job_id);
  return SavedAtLeast(accepted != accepted_version_.end() ? accepted->second : 0);
}

void GpuResetModule::StepChanged(ResetJob& job) {
  WriteStatus(job);
  PublishState();
}

void GpuResetModule::GpuEnded(const GpuReset& gpu) {
  if (gpu.outcome == "succeeded") {
    resets_ok_->Inc();
    last_command_seconds_->Set(static_cast<double>(gpu.command_ms) / 1000.0);
    last_overhead_seconds_->Set(static_cast<double>(gpu.total_ms - gpu.command_ms) / 1000.0);
  } else if (gpu.outcome == "refused") {
    resets_refused_->Inc();
  } else {
    resets_failed_->Inc();
  }
}

int64_t GpuResetModule::NowMs() const {
  return std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
}

}  // namespace gns::gpu_reset
