// The gpu-health module: wiring, the health-stream consumer and the checkpoint.
#include "modules/gpu_health/gpu_health_module.hpp"

#include "loop/atomic_file.hpp"
#include "loop/awaitables.hpp"
#include "loop/config_checks.hpp"
#include "loop/exception_text.hpp"
#include "loop/state_file.hpp"
#include "loop/state_load.hpp"
#include "modules/gpu_health/checks_config.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <system_error>

namespace gns::gpu_health {
namespace {

// The site config tree as a YAML node, for ParseSiteOverrides (scalars stay text; the parser
// converts them).
YAML::Node ToYaml(const ConfigValue& value) {
  switch (value.kind) {
    case ConfigValue::Kind::kNull:
      return YAML::Node();
    case ConfigValue::Kind::kScalar:
      return YAML::Node(value.scalar);
    case ConfigValue::Kind::kSequence: {
      YAML::Node out(YAML::NodeType::Sequence);
      for (const auto& item : value.items) out.push_back(ToYaml(item));
      return out;
    }
    case ConfigValue::Kind::kMap: {
      YAML::Node out(YAML::NodeType::Map);
      for (const auto& entry : value.entries) out[entry.key] = ToYaml(entry.value);
      return out;
    }
  }
  return YAML::Node();
}

// A published verdict that says the same as another (since aside: a verdict decided again is
// not a change).
bool SameVerdict(const DeviceHealth& a, const DeviceHealth& b) {
  return a.healthy == b.healthy && a.reason == b.reason && a.xid == b.xid &&
         a.recommended_action == b.recommended_action && a.pci == b.pci;
}

// One pass of the sampler under a time limit. Not a coroutine (the g++ 12 pitfall,
// loop/awaitables.hpp): it hands its arguments to the awaitables it returns.
boost::asio::awaitable<Timed<gpu_inventory::HealthSample>> SamplePass(
    boost::asio::io_context& io, std::shared_ptr<gpu_inventory::GpuHealthSampler> sampler, uint32_t groups,
    std::chrono::milliseconds limit, Gate::Ticket alive) {
  auto start = [sampler = std::move(sampler), groups](auto resume) { sampler->Sample(groups, std::move(resume)); };
  auto pass = AwaitCallback<gpu_inventory::HealthSample>(std::move(start), alive);
  return WithDeadline(io, limit, std::move(pass), std::move(alive));
}

}  // namespace

GpuHealthModule::Config GpuHealthModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  config.catalog_path = ReadAbsolutePath(section, "catalog", "", /*allow_empty=*/true);
  const XidCatalog& builtin = XidCatalog::Builtin();
  config.catalog = builtin;
  config.catalog_source = "built-in (" + std::to_string(builtin.size()) + " entries)";
  // A disabled module opens no file: its section is still checked for keys and types.
  if (!config.catalog_path.empty() && section.ModuleEnabled()) {
    try {
      const XidCatalog site = XidCatalog::LoadFile(config.catalog_path);
      config.catalog = builtin.LaidOver(site);
      config.catalog_source += " + " + config.catalog_path + " (" + std::to_string(site.size()) + " entries)";
    } catch (const gpu_health::ConfigError& e) {
      section.Fail("catalog", e.what());
    }
  }
  config.sxid_catalog_path = ReadAbsolutePath(section, "sxidCatalog", "", /*allow_empty=*/true);
  const SxidCatalog& sxid_builtin = SxidCatalog::Builtin();
  config.sxid_catalog = sxid_builtin;
  config.sxid_catalog_source = "built-in (" + std::to_string(sxid_builtin.size()) + " entries)";
  if (!config.sxid_catalog_path.empty() && section.ModuleEnabled()) {
    try {
      const SxidCatalog site = SxidCatalog::LoadFile(config.sxid_catalog_path);
      config.sxid_catalog = sxid_builtin.LaidOver(site);
      config.sxid_catalog_source +=
          " + " + config.sxid_catalog_path + " (" + std::to_string(site.size()) + " entries)";
    } catch (const gpu_health::ConfigError& e) {
      section.Fail("sxidCatalog", e.what());
    }
  }
  if (const ConfigValue* overrides = section.Raw("overrides"); overrides != nullptr) {
    try {
      config.overrides = ParseSiteOverrides(ToYaml(*overrides), overrides->where.ToString(), section.Path() + ".overrides");
    } catch (const gpu_health::ConfigError& e) {
      section.Fail("overrides", e.key_path() + ": " + e.message());
    }
  }
  config.check_name = section.String("checkName", config.check_name);
  config.condition_type = section.String("conditionType", config.condition_type);
  if (config.condition_type.empty()) section.Fail("conditionType", "must not be empty");
  config.agent = section.String("agent", config.agent);
  config.admin_socket = section.Bool("adminSocket", config.admin_socket);
  if (config.admin_socket) {
    if (const auto problem = SocketPathProblem(site.paths.state_dir + "/admin.sock"); !problem.empty()) {
      section.Fail("adminSocket", "admin.sock in paths.stateDir: " + problem);
    }
  }
  config.watch_annotation = section.Bool("watchAnnotation", config.watch_annotation);
  config.recent_events = static_cast<std::size_t>(section.Int("recentEvents", 0, 1000, 32));
  config.event_log = static_cast<std::size_t>(
      section.Int("eventLog", 0, static_cast<int64_t>(HealthCheckpoint::kMaxEventLog), static_cast<int64_t>(config.event_log)));
  config.checkpoint_interval = section.Duration("checkpointInterval", std::chrono::milliseconds(10),
                                                std::chrono::minutes(10), config.checkpoint_interval);
  config.checks = ParseChecksConfig(section);
  return config;
}

GpuHealthModule::GpuHealthModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      warn_(context.GetClock()),
      judge_(config_.catalog, config_.overrides,
             XidJudge::Settings{config_.agent, config_.check_name, context.Site().node_name}, context.Log(),
             XidJudge::Outputs{
                 [this](const DeviceHealth& h) { OnVerdict(h); },
                 [this](HealthEvent e, XidJudge::KubeEvent k) { OnEvent(std::move(e), k); },
                 [this](std::string_view gpu, uint32_t xid, uint64_t total) { OnCounted(gpu, xid, total); },
                 [this](std::string_view kind, std::string_view what) { Bad(kind, what); },
                 [this] { duplicates_total_->Inc(); },
                 [this] { suppressed_total_->Inc(); },
                 [this] { recoveries_total_->Inc(); },
                 [this](uint32_t sxid, bool fatal, bool mapped) { OnSxid(sxid, fatal, mapped); },
                 [this](uint32_t) { beyond_lookback_total_->Inc(); }}),
      checks_(config_.checks),
      check_book_(config_.checks.clear_after),
      schedule_(config_.checks.intervals),
      check_timer_(context.GetLoop().Io()),
      report_(context.GetBus(), context.Metrics(), context.GetClock(), context.Log(),
              HealthReport::Settings{context.Site().node_name, config_.condition_type, std::string(kName),
                                     config_.recent_events, config_.catalog_source}),
      operator_(context.GetLoop().Io(), context.GetBus(), context.GetClock(), context.Log(), context.Site().node_name,
                std::string(kName), [this](std::string_view target, std::string_view who) { return SetHealthy(target, who); },
                [this] {
                  nlohmann::json out = nlohmann::json::object();
                  for (const auto& h : Published()) out[h.RetainKey()] = h;
                  return out.dump();
                }),
      position_timer_(context.GetLoop().Io()) {
  const auto& paths = context.Site().paths;
  if (config_.admin_socket && !paths.state_dir.empty()) admin_path_ = paths.state_dir + "/admin.sock";
  if (!paths.state_dir.empty()) {
    state_path_ = paths.state_dir + "/gpu-health/devices.json";
    writer_ = std::make_unique<CheckpointWriter>(
        context.Pool(), state_path_, [this] { return TakeSnapshot(); },
        [this](uint64_t covers, bool ok, const std::string& error) { OnWritten(covers, ok, error); });
  }
  auto& m = context.Metrics();
  events_total_ = &m.Counter("gpu_node_supervisor_gpu_health_events_total", "Health events emitted");
  suppressed_total_ = &m.Counter("gpu_node_supervisor_gpu_health_suppressed_total",
                                 "XID occurrences swallowed by the per-(GPU, XID) rate limit");
  duplicates_total_ = &m.Counter("gpu_node_supervisor_gpu_health_xid_duplicates_total",
                                 "XID reports folded into one occurrence (NVML and the kernel log both saw it)");
  recoveries_total_ = &m.Counter("gpu_node_supervisor_gpu_health_recoveries_total",
                                 "Devices made Healthy again (reset ack, new boot, operator)");
  stale_lines_total_ = &m.Counter("gpu_node_supervisor_gpu_health_stale_lines_total",
                                  "Health-stream lines of an earlier request dropped (read again from the position)");
  state_writes_failed_ = &m.Counter("gpu_node_supervisor_gpu_health_state_write_failures_total",
                                    "Failed writes of gpu-health/devices.json");
  state_corrupt_ = &m.Counter("gpu_node_supervisor_gpu_health_state_file_corrupt_total",
                              "gpu-health/devices.json files found corrupt or of an unknown version and moved aside");
  beyond_lookback_total_ = &m.Counter("gpu_node_supervisor_gpu_health_xid_beyond_lookback_total",
                                     "XID occurrences older than their lookback when read: counted, not acted on");
  restored_total_ = &m.Counter("gpu_node_supervisor_gpu_health_restored_total",
                               "Unhealthy verdicts of the same boot restored from gpu-health/devices.json");
  check_passes_ = &m.Counter("gpu_node_supervisor_gpu_health_check_passes_total",
                             "Passes of the polled checks answered by gpu-inventory's sampler");
  check_event_passes_ = &m.Counter("gpu_node_supervisor_gpu_health_check_event_passes_total",
                                   "Passes of the polled checks an NVML ECC or clock event asked for");
  check_passes_failed_ = &m.Counter("gpu_node_supervisor_gpu_health_check_passes_failed_total",
                                    "Passes of the polled checks that judged nothing (NVML unavailable, a pass past its "
                                    "deadline, no answer within passTimeout)");
  check_pass_seconds_ = &m.Gauge("gpu_node_supervisor_gpu_health_check_pass_seconds",
                                 "How long the last pass of the polled checks took on the pool");
  judge_.SetSxidCatalog(config_.sxid_catalog);
  // A validated reset takes the checks' latched conditions with the XID verdict, and the
  // GPU's counters start again.
  judge_.OnResetHealed([this](const std::string& uuid) {
    checks_.Forget(uuid);
    ConditionsChanged(check_book_.Heal(uuid, "GPU reset occurred"));
  });
  checks_state_.status = config_.checks.enabled ? "not started" : "disabled (checks.enabled: false)";
  for (std::size_t i = 0; i < config_.checks.intervals.size(); ++i) {
    checks_state_.intervals_ms.emplace_back(std::string(GroupName(i)), config_.checks.intervals[i].count());
  }
  std::random_device random;
  generation_base_ = (static_cast<uint64_t>(random()) << 32 | random()) & 0x7fffffffffff0000ull;
}

GpuHealthModule::~GpuHealthModule() { lifetime_.Close(); }

int64_t GpuHealthModule::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(context_.GetClock().WallNow().time_since_epoch())
      .count();
}

void GpuHealthModule::Start() {
  // Before anything can change a verdict: what this boot already decided, and where in the
  // health stream that was. Read on the pool (a slow or large file must not stall the loop);
  // until it is back nothing is subscribed, so no line is judged and no verdict published that
  // a restored Unhealthy one would have to override (the device plugin would have offered it).
  if (state_path_.empty()) {
    Serve();
    return;
  }
  namespace fs = std::filesystem;
  const std::string& root = context_.Site().paths.host_root;
  std::string boot_path = (fs::path(root.empty() ? "/" : root) / "proc/sys/kernel/random/boot_id").string();
  loading_ = true;
  LoadStateOffLoop(
      context_, lifetime_.Watch(), state_path_,
      [boot_path, state_path = state_path_] { return ReadStartFiles(boot_path, state_path); },
      [this](StartFiles files) {
        if (stopping_) return;
        loading_ = false;
        try {
          LoadCheckpoint(std::move(files));
          PublishEventLog();  // what the last run let out, for a consumer a kill -9 kept it from
          Serve();
        } catch (const std::exception& e) {
          context_.ReportFailure(std::string("start failed: ") + e.what());
          return;
        }
        UpdateModuleHealth();
      });
}

void GpuHealthModule::Serve() {
  auto& bus = context_.GetBus();
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory& inv) {
    judge_.OnInventory(inv.gpus, NowMs());
    inventory_seen_ = true;
    inventory_pci_.clear();
    for (const auto& gpu : inv.gpus) inventory_pci_.push_back(gpu.pci_bus_id);
    Report();
    StartChecks();  // gpu-inventory (and its sampler) may have come after us
  });
  kernel_sub_ = bus.Subscribe<journald::KernelLine>(
      [this](const journald::KernelLine& line) { OnHealthLine(line, false); });
  unit_sub_ = bus.Subscribe<journald::UnitLine>([this](const journald::UnitLine& line) {
    if (line.acknowledgement) OnHealthLine(line, true);
  });
  pods_sub_ = bus.Subscribe<pod_resources::GpuPodMap>(
      [this](const pod_resources::GpuPodMap& map) { pods_ = map; });
  nvml_sub_ = bus.Subscribe<gpu_inventory::XidObservation>(
      [this](const gpu_inventory::XidObservation& xid) { judge_.OnNvmlXid(xid, NowMs()); });
  nvml_health_sub_ = bus.Subscribe<gpu_inventory::NvmlHealthEvent>(
      [this](const gpu_inventory::NvmlHealthEvent& event) { OnNvmlEvent(event); });
  // Last: its retained state (journald running) makes us ask for the health stream at once.
  journal_state_sub_ = bus.Subscribe<journald::JournalState>(
      [this](const journald::JournalState& state) { OnJournalState(state); });
  try {
    operator_.StartSocket(admin_path_);
  } catch (const std::exception& e) {
    // The socket is optional (set-healthy also comes through the Node annotation): a state
    // directory that cannot take it (read-only, full) must not keep the verdicts from flowing.
    admin_problem_ = e.what();
    context_.Log().error("admin socket {} unavailable ({}): set-healthy only through the Node annotation",
                         admin_path_, admin_problem_);
    // After Start returns: the supervisor clears the detail of a module it marks running.
    context_.GetLoop().Post(lifetime_.Guard([this] { UpdateModuleHealth(); }));
  }
  // kube's services as they are now: the supervisor restarts this module when kube comes.
  auto& services = context_.GetServices();
  report_.UseKube(services.Find<kube::KubeClient>(), services.Find<kube::EventRecorder>());
  if (!corrupt_note_.empty()) {
    if (const auto recorder = services.Find<kube::EventRecorder>(); recorder && !context_.Site().node_name.empty()) {
      kube::ObjectReference node;
      node.name = context_.Site().node_name;
      recorder->Record(node, "Warning", "CorruptStateFile", "LoadCheckpoint", corrupt_note_);
    }
    corrupt_note_.clear();
  }
  if (config_.watch_annotation) {
    operator_.WatchAnnotation(services.Find<kube::InformerRegistry>(), services.Find<kube::KubeClient>());
  }
  Report();
  StartChecks();
  StartHostServices();
  context_.Log().info("XID catalog {}, {} ignored, {} critical, {} thresholds, {} per-XID site entries; SXid catalog {}{}",
                      config_.catalog_source, config_.overrides.ignore.size(), config_.overrides.critical.size(),
                      config_.overrides.thresholds.size(), config_.overrides.xids.size(), config_.sxid_catalog_source,
                      admin_path_.empty() ? "" : ", admin socket " + admin_path_);
}

void GpuHealthModule::Stop(std::function<void()> done) {
  stopping_ = true;
  stop_done_ = std::move(done);
  operator_.Stop();
  kernel_sub_.Reset();
  unit_sub_.Reset();
  journal_state_sub_.Reset();
  nvml_sub_.Reset();
  position_timer_.cancel();
  check_timer_.cancel();
  for (auto& followed : host_services_) followed.watcher->Stop();
  // journald stops reading for us; our next instance asks again from what is written now.
  if (!reader_.empty()) {
    journald::HealthStreamRequest request;
    request.consumer = std::string(kName);
    request.reader = reader_;
    request.active = false;
    context_.GetBus().Publish(std::move(request));
  }
  if (CanPersist() && writer_) {
    writer_->Dirty();  // done in OnWritten, once everything is on disk
    return;
  }
  FinishStop();
}

void GpuHealthModule::FinishStop() {
  if (!stop_done_) return;
  Release(change_);  // nothing more can be made durable: what is left goes now
  auto done = std::move(stop_done_);
  stop_done_ = nullptr;
  lifetime_.Close();
  done();
}

// --- the health stream ------------------------------------------------------------------

void GpuHealthModule::OnJournalState(const journald::JournalState& state) {
  if (!state.boot_id.empty()) OnBoot(state.boot_id);
  if (!state.reader.empty() && state.reader != reader_) RequestStream(state.reader);
}

void GpuHealthModule::RequestStream(const std::string& reader) {
  reader_ = reader;
  generation_ = generation_base_ + (++requests_ & 0xffff);
  journald::HealthStreamRequest request;
  request.consumer = std::string(kName);
  request.reader = reader;
  request.active = true;
  request.generation = generation_;
  request.after = consumed_;
  context_.Log().info("asking journald {} for the health stream {}", reader,
                      consumed_.cursor.empty() ? "from the head of the boot" : "after the last line handled");
  context_.GetBus().Publish(std::move(request));
}

void GpuHealthModule::OnHealthLine(const journald::JournalLine& line, bool acknowledgement) {
  if (line.generation != 0 && line.generation != generation_) {
    // Read for an earlier request and still queued: the current one reads it again.
    stale_lines_total_->Inc();
    return;
  }
  if (!line.boot_id.empty()) OnBoot(line.boot_id);
  const bool positioned = line.generation != 0 && !line.cursor.empty();
  // The position moves before the judge acts on the line: a verdict or event it causes takes
  // a checkpoint at once (the snapshot is taken inside the call), and that checkpoint must
  // hold this line's position beside the count the line added. Moved after, a kill -9 once
  // that checkpoint landed read the line again and counted it twice.
  if (positioned) {
    consumed_ = journald::JournalPosition{line.boot_id, line.cursor, line.monotonic_usec, line.realtime_usec};
  }
  judge_.OnKernelLine(line.message, line.realtime_usec, acknowledgement, NowMs());
  if (positioned) PositionMoved();
}

void GpuHealthModule::OnBoot(const std::string& boot_id) {
  if (boot_id == boot_id_) return;
  const bool first = boot_id_.empty();
  boot_id_ = boot_id;
  judge_.SetBoot(boot_id);  // the boot history's boot, the first one included
  if (first) {
    ResolveBoot(boot_id);
    Report();
    return;
  }
  // A reboot resets every GPU: the checks' conditions and counters start again too.
  checks_.ForgetAll();
  ConditionsChanged(check_book_.HealAll("new boot"));
  judge_.OnNewBoot(boot_id, NowMs());
  // Without the host's boot ID the verdicts belong to the boot journald reports.
  if (!boot_from_host_) {
    if (const auto normal = NormalizeBootId(boot_id); !normal.empty() && normal != persist_boot_) {
      persist_boot_ = normal;
      Persist();
    }
  }
  Report();
}

// --- the judge's outputs ------------------------------------------------------------------

void GpuHealthModule::OnVerdict(const DeviceHealth& health) {
  // At once: the device plugin stops offering a failed GPU without waiting for the disk. A
  // whole GPU's verdict goes out combined with the checks' conditions (a GPU instance's as it is:
  // the checks judge whole GPUs).
  if (health.gpu_instance == kWholeGpu) {
    Republish(health.uuid);
  } else {
    context_.GetBus().Publish(health);
  }
  Persist();
  Report();
}

void GpuHealthModule::Republish(const std::string& uuid, std::string_view why) {
  const DeviceHealth* xid = judge_.Verdicts().Find(uuid);
  auto combined = CombinedVerdict(uuid, xid, check_book_.Of(uuid));
  const auto known = published_.find(uuid);
  DeviceHealth next;
  if (combined) {
    next = std::move(*combined);
  } else {
    // Healthy now: worth saying only if it was said Unhealthy.
    if (known == published_.end() || known->second.healthy) return;
    if (xid != nullptr && why.empty()) {
      next = *xid;  // the XID judge healed it: its verdict says how
    } else {
      next = known->second;
      next.healthy = true;
      next.reason = why.empty() ? "no check condition holds" : std::string(why);
      next.xid = 0;
      next.recommended_action.clear();
      next.since_unix_ms = NowMs();
    }
  }
  if (known != published_.end() && SameVerdict(known->second, next)) return;
  if (next.pci.empty()) next.pci = judge_.Directory().PciForUuid(uuid);
  published_[uuid] = next;
  context_.GetBus().Publish(next);
}

std::vector<DeviceHealth> GpuHealthModule::Published() const {
  std::vector<DeviceHealth> out;
  std::set<std::string, std::less<>> seen;
  for (const DeviceHealth& h : judge_.Verdicts().All()) {
    if (h.gpu_instance == kWholeGpu) {
      seen.insert(h.uuid);
      const auto it = published_.find(h.uuid);
      out.push_back(it != published_.end() ? it->second : h);
    } else {
      out.push_back(h);
    }
  }
  for (const auto& [uuid, h] : published_) {
    if (seen.count(uuid) == 0) out.push_back(h);
  }
  return out;
}

void GpuHealthModule::OnEvent(HealthEvent event, XidJudge::KubeEvent k8s) {
  // Join health to pods: the workloads on a GPU that turned unhealthy are named in the event
  // (and so in the Node Event), for whoever drains or reschedules them.
  if (!event.is_healthy) {
    for (const auto& entity : event.entities_impacted) {
      if (entity.type != "GPU_UUID") continue;
      for (const auto& holder : pods_.Holders(entity.value)) {
        std::string pod = holder.namespace_name + "/" + holder.name;
        if (std::find(event.pods.begin(), event.pods.end(), pod) == event.pods.end()) event.pods.push_back(std::move(pod));
      }
    }
  }
  KeepInEventLog(event);
  outbox_.push_back(Outgoing{++change_, std::move(event), k8s});
  if (CanPersist() && writer_) {
    writer_->Dirty();
  } else {
    Release(change_);  // nothing can be made durable: it goes now
  }
}

void GpuHealthModule::OnCounted(std::string_view gpu, uint32_t xid, uint64_t total) {
  auto it = xid_series_.find(std::make_pair(gpu, xid));
  if (it == xid_series_.end()) {
    auto& series = context_.Metrics().Counter(
        "gpu_node_supervisor_xid_errors_total", "XIDs seen, by GPU (UUID, or PCI address when unknown) and XID",
        {{"gpu", gpu.empty() ? "unknown" : std::string(gpu)}, {"xid", xid == 0 ? "other" : std::to_string(xid)}});
    it = xid_series_.emplace(std::make_pair(std::string(gpu), xid), &series).first;
  }
  // The count is the judge's (restored from the checkpoint), so a restart neither resets nor
  // repeats it.
  it->second->Set(static_cast<double>(total));
}

void GpuHealthModule::OnSxid(uint32_t sxid, bool fatal, bool mapped) {
  // Not in the checkpoint (unlike XID counts): after kill -9 the lines read again since the last
  // checkpoint are counted again.
  context_.Metrics()
      .Counter("gpu_node_supervisor_sxid_errors_total",
               "NVSwitch SXid reports in the kernel log, by SXid, severity (the line's, or the SXid catalog's) and "
               "whether a GPU of ours is wired to the port",
               {{"sxid", std::to_string(sxid)},
                {"severity", fatal ? "fatal" : "non-fatal"},
                {"mapped", mapped ? "true" : "false"}})
      .Inc();
}

void GpuHealthModule::Bad(std::string_view kind, std::string_view what) {
  context_.Metrics()
      .Counter("gpu_node_supervisor_gpu_health_bad_input_total", "Unusable or unexpected input, by kind",
               {{"kind", std::string(kind)}})
      .Inc();
  warn_.Warn(context_.Log(), kind, what);
}

void GpuHealthModule::Report() {
  const auto verdicts = Published();
  report_.Verdicts(verdicts, judge_.KnownGpus());
  report_.PublishState(boot_id_, verdicts, judge_.Directory().Learned());
}

std::string GpuHealthModule::SetHealthy(std::string_view target, std::string_view who) {
  // The checks' conditions go first (a fault still there is found again by the next pass), so
  // the XID judge's verdicts turn the GPUs Healthy at once.
  const std::string why = "set healthy by " + std::string(who);
  const auto xid_unhealthy = judge_.Verdicts().UnhealthyUuids();
  std::vector<CheckBook::Change> healed;
  if (target == "all") {
    healed = check_book_.HealAll(why);
  } else if (target.rfind("GPU-", 0) == 0) {
    healed = check_book_.Heal(std::string(target), why);
  }
  std::set<std::string> only_checks;  // GPUs Unhealthy through a check alone
  for (const auto& change : healed) {
    if (change.uuid == kNodeKey || change.condition.severity == Severity::kWarning) continue;
    if (std::find(xid_unhealthy.begin(), xid_unhealthy.end(), change.uuid) == xid_unhealthy.end()) {
      only_checks.insert(change.uuid);
    }
  }
  ConditionsChanged(healed);
  std::string answer = judge_.SetHealthy(target, who, NowMs());
  if (only_checks.empty() || answer.rfind("ok:", 0) != 0) return answer;
  if (target == "all") return "ok: " + std::to_string(xid_unhealthy.size() + only_checks.size()) + " device(s) set healthy";
  return "ok: 1 device(s) set healthy";
}

// --- the polled checks --------------------------------------------------------------------

std::size_t GpuHealthModule::KnownGpus() const { return judge_.KnownGpus(); }

void GpuHealthModule::StartChecks() {
  if (!config_.checks.enabled || checks_running_ || stopping_) return;
  if (schedule_.Enabled() == 0) {
    checks_state_.status = "disabled (every group is off)";
    PublishChecks();
    return;
  }
  if (!context_.GetServices().Find<gpu_inventory::GpuHealthSampler>()) {
    const std::string status = "no GpuHealthSampler (gpu-inventory not running): no polled checks";
    if (checks_state_.status != status) {
      checks_state_.status = status;
      context_.Log().info("{}; XIDs are still judged", status);
      PublishChecks();
    }
    return;
  }
  if (!inventory_seen_) {
    checks_state_.status = "waiting for gpu-inventory's first inventory";
    PublishChecks();
    return;  // its first message starts them
  }
  checks_running_ = true;
  checks_state_.status = "running";
  PublishChecks();
  auto ended = [this](std::exception_ptr error) {
    checks_running_ = false;
    if (!error) return;
    const std::string what = DescribeException(error);
    context_.Log().error("the polled checks failed: {}", what);
    context_.ReportFailure("polled checks: " + what);
  };
  boost::asio::co_spawn(context_.GetLoop().Io(), RunChecks(lifetime_.Watch()), lifetime_.Guard(std::move(ended)));
}

// `alive` by value: co_spawn starts the coroutine one loop turn later. One timer for the next
// group due; one pass (all GPUs) for every group due then.
boost::asio::awaitable<void> GpuHealthModule::RunChecks(Gate::Ticket alive) {
  namespace asio = boost::asio;
  while (alive && !stopping_) {
    const auto next = schedule_.NextDue();
    if (!next) co_return;
    const auto now = context_.GetClock().Now();
    // An NVML event's groups go at once, no sooner than kEventPassGap after the last pass an
    // event asked for (a storm of SBE events is one pass a second, not one per event).
    event_groups_ &= schedule_.Enabled();
    const bool event_due = event_groups_ != 0 && (!last_event_pass_ || *last_event_pass_ + kEventPassGap <= now);
    if (*next > now && !event_due) {
      auto wake = *next;
      if (event_groups_ != 0) wake = std::min(wake, *last_event_pass_ + kEventPassGap);
      check_timer_.expires_after(wake - now);
      boost::system::error_code ec;
      co_await check_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;  // the loop's condition says whether we still run (OnNvmlEvent cancels the wait)
    }
    uint32_t groups = *next <= now ? schedule_.Due(now) : 0;
    if (event_due) {
      groups |= event_groups_;
      event_groups_ = 0;
      last_event_pass_ = now;
      check_event_passes_->Inc();
    }
    schedule_.Ran(groups, now);
    auto sampler = context_.GetServices().Find<gpu_inventory::GpuHealthSampler>();
    if (!sampler) {
      checks_state_.status = "no GpuHealthSampler (gpu-inventory stopped): no polled checks";
      PublishChecks();
      co_return;  // the inventory's next message starts them again
    }
    auto timed = co_await SamplePass(context_.GetLoop().Io(), std::move(sampler), groups, config_.checks.pass_timeout,
                                     alive);
    if (!alive || stopping_) co_return;
    if (timed.value) {
      OnSample(*timed.value);
    } else {
      gpu_inventory::HealthSample failed;
      failed.groups = groups;
      failed.error = timed.timed_out ? "the sampler did not answer within checks.passTimeout" : "the sampler threw";
      OnSample(failed);
    }
  }
}

void GpuHealthModule::OnNvmlEvent(const gpu_inventory::NvmlHealthEvent& event) {
  using Kind = gpu_inventory::NvmlHealthEvent::Kind;
  const uint32_t group = event.kind == Kind::kClock ? gpu_inventory::kHealthThermal : gpu_inventory::kHealthMemory;
  if (!checks_running_ || stopping_ || (schedule_.Enabled() & group) == 0) return;
  event_groups_ |= group;
  check_timer_.cancel();  // a wait for the next poll ends now; a pass under way picks it up next
}

void GpuHealthModule::OnSample(const gpu_inventory::HealthSample& sample) {
  ++checks_state_.passes;
  check_passes_->Inc();
  checks_state_.last_ok = sample.ok;
  checks_state_.last_groups = sample.groups;
  checks_state_.last_unix_ms = sample.taken_unix_ms != 0 ? sample.taken_unix_ms : NowMs();
  checks_state_.last_pass_micros = sample.pass_micros;
  check_pass_seconds_->Set(static_cast<double>(sample.pass_micros) / 1e6);
  if (!sample.ok) {
    // Nothing new is judged: every condition stays as it is (no clean pass counted either).
    // gpu-inventory marks the inventory unavailable itself when NVML hangs.
    ++checks_state_.failed_passes;
    check_passes_failed_->Inc();
    checks_state_.last_error = sample.error.empty() ? "the pass failed" : sample.error;
    warn_.Warn(context_.Log(), "check_pass_failed", "a pass of the polled checks judged nothing: " + checks_state_.last_error);
    PublishChecks();
    return;
  }
  checks_state_.last_error.clear();
  const int64_t now = NowMs();
  const auto found = checks_.Judge(sample, KnownGpus(), inventory_pci_);
  std::vector<CheckBook::Change> changes;
  for (const auto& gpu : found.gpus) {
    auto more = check_book_.Apply(gpu.uuid, gpu.pci, gpu.findings, now);
    changes.insert(changes.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  if (found.node) {
    auto more = check_book_.Apply(std::string(kNodeKey), "", {*found.node}, now);
    changes.insert(changes.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  ConditionsChanged(changes);
  JudgeHostServices();
  PublishChecks();
}

// --- the host services ---------------------------------------------------------------------

void GpuHealthModule::StartHostServices() {
  if (!config_.checks.enabled || !host_services_.empty() || stopping_) return;
  for (auto& service : HostServices(config_.checks.host_services)) {
    host_services_.push_back(FollowedService{std::move(service), {}, nullptr});
  }
  for (std::size_t i = 0; i < host_services_.size(); ++i) {
    imex_health::SystemdUnitWatcher::Options options;
    options.bus_address = config_.checks.host_services.bus_address;
    options.unit = host_services_[i].service.unit;
    // Index, not pointer: host_services_ is not resized after this loop.
    host_services_[i].watcher = std::make_unique<imex_health::SystemdUnitWatcher>(
        context_.GetLoop().Io(), options,
        [this, i](const imex_health::UnitState& unit) {
          host_services_[i].unit = unit;
          JudgeHostServices();
          PublishChecks();
        },
        context_.Logger());
    host_services_[i].watcher->Start();
    context_.Log().info("following {} over D-Bus ({}) for {}", options.unit,
                        imex_health::SystemBusAddress(options.bus_address), host_services_[i].service.check);
  }
}

void GpuHealthModule::JudgeHostServices() {
  if (host_services_.empty() || stopping_) return;
  Findings findings;
  for (const auto& followed : host_services_) {
    if (!followed.unit.known && !followed.unit.error.empty()) {
      warn_.Warn(context_.Log(), "host_service_unknown:" + followed.service.unit,
                 followed.service.check + " not judged: " + followed.service.unit + ": " + followed.unit.error);
    }
    if (auto finding = JudgeHostService(followed.service, followed.unit)) findings.push_back(std::move(*finding));
  }
  if (findings.empty()) return;
  ConditionsChanged(check_book_.Apply(std::string(kNodeKey), "", findings, NowMs()));
}

void GpuHealthModule::ConditionsChanged(const std::vector<CheckBook::Change>& changes) {
  if (changes.empty()) return;
  bool fatal = false;
  std::vector<std::pair<std::string, std::string>> gpus;  // (uuid, why it cleared)
  for (const auto& change : changes) {
    const Condition& c = change.condition;
    fatal = fatal || c.severity == Severity::kFatal;
    const bool node = change.uuid == kNodeKey;
    if (!node) {
      const auto it = std::find_if(gpus.begin(), gpus.end(), [&](const auto& g) { return g.first == change.uuid; });
      // What a Healthy verdict says: "NvLinkDown cleared after 2 clean pass(es)", or what
      // healed the GPU ("GPU reset occurred", "set healthy by …", "new boot").
      const bool by_itself = change.why.rfind("cleared after", 0) == 0;
      std::string why = change.appeared ? std::string() : by_itself ? c.check + " " + change.why : change.why;
      if (it == gpus.end()) {
        gpus.emplace_back(change.uuid, std::move(why));
      } else if (!change.appeared) {
        it->second = std::move(why);
      }
    }
    if (change.appeared) {
      context_.Log().warn("{} ({}, {}): {}", c.check, SeverityName(c.severity), ActionName(c.action), c.message);
    } else {
      context_.Log().info("{} on {}: {}", c.check, change.uuid, change.why);
    }
    context_.Metrics()
        .Gauge("gpu_node_supervisor_gpu_health_check_condition",
               "Conditions of the polled checks that hold (1) or held and cleared (0), by GPU and check",
               {{"gpu", change.uuid}, {"check", c.check}, {"severity", std::string(SeverityName(c.severity))}})
        .Set(change.appeared ? 1 : 0);
    // NVSentinel's HealthEvent: checkName = the check; a cleared condition is a healthy event
    // of the same check, so the one it clears can be found.
    HealthEvent event;
    event.agent = config_.agent;
    event.check_name = c.check;
    event.node_name = context_.Site().node_name;
    event.source = "check";
    const int64_t ms = NowMs();
    event.generated_seconds = ms / 1000;
    event.generated_nanos = static_cast<int32_t>((ms % 1000) * 1'000'000);
    event.is_fatal = c.severity == Severity::kFatal;
    event.is_healthy = !change.appeared;
    const RecommendedAction action = change.appeared ? c.action : RecommendedAction::kNone;
    event.recommended_action = static_cast<int>(action);
    event.recommended_action_name = std::string(ActionName(action));
    event.message = change.appeared ? c.message : c.check + " cleared: " + change.why;
    if (change.appeared && !c.error_code.empty()) event.error_code = {c.error_code};
    if (!node) {
      const std::string pci = change.pci.empty() ? judge_.Directory().PciForUuid(change.uuid) : change.pci;
      if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
      event.entities_impacted.push_back({"GPU_UUID", change.uuid});
    }
    // Node Events for what changes a verdict (warnings: the HealthEvent, metrics, /debug/state).
    const bool record = c.severity != Severity::kWarning;
    OnEvent(std::move(event), XidJudge::KubeEvent{record, change.appeared ? "Warning" : "Normal",
                                                  change.appeared ? "GpuCheckFailed" : "GpuCheckCleared"});
  }
  for (const auto& [uuid, why] : gpus) Republish(uuid, why);
  if (fatal) Persist();
  Report();
}

void GpuHealthModule::PublishChecks() {
  GpuHealthChecks state = checks_state_;
  for (const auto& [gpu, checks] : check_book_.All()) {
    for (const auto& [check, h] : checks) {
      const Condition& c = h.condition;
      state.conditions.push_back(GpuHealthChecks::Held{gpu, c.check, std::string(ComponentName(c.component)),
                                                       std::string(SeverityName(c.severity)),
                                                       std::string(ActionName(c.action)), c.message, c.error_code,
                                                       h.since_unix_ms});
    }
  }
  context_.GetBus().Publish(std::move(state));
}

// --- the checkpoint: <stateDir>/gpu-health/devices.json -----------------------------------

GpuHealthModule::StartFiles GpuHealthModule::ReadStartFiles(const std::string& boot_path,
                                                             const std::string& state_path) {
  StartFiles files;
  files.boot_path = boot_path;
  std::string error;
  files.boot_read = ReadWholeFile(boot_path, files.boot_text, error);
  // Bounded and type-checked (a FIFO, /dev/zero or a huge file here is refused, not read). The
  // file holds a verdict and XID counts per GPU: kilobytes; 1 MiB parses in milliseconds.
  files.state = ReadStateFile(state_path, 1u << 20);
  return files;
}

void GpuHealthModule::LoadCheckpoint(StartFiles files) {
  const std::string& boot_path = files.boot_path;
  std::string error;
  if (files.boot_read) {
    persist_boot_ = NormalizeBootId(files.boot_text);
    if (persist_boot_.empty()) Bad("bad_boot_id", boot_path + " does not hold a boot ID");
  }
  boot_from_host_ = !persist_boot_.empty();
  if (!boot_from_host_) {
    context_.Log().info("{} unreadable: the saved verdicts wait for the boot journald reports", boot_path);
  }

  auto& read = files.state;
  if (read.status == StateFileRead::Status::kMissing) return;
  if (read.status == StateFileRead::Status::kUnreadable) {
    Bad("unreadable_state_file", read.error + "; starting with every device Healthy");
    return;
  }
  std::optional<HealthCheckpoint> saved;
  if (read.status == StateFileRead::Status::kRejected) {
    error = read.error;
  } else {
    saved = HealthCheckpoint::Parse(read.content, error);
  }
  if (!saved) {
    const auto moved = MoveStateFileAside(state_path_, NowMs() / 1000);
    state_corrupt_->Inc();
    const std::string note = state_path_ + ": " + error + "; " +
                             (moved.ok ? "moved to " + moved.moved_to : "could not move it aside (" + moved.error + ")") +
                             ", starting with every device Healthy and the health stream from the head of the boot";
    context_.Log().error("{}", note);
    corrupt_note_ = note;  // a Node Event once kube's services are picked up (Start)
    return;
  }
  // The position is journald's to judge (it knows the current boot): whatever the boot, the
  // stream resumes after it, or at the head of a newer boot.
  consumed_ = saved->journal;
  // The boot history is no boot's: it is what escalation across boots remembers.
  judge_.RestoreBootHistory(std::move(saved->xid_boots));
  // So is the event log: its events left (or were about to leave) whatever boot it was.
  for (const auto& event : saved->event_log) KeepInEventLog(event);
  if (!boot_from_host_) {
    awaiting_boot_ = std::move(*saved);
    return;
  }
  if (saved->boot_id == persist_boot_) {
    Restore(*saved);
    return;
  }
  context_.Log().info("the saved verdicts belong to boot {}, this is boot {}: every device starts Healthy",
                      saved->boot_id.empty() ? "(unknown)" : saved->boot_id, persist_boot_);
  Persist();  // the file now says which boot it is
}

void GpuHealthModule::ResolveBoot(const std::string& boot_id) {
  if (boot_from_host_ || state_path_.empty()) return;
  const std::string normal = NormalizeBootId(boot_id);
  if (normal.empty()) return;
  persist_boot_ = normal;
  if (awaiting_boot_) {
    auto saved = std::move(*awaiting_boot_);
    awaiting_boot_.reset();
    if (saved.boot_id == normal) {
      Restore(saved);
    } else {
      context_.Log().info("the saved verdicts belong to boot {}, journald reports boot {}: not restored",
                          saved.boot_id.empty() ? "(unknown)" : saved.boot_id, normal);
    }
  }
  // Whatever this run decided while the boot was unknown, and the file's boot.
  Persist();
}

void GpuHealthModule::Restore(const HealthCheckpoint& saved) {
  std::size_t restored = 0;
  std::vector<std::string> gpus;
  for (const auto& h : saved.devices) {
    const auto held = saved.held_by.find(h.RetainKey());
    if (!judge_.Restore(h, held != saved.held_by.end() ? &held->second : nullptr)) continue;
    ++restored;
    context_.Log().warn("{} stays Unhealthy (restored, boot {}): {}, recommended action {}", h.uuid, saved.boot_id,
                        h.reason, h.recommended_action);
    if (h.gpu_instance == kWholeGpu) {
      gpus.push_back(h.uuid);
    } else {
      context_.GetBus().Publish(h);
    }
  }
  for (const auto& [uuid, held] : saved.conditions) {
    if (!check_book_.Restore(uuid, held)) continue;
    ++restored;
    context_.Log().warn("{} stays Unhealthy (restored, boot {}): {}", uuid, saved.boot_id, ConditionReason(held.condition));
    if (std::find(gpus.begin(), gpus.end(), uuid) == gpus.end()) gpus.push_back(uuid);
  }
  for (const auto& uuid : gpus) Republish(uuid);
  if (!saved.conditions.empty()) PublishChecks();
  restored_total_->Inc(static_cast<double>(restored));
  judge_.RestoreCounts(saved.xid_counts);
  for (const auto& c : judge_.Counts().All()) OnCounted(c.gpu, c.xid, c.count);
  Report();
}

void GpuHealthModule::Persist() {
  ++change_;
  if (CanPersist() && writer_) writer_->Dirty();
}

void GpuHealthModule::PositionMoved() {
  // Lines that changed nothing: their position may wait (a crash reads them again, and they
  // change nothing again); bounded by checkpointInterval.
  if (!CanPersist() || position_timer_armed_ || stopping_) return;
  position_timer_armed_ = true;
  position_timer_.expires_after(config_.checkpoint_interval);
  position_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    position_timer_armed_ = false;
    if (!ec && writer_) writer_->Dirty();
  }));
}

CheckpointWriter::Snapshot GpuHealthModule::TakeSnapshot() {
  HealthCheckpoint checkpoint;
  checkpoint.boot_id = persist_boot_;
  checkpoint.devices = judge_.Verdicts().All();
  for (const auto& d : checkpoint.devices) {
    if (const auto& held = judge_.Verdicts().HeldBy(d.RetainKey()); !held.empty()) checkpoint.held_by[d.RetainKey()] = held;
  }
  checkpoint.xid_boots = judge_.BootHistory().All();
  checkpoint.event_log.assign(event_log_.begin(), event_log_.end());
  checkpoint.journal = consumed_;
  checkpoint.xid_counts = judge_.Counts().All();
  checkpoint.conditions = check_book_.Fatal();
  return CheckpointWriter::Snapshot{checkpoint.Serialize(), change_};
}

void GpuHealthModule::OnWritten(uint64_t covers, bool ok, const std::string& error) {
  if (!ok) {
    state_writes_failed_->Inc();
    // The events cannot be made durable now; holding them back would lose them at the next
    // crash anyway. A crash before the next good write may then repeat them.
    warn_.Warn(context_.Log(), "state_write_failed", error + "; events are sent without waiting for the disk");
  } else if (!persist_problem_.empty()) {
    context_.Log().info("{} written again: health is persisted", state_path_);
  }
  if ((ok ? std::string() : error) != persist_problem_) {
    persist_problem_ = ok ? std::string() : error;
    report_.Persistence(persist_problem_);
    UpdateModuleHealth();
  }
  Release(covers);
  if (stopping_ && writer_ && writer_->Idle()) FinishStop();
}

void GpuHealthModule::UpdateModuleHealth() {
  // Verdicts flow either way; /readyz says what is missing. Not persisted is not ready: a
  // restart would not know this boot's set-healthy, and its events could repeat.
  if (!persist_problem_.empty()) {
    context_.SetHealth(ModuleHealth::kUnhealthy, "health is not persisted (verdicts still published): " + persist_problem_);
  } else if (!admin_problem_.empty()) {
    context_.SetHealth(ModuleHealth::kDegraded, "admin socket unavailable: " + admin_problem_);
  } else {
    context_.SetHealth(ModuleHealth::kOk);
  }
}

void GpuHealthModule::Release(uint64_t covers) {
  bool released = false;
  while (!outbox_.empty() && outbox_.front().seq <= covers) {
    Outgoing out = std::move(outbox_.front());
    outbox_.pop_front();
    events_total_->Inc();
    report_.Event(out.event, out.k8s.record, out.k8s.type, out.k8s.reason);
    context_.GetBus().Publish(std::move(out.event));
    released = true;
  }
  // After the events themselves: a consumer has taken them from the topic before it sees them
  // in the log, so the log gives it only what it missed.
  if (released) PublishEventLog();
  if (!stopping_) Report();
}

void GpuHealthModule::KeepInEventLog(const HealthEvent& event) {
  if (config_.event_log == 0) return;
  event_log_.push_back(event);
  while (event_log_.size() > config_.event_log) event_log_.pop_front();
}

void GpuHealthModule::PublishEventLog() {
  // The events still in the outbox have not left: they are the newest of the log.
  const std::size_t waiting = std::min(outbox_.size(), event_log_.size());
  HealthEventLog log;
  log.events.assign(event_log_.begin(), event_log_.end() - static_cast<std::ptrdiff_t>(waiting));
  context_.GetBus().Publish(std::move(log));
}

}  // namespace gns::gpu_health
