// The gpu-inventory module: the loop side of NVML (state machine, publishing, metrics, logs).
#include "modules/gpu_inventory/gpu_inventory_module.hpp"

#include "modules/gpu_inventory/nvml_maintenance.hpp"

#include "loop/awaitables.hpp"
#include "loop/exception_text.hpp"
#include "loop/wake_grid.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as kube's client_await.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <algorithm>
#include <array>
#include <utility>

namespace gns::gpu_inventory {

namespace {

using std::chrono::milliseconds;

// A session that ran this long before failing was a success: its failure starts the backoff
// from the beginning again.
constexpr auto kStableSession = std::chrono::seconds(60);
// The same error, or the same XID on the same GPU, is logged at most this often.
constexpr auto kLogInterval = std::chrono::seconds(60);

bool SameGpus(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const auto& x, const auto& y) { return x.first == y.first; });
}

// "10s", "1500ms": a deadline as the operator wrote it.
std::string FormatDuration(milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

}  // namespace

GpuInventoryModule::Config GpuInventoryModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  Config config;
  config.nvml_library = section.String("nvmlLibrary", std::string(nvml::kLibraryName));
  if (config.nvml_library.empty()) section.Fail("nvmlLibrary", "must not be empty");
  // Up to an hour: a release no longer waits for a wait (the child is killed), so a long one
  // only means fewer wake-ups.
  config.event_wait_timeout =
      section.Duration("eventWaitTimeout", milliseconds(100), milliseconds(3600000), Config{}.event_wait_timeout);
  config.event_waiter_program = section.String("eventWaiterProgram", Config{}.event_waiter_program);
  if (config.event_waiter_program.empty()) section.Fail("eventWaiterProgram", "must not be empty");
  {
    auto backoff = section.Section("retryBackoff");
    config.retry_backoff.initial =
        backoff.Duration("initial", milliseconds(10), milliseconds(600000), milliseconds(1000));
    config.retry_backoff.max = backoff.Duration("max", milliseconds(10), milliseconds(3600000), milliseconds(60000));
    if (config.retry_backoff.max < config.retry_backoff.initial) {
      backoff.Fail("max", "must not be less than retryBackoff.initial");
    }
    backoff.Finish();
  }
  config.refresh_interval =
      section.Duration("refreshInterval", milliseconds(1000), milliseconds(3600000), milliseconds(60000));
  config.health_read_timeout =
      section.Duration("healthReadTimeout", milliseconds(100), milliseconds(600000), Config{}.health_read_timeout);
  return config;
}

GpuInventoryModule::GpuInventoryModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      backoff_(config.retry_backoff),
      retry_timer_(context.GetLoop().Io()),
      refresh_timer_(context.GetLoop().Io()),
      gpus_gauge_(&context.Metrics().Gauge("gpu_node_supervisor_gpus",
                                           "GPUs NVML reports (0 while NVML is unavailable)")),
      nvml_up_gauge_(&context.Metrics().Gauge("gpu_node_supervisor_nvml_up", "1 while NVML is loaded and usable")),
      inventory_reads_(&context.Metrics().Counter("gpu_node_supervisor_nvml_inventory_reads_total",
                                                  "Reads of every GPU through NVML (opens and refreshes)")),
      health_reads_(&context.Metrics().Counter("gpu_node_supervisor_nvml_health_reads_total",
                                               "Health passes over every GPU through NVML (GpuHealthSampler)")),
      health_hangs_(&context.Metrics().Counter("gpu_node_supervisor_nvml_health_read_hangs_total",
                                               "Health passes that outlived healthReadTimeout (an NVML call hung)")),
      waiter_restarts_(&context.Metrics().Counter(
          "gpu_node_supervisor_nvml_event_waiter_restarts_total",
          "NVML event waiter restarts because a GPU's MIG mode or supported event types changed")) {}

// What other modules find in the services while gpu-inventory runs (withdrawn on Stop).
class GpuInventoryModule::HealthSamplerService final : public GpuHealthSampler {
 public:
  HealthSamplerService(GpuInventoryModule& module, Gate::Ticket ticket) : module_(module), ticket_(std::move(ticket)) {}
  void Sample(uint32_t groups, std::function<void(HealthSample)> done) override {
    if (ticket_) module_.SampleHealth(groups, std::move(done));  // the module is gone: never answered
  }

 private:
  GpuInventoryModule& module_;
  Gate::Ticket ticket_;
};

GpuInventoryModule::~GpuInventoryModule() {
  lifetime_.Close();
  // Normally Stop() did this already.
  if (waiter_) waiter_->Kill({});
  if (session_) {
    context_.Pool().Execute([session = std::move(session_)]() mutable { session.reset(); });
  }
}

void GpuInventoryModule::Start() {
  GNS_ASSERT_ON_LOOP(context_.GetLoop());
  nvml_up_gauge_->Set(0);
  gpus_gauge_->Set(0);
  context_.SetHealth(ModuleHealth::kUnhealthy, "opening NVML");
  release_sub_ = context_.GetBus().Subscribe<NvmlReleaseRequest>(
      [this](const NvmlReleaseRequest& request) { OnReleaseRequest(request); });
  context_.GetServices().Provide<GpuMaintenance>(
      std::make_shared<NvmlMaintenance>(context_.Pool(), config_.nvml_library));
  context_.GetServices().Provide<GpuHealthSampler>(std::make_shared<HealthSamplerService>(*this, lifetime_.Watch()));
  Reconcile();
}

void GpuInventoryModule::Stop(std::function<void()> done) {
  GNS_ASSERT_ON_LOOP(context_.GetLoop());
  stopping_ = true;
  release_sub_.Reset();
  context_.GetServices().Withdraw<GpuMaintenance>();
  context_.GetServices().Withdraw<GpuHealthSampler>();
  // Requests not answered yet never are (the sampler is withdrawn); a pass under way is dropped.
  ++health_seq_;
  health_current_.clear();
  health_waiting_.clear();
  CancelRetry();
  ++refresh_seq_;
  refresh_timer_.cancel();
  // Kills the event waiter child and hands the session to the pool for closing, and returns:
  // nothing here waits for an event wait.
  Reconcile();
  PublishUnavailable("gpu-inventory stopped");
  nvml_up_gauge_->Set(0);
  gpus_gauge_->Set(0);
  done();
}

void GpuInventoryModule::Reconcile() {
  GNS_ASSERT_ON_LOOP(context_.GetLoop());
  if (task_in_flight_) return;  // its completion calls back here
  if (session_) {
    // A per-GPU release or take-back reopens the session with the new set of excluded GPUs
    // (NVML cannot unregister one GPU's events): the inventory stays available meanwhile.
    if (stopping_ || released_ || session_failed_ || !SameGpus(session_released_, released_gpus_)) {
      StartClose();
    } else if (refresh_wanted_ && armed_) {
      StartRefresh();
    }
    return;
  }
  if (stopping_) return;
  if (released_) {
    if (!release_published_) {
      release_published_ = true;
      PublishUnavailable("released: " + release_reason_);
      nvml_up_gauge_->Set(0);
      gpus_gauge_->Set(0);
      context_.SetHealth(ModuleHealth::kDegraded, "NVML released: " + release_reason_);
      context_.Log().info("NVML released ({})", release_reason_);
    }
    return;
  }
  if (retry_pending_) return;
  if (retry_due_) {
    ScheduleRetry();
    return;
  }
  StartOpen();
}

EventWaiterProcess::Callbacks GpuInventoryModule::WaiterCallbacks(uint64_t generation) {
  // On the loop; never after the waiter was killed (so never after the module is gone).
  EventWaiterProcess::Callbacks callbacks;
  callbacks.armed = [this, generation] { OnArmed(generation); };
  callbacks.xid = [this](XidEvent event) { OnXid(std::move(event)); };
  callbacks.mig_changed = [this](std::string uuid) { OnMigChanged(std::move(uuid)); };
  callbacks.health = [this](HealthEventLine event) { OnHealthEvent(std::move(event)); };
  callbacks.registered = [this, generation](std::string uuid, uint64_t types, GpuEventBasis basis) {
    if (generation != generation_) return;
    context_.Log().info("NVML events of {}: {}", uuid, DescribeEventTypes(types));
    waiter_basis_[uuid] = std::move(basis);
  };
  callbacks.warning = [this](std::string text) { context_.Log().warn("NVML events: {}", text); };
  callbacks.failed = [this, generation](std::string function, std::string message) {
    OnWaiterFailed(generation, function, message);
  };
  return callbacks;
}

void GpuInventoryModule::StartOpen() {
  task_in_flight_ = true;
  refresh_wanted_ = false;  // the open reads every GPU
  const uint64_t generation = ++generation_;
  SessionOptions options{config_.nvml_library, context_.Site().paths.host_root, {}};
  session_released_ = released_gpus_;
  uint32_t unknown_index = 0xFFFFFFFF;  // a UUID we never read: excluded by UUID only
  for (const auto& [uuid, reason] : released_gpus_) {
    const auto known = std::find_if(last_gpus_.begin(), last_gpus_.end(), [&](const GpuInfo& g) { return g.uuid == uuid; });
    options.excluded[known != last_gpus_.end() ? known->index : unknown_index--] = uuid;
  }
  BlockingPool* pool = &context_.Pool();
  context_.Pool().Run(
      [options = std::move(options)] { return NvmlSession::Open(options); },
      [this, alive = lifetime_.Watch(), pool, generation](NvmlSession::Opened opened, std::exception_ptr error) {
        if (!alive) {
          // The module is gone: close what was opened for it, off the loop.
          if (opened.session) pool->Execute([session = std::move(opened.session)]() mutable { session.reset(); });
          return;
        }
        OnOpened(generation, std::move(opened), error);
      });
}

void GpuInventoryModule::OnOpened(uint64_t generation, NvmlSession::Opened opened, std::exception_ptr error) {
  task_in_flight_ = false;
  if (error) opened.read.error = "opening NVML threw: " + DescribeException(error);
  CountErrors(opened.read.failed_functions);
  LogWarnings(opened.read.warnings);
  if (opened.session) {
    inventory_reads_->Inc();
    session_ = std::move(opened.session);
    session_failed_ = false;
    armed_ = false;
    pending_read_ = std::move(opened.read);
    if (!stopping_ && !released_) StartWaiter(generation);
    context_.Log().debug("NVML open (attempt {}): {} GPUs, waiting for the event set", generation,
                         pending_read_.inventory.gpus.size());
  } else if (!stopping_ && !released_) {
    RecordFailure(opened.read.error);
  }
  Reconcile();
}

void GpuInventoryModule::OnArmed(uint64_t generation) {
  if (generation != generation_ || !session_ || session_failed_ || stopping_ || released_) return;
  if (armed_) {
    // A waiter started again for new registrations (RestartWaiter): whatever changed while none
    // listened is read now.
    context_.Log().debug("the restarted NVML event waiter is armed: reading the GPUs again");
    refresh_wanted_ = true;
    Reconcile();
    return;
  }
  armed_ = true;
  armed_at_ = context_.GetClock().Now();
  PublishAvailable(pending_read_);
  const auto& inventory = pending_read_.inventory;
  context_.Log().info("NVML up ({}): {} GPUs, driver {}, clique {}", config_.nvml_library, inventory.gpus.size(),
                      inventory.driver_version,
                      pending_read_.clique.clique_id.empty() ? "none (" + pending_read_.clique.reason + ")"
                                                             : pending_read_.clique.clique_id);
  // The waiter registered by what it read itself, a moment after this read.
  CheckWaiterRegistrations(pending_read_);
  pending_read_ = {};
  last_error_.clear();
  suppressed_errors_ = 0;
  SetOkHealth();
  ScheduleRefresh();
  // A MIG reconfiguration reported before the inventory was published may postdate its read.
  Reconcile();
}

void GpuInventoryModule::OnXid(XidEvent event) {
  if (stopping_) return;
  XidObservation observation;
  observation.uuid = std::move(event.uuid);
  observation.xid = event.xid;
  observation.gpu_instance = event.gpu_instance;
  observation.compute_instance = event.compute_instance;
  observation.observed_unix_ms =
      std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
  context_.Metrics()
      .Counter("gpu_node_supervisor_nvml_xid_events_total", "XID events reported by NVML",
               {{"gpu", observation.uuid}, {"xid", std::to_string(observation.xid)}})
      .Inc();

  // An XID storm (say XID 13 from a faulting application) must not flood the log.
  const auto now = context_.GetClock().Now();
  auto& [logged_at, suppressed] = xid_log_[observation.uuid + "/" + std::to_string(observation.xid)];
  if (logged_at == Clock::SteadyTime{} || now - logged_at >= kLogInterval) {
    if (suppressed > 0) {
      context_.Log().warn("XID {} on {} (and {} more since the last report)", observation.xid, observation.uuid,
                          suppressed);
    } else {
      context_.Log().warn("XID {} on {}", observation.xid, observation.uuid);
    }
    logged_at = now;
    suppressed = 0;
  } else {
    ++suppressed;
  }
  context_.GetBus().Publish(std::move(observation));
}

// The event types the waiter registered, in words (its `registered` lines, for the log).
std::string GpuInventoryModule::DescribeEventTypes(uint64_t types) {
  static constexpr std::array<std::pair<uint64_t, std::string_view>, 5> kNames{{
      {nvml::kEventTypeXidCriticalError, "xid"},
      {nvml::kEventTypeSingleBitEccError, "singleBitEcc"},
      {nvml::kEventTypeDoubleBitEccError, "doubleBitEcc"},
      {nvml::kEventTypeClock, "clock"},
      {nvml::kEventMigConfigChange, "migConfigChange"},
  }};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((types & bit) != 0) out += (out.empty() ? "" : ", ") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

// An ECC or clock event: gpu-health reads and judges that group now. Counted, not logged (an SBE
// storm would flood the log; the verdict and its HealthEvent say what matters).
void GpuInventoryModule::OnHealthEvent(HealthEventLine event) {
  if (stopping_) return;
  NvmlHealthEvent out;
  out.uuid = std::move(event.uuid);
  out.kind = event.kind;
  out.data = event.data;
  out.observed_unix_ms =
      std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
  context_.Metrics()
      .Counter("gpu_node_supervisor_nvml_health_events_total", "ECC and clock events reported by NVML",
               {{"gpu", out.uuid}, {"kind", std::string(HealthEventKindName(out.kind))}})
      .Inc();
  context_.GetBus().Publish(std::move(out));
}

void GpuInventoryModule::OnMigChanged(std::string uuid) {
  if (stopping_) return;
  context_.Metrics()
      .Counter("gpu_node_supervisor_nvml_mig_config_changes_total",
               "MIG reconfigurations reported by NVML (nvmlEventMigConfigChange)", {{"gpu", uuid}})
      .Inc();
  // Creating or destroying instances reports one event per step; they coalesce into the one
  // refresh owed, and only the first of a burst is logged at info.
  if (refresh_wanted_) {
    context_.Log().debug("MIG configuration of {} changed (a refresh is already owed)", uuid);
  } else {
    context_.Log().info("MIG configuration of {} changed: reading the GPUs again", uuid.empty() ? "a GPU" : uuid);
  }
  refresh_wanted_ = true;
  StartRefresh();
}

void GpuInventoryModule::StartWaiter(uint64_t generation) {
  waiter_basis_.clear();
  EventWaiterOptions options;
  options.library = config_.nvml_library;
  options.wait_ms = static_cast<unsigned int>(config_.event_wait_timeout.count());
  for (const auto& [index, uuid] : session_->Excluded()) {
    options.excluded_indices.push_back(index);
    options.excluded_uuids.push_back(uuid);
  }
  try {
    waiter_ = EventWaiterProcess::Start(context_.GetLoop().Io(), config_.event_waiter_program, options,
                                        WaiterCallbacks(generation));
  } catch (const std::exception& e) {  // no pipe, no fork
    session_failed_ = true;
    RecordFailure(std::string("cannot start the NVML event waiter: ") + e.what());
  }
}

void GpuInventoryModule::CheckWaiterRegistrations(const ReadResult& read) {
  if (!waiter_ || !armed_ || session_failed_ || stopping_ || released_) return;
  const auto changed = GpusWithNewEventBasis(waiter_basis_, read.event_basis);
  if (!changed.empty()) RestartWaiter(changed);
}

// NVML registers events per GPU once, by what the GPU supports then: an older driver reports
// nvmlEventMigConfigChange only while MIG mode is on, so a GPU that was whole when the waiter
// registered never reports going into MIG mode, and one that left it keeps a registration that
// no longer fits. A MIG mode change alone counts too: nvmlDeviceSetMigMode may reset the GPU,
// and registrations made before it are not promised to outlive it. The old child is reaped
// before the new one starts, so no event is reported
// twice; one that comes in between (milliseconds) is missed by NVML's path: the read after the
// new one is armed brings any MIG change, and an XID still reaches gpu-health through the kernel
// log. The inventory stays available throughout.
void GpuInventoryModule::RestartWaiter(const std::vector<std::string>& gpus) {
  std::string which;
  for (const auto& uuid : gpus) which += (which.empty() ? "" : ", ") + uuid;
  context_.Log().info("MIG mode or NVML event types of {} changed: starting the NVML event waiter again to register "
                      "them as they are now",
                      which);
  waiter_restarts_->Inc();
  waiter_basis_.clear();
  const uint64_t generation = ++generation_;
  // waiter_ stays until reaped: a close meanwhile waits for the same reap (Kill tells both).
  waiter_->Kill([this, alive = lifetime_.Watch(), generation] {
    if (alive) OnOldWaiterReaped(generation);
  });
}

void GpuInventoryModule::OnOldWaiterReaped(uint64_t generation) {
  // A close, a failure or a newer restart since: that path starts what comes next.
  if (generation != generation_ || !session_ || session_failed_ || stopping_ || released_) return;
  StartWaiter(generation);
  Reconcile();  // a waiter that cannot start failed the session: closed and opened again
}

void GpuInventoryModule::OnWaiterFailed(uint64_t generation, const std::string& function, const std::string& message) {
  if (generation != generation_ || !session_ || session_failed_) return;
  if (!function.empty()) CountErrors({function});
  session_failed_ = true;
  if (!stopping_ && !released_) RecordFailure(message);
  Reconcile();
}

void GpuInventoryModule::StartClose() {
  task_in_flight_ = true;
  auto session = std::move(session_);
  auto waiter = std::move(waiter_);
  session_failed_ = false;
  armed_ = false;
  pending_read_ = {};
  ++refresh_seq_;
  refresh_timer_.cancel();
  // Two parts, at once: the child that waits for events is killed (its handles are closed by
  // the kernel once it is reaped), and the session's NVML is shut down on the pool. Closed when
  // both are done: then nothing in the process tree holds what the session held.
  struct Closing {
    int parts = 1;
    NvmlSession::Closed closed;
  };
  auto closing = std::make_shared<Closing>();
  closing->parts = waiter ? 2 : 1;
  auto part_done = [this, alive = lifetime_.Watch(), closing] {
    if (--closing->parts == 0 && alive) OnClosed(std::move(closing->closed));
  };
  if (waiter) waiter->Kill(part_done);
  context_.Pool().Run(
      [session = std::move(session)]() mutable {
        auto closed = session->Close();
        session.reset();
        return closed;
      },
      [closing, part_done](NvmlSession::Closed closed, std::exception_ptr error) {
        closing->closed.warnings.insert(closing->closed.warnings.end(), closed.warnings.begin(), closed.warnings.end());
        closing->closed.failed_functions.insert(closing->closed.failed_functions.end(), closed.failed_functions.begin(),
                                                closed.failed_functions.end());
        if (error) closing->closed.warnings.push_back("closing NVML threw: " + DescribeException(error));
        part_done();
      });
}

void GpuInventoryModule::OnClosed(NvmlSession::Closed closed) {
  task_in_flight_ = false;
  if (!stopping_) AckGpuReleases();
  CountErrors(closed.failed_functions);
  // Rare (nvmlShutdown failing) and at most once per backoff step.
  for (const auto& warning : closed.warnings) context_.Log().warn("{}", warning);
  Reconcile();
}

void GpuInventoryModule::ScheduleRetry() {
  retry_due_ = false;
  retry_pending_ = true;
  const auto delay = backoff_.Next();
  context_.Log().debug("opening NVML again in {} ms (attempt {})", delay.count(), backoff_.Attempts());
  const uint64_t seq = ++retry_seq_;
  retry_timer_.expires_after(delay);
  retry_timer_.async_wait(lifetime_.Guard([this, seq](const boost::system::error_code& ec) {
    if (ec || seq != retry_seq_) return;
    retry_pending_ = false;
    Reconcile();
  }));
}

void GpuInventoryModule::CancelRetry() {
  ++retry_seq_;
  retry_pending_ = false;
  retry_due_ = false;
  retry_timer_.cancel();
}

void GpuInventoryModule::ScheduleRefresh() {
  const uint64_t seq = ++refresh_seq_;
  // On the loop's wake grid (src/loop/wake_grid.hpp): at rest the refresh shares a wake-up.
  const auto now = context_.GetClock().Now();
  refresh_timer_.expires_after(SnapToWakeGrid(now + config_.refresh_interval, config_.refresh_interval) - now);
  refresh_timer_.async_wait(lifetime_.Guard([this, seq](const boost::system::error_code& ec) {
    if (ec || seq != refresh_seq_) return;
    StartRefresh();
  }));
}

void GpuInventoryModule::StartRefresh() {
  // Not while a health pass hangs: NVML would hang this read too; its return reads again.
  if (!session_ || !armed_ || session_failed_ || stopping_ || released_ || health_pass_hung_) return;
  if (task_in_flight_) {
    // With a session in place that task is a refresh, whose read may predate what asked for
    // this one: another follows it (Reconcile).
    refresh_wanted_ = true;
    return;
  }
  refresh_wanted_ = false;
  task_in_flight_ = true;
  const uint64_t generation = generation_;
  // The task holds its own reference: Read() and the waiter may use NVML at the same time
  // (NVML is thread-safe), but Close() never overlaps Read() since only one task runs.
  context_.Pool().Run([session = session_] { return session->Read(); },
                      lifetime_.Guard([this, generation](ReadResult read, std::exception_ptr error) {
                        OnRefreshed(generation, std::move(read), error);
                      }));
}

void GpuInventoryModule::OnRefreshed(uint64_t generation, ReadResult read, std::exception_ptr error) {
  task_in_flight_ = false;
  if (error) {
    read.ok = false;
    read.error = "reading NVML threw: " + DescribeException(error);
  }
  inventory_reads_->Inc();
  CountErrors(read.failed_functions);
  LogWarnings(read.warnings);
  if (generation == generation_ && session_ && armed_ && !session_failed_ && !stopping_ && !released_) {
    if (read.ok) {
      PublishAvailable(read);
      SetOkHealth();
      ScheduleRefresh();
      CheckWaiterRegistrations(read);
    } else {
      session_failed_ = true;
      RecordFailure(read.error);
    }
  }
  Reconcile();
}

void GpuInventoryModule::OnReleaseRequest(const NvmlReleaseRequest& request) {
  if (stopping_) return;
  if (!request.gpu_uuid.empty()) {
    OnGpuReleaseRequest(request);
    return;
  }
  if (request.release) {
    if (released_ && release_reason_ == request.reason) return;
    context_.Log().info("releasing NVML: {}", request.reason);
    released_ = true;
    release_reason_ = request.reason;
    release_published_ = false;
    CancelRetry();
  } else {
    if (!released_) return;
    context_.Log().info("taking NVML back{}", request.reason.empty() ? "" : ": " + request.reason);
    released_ = false;
    release_published_ = false;
    CancelRetry();
    backoff_.Reset();
    context_.SetHealth(ModuleHealth::kUnhealthy, "opening NVML");
  }
  Reconcile();
}

void GpuInventoryModule::OnGpuReleaseRequest(const NvmlReleaseRequest& request) {
  const std::string& uuid = request.gpu_uuid;
  if (request.release) {
    const auto it = released_gpus_.find(uuid);
    if (it != released_gpus_.end() && it->second == request.reason) return;
    context_.Log().info("releasing the NVML handles of {}: {}", uuid, request.reason);
    released_gpus_[uuid] = request.reason;
  } else {
    if (released_gpus_.erase(uuid) == 0) return;
    context_.Log().info("taking {} back{}", uuid, request.reason.empty() ? "" : ": " + request.reason);
  }
  // No session and no task: nothing touches any GPU, so a release holds at once.
  if (!session_ && !task_in_flight_) AckGpuReleases();
  Reconcile();
}

void GpuInventoryModule::AckGpuReleases() {
  auto acked = acked_gpus_;  // taken-back GPUs stay released until they are read again
  for (const auto& [uuid, reason] : released_gpus_) acked[uuid] = reason;
  if (acked == acked_gpus_) return;
  for (const auto& [uuid, reason] : acked) {
    if (acked_gpus_.count(uuid) == 0) context_.Log().info("NVML handles of {} released ({})", uuid, reason);
  }
  acked_gpus_ = std::move(acked);
  ApplyReleased(last_gpus_);
  if (published_inventory_) {
    GpuInventory inventory = *published_inventory_;
    ApplyReleased(inventory.gpus);
    PublishInventory(std::move(inventory));
  }
}

void GpuInventoryModule::ApplyReleased(std::vector<GpuInfo>& gpus) const {
  for (auto& gpu : gpus) {
    const auto it = acked_gpus_.find(gpu.uuid);
    gpu.released = it != acked_gpus_.end();
    gpu.release_reason = gpu.released ? it->second : std::string{};
  }
}

void GpuInventoryModule::SetOkHealth() {
  if (health_pass_hung_) {
    context_.SetHealth(ModuleHealth::kUnhealthy, health_hung_error_);
    return;
  }
  if (released_gpus_.empty()) {
    context_.SetHealth(ModuleHealth::kOk);
    return;
  }
  std::string detail = "NVML handles released for";
  for (const auto& [uuid, reason] : released_gpus_) detail += " " + uuid + " (" + reason + ")";
  context_.SetHealth(ModuleHealth::kDegraded, detail);
}

void GpuInventoryModule::RecordFailure(const std::string& error) {
  const auto now = context_.GetClock().Now();
  if (armed_ && now - armed_at_ >= kStableSession) backoff_.Reset();
  armed_ = false;
  retry_due_ = true;
  PublishUnavailable(error);
  nvml_up_gauge_->Set(0);
  gpus_gauge_->Set(0);
  context_.SetHealth(ModuleHealth::kUnhealthy, error);
  LogFailure(error);
}

void GpuInventoryModule::PublishAvailable(const ReadResult& read) {
  if (health_pass_hung_) {
    // A read that did not hang (opened before the pass, say) does not make NVML usable again
    // while another call still hangs: its return reads the inventory again.
    last_gpus_ = read.inventory.gpus;
    PublishUnavailable(health_hung_error_);
    return;
  }
  GpuInventory inventory = read.inventory;
  inventory.available = true;
  inventory.error.clear();
  // The GPUs this session excludes are released (acknowledged); all others were just read.
  acked_gpus_ = session_released_;
  for (const auto& [uuid, reason] : acked_gpus_) {
    if (inventory.FindByUuid(uuid) != nullptr) continue;
    const auto last = std::find_if(last_gpus_.begin(), last_gpus_.end(), [&](const GpuInfo& g) { return g.uuid == uuid; });
    if (last != last_gpus_.end()) {
      inventory.gpus.push_back(*last);  // its last read, listed as released
      continue;
    }
    // Released before this process ever read it (a reset resumed right after a restart asks
    // before the first session is up): listed by its UUID alone, so the release is seen.
    GpuInfo unread;
    unread.uuid = uuid;
    if (session_) {
      for (const auto& [index, excluded] : session_->Excluded()) {
        if (excluded == uuid) unread.index = index;
      }
    }
    inventory.gpus.push_back(std::move(unread));
  }
  std::sort(inventory.gpus.begin(), inventory.gpus.end(),
            [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
  ApplyReleased(inventory.gpus);
  last_gpus_ = inventory.gpus;
  last_driver_version_ = inventory.driver_version;
  gpus_gauge_->Set(static_cast<double>(inventory.gpus.size()));
  nvml_up_gauge_->Set(1);
  PublishInventory(std::move(inventory));
  clique_known_ = true;
  NodeClique clique = read.clique;
  clique.known = true;
  PublishClique(std::move(clique));
}

void GpuInventoryModule::PublishUnavailable(const std::string& error) {
  GpuInventory inventory;
  inventory.available = false;
  inventory.error = error;
  inventory.gpus = last_gpus_;
  inventory.driver_version = last_driver_version_;
  PublishInventory(std::move(inventory));
  // A clique once read stays: NVML being away does not move the node to another clique.
  if (!clique_known_) PublishClique(NodeClique{"", "NVML unavailable: " + error, false});
}

void GpuInventoryModule::PublishInventory(GpuInventory inventory) {
  if (published_inventory_ && *published_inventory_ == inventory) return;
  published_inventory_ = inventory;
  context_.GetBus().Publish(std::move(inventory));
}

void GpuInventoryModule::PublishClique(NodeClique clique) {
  if (published_clique_ && *published_clique_ == clique) return;
  if (published_clique_ && clique_known_ && published_clique_->clique_id != clique.clique_id) {
    context_.Log().info("clique changed from \"{}\" to \"{}\"{}", published_clique_->clique_id, clique.clique_id,
                        clique.reason.empty() ? "" : " (" + clique.reason + ")");
  }
  published_clique_ = clique;
  context_.GetBus().Publish(std::move(clique));
}

void GpuInventoryModule::CountErrors(const std::vector<std::string>& functions) {
  for (const auto& function : functions) {
    context_.Metrics()
        .Counter("gpu_node_supervisor_nvml_errors_total", "NVML calls that failed", {{"function", function}})
        .Inc();
  }
}

void GpuInventoryModule::LogWarnings(const std::vector<std::string>& warnings) {
  // Refreshes repeat the same warnings every interval: log a set only when it changes.
  if (warnings == last_warnings_) return;
  last_warnings_ = warnings;
  constexpr std::size_t kMaxLines = 8;
  for (std::size_t i = 0; i < std::min(warnings.size(), kMaxLines); ++i) context_.Log().warn("{}", warnings[i]);
  if (warnings.size() > kMaxLines) context_.Log().warn("… and {} more NVML warnings", warnings.size() - kMaxLines);
}

void GpuInventoryModule::LogFailure(const std::string& error) {
  const auto now = context_.GetClock().Now();
  if (error != last_error_ || now - last_error_at_ >= kLogInterval) {
    if (suppressed_errors_ > 0) {
      context_.Log().error("NVML unavailable: {} (repeated {} times since the last report)", error,
                           suppressed_errors_);
    } else {
      context_.Log().error("NVML unavailable: {}", error);
    }
    last_error_ = error;
    last_error_at_ = now;
    suppressed_errors_ = 0;
  } else {
    ++suppressed_errors_;
    context_.Log().debug("NVML unavailable: {}", error);
  }
}

}  // namespace gns::gpu_inventory

namespace gns::gpu_inventory {

// ---- GpuHealthSampler ---------------------------------------------------------------------------

HealthSample GpuInventoryModule::FailedSample(uint32_t groups, std::string error) const {
  HealthSample sample;
  sample.ok = false;
  sample.error = std::move(error);
  sample.groups = groups & kHealthAll;
  sample.taken_unix_ms =
      std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
  return sample;
}

// `done` runs on the loop later, never inside Sample (the caller may hold state it expects to
// change first), and not once the module is gone.
void GpuInventoryModule::AnswerLater(std::function<void(HealthSample)> done, HealthSample sample) {
  context_.GetLoop().Post(lifetime_.Guard([done = std::move(done), sample = std::move(sample)]() mutable {
    done(std::move(sample));
  }));
}

void GpuInventoryModule::SampleHealth(uint32_t groups, std::function<void(HealthSample)> done) {
  GNS_ASSERT_ON_LOOP(context_.GetLoop());
  if (stopping_ || !done) return;
  if (health_pass_hung_) {
    // Never a second pass beside a hung one: it would hang too, and pile up pool threads.
    AnswerLater(std::move(done), FailedSample(groups, health_hung_error_));
    return;
  }
  if (!session_ || !armed_ || session_failed_ || released_) {
    std::string why = released_ ? "NVML released: " + release_reason_
                                : (published_inventory_ && !published_inventory_->error.empty()
                                       ? "NVML unavailable: " + published_inventory_->error
                                       : std::string("NVML unavailable: not open yet"));
    AnswerLater(std::move(done), FailedSample(groups, std::move(why)));
    return;
  }
  health_waiting_.push_back(HealthRequest{groups, std::move(done)});
  if (!health_pass_running_) StartHealthPass();
}

void GpuInventoryModule::StartHealthPass() {
  health_current_ = std::move(health_waiting_);
  health_waiting_.clear();
  uint32_t groups = 0;
  for (const auto& request : health_current_) groups |= request.groups;
  health_pass_running_ = true;
  health_pass_returned_ = false;
  health_pass_started_ = context_.GetClock().Now();
  const uint64_t seq = ++health_seq_;
  boost::asio::co_spawn(context_.GetLoop().Io(), RunHealthPass(session_, groups & kHealthAll, last_gpus_, seq),
                        boost::asio::detached);
}

// The pass itself: on the pool, then back on the loop whenever it returns, in time or not. A
// coroutine, but its parameters are no closures (the g++ 12 pitfall of loop/awaitables.hpp).
boost::asio::awaitable<HealthSample> GpuInventoryModule::HealthPoolPass(std::shared_ptr<NvmlSession> session,
                                                                        uint32_t groups, std::vector<GpuInfo> known,
                                                                        uint64_t seq) {
  auto work = [session = std::move(session), groups, known = std::move(known)] {
    return session->ReadHealth(groups, known);
  };
  JobResult<HealthSample> result = co_await OnPool(context_.Pool(), std::move(work), lifetime_.Watch());
  OnHealthPassReturned(seq);
  if (result.failure) std::rethrow_exception(result.failure);
  co_return std::move(result.value);
}

boost::asio::awaitable<void> GpuInventoryModule::RunHealthPass(std::shared_ptr<NvmlSession> session, uint32_t groups,
                                                               std::vector<GpuInfo> known, uint64_t seq) {
  auto pass = HealthPoolPass(std::move(session), groups, std::move(known), seq);
  Timed<HealthSample> timed = co_await WithDeadline(context_.GetLoop().Io(), config_.health_read_timeout,
                                                    std::move(pass), lifetime_.Watch());
  OnHealthPassDone(seq, groups, timed.timed_out, std::move(timed.value), timed.failure);
}

void GpuInventoryModule::OnHealthPassReturned(uint64_t seq) {
  if (seq != health_seq_) return;  // dropped by Stop
  health_pass_returned_ = true;
  if (!health_pass_hung_) return;  // in time: OnHealthPassDone answers
  const auto took = std::chrono::duration_cast<milliseconds>(context_.GetClock().Now() - health_pass_started_);
  context_.Log().warn("the NVML health read that hung returned after {} ms: reading the inventory again", took.count());
  health_pass_hung_ = false;
  health_pass_running_ = false;
  health_hung_error_.clear();
  // Back to what the session says: a refresh publishes the inventory available again (or
  // finds NVML failed and reopens it); without an armed session Reconcile does what is due.
  if (session_ && armed_ && !session_failed_) {
    refresh_wanted_ = true;
    StartRefresh();
  } else {
    Reconcile();
  }
  if (!health_waiting_.empty()) StartHealthPass();
}

void GpuInventoryModule::OnHealthPassDone(uint64_t seq, uint32_t groups, bool timed_out,
                                          std::optional<HealthSample> sample, std::exception_ptr failure) {
  if (seq != health_seq_) return;
  auto requests = std::move(health_current_);
  health_current_.clear();
  HealthSample answer;
  if (timed_out) {
    answer = FailedSample(groups, "NVML health read did not return within " +
                                      FormatDuration(config_.health_read_timeout) +
                                      ": an NVML call hangs; no NVML read starts until it returns");
    health_hangs_->Inc();
    if (!health_pass_returned_) {
      health_pass_hung_ = true;
      health_hung_error_ = answer.error;
      context_.Log().error("{}", answer.error);
      // The inventory is not to be trusted (nor refreshed) while NVML hangs: consumers (the
      // device plugin) treat the GPUs as they do whenever NVML is unavailable.
      ++refresh_seq_;
      refresh_timer_.cancel();
      PublishUnavailable(answer.error);
      nvml_up_gauge_->Set(0);
      context_.SetHealth(ModuleHealth::kUnhealthy, answer.error);
      for (auto& request : health_waiting_) requests.push_back(std::move(request));
      health_waiting_.clear();
    } else {
      health_pass_running_ = false;  // it came back just after its deadline
    }
  } else if (failure || !sample) {
    health_pass_running_ = false;
    answer = FailedSample(groups, "NVML health read threw: " + (failure ? DescribeException(failure) : std::string("no result")));
  } else {
    health_pass_running_ = false;
    answer = std::move(*sample);
    answer.taken_unix_ms =
        std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
    health_reads_->Inc();
    for (const auto& gpu : answer.gpus) CountErrors(gpu.failed_functions);
  }
  for (auto& request : requests) request.done(answer);
  if (!health_pass_running_ && !health_waiting_.empty() && !stopping_) StartHealthPass();
}

}  // namespace gns::gpu_inventory
