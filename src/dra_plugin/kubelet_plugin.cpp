// The DRA kubelet-plugin core: the FIFO of kubelet calls, the commits, the start-up reconcile and
// the server start/stop order, for any driver (kubelet_plugin.hpp).
#include "dra_plugin/kubelet_plugin.hpp"
#include "dra_plugin/registration_server.hpp"
#include "loop/awaitables.hpp"
#include "loop/exception_text.hpp"
#include "loop/state_file.hpp"

// GCC 12 at -O2 (GCC bug 109224): once Asio's coroutine frame allocation (operator new through
// thread_info_base) and the frame's own sized operator delete are both inlined into a coroutine,
// it reports them as mismatched. They are Asio's matched pair.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"

#include <boost/asio/co_spawn.hpp>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

namespace gns::dra {

namespace asio = boost::asio;
using std::chrono::milliseconds;

namespace {

std::string Ref(const ClaimRef& claim) { return "ResourceClaim " + claim.namespace_name + "/" + claim.name; }

PrepareResult ResultFrom(const PreparedClaim& entry) {
  PrepareResult result;
  for (const auto& device : entry.Devices()) {
    result.devices.push_back(PreparedDevice{device.request_names, entry.pool_name, device.device, {device.cdi_device_id}});
  }
  return result;
}

PrepareResult ErrorResult(std::string error) {
  PrepareResult result;
  result.error = std::move(error);
  return result;
}

int64_t UnixMillis(const Clock& clock) {
  return std::chrono::duration_cast<milliseconds>(clock.WallNow().time_since_epoch()).count();
}

// The pool side of the commits (no plugin state travels to the pool), as named callables: they
// are awaited through OnPool as named locals (the g++ 12 pitfall, loop/awaitables.hpp).
struct WritePrepares {
  std::shared_ptr<ClaimLog> log;
  ClaimSpecIo specs;
  std::vector<PreparedClaim> entries;
  uint64_t seq = 0;
  CommitOutcome operator()() const { return AppendPrepares(*log, specs, entries, seq); }
};

struct WriteUnprepares {
  std::shared_ptr<ClaimLog> log;
  ClaimSpecIo specs;
  std::vector<std::string> uids;
  std::vector<bool> known;
  uint64_t seq = 0;
  CommitOutcome operator()() const { return AppendUnprepares(*log, specs, uids, known, seq); }
};

struct CompactLog {
  std::shared_ptr<ClaimLog> log;
  std::string checkpoint_file;
  Checkpoint snapshot;
  std::string operator()() const { return CompactClaimLog(*log, checkpoint_file, snapshot); }
};

}  // namespace

// A coroutine with a default body: a driver without per-claim clean-up keeps it.
asio::awaitable<std::string> DraDriver::AfterUnprepare(ClaimRef) { co_return std::string(); }

KubeletPlugin::KubeletPlugin(ModuleContext& context, Options options, DraDriver& driver)
    : context_(context), options_(std::move(options)), driver_(driver) {
  auto& m = context_.Metrics();
  const std::string& driver_name = options_.driver_name;
  const auto prepares = [&m, &driver_name](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_prepares_total", "Claims answered in NodePrepareResources, by result",
                     {{"driver", driver_name}, {"result", result}});
  };
  prepares_ok_ = &prepares("ok");
  prepares_already_ = &prepares("already_prepared");
  prepares_permanent_ = &prepares("permanent_error");
  prepares_retryable_ = &prepares("retryable_error");
  const auto unprepares = [&m, &driver_name](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_unprepares_total", "Claims answered in NodeUnprepareResources, by result",
                     {{"driver", driver_name}, {"result", result}});
  };
  unprepares_ok_ = &unprepares("ok");
  unprepares_unknown_ = &unprepares("unknown_claim");
  unprepares_error_ = &unprepares("error");
  checkpoint_entries_ =
      &m.Gauge("gpu_node_supervisor_dra_checkpoint_entries", "Claims in the DRA checkpoint", {{"driver", driver_name}});
  const auto slices = [&m, &driver_name](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_slice_publishes_total", "ResourceSlice writes, by result",
                     {{"driver", driver_name}, {"result", result}});
  };
  const bool labelled = !options_.unlabelled_reconcile_metrics;
  const auto reconciled = [&m, &driver_name, labelled](const char* action) -> MetricsRegistry::Series& {
    MetricLabels labels = {{"action", action}};
    if (labelled) labels = {{"action", action}, {"driver", driver_name}};
    return m.Counter("gpu_node_supervisor_dra_reconciled_total",
                     "Start-up reconcile of checkpoint and CDI specs, by action", std::move(labels));
  };
  reconcile_rollbacks_ = &reconciled("rollback_prepare_started");
  reconcile_orphans_ = &reconciled("delete_orphan_spec");
  reconcile_respecs_ = &reconciled("rewrite_missing_spec");
  MetricLabels corrupt_labels;
  if (labelled) corrupt_labels = {{"driver", driver_name}};
  corrupt_checkpoints_ = &m.Counter("gpu_node_supervisor_dra_corrupt_checkpoints_total",
                                    "Corrupt checkpoints moved aside at start", std::move(corrupt_labels));
  SlicePublisher::Hooks hooks;
  hooks.devices = [this] { return driver_.SliceDevices(); };
  hooks.note = [this] { return driver_.SliceNote(); };
  hooks.on_error = [this](const std::string& error) { SetError(error); };
  hooks.on_attempt = [this] { Changed(); };
  slices_ = std::make_unique<SlicePublisher>(
      context_,
      SlicePublisher::Options{options_.driver_name, options_.node_name, options_.api_version, options_.slice_resync},
      SlicePublisher::Counters{&slices("created"), &slices("updated"), &slices("error")}, std::move(hooks));
}

KubeletPlugin::~KubeletPlugin() { lifetime_.Close(); }

// ---------------------------------------------------------------------------------- start

void KubeletPlugin::FindServices() {
  stopping_ = false;
  auto& services = context_.GetServices();
  client_ = services.Find<kube::KubeClient>();
  informers_ = services.Find<kube::InformerRegistry>();
  if (!client_ || !informers_) {
    throw std::runtime_error("the kube module's client is not available (is the `kube` module enabled?)");
  }
  events_ = services.Find<kube::EventRecorder>();
}

void KubeletPlugin::Serve(ClaimStateLoad loaded, const std::function<void()>& before_servers) {
  Reconcile(std::move(loaded));
  if (before_servers) before_servers();

  // The DRA service first: the kubelet dials it as soon as it has registered us.
  const auto& paths = options_.paths;
  std::shared_ptr<HealthService> health;
  RegistrationServer::Info info{options_.driver_name, paths.dra_socket};
  if (driver_.ServesDeviceHealth()) {
    health = std::make_shared<HealthService>(context_.GetLoop(), [this] { return driver_.DeviceHealth(); },
                                             options_.health_resend);
    for (const auto service : {kHealthServiceV1, kHealthServiceV1beta1, kHealthServiceV1alpha1}) {
      info.supported_versions.emplace_back(service);
    }
  }
  dra_server_ = std::make_unique<DraServer>(context_.GetLoop(), static_cast<DraHandler&>(*this), std::move(health));
  dra_server_->Start(paths.dra_socket);
  registration_server_ = std::make_unique<RegistrationServer>(
      context_.GetLoop(), std::move(info),
      lifetime_.Guard([this](bool registered, const std::string& error) {
        registered_ = registered;
        registration_error_ = error;
        if (registered) {
          context_.Log().info("registered with the kubelet as {}", options_.driver_name);
          context_.SetHealth(ModuleHealth::kOk);
        } else {
          context_.Log().warn("the kubelet refused the registration: {}", error);
          context_.SetHealth(ModuleHealth::kUnhealthy, "kubelet refused the registration: " + error);
        }
        Changed();
      }));
  registration_server_->Start(paths.registration_socket);
  context_.SetHealth(ModuleHealth::kUnhealthy, "waiting for the kubelet's plugin watcher");
  context_.Log().info("serving DRA v1/v1beta1{} on {}, registration on {}",
                      dra_server_->Health() != nullptr ? " and device health (v1, v1beta1, v1alpha1)" : "", paths.dra_socket,
                      paths.registration_socket);

  if (!corrupt_note_.empty()) RecordCorruptCheckpointEvent();
  // Keep the ResourceSlice true: the kubelet deletes a node's slices when it starts.
  slices_->Start(client_, informers_);
  Changed();
}

void KubeletPlugin::Reconcile(ClaimStateLoad loaded) {
  checkpoint_ = {};
  corrupt_note_.clear();
  log_.reset();
  const auto& path = options_.paths.checkpoint_file;
  const auto& log_path = options_.paths.claim_log_file;
  const auto& cdi_dir = options_.paths.cdi_dir;
  const auto& names = options_.spec_names;
  const ClaimSpecIo specs = driver_.SpecIo();
  const auto now_s = UnixMillis(context_.GetClock()) / 1000;
  switch (loaded.checkpoint.status) {
    case CheckpointStatus::kLoaded:
      context_.Log().info("checkpoint {}: {} claim(s), up to claim-log seq {}", path,
                          loaded.checkpoint.checkpoint.claims.size(), loaded.checkpoint.checkpoint.log_seq);
      break;
    case CheckpointStatus::kMissing:
      context_.Log().info("no checkpoint at {}", path);
      break;
    case CheckpointStatus::kCorrupt: {
      const auto moved = MoveCorruptCheckpointAside(path, now_s);
      if (!moved.ok) {
        throw std::runtime_error("checkpoint " + path + " is corrupt (" + loaded.checkpoint.error +
                                 ") and cannot be moved aside: " + moved.error);
      }
      corrupt_checkpoints_->Inc();
      corrupt_note_ = "DRA checkpoint " + path + " was corrupt (" + loaded.checkpoint.error + "); moved to " +
                      moved.moved_to + "; starting with the claims the claim log holds (" +
                      std::to_string(loaded.state.claims.size()) + ")";
      context_.Log().error("{}", corrupt_note_);
      break;
    }
    case CheckpointStatus::kUnreadable:
      throw std::runtime_error("cannot read checkpoint " + path + ": " + loaded.checkpoint.error);
  }
  if (!loaded.log_error.empty()) throw std::runtime_error("cannot read the claim log: " + loaded.log_error);
  if (!loaded.log.records.empty()) {
    context_.Log().info("claim log {}: replayed {} record(s) (seq {}..{})", log_path, loaded.log.records.size(),
                        loaded.log.records.front().seq, loaded.log.records.back().seq);
  }
  if (!loaded.log.torn_tail.empty()) {
    // kill -9 or a power loss during an append: expected, and nothing the kubelet was told is lost.
    context_.Log().warn("claim log {}: {}", log_path, loaded.log.torn_tail);
  }
  if (!loaded.log.corruption.empty()) {
    // Damage between valid records: something other than a crash wrote here. Keep the file for
    // the operator, serve with what is valid, and do not trust the CDI directory's absences.
    std::string what;
    for (const auto& c : loaded.log.corruption) what += (what.empty() ? "" : "; ") + c;
    const auto aside = MoveStateFileAside(log_path, now_s);
    std::string moved = aside.ok ? "moved to " + aside.moved_to : "could not be moved aside (" + aside.error + ")";
    corrupt_checkpoints_->Inc();
    const std::string note = "DRA claim log " + log_path + " is damaged: " + what + "; " + moved +
                             "; serving with the " + std::to_string(loaded.state.claims.size()) +
                             " claim(s) it could read";
    context_.Log().error("{}", note);
    corrupt_note_ = corrupt_note_.empty() ? note : corrupt_note_ + "; " + note;
  }
  checkpoint_ = std::move(loaded.state);
  last_error_ = corrupt_note_;

  // Finish or roll back what a crash interrupted.
  for (auto it = checkpoint_.claims.begin(); it != checkpoint_.claims.end();) {
    const PreparedClaim& entry = it->second;
    if (entry.state == ClaimState::kPrepareStarted) {
      // Only checkpoints written before the claim log have this state. The kubelet never got an
      // answer for it, so it will call Prepare again: roll back.
      const auto deleted = specs.remove(entry.uid);
      if (!deleted) throw std::runtime_error("reconcile: " + deleted.error);
      context_.Log().warn("reconcile: rolled back claim {}/{} (uid {}) left in PrepareStarted: CDI spec deleted, "
                          "checkpoint entry removed; the kubelet's retry prepares it again",
                          entry.namespace_name, entry.name, entry.uid);
      reconcile_rollbacks_->Inc();
      it = checkpoint_.claims.erase(it);
      continue;
    }
    // The spec is derived state, written without fsync in the hot path: make it again when it
    // is missing (a cleaned CDI dir), emptied (a power loss) or stale (another device major).
    if (!specs.current(entry)) {
      const auto written = specs.write(entry, SpecDurability::kDurable);
      if (!written) throw std::runtime_error("reconcile: " + written.error);
      context_.Log().warn("reconcile: rewrote the missing or stale CDI spec of prepared claim {}/{} (uid {})",
                          entry.namespace_name, entry.name, entry.uid);
      reconcile_respecs_->Inc();
    }
    ++it;
  }

  // Temp files of our spec writes that a crash interrupted (only ours: the directory is shared).
  const auto sweep = RemoveInterruptedClaimSpecWrites(cdi_dir, names);
  for (const auto& removed : sweep.removed) {
    context_.Log().info("reconcile: removed {}, left by an interrupted CDI spec write", removed);
  }
  for (const auto& error : sweep.errors) context_.Log().warn("reconcile: {}", error);

  const auto listing = ListClaimSpecs(cdi_dir, names);
  if (!listing.ok) throw std::runtime_error("reconcile: " + listing.error);
  for (const auto& uid : listing.claim_uids) {
    if (checkpoint_.Find(uid) != nullptr) continue;
    if (!corrupt_note_.empty()) {
      // With the record lost, a spec may still serve a running pod's container restarts: keep
      // it. An Unprepare of that claim removes it (Unprepare of an unknown claim deletes by UID).
      context_.Log().warn("reconcile: keeping CDI spec of claim uid {} (the claim state was damaged)", uid);
      continue;
    }
    // A prepare that a crash cut before its record was durable: the kubelet got no answer and
    // prepares again (writing the same spec), or never does.
    const auto deleted = specs.remove(uid);
    if (!deleted) throw std::runtime_error("reconcile: " + deleted.error);
    context_.Log().warn("reconcile: deleted orphan CDI spec of claim uid {} (no record of it)", uid);
    reconcile_orphans_->Inc();
  }

  // Compact: the checkpoint takes in everything the old log held (up to the highest seq seen,
  // so no later record can look older), then a fresh log. A crash between the two leaves the
  // old log, whose records the checkpoint already covers.
  checkpoint_.log_seq = std::max(checkpoint_.log_seq, loaded.log.max_seq);
  if (const auto saved = SaveCheckpoint(path, checkpoint_); !saved) throw std::runtime_error("reconcile: " + saved.error);
  auto log = std::make_shared<ClaimLog>(log_path);
  if (const auto reset = log->Reset(); !reset) throw std::runtime_error("cannot create the claim log: " + reset.error);
  log_ = std::move(log);
  next_seq_ = checkpoint_.log_seq + 1;
  pending_prepares_.clear();
  compaction_queued_ = false;
  UpdateCheckpointGauge();
}

void KubeletPlugin::RecordCorruptCheckpointEvent() {
  if (!options_.node_events_on_corrupt_checkpoint) return;
  if (!events_) {
    context_.Log().warn("no event recorder: the corrupt-checkpoint Node Event is not sent");
    return;
  }
  kube::ObjectReference node;
  node.name = options_.node_name;
  node.uid = slices_->NodeUid();
  events_->Record(node, "Warning", "CorruptCheckpoint", "LoadCheckpoint", corrupt_note_);
}

void KubeletPlugin::DeviceHealthChanged() {
  if (dra_server_ && dra_server_->Health() != nullptr) dra_server_->Health()->Update();
}

std::size_t KubeletPlugin::HealthStreams() const {
  return dra_server_ && dra_server_->Health() != nullptr ? dra_server_->Health()->OpenStreams() : 0;
}

// ---------------------------------------------------------------------------------- stop

void KubeletPlugin::Stop(std::function<void()> done) {
  stopping_ = true;
  slices_->Stop();
  jobs_.clear();              // their calls are failed by the DRA server's shutdown
  pending_prepares_.clear();  // never committed, never answered
  auto finish = [this, alive = lifetime_.Watch(), done = std::move(done)] {
    if (alive) {
      dra_server_.reset();
      registration_server_.reset();
      registered_ = false;
      Changed();
    }
    done();
  };
  auto stop_dra = [this, alive = lifetime_.Watch(), finish = std::move(finish)]() mutable {
    if (alive && dra_server_) {
      dra_server_->Shutdown(context_.Pool(), std::move(finish));
    } else {
      finish();
    }
  };
  // Registration first: removing its socket deregisters us before the DRA socket goes.
  auto stop_servers = [this, alive = lifetime_.Watch(), stop_dra = std::move(stop_dra)]() mutable {
    if (alive && registration_server_) {
      registration_server_->Shutdown(context_.Pool(), std::move(stop_dra));
    } else {
      stop_dra();
    }
  };
  driver_.StopBeforeServers(std::move(stop_servers));
}

// ---------------------------------------------------------------------------------- jobs

void KubeletPlugin::Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) {
  Enqueue(PrepareJob{std::move(claims), std::move(done)});
}

void KubeletPlugin::Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) {
  Enqueue(UnprepareJob{std::move(claims), std::move(done)});
}

void KubeletPlugin::Enqueue(Job job) {
  jobs_.push_back(std::move(job));
  // After Stop the queue is never run: the DRA server's shutdown answers its calls.
  if (jobs_running_ || stopping_) return;
  jobs_running_ = true;
  auto ended = [this](std::exception_ptr error) {
    jobs_running_ = false;
    if (!error) return;
    // A bug, not an expected error (those are values): restart the module, which recovers from
    // what is on disk; the calls it was serving are answered by the DRA server's shutdown.
    const std::string what = DescribeException(error);
    context_.Log().error("the prepare/unprepare runner failed: {}", what);
    context_.ReportFailure("prepare/unprepare runner: " + what);
  };
  asio::co_spawn(context_.GetLoop().Io(), RunJobs(lifetime_.Watch()), lifetime_.Guard(std::move(ended)));
}

// `alive` by value: co_spawn starts the coroutine one loop turn later.
asio::awaitable<void> KubeletPlugin::RunJobs(Gate::Ticket alive) {
  if (!alive) co_return;
  while (!stopping_ && !jobs_.empty()) {
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    if (auto* prepare = std::get_if<PrepareJob>(&job)) {
      co_await PrepareCall(std::move(*prepare));
    } else if (auto* unprepare = std::get_if<UnprepareJob>(&job)) {
      co_await UnprepareCall(std::move(*unprepare));
    } else {
      co_await Compact();
    }
  }
}

// ---------------------------------------------------------------------------------- prepare

// Claim by claim (each decision sees the claims decided before it in the call), then one durable
// commit of the decided claims, then the answer. Stop cuts the call anywhere before the commit:
// nothing is committed or answered (the DRA server's shutdown answers it); a commit under way
// finishes, and the loop's state follows what reached the disk.
asio::awaitable<void> KubeletPlugin::PrepareCall(PrepareJob job) {
  PrepareResults results;
  for (const ClaimRef& claim : job.claims) {
    if (stopping_) co_return;
    std::optional<PrepareResult> result = co_await PrepareClaim(claim);
    if (!result) co_return;
    results[claim.uid] = std::move(*result);
  }
  if (stopping_) co_return;
  if (!pending_prepares_.empty()) results = co_await CommitPrepares(job.claims, std::move(results));
  job.done(std::move(results));
}

asio::awaitable<std::optional<PrepareResult>> KubeletPlugin::PrepareClaim(ClaimRef claim) {
  // A repeated Prepare (the kubelet lost our answer, or restarted) answers from the claim state.
  if (const PreparedClaim* existing = DecideView().Find(claim.uid);
      existing != nullptr && existing->state == ClaimState::kPrepareCompleted) {
    prepares_already_->Inc();
    co_return ResultFrom(*existing);
  }
  if (!IsValidClaimUid(claim.uid) || claim.namespace_name.empty() || claim.name.empty()) {
    prepares_permanent_->Inc();
    co_return ErrorResult(Ref(claim) + ": the kubelet sent an invalid claim reference (uid \"" + claim.uid + "\")");
  }
  ClaimDecision decision = co_await driver_.DecideClaim(claim);
  if (stopping_) co_return std::nullopt;
  switch (decision.kind) {
    case ClaimDecision::Kind::kStopped:
      co_return std::nullopt;
    case ClaimDecision::Kind::kAlreadyPrepared:
      prepares_already_->Inc();
      co_return ResultFrom(decision.entry);
    case ClaimDecision::Kind::kPermanentError:
    case ClaimDecision::Kind::kRetryableError:
      (decision.kind == ClaimDecision::Kind::kPermanentError ? prepares_permanent_ : prepares_retryable_)->Inc();
      co_return ErrorResult(std::move(decision.error));
    case ClaimDecision::Kind::kPrepare:
      break;
  }
  PreparedClaim entry = std::move(decision.entry);
  entry.uid = claim.uid;
  entry.state = ClaimState::kPrepareCompleted;
  entry.started_unix_ms = UnixMillis(context_.GetClock());
  entry.completed_unix_ms = entry.started_unix_ms;
  // Not yet durable: the call's claims are committed together (CommitPrepares) before the
  // kubelet hears of any; this answer stands only if that commit succeeds.
  pending_prepares_.push_back(entry);
  co_return ResultFrom(entry);
}

const Checkpoint& KubeletPlugin::DecideView() {
  if (pending_prepares_.empty()) return checkpoint_;
  decide_view_ = checkpoint_;
  for (const auto& entry : pending_prepares_) decide_view_.claims[entry.uid] = entry;
  return decide_view_;
}

// One durable write for the whole call: each claim's CDI spec (visible at once, no fsync: it is
// re-made from the record at start), then every record in one append + fdatasync.
asio::awaitable<PrepareResults> KubeletPlugin::CommitPrepares(std::vector<ClaimRef> claims, PrepareResults results) {
  std::vector<PreparedClaim> entries = std::move(pending_prepares_);
  pending_prepares_.clear();
  WritePrepares write{log_, driver_.SpecIo(), entries, next_seq_};
  JobResult<CommitOutcome> written = co_await OnPool(context_.Pool(), std::move(write), lifetime_.Watch());
  CommitOutcome& out = written.value;
  // No stopping_ check from here: what reached the disk is taken in even after Stop.
  if (written.failure && out.log_error.empty()) out.log_error = "unexpected failure while committing";
  for (const auto& entry : entries) {
    const ClaimRef* claim = nullptr;
    for (const auto& c : claims) {
      if (c.uid == entry.uid) claim = &c;
    }
    const std::string who = claim ? Ref(*claim) : "ResourceClaim uid " + entry.uid;
    std::string why;
    if (const auto it = out.failed.find(entry.uid); it != out.failed.end()) why = it->second;
    if (why.empty() && !out.log_error.empty()) why = out.log_error;
    if (!why.empty()) {
      prepares_retryable_->Inc();
      context_.Log().error("prepare {} (uid {}) failed: {}", entry.namespace_name + "/" + entry.name, entry.uid, why);
      SetError(who + ": " + why);
      results[entry.uid] = ErrorResult(who + ": " + why);
      continue;
    }
    checkpoint_.claims[entry.uid] = entry;
    prepares_ok_->Inc();
    driver_.Prepared(entry);
  }
  CommitDone(out.log_error, out.last_seq, out.log_used, out.committed.size());
  co_return results;
}

// The loop's side of a commit: the sequence moves on, a failed append restarts the module (the
// file's state after a failed write or fdatasync is unknown: recover from what is on disk), a
// full log is compacted before the next call.
void KubeletPlugin::CommitDone(const std::string& log_error, uint64_t last_seq, std::size_t log_used,
                               std::size_t committed) {
  UpdateCheckpointGauge();
  Changed();
  if (!log_error.empty()) {
    context_.ReportFailure(log_error);
    return;
  }
  if (committed > 0) next_seq_ = last_seq + 1;
  if (log_used >= options_.claim_log_compact_at && !compaction_queued_ && !stopping_) {
    compaction_queued_ = true;
    Enqueue(CompactJob{});
  }
}

// The checkpoint takes in the log (durably, atomically), then the log starts over. Runs as a job,
// between kubelet calls.
asio::awaitable<void> KubeletPlugin::Compact() {
  Checkpoint snapshot = checkpoint_;
  snapshot.log_seq = next_seq_ - 1;
  CompactLog compact{log_, options_.paths.checkpoint_file, std::move(snapshot)};
  JobResult<std::string> compacted = co_await OnPool(context_.Pool(), std::move(compact), lifetime_.Watch());
  compaction_queued_ = false;
  std::string& error = compacted.value;
  if (compacted.failure && error.empty()) error = "unexpected failure";
  if (!error.empty()) {
    // The log keeps growing past its pre-zeroed size (slower appends); tried again after
    // the next commit.
    context_.Log().warn("claim log compaction failed: {}", error);
  } else {
    context_.Log().debug("claim log compacted into {} (up to seq {})", options_.paths.checkpoint_file,
                         next_seq_ - 1);
  }
}

// ---------------------------------------------------------------------------------- unprepare

asio::awaitable<void> KubeletPlugin::UnprepareCall(UnprepareJob job) {
  if (stopping_) co_return;  // the DRA server's shutdown answers the call
  UnprepareResults results;
  // Claims we hold a record of get one "unprepared" record each, all in one append; the spec of
  // every valid UID is deleted first (by UID even for an unknown claim: after a damaged claim
  // state, specs of claims we no longer know about are kept until their Unprepare). A crash
  // after the deletion and before the record: the entry is still there at start, its spec is
  // made again, and the kubelet's retry (it got no answer) deletes it.
  std::vector<ClaimRef> work;
  std::vector<bool> known;
  for (const auto& claim : job.claims) {
    const bool is_known = checkpoint_.Find(claim.uid) != nullptr;
    if (!is_known && !IsValidClaimUid(claim.uid)) {
      unprepares_unknown_->Inc();
      results[claim.uid] = {};
      continue;
    }
    work.push_back(claim);
    known.push_back(is_known);
  }
  std::vector<ClaimRef> after;
  if (!work.empty()) {
    std::vector<std::string> uids;
    for (const auto& claim : work) uids.push_back(claim.uid);
    WriteUnprepares write{log_, driver_.SpecIo(), std::move(uids), known, next_seq_};
    JobResult<CommitOutcome> written = co_await OnPool(context_.Pool(), std::move(write), lifetime_.Watch());
    CommitOutcome& out = written.value;
    // No stopping_ check from here: what reached the disk is taken in even after Stop.
    if (written.failure && out.log_error.empty()) out.log_error = "unexpected failure while committing";
    for (std::size_t i = 0; i < work.size(); ++i) {
      const ClaimRef& claim = work[i];
      std::string why;
      if (const auto it = out.failed.find(claim.uid); it != out.failed.end()) why = it->second;
      if (why.empty() && known[i] && !out.log_error.empty()) why = out.log_error;
      UnprepareResult result;
      if (!why.empty()) {
        unprepares_error_->Inc();
        result.error = Ref(claim) + ": " + why;
        context_.Log().error("unprepare {} (uid {}) failed: {}", claim.namespace_name + "/" + claim.name, claim.uid,
                             why);
        SetError(result.error);
      } else if (known[i]) {
        checkpoint_.claims.erase(claim.uid);
        unprepares_ok_->Inc();
        context_.Log().info("unprepared {} (uid {})", claim.namespace_name + "/" + claim.name, claim.uid);
        after.push_back(claim);
      } else {
        unprepares_unknown_->Inc();
        after.push_back(claim);
      }
      results[claim.uid] = std::move(result);
    }
    CommitDone(out.log_error, out.last_seq, out.log_used, out.committed.size());
  }
  // The driver's clean-up, claim by claim (the last first); then the kubelet gets the answer.
  while (!after.empty()) {
    const ClaimRef claim = after.back();
    after.pop_back();
    const std::string error = co_await driver_.AfterUnprepare(claim);
    if (!error.empty()) results[claim.uid].error = Ref(claim) + ": " + error;
  }
  job.done(std::move(results));
}

void KubeletPlugin::UpdateCheckpointGauge() {
  checkpoint_entries_->Set(static_cast<double>(checkpoint_.claims.size()));
}

// ---------------------------------------------------------------------------------- API reads

asio::awaitable<kube::Result> KubeletPlugin::FetchWithRetry(Gate::Ticket alive, bool list, std::string path,
                                                            Clock::SteadyTime deadline) {
  if (!alive) co_return kube::Result{};  // the caller is gone (Both() resumes nothing then)
  constexpr std::chrono::milliseconds kFirstRetryDelay{200};
  constexpr std::chrono::milliseconds kMaxRetryDelay{2000};
  for (std::chrono::milliseconds delay = kFirstRetryDelay;; delay = std::min(delay * 2, kMaxRetryDelay)) {
    kube::Result result = co_await Fetch(list, path);
    if (!kube::IsTransient(result) || stopping_ || context_.GetClock().Now() + delay >= deadline) co_return result;
    context_.Log().debug("{} {}: {} (HTTP {}); retrying in {} ms", list ? "list" : "get", path, result.error,
                         result.http_status, delay.count());
    co_await Sleep(delay);
  }
}

// Not coroutines: the awaited calls are built outside any coroutine frame (the g++ 12 pitfall,
// loop/awaitables.hpp); the client's verbs copy what they need before they return.
asio::awaitable<kube::Result> KubeletPlugin::Fetch(bool list, std::string path) {
  if (list) return client_->List(path, kube::ListOptions{}, kube::Deadline{}, lifetime_.Watch());
  return client_->Get(path, kube::Deadline{}, lifetime_.Watch());
}

asio::awaitable<void> KubeletPlugin::Sleep(std::chrono::milliseconds delay) {
  // A timer of its own: nothing cancels a retry's wait (Stop lets it run out).
  asio::steady_timer timer(context_.GetLoop().Io(), delay);
  co_await Expiry(timer);
}

asio::awaitable<boost::system::error_code> KubeletPlugin::Expiry(asio::steady_timer& timer) {
  auto start = [timer = &timer](auto resume) { timer->async_wait(std::move(resume)); };
  return AwaitCallback<boost::system::error_code>(std::move(start), lifetime_.Watch());
}

}  // namespace gns::dra
