// The dra-gpu module (gpu.nvidia.com).
#include "modules/dra_gpu/dra_gpu_module.hpp"
#include "loop/atomic_file.hpp"
#include "loop/awaitables.hpp"
#include "loop/gpu_split_config.hpp"
#include "loop/state_load.hpp"
#include "loop/supervisor_messages.hpp"

// GCC 12 at -O2 (GCC bug 109224): Asio's coroutine frame allocation and its sized delete,
// both inlined, are reported as mismatched. They are Asio's matched pair.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "modules/device_plugin/api/mps.hpp"
#include "modules/dra_gpu/messages.hpp"
#include "modules/kube/api/client.hpp"

#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace gns::dra_gpu {

namespace asio = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

constexpr std::string_view kHealthModule = "gpu-health";

std::string Ref(const dra::ClaimRef& claim) { return "ResourceClaim " + claim.namespace_name + "/" + claim.name; }

}  // namespace

DraGpuModule::Config DraGpuModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  const bool written = section.Has("gpus");
  config.gpus = ParseGpuSelection(section, "gpus", GpuSelection{true, {}});
  if (config.gpus.Empty()) section.Fail("gpus", "selects no GPU (disable the module instead)");
  RecordGpuSelection(section, "gpus", site, /*dra=*/true, config.gpus, written);
  const auto version = section.Enum("resourceApiVersion", {"v1", "v1beta2", "v1beta1"}, "v1");
  config.api_version = version == "v1beta1"   ? dra::ResourceApiVersion::kV1beta1
                       : version == "v1beta2" ? dra::ResourceApiVersion::kV1beta2
                                              : dra::ResourceApiVersion::kV1;
  // Below the kubelet's 45 s per-call deadline, so the kubelet always gets our answer.
  config.prepare_timeout =
      section.Duration("prepareTimeout", milliseconds(100), milliseconds(40000), milliseconds(20000));
  config.slice_resync =
      section.Duration("sliceResync", milliseconds(1000), milliseconds(86400000), milliseconds(600000));
  config.node_events_on_corrupt_checkpoint = section.Bool("nodeEventsOnCorruptCheckpoint", true);
  // The kubelet reads a device Unknown once its last report is older than its timeout (30 s for
  // a v1alpha1 kubelet): the whole list goes out again this often (dra_plugin/health_service.hpp).
  config.health_resend =
      section.Duration("healthResend", milliseconds(100), dra::kMaxHealthResend, dra::kDefaultHealthResend);
  config.time_slice_command = section.StringList("timeSliceCommand", config.time_slice_command);
  if (config.time_slice_command.empty() || config.time_slice_command.front().empty()) {
    section.Fail("timeSliceCommand", "must name a program");
  }
  config.time_slice_timeout =
      section.Duration("timeSliceTimeout", milliseconds(100), milliseconds(30000), config.time_slice_timeout);
  config.mps_root = section.String("mpsRoot", device_plugin::kDefaultMpsRoot);
  if (config.mps_root.empty() || config.mps_root.front() != '/') section.Fail("mpsRoot", "must be an absolute path");
  auto cdi = section.Section("cdi");
  config.cdi.driver_root = cdi.String("driverRoot", "/");
  if (config.cdi.driver_root.empty() || config.cdi.driver_root.front() != '/') {
    cdi.Fail("driverRoot", "must be an absolute path");
  }
  config.cdi.hook_path = cdi.String("hookPath", "auto");
  if (!config.cdi.hook_path.empty() && config.cdi.hook_path != "auto" && config.cdi.hook_path.front() != '/') {
    cdi.Fail("hookPath", "must be \"auto\", an absolute path, or empty (no hooks)");
  }
  cdi.Finish();
  const auto effect = section.Enum("taintEffect", {"NoSchedule", "NoExecute"},
                                   std::string(TaintEffectName(kDefaultTaintEffect)));
  config.taint_effect = effect == "NoExecute" ? TaintEffect::kNoExecute : TaintEffect::kNoSchedule;
  config.unmonitored_taint = section.Bool("unmonitoredTaint", false);
  return config;
}

DraGpuModule::DraGpuModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      paths_(dra::MakePluginPaths(context.Site().paths, kDriverName, kStateFolder)),
      node_name_(context.Site().node_name),
      facts_(std::make_shared<const device_plugin::CdiHostFacts>()),
      judge_timer_(context.GetLoop().Io()),
      time_slice_book_path_(paths_.state_dir + "/" + std::string(kTimeSliceBookFile)) {
  dra::KubeletPlugin::Options options;
  options.driver_name = std::string(kDriverName);
  options.paths = paths_;
  options.spec_names = GpuSpecNames();
  options.node_name = node_name_;
  options.api_version = config_.api_version;
  options.slice_resync = config_.slice_resync;
  options.health_resend = config_.health_resend;
  options.node_events_on_corrupt_checkpoint = config_.node_events_on_corrupt_checkpoint;
  options.claim_log_compact_at = config_.claim_log_compact_at;
  plugin_ = std::make_unique<dra::KubeletPlugin>(context_, std::move(options), static_cast<dra::DraDriver&>(*this));
}

DraGpuModule::~DraGpuModule() {
  lifetime_.Close();
  judge_timer_.cancel();
}

void DraGpuModule::Start() {
  if (node_name_.empty()) throw std::runtime_error("the node name is not set; it names the ResourceSlice pool");
  plugin_->FindServices();
  context_.Log().info("serving {} GPUs through DRA as {} (a MIG-enabled GPU as its MIG devices)",
                      config_.gpus.Describe(), kDriverName);
  loading_ = true;
  LoadStateOffLoop(
      context_, lifetime_.Watch(), paths_.checkpoint_file + ", " + paths_.claim_log_file + " and the CDI host facts",
      [paths = paths_, host_root = context_.Site().paths.host_root, cdi = config_.cdi,
       book = time_slice_book_path_, now = NowUnixMs() / 1000] {
        StartFiles files;
        files.claims = dra::KubeletPlugin::ReadClaimState(paths);
        files.facts = device_plugin::DiscoverCdiHostFacts(host_root, cdi);
        files.time_slices = LoadTimeSliceBook(book, now);
        return files;
      },
      [this](StartFiles files) {
        if (plugin_->Stopping()) return;
        loading_ = false;
        ServeWhenJudged(std::move(files));
      });
}

void DraGpuModule::ServeWhenJudged(StartFiles files) {
  auto& bus = context_.GetBus();
  const auto* states = bus.Latest<ModuleStates>();
  const bool health_enabled = states != nullptr && std::any_of(states->modules.begin(), states->modules.end(),
                                                               [](const ModuleStatus& m) { return m.name == kHealthModule; });
  if (health_enabled && bus.Latest<gpu_health::GpuHealthState>() == nullptr) {
    awaiting_judge_ = true;
    waiting_files_ = std::make_unique<StartFiles>(std::move(files));
    judge_sub_ = bus.Subscribe<gpu_health::GpuHealthState>([this](const gpu_health::GpuHealthState&) { OnJudgeState(); });
    judge_timer_.expires_after(kJudgeWait);
    judge_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
      if (ec || !awaiting_judge_) return;
      context_.Log().warn("{} has not published its state after {} s: publishing the slice without its verdicts",
                          kHealthModule, std::chrono::duration_cast<std::chrono::seconds>(kJudgeWait).count());
      OnJudgeState();
    }));
    return;
  }
  try {
    Serve(std::move(files));
  } catch (const std::exception& e) {
    context_.ReportFailure(std::string("start failed: ") + e.what());
  }
}

void DraGpuModule::OnJudgeState() {
  if (!awaiting_judge_) return;
  awaiting_judge_ = false;
  judge_timer_.cancel();
  judge_sub_.Reset();
  auto files = std::move(waiting_files_);
  if (!files || plugin_->Stopping()) return;
  try {
    Serve(std::move(*files));
  } catch (const std::exception& e) {
    context_.ReportFailure(std::string("start failed: ") + e.what());
  }
}

void DraGpuModule::Serve(StartFiles files) {
  for (const auto& warning : files.facts.warnings) context_.Log().warn("CDI: {}", warning);
  facts_ = std::make_shared<const device_plugin::CdiHostFacts>(std::move(files.facts));
  if (!files.time_slices.warning.empty()) context_.Log().warn("time-slice book: {}", files.time_slices.warning);
  // Booked GPUs are not confirmed: the next prepare or unprepare sets each again (or back).
  time_slice_book_ = std::move(files.time_slices.book);
  unmonitored_since_ms_ = NowUnixMs();
  // The inventory first: the slice the core publishes at Serve holds the GPUs already known.
  auto& bus = context_.GetBus();
  if (const auto* inventory = bus.Latest<gpu_inventory::GpuInventory>()) OnInventory(*inventory);
  // And gpu-health's retained verdicts: the first slice already carries their taints, so a
  // restart with an unhealthy GPU writes nothing (the slice in the API has them).
  if (bus.Latest<gpu_health::GpuHealthState>() != nullptr) health_.JudgeSeen(NowUnixMs());
  for (const auto& [key, verdict] : bus.LatestByKey<gpu_health::DeviceHealth>()) health_.OnVerdict(verdict);
  plugin_->Serve(std::move(files.claims));
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>(
      [this](const gpu_inventory::GpuInventory& inventory) { OnInventory(inventory); });
  verdict_sub_ = bus.Subscribe<gpu_health::DeviceHealth>(
      [this](const gpu_health::DeviceHealth& verdict) { OnVerdict(verdict); });
  judge_sub_ = bus.Subscribe<gpu_health::GpuHealthState>([this](const gpu_health::GpuHealthState&) {
    const auto before = Taints(served_);
    if (!health_.JudgeSeen(NowUnixMs())) return;
    plugin_->DeviceHealthChanged();  // Unknown → Healthy
    if (Taints(served_) == before) return;  // no unmonitored taints to take off
    context_.Log().info("gpu-health watches the GPUs: the {} taints removed", kTaintKeyUnmonitored);
    plugin_->Slices().Publish();
    PublishState();
  });
}

void DraGpuModule::OnVerdict(const gpu_health::DeviceHealth& verdict) {
  const auto before = Taints(served_);
  if (!health_.OnVerdict(verdict)) return;
  plugin_->DeviceHealthChanged();
  const auto after = Taints(served_);
  if (after == before) return;  // a GPU not served here, or the same taints
  const std::string which = verdict.RetainKey();
  if (!verdict.healthy) {
    std::string names;
    for (const auto& [name, taints] : after) {
      if (before.count(name) == 0 || before.at(name) != taints) names += (names.empty() ? "" : ", ") + name;
    }
    context_.Log().warn("{}: tainting {} ({}, {})", which, names, TaintEffectName(config_.taint_effect),
                        verdict.reason);
  } else {
    context_.Log().info("{}: healthy again ({}): taints removed", which, verdict.reason);
  }
  plugin_->Slices().Publish();
  PublishState();
}

std::map<std::string, json> DraGpuModule::Taints(const std::vector<gpu_inventory::GpuInfo>& gpus) const {
  std::map<std::string, json> taints;
  // No judge: nobody watches these GPUs (upstream's unmonitored devices), when the site asks.
  const bool unmonitored = config_.unmonitored_taint && !health_.JudgeKnown();
  for (const ServedDevice& device : ServedDevices(gpus)) {
    json t = TaintsFor(HealthOf(device), config_.taint_effect);
    if (unmonitored) t.push_back(UnmonitoredTaint(unmonitored_since_ms_));
    if (!t.empty()) taints.emplace(device.name, std::move(t));
  }
  return taints;
}

GpuHealth DraGpuModule::HealthOf(const ServedDevice& device) const {
  return device.mig == nullptr ? health_.Of(device.gpu->uuid)
                               : health_.OfMig(device.gpu->uuid, device.mig->gpu_instance);
}

dra::DeviceHealthList DraGpuModule::DeviceHealth() const {
  dra::DeviceHealthList list;
  for (const ServedDevice& device : ServedDevices(served_)) {
    const GpuHealth health = HealthOf(device);
    const auto status = health.status == HealthStatus::kHealthy     ? dra::DeviceHealthStatus::kHealthy
                        : health.status == HealthStatus::kUnhealthy ? dra::DeviceHealthStatus::kUnhealthy
                                                                    : dra::DeviceHealthStatus::kUnknown;
    list.push_back(dra::DeviceHealthEntry{node_name_, device.name, status, health.since_unix_ms / 1000, health.message});
  }
  return list;
}

int64_t DraGpuModule::NowUnixMs() const {
  return std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
}

void DraGpuModule::OnInventory(const gpu_inventory::GpuInventory& inventory) {
  // While NVML is unavailable the inventory keeps the last GPUs: the slice stays as it is (a
  // GPU taken out for a reset is refused at prepare, see PlanGpuClaim).
  if (!inventory.available && inventory_seen_) return;
  inventory_seen_ = inventory_seen_ || inventory.available;
  auto served = ServedGpus(inventory, config_.gpus);
  const bool devices_changed = GpuSliceDevices(inventory, served, config_.api_version, Taints(served)) !=
                               GpuSliceDevices(inventory_, served_, config_.api_version, Taints(served_));
  inventory_ = inventory;
  served_ = std::move(served);
  if (devices_changed) {
    context_.Log().info("serving {} GPU(s) through DRA: {} device(s)", served_.size(), ServedDevices(served_).size());
    plugin_->Slices().Publish();
    plugin_->DeviceHealthChanged();
    PublishState();
  }
}

void DraGpuModule::Stop(std::function<void()> done) {
  inventory_sub_.Reset();
  verdict_sub_.Reset();
  judge_sub_.Reset();
  awaiting_judge_ = false;
  waiting_files_.reset();
  judge_timer_.cancel();
  // A time-slice command in flight ends now; its prepare answers as stopped.
  if (time_slice_child_) time_slice_child_->Kill();
  plugin_->Stop([this, alive = lifetime_.Watch(), done = std::move(done)] {
    if (alive) PublishState();
    done();
  });
}

// ---------------------------------------------------------------------------------- driver

dra::ClaimSpecIo DraGpuModule::SpecIo() const {
  dra::ClaimSpecIo io;
  io.write = [dir = paths_.cdi_dir, cdi = config_.cdi, facts = facts_](const dra::PreparedClaim& entry,
                                                                      dra::SpecDurability durability) {
    const auto gpus = GpusOf(entry);
    if (gpus.empty()) return FileWriteResult{false, "claim " + entry.uid + ": its record names no GPU"};
    return dra::WriteClaimSpec(dir, GpuSpecNames(), entry.uid, GpuClaimSpecContent(entry.uid, gpus, cdi, *facts, MpsOf(entry)),
                               durability);
  };
  io.remove = [dir = paths_.cdi_dir](std::string_view uid) { return dra::DeleteClaimSpec(dir, GpuSpecNames(), uid); };
  io.current = [dir = paths_.cdi_dir, cdi = config_.cdi, facts = facts_](const dra::PreparedClaim& entry) {
    const auto gpus = GpusOf(entry);
    return !gpus.empty() &&
           dra::ClaimSpecIsCurrent(dir, GpuSpecNames(), entry.uid,
                                   GpuClaimSpecContent(entry.uid, gpus, cdi, *facts, MpsOf(entry)));
  };
  return io;
}

asio::awaitable<dra::ClaimDecision> DraGpuModule::DecideClaim(dra::ClaimRef claim) {
  if (!inventory_seen_) {
    co_return dra::ClaimDecision::Retryable(Ref(claim) + ": gpu-inventory has not read this node's GPUs yet; the "
                                            "kubelet retries");
  }
  const Clock::SteadyTime deadline = context_.GetClock().Now() + config_.prepare_timeout;
  const std::string path = kube::ResourcePath::Grouped("resource.k8s.io",
                                                       std::string(dra::ApiVersionOnly(config_.api_version)),
                                                       "resourceclaims", claim.namespace_name)
                               .Object(claim.name);
  const kube::Result fetched = co_await plugin_->FetchWithRetry(lifetime_.Watch(), /*list=*/false, path, deadline);
  if (plugin_->Stopping()) co_return dra::ClaimDecision::Stopped();
  if (fetched.http_status == 404) {
    plugin_->SetError(Ref(claim) + ": not found");
    co_return dra::ClaimDecision::Permanent(Ref(claim) + ": not found (deleted?)");
  }
  if (!fetched.Ok()) {
    plugin_->SetError(Ref(claim) + ": cannot fetch: " + fetched.error);
    co_return dra::ClaimDecision::Retryable(Ref(claim) + ": cannot fetch the claim: " + fetched.error);
  }
  const GpuClaimPlan plan = PlanGpuClaim(fetched.object, claim.uid, node_name_, served_, plugin_->DecideView());
  if (!plan.error.empty()) {
    context_.Log().warn("prepare {} (uid {}) failed ({}): {}", claim.namespace_name + "/" + claim.name, claim.uid,
                        plan.permanent ? "permanent" : "retryable", plan.error);
    plugin_->SetError(plan.error);
    co_return plan.permanent ? dra::ClaimDecision::Permanent(plan.error) : dra::ClaimDecision::Retryable(plan.error);
  }
  if (const std::string missing = co_await MissingMigCaps(plan); !missing.empty()) {
    const std::string error = Ref(claim) + ": " + missing + ": a container could not open the MIG device";
    context_.Log().warn("prepare {} (uid {}) failed (retryable): {}", claim.namespace_name + "/" + claim.name,
                        claim.uid, error);
    plugin_->SetError(error);
    co_return dra::ClaimDecision::Retryable(error);
  }
  if (plugin_->Stopping()) co_return dra::ClaimDecision::Stopped();
  const std::optional<ClaimMps> mps = MpsFor(plan, config_.mps_root);
  if (mps) {
    // The operator's control daemon must serve the device before a container may count on it;
    // it may be starting: retryable.
    const std::string why = device_plugin::ProbeMpsControl(device_plugin::MpsControlPath(mps->pipe_dir));
    if (!why.empty()) {
      const std::string error = Ref(claim) + ": " + plan.gpus.front().device +
                                ": sharing.strategy MPS, but its control daemon does not answer (" + why + ")";
      context_.Log().warn("prepare {} (uid {}) failed (retryable): {}", claim.namespace_name + "/" + claim.name,
                          claim.uid, error);
      plugin_->SetError(error);
      co_return dra::ClaimDecision::Retryable(error);
    }
  }
  // The GPUs' time-slices, the claim's own included, before it is prepared.
  TimeSlices wanted = WantedTimeSlices(plugin_->DecideView());
  AddWantedTimeSlices(wanted, plan);
  std::map<std::string, std::string> slice_errors = co_await SettleTimeSlices(std::move(wanted));
  if (plugin_->Stopping()) co_return dra::ClaimDecision::Stopped();
  if (plan.sharing.strategy == "TimeSlicing") {
    for (const ClaimGpu& gpu : plan.gpus) {
      const auto failed = slice_errors.find(gpu.uuid);
      if (gpu.Mig() || failed == slice_errors.end()) continue;
      const std::string error = Ref(claim) + ": " + gpu.device + ": sharing.timeSlicingConfig.interval " +
                                (plan.sharing.interval.empty() ? "Default" : plan.sharing.interval) + ": " +
                                failed->second;
      slice_errors.erase(failed);
      LogTimeSliceErrors(slice_errors, "prepare of " + Ref(claim));
      context_.Log().warn("prepare {} (uid {}) failed (retryable): {}", claim.namespace_name + "/" + claim.name,
                          claim.uid, error);
      plugin_->SetError(error);
      co_return dra::ClaimDecision::Retryable(error);
    }
  }
  LogTimeSliceErrors(slice_errors, "prepare of " + Ref(claim));
  co_return dra::ClaimDecision::Prepare(RecordFor(claim.uid, node_name_, plan, mps));
}

asio::awaitable<std::string> DraGpuModule::MissingMigCaps(const GpuClaimPlan& plan) {
  const auto missing = [&plan](const device_plugin::CdiHostFacts& facts) -> std::string {
    for (const ClaimGpu& gpu : plan.gpus) {
      if (!gpu.Mig()) continue;
      device_plugin::PhysicalDevice device;
      device.minor = gpu.minor;
      device.mig = true;
      device.gpu_instance = gpu.gpu_instance;
      device.compute_instance = gpu.compute_instance;
      std::string error;
      if (device_plugin::MigCapNodes(device, facts, error).empty()) return gpu.device + ": " + error;
    }
    return {};
  };
  if (missing(*facts_).empty()) co_return std::string();
  // Read at start; read again (a driver loaded since, a MIG layout the start did not know).
  auto read = [path = device_plugin::MigMinorsPath(context_.Site().paths.host_root), facts = *facts_]() mutable {
    std::string text, error;
    if (!ReadWholeFile(path, text, error)) return std::make_pair(std::move(facts), "cannot read " + path + ": " + error);
    facts.gi_caps.clear();
    facts.ci_caps.clear();
    device_plugin::ParseMigMinors(text, facts);
    return std::make_pair(std::move(facts), std::string());
  };
  JobResult<std::pair<device_plugin::CdiHostFacts, std::string>> read_back =
      co_await OnPool(context_.Pool(), std::move(read), lifetime_.Watch());
  if (read_back.failure) co_return "cannot read the host's mig-minors";
  if (!read_back.value.second.empty()) co_return read_back.value.second;
  facts_ = std::make_shared<const device_plugin::CdiHostFacts>(std::move(read_back.value.first));
  co_return missing(*facts_);
}

asio::awaitable<std::string> DraGpuModule::AfterUnprepare(dra::ClaimRef claim) {
  // The claim's record is gone: a GPU it set goes back to Default unless another claim asks for
  // an interval. A failure does not hold the unprepare (the pod must go); the book keeps the
  // GPU, and the next prepare or unprepare call tries again.
  TimeSlices wanted = WantedTimeSlices(plugin_->Claims());  // a named local: awaitables.hpp's g++ 12 pitfall
  const std::map<std::string, std::string> errors = co_await SettleTimeSlices(std::move(wanted));
  LogTimeSliceErrors(errors, "unprepare of " + Ref(claim));
  co_return std::string();
}

void DraGpuModule::LogTimeSliceErrors(const std::map<std::string, std::string>& errors, const std::string& after) {
  for (const auto& [uuid, error] : errors) {
    const std::string text = "time-slice of GPU " + uuid + " (after " + after + "): " + error;
    context_.Log().warn("{}; tried again at the next prepare or unprepare", text);
    plugin_->SetError(text);
  }
}

asio::awaitable<std::map<std::string, std::string>> DraGpuModule::SettleTimeSlices(TimeSlices wanted) {
  std::map<std::string, std::string> errors;
  for (const TimeSliceStep& step : TimeSliceSteps(time_slice_book_, time_slices_confirmed_, wanted)) {
    const auto booked = time_slice_book_.find(step.uuid);
    if (step.value != 0 && (booked == time_slice_book_.end() || booked->second != step.value)) {
      // In the book before the command runs: a crash after it leaves the GPU where a later call
      // finds it. Without the book written, the command does not run.
      const TimeSlices before = time_slice_book_;
      time_slice_book_[step.uuid] = step.value;
      time_slices_confirmed_.erase(step.uuid);
      const std::string written = co_await WriteTimeSliceBook();
      if (!written.empty()) {
        time_slice_book_ = before;
        errors[step.uuid] = "not set: " + written;
        continue;
      }
    }
    std::vector<std::string> argv =
        ExpandCommand(config_.time_slice_command, {{"{uuid}", step.uuid}, {"{interval}", std::to_string(step.value)}});
    const std::string shown = fmt::format("{}", fmt::join(argv, " "));
    const CommandResult result = co_await RunTimeSliceCommand(std::move(argv));
    if (plugin_->Stopping()) co_return errors;
    if (!result.Ok()) {
      time_slices_confirmed_.erase(step.uuid);
      std::string output = result.err.empty() ? result.out : result.err;
      while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
      if (const auto nl = output.rfind('\n'); nl != std::string::npos) output.erase(0, nl + 1);
      errors[step.uuid] = "`" + shown + "`: " + result.Describe() + (output.empty() ? "" : ": " + output);
      continue;
    }
    context_.Log().info("GPU {}: time-slice {} set ({})", step.uuid, step.value, shown);
    if (step.value != 0) {
      time_slices_confirmed_.insert(step.uuid);
      continue;
    }
    // Back at Default: out of the book (a failed write only means one more reset after a restart).
    time_slices_confirmed_.erase(step.uuid);
    if (time_slice_book_.erase(step.uuid) != 0) {
      const std::string written = co_await WriteTimeSliceBook();
      if (!written.empty()) context_.Log().warn("time-slice book: {}", written);
    }
  }
  PublishState();
  co_return errors;
}

asio::awaitable<std::string> DraGpuModule::WriteTimeSliceBook() {
  auto write = [path = time_slice_book_path_, text = TimeSliceBookText(time_slice_book_)] {
    const FileWriteResult written = WriteFileAtomically(path, text);
    return written.ok ? std::string() : written.error;
  };
  JobResult<std::string> done = co_await OnPool(context_.Pool(), std::move(write), lifetime_.Watch());
  if (done.failure) co_return "cannot write " + time_slice_book_path_;
  co_return done.value;
}

asio::awaitable<CommandResult> DraGpuModule::RunTimeSliceCommand(std::vector<std::string> argv) {
  auto start = [this, argv = std::move(argv)](auto resume) {
    CommandSpec spec;
    spec.argv = argv;
    spec.timeout = config_.time_slice_timeout;
    spec.env = InheritedEnvironment();  // nvidia-smi finds what we find (PATH, LD_LIBRARY_PATH)
    time_slice_child_ = gns::RunCommand(context_.GetLoop().Io(), std::move(spec),
                                        [this, resume, alive = lifetime_.Watch()](CommandResult result) {
                                          if (alive) time_slice_child_.reset();
                                          resume(std::move(result));
                                        });
  };
  return AwaitCallback<CommandResult>(std::move(start), lifetime_.Watch());
}

void DraGpuModule::Prepared(const dra::PreparedClaim& entry) {
  std::string devices;
  for (const auto& d : entry.Devices()) devices += (devices.empty() ? "" : ", ") + d.device;
  context_.Log().info("prepared {} (uid {}): {}", entry.namespace_name + "/" + entry.name, entry.uid, devices);
}

json DraGpuModule::SliceDevices() const {
  return GpuSliceDevices(inventory_, served_, config_.api_version, Taints(served_));
}

std::string DraGpuModule::SliceNote() const {
  return std::to_string(served_.size()) + " GPU(s), " + std::to_string(ServedDevices(served_).size()) + " device(s)";
}

// ---------------------------------------------------------------------------------- state

void DraGpuModule::PublishState() {
  DraGpuState state;
  state.registered = plugin_->Registered();
  state.registration_error = plugin_->RegistrationError();
  for (const ServedDevice& device : ServedDevices(served_)) {
    state.served.push_back(device.name);
    const GpuHealth health = HealthOf(device);
    if (health.status == HealthStatus::kUnhealthy) {
      state.tainted.push_back(device.name + ": " + health.taint_key + "=" + health.taint_value + ":" +
                              std::string(TaintEffectName(config_.taint_effect)));
    }
    if (config_.unmonitored_taint && !health_.JudgeKnown()) {
      state.tainted.push_back(device.name + ": " + std::string(kTaintKeyUnmonitored) + ":None");
    }
  }
  for (const auto& [uid, entry] : plugin_->Claims().claims) {
    DraGpuState::Claim c{uid, entry.namespace_name, entry.name, {}};
    for (const auto& d : entry.Devices()) c.devices.push_back(d.device);
    state.prepared_claims.push_back(std::move(c));
  }
  state.slice_generation = plugin_->Slices().Generation();
  state.slice_publishes = plugin_->Slices().Publishes();
  state.last_error = plugin_->LastError();
  state.time_slices = time_slice_book_;
  context_.GetBus().Publish(std::move(state));
}

}  // namespace gns::dra_gpu
