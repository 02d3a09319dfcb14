// The dra-compute-domain module.
#include "modules/dra_compute_domain/dra_module.hpp"

#include "modules/dra_compute_domain/cdi_spec.hpp"
#include "modules/dra_compute_domain/claim_log.hpp"
#include "modules/dra_compute_domain/messages.hpp"
#include "modules/dra_compute_domain/proc_devices.hpp"
#include "modules/dra_compute_domain/registration_server.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/imex_health/messages.hpp"
#include "modules/kube/client.hpp"
#include "modules/kube/events.hpp"
#include "modules/kube/informer.hpp"
#include "modules/kube/messages.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

namespace gns::dra {

using nlohmann::json;
using std::chrono::milliseconds;

// One NodePrepareResources call, claim by claim.
struct PrepareBatch {
  std::vector<ClaimRef> claims;
  std::size_t next = 0;
  PrepareResults results;
  std::function<void(PrepareResults)> done;
  std::function<void()> finished;  // lets the next job run
};

struct UnprepareBatch {
  std::vector<ClaimRef> claims;
  std::size_t next = 0;
  UnprepareResults results;
  std::function<void(UnprepareResults)> done;
  std::function<void()> finished;
};

namespace {

constexpr milliseconds kFirstRetryDelay{200};
constexpr milliseconds kMaxRetryDelay{2000};
constexpr milliseconds kSliceRetryInitial{500};
constexpr milliseconds kSliceRetryMax{30000};

std::string_view VersionOnly(ResourceApiVersion version) {
  switch (version) {
    case ResourceApiVersion::kV1: return "v1";
    case ResourceApiVersion::kV1beta2: return "v1beta2";
    case ResourceApiVersion::kV1beta1: return "v1beta1";
  }
  return "v1";
}

std::string Ref(const ClaimRef& claim) { return "ResourceClaim " + claim.namespace_name + "/" + claim.name; }

PrepareResult ResultFrom(const PreparedClaim& entry) {
  PrepareResult result;
  result.devices.push_back(PreparedDevice{entry.request_names, entry.pool_name, entry.device, {entry.cdi_device_id}});
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

std::string StringAt(const json& object, const char* pointer) {
  const json::json_pointer ptr(pointer);
  if (!object.contains(ptr)) return {};
  const auto& value = object.at(ptr);
  return value.is_string() ? value.get<std::string>() : std::string{};
}

}  // namespace

DraComputeDomainModule::Config DraComputeDomainModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  Config config;
  if (section.Has("driverName")) {
    // Accepted only as documentation: the kubelet, the ResourceSlice and the DeviceClasses all
    // name the driver, so another value could only break the install.
    const auto name = section.String("driverName");
    if (name != kDriverName) {
      section.Fail("driverName", "is fixed to " + std::string(kDriverName) + " and cannot be changed, got \"" + name +
                                     "\"");
    }
  }
  const auto version = section.Enum("resourceApiVersion", {"v1", "v1beta2", "v1beta1"}, "v1");
  config.api_version = version == "v1beta1"   ? ResourceApiVersion::kV1beta1
                       : version == "v1beta2" ? ResourceApiVersion::kV1beta2
                                              : ResourceApiVersion::kV1;
  // Below the kubelet's 45 s per-call deadline, so the kubelet always gets our answer.
  config.prepare_timeout =
      section.Duration("prepareTimeout", milliseconds(100), milliseconds(40000), milliseconds(20000));
  config.slice_resync =
      section.Duration("sliceResync", milliseconds(1000), milliseconds(86400000), milliseconds(600000));
  config.node_events_on_corrupt_checkpoint = section.Bool("nodeEventsOnCorruptCheckpoint", true);
  config.require_imex_ready = section.Bool("requireImexReady", false);
  config.all_channels = static_cast<uint32_t>(section.Int("allChannels", 1, 2048, 2048));
  config.driver_managed = ParseDriverManagedSection(section);
  return config;
}

DraComputeDomainModule::DraComputeDomainModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      paths_(MakeDriverPaths(context.Site().paths)),
      node_name_(context.Site().node_name),
      slice_retry_timer_(context.GetLoop().Io()),
      resync_timer_(context.GetLoop().Io()) {
  auto& m = context_.Metrics();
  const auto prepares = [&m](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_prepares_total", "Claims answered in NodePrepareResources, by result",
                     {{"driver", std::string(kDriverName)}, {"result", result}});
  };
  prepares_ok_ = &prepares("ok");
  prepares_already_ = &prepares("already_prepared");
  prepares_permanent_ = &prepares("permanent_error");
  prepares_retryable_ = &prepares("retryable_error");
  const auto unprepares = [&m](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_unprepares_total", "Claims answered in NodeUnprepareResources, by result",
                     {{"driver", std::string(kDriverName)}, {"result", result}});
  };
  unprepares_ok_ = &unprepares("ok");
  unprepares_unknown_ = &unprepares("unknown_claim");
  unprepares_error_ = &unprepares("error");
  checkpoint_entries_ = &m.Gauge("gpu_node_supervisor_dra_checkpoint_entries", "Claims in the DRA checkpoint",
                                 {{"driver", std::string(kDriverName)}});
  const auto slices = [&m](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_slice_publishes_total", "ResourceSlice writes, by result",
                     {{"driver", std::string(kDriverName)}, {"result", result}});
  };
  slice_created_ = &slices("created");
  slice_updated_ = &slices("updated");
  slice_errors_ = &slices("error");
  const auto reconciled = [&m](const char* action) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_dra_reconciled_total",
                     "Start-up reconcile of checkpoint and CDI specs, by action", {{"action", action}});
  };
  reconcile_rollbacks_ = &reconciled("rollback_prepare_started");
  reconcile_orphans_ = &reconciled("delete_orphan_spec");
  reconcile_respecs_ = &reconciled("rewrite_missing_spec");
  corrupt_checkpoints_ = &m.Counter("gpu_node_supervisor_dra_corrupt_checkpoints_total",
                                    "Corrupt checkpoints moved aside at start");
}

DraComputeDomainModule::~DraComputeDomainModule() { *alive_ = false; }

// ---------------------------------------------------------------------------------- start

void DraComputeDomainModule::LogGates() {
  const auto& gates = context_.Site().gates;
  std::string line;
  for (const auto& [name, value] : gates.Values()) {
    if (!line.empty()) line += ", ";
    line += name + "=" + (value ? "true" : "false");
  }
  context_.Log().info("feature gates (resolved): {}", line);
  if (host_managed_) {
    context_.Log().info("HostManagedIMEX is on: {}={}, {}={} (forced off when the gates were resolved); channel-0 "
                        "only, no IMEX daemons, no node labels",
                        gates::kIMEXDaemonsWithDNSNames, gates.Enabled(gates::kIMEXDaemonsWithDNSNames),
                        gates::kComputeDomainCliques, gates.Enabled(gates::kComputeDomainCliques));
  } else {
    context_.Log().info("HostManagedIMEX is off: driver-managed IMEX, the supervisor runs each ComputeDomain's {} "
                        "(no per-domain DaemonSet); {}={}; {}={} (nodes register in {})",
                        config_.driver_managed.daemon.daemon_path, gates::kIMEXDaemonsWithDNSNames,
                        gates.Enabled(gates::kIMEXDaemonsWithDNSNames), gates::kComputeDomainCliques,
                        gates.Enabled(gates::kComputeDomainCliques),
                        gates.Enabled(gates::kComputeDomainCliques) ? "ComputeDomainClique objects"
                                                                     : "the ComputeDomain's status.nodes");
  }
}

void DraComputeDomainModule::Start() {
  stopping_ = false;
  host_managed_ = context_.Site().gates.Enabled(gates::kHostManagedIMEX);
  LogGates();
  if (node_name_.empty()) throw std::runtime_error("the node name is not set; it names the ResourceSlice pool");

  auto& services = context_.GetServices();
  client_ = services.Find<kube::KubeClient>();
  const auto informers = services.Find<kube::InformerRegistry>();
  if (!client_ || !informers) {
    throw std::runtime_error("the kube module's client is not available (is the `kube` module enabled?)");
  }
  events_ = services.Find<kube::EventRecorder>();

  // Seed 000 §11: without the channel major there is nothing to inject; fail the start, the
  // supervisor retries with backoff once the driver is loaded.
  const auto major = ReadImexChannelMajor(paths_.proc_devices);
  if (!major.ok()) throw std::runtime_error("cannot start without the IMEX channel major: " + major.error);
  channel_major_ = *major.major;
  context_.Log().info("IMEX channel major {} (from {})", channel_major_, paths_.proc_devices);

  LoadAndReconcile();
  if (!host_managed_) {
    DriverManagedSettings settings = config_.driver_managed;
    settings.node_name = node_name_;
    settings.state_dir = paths_.state_dir;
    settings.dns_names = context_.Site().gates.Enabled(gates::kIMEXDaemonsWithDNSNames);
    settings.cliques = context_.Site().gates.Enabled(gates::kComputeDomainCliques);
    domains_ = std::make_unique<DriverManagedDomains>(context_, settings, client_, informers);
    domains_->Load();
  }

  auto& bus = context_.GetBus();
  clique_id_.clear();
  clique_known_ = false;
  clique_reason_ = "gpu-inventory has published no clique yet";
  if (const auto* clique = bus.Latest<gpu_inventory::NodeClique>()) {
    clique_id_ = clique->clique_id;
    clique_known_ = clique->known || !clique->clique_id.empty();
    clique_reason_ = clique->reason;
  }
  if (domains_) {
    domains_->SetClique(clique_id_);
    std::vector<std::string> prepared;
    for (const auto& [uid, entry] : checkpoint_.claims) {
      if (entry.state == ClaimState::kPrepareCompleted) prepared.push_back(uid);
    }
    domains_->Resume(prepared);
  }
  clique_sub_ = bus.Subscribe<gpu_inventory::NodeClique>(
      [this](const gpu_inventory::NodeClique& clique) { OnClique(clique); });

  // The DRA service first: the kubelet dials it as soon as it has registered us.
  dra_server_ = std::make_unique<DraServer>(context_.GetLoop(), static_cast<DraHandler&>(*this));
  dra_server_->Start(paths_.dra_socket);
  registration_server_ = std::make_unique<RegistrationServer>(
      context_.GetLoop(), RegistrationServer::Info{std::string(kDriverName), paths_.dra_socket},
      [this, alive = alive_](bool registered, const std::string& error) {
        if (!*alive) return;
        registered_ = registered;
        registration_error_ = error;
        if (registered) {
          context_.Log().info("registered with the kubelet as {}", kDriverName);
          context_.SetHealth(ModuleHealth::kOk);
        } else {
          context_.Log().warn("the kubelet refused the registration: {}", error);
          context_.SetHealth(ModuleHealth::kUnhealthy, "kubelet refused the registration: " + error);
        }
        PublishState();
      });
  registration_server_->Start(paths_.registration_socket);
  context_.SetHealth(ModuleHealth::kUnhealthy, "waiting for the kubelet's plugin watcher");
  context_.Log().info("serving DRA v1/v1beta1 on {}, registration on {}", paths_.dra_socket,
                      paths_.registration_socket);

  // Keep the ResourceSlice true: the kubelet deletes a node's slices when it starts.
  const kube::InformerSpec spec{SliceCollection(), "",
                                "spec.nodeName=" + node_name_ + ",spec.driver=" + std::string(kDriverName)};
  slice_informer_key_ = spec.Key();
  slice_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& event) {
    if (event.informer_key != slice_informer_key_ || !event.object) return;
    if (StringAt(*event.object, "/metadata/name") != ResourceSliceName(node_name_)) return;
    if (event.type == kube::ResourceEvent::Type::kDeleted) {
      context_.Log().warn("ResourceSlice {} was deleted (a kubelet start wipes the node's slices): recreating it",
                          ResourceSliceName(node_name_));
      PublishSlice();
    } else if (!node_uid_.empty() && SliceNeedsUpdate(*event.object, DesiredSlice(0))) {
      PublishSlice();
    }
  });
  slice_informer_ = informers->Acquire(spec);
  if (!corrupt_note_.empty()) RecordCorruptCheckpointEvent();
  PublishSlice();
  ScheduleResync();
  PublishState();
}

void DraComputeDomainModule::LoadAndReconcile() {
  checkpoint_ = {};
  corrupt_note_.clear();
  log_.reset();
  const auto& path = paths_.checkpoint_file;
  const auto& log_path = paths_.claim_log_file;
  ClaimStateLoad loaded = LoadClaimState(path, log_path);
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
    const std::string aside = log_path + ".corrupt-" + std::to_string(now_s);
    std::string moved = std::rename(log_path.c_str(), aside.c_str()) == 0
                            ? "moved to " + aside
                            : "could not be moved aside (" + std::string(std::strerror(errno)) + ")";
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
      const auto deleted = DeleteCdiSpec(paths_.cdi_dir, entry.uid);
      if (!deleted) throw std::runtime_error("reconcile: " + deleted.error);
      context_.Log().warn("reconcile: rolled back claim {}/{} (uid {}) left in PrepareStarted: CDI spec deleted, "
                          "checkpoint entry removed; the kubelet's retry prepares it again",
                          entry.namespace_name, entry.name, entry.uid);
      reconcile_rollbacks_->Inc();
      it = checkpoint_.claims.erase(it);
      continue;
    }
    // The spec is derived state, written without fsync in the hot path: make it again when it
    // is missing (a cleaned CDI dir), emptied (a power loss) or stale (another channel major).
    if (!CdiSpecIsCurrent(paths_.cdi_dir, entry.uid, channel_major_, entry.channels)) {
      const auto written = WriteChannelCdiSpec(paths_.cdi_dir, entry.uid, channel_major_, entry.channels);
      if (!written) throw std::runtime_error("reconcile: " + written.error);
      context_.Log().warn("reconcile: rewrote the missing or stale CDI spec of prepared claim {}/{} (uid {})",
                          entry.namespace_name, entry.name, entry.uid);
      reconcile_respecs_->Inc();
    }
    ++it;
  }

  // Temp files of our spec writes that a crash interrupted (only ours: the directory is shared).
  const auto sweep = RemoveInterruptedCdiSpecWrites(paths_.cdi_dir);
  for (const auto& removed : sweep.removed) {
    context_.Log().info("reconcile: removed {}, left by an interrupted CDI spec write", removed);
  }
  for (const auto& error : sweep.errors) context_.Log().warn("reconcile: {}", error);

  const auto listing = ListCdiSpecClaimUids(paths_.cdi_dir);
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
    const auto deleted = DeleteCdiSpec(paths_.cdi_dir, uid);
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

void DraComputeDomainModule::RecordCorruptCheckpointEvent() {
  if (!config_.node_events_on_corrupt_checkpoint) return;
  if (!events_) {
    context_.Log().warn("no event recorder: the corrupt-checkpoint Node Event is not sent");
    return;
  }
  kube::ObjectReference node;
  node.name = node_name_;
  node.uid = node_uid_;
  events_->Record(node, "Warning", "CorruptCheckpoint", "LoadCheckpoint", corrupt_note_);
}

void DraComputeDomainModule::OnClique(const gpu_inventory::NodeClique& clique) {
  const bool known = clique.known || !clique.clique_id.empty();
  clique_reason_ = clique.reason;
  const bool known_now = known && !clique_known_;
  const bool known_changed = known != clique_known_;
  clique_known_ = known;
  if (known_changed && !known_now) PublishState();
  if (clique.clique_id != clique_id_) {
    context_.Log().info("node clique {} → {}{}", clique_id_.empty() ? "(none)" : clique_id_,
                        clique.clique_id.empty() ? "(none)" : clique.clique_id,
                        clique.clique_id.empty() ? " (" + clique.reason + ")" : std::string{});
    clique_id_ = clique.clique_id;
    if (domains_) domains_->SetClique(clique_id_);
    PublishState();
    PublishSlice();
  }
  if (known_now && !clique_waiters_.empty()) {
    context_.Log().info("the node's clique is known ({}): deciding {} waiting prepare(s) again",
                        clique_id_.empty() ? "none" : clique_id_, clique_waiters_.size());
    auto waiters = std::move(clique_waiters_);
    clique_waiters_.clear();
    for (auto& waiter : waiters) waiter();
  }
  if (known_now) PublishState();
}

// ---------------------------------------------------------------------------------- stop

void DraComputeDomainModule::Stop(std::function<void()> done) {
  stopping_ = true;
  slice_retry_timer_.cancel();
  resync_timer_.cancel();
  clique_sub_.Reset();
  clique_waiters_.clear();  // their calls are failed by the DRA server's shutdown
  slice_sub_.Reset();
  slice_informer_.reset();
  jobs_.clear();  // their calls are failed by the DRA server's shutdown
  pending_prepares_.clear();  // never committed, never answered
  auto finish = [this, alive = alive_, done = std::move(done)] {
    if (*alive) {
      domains_.reset();
      dra_server_.reset();
      registration_server_.reset();
      registered_ = false;
      PublishState();
    }
    done();
  };
  auto stop_dra = [this, alive = alive_, finish = std::move(finish)]() mutable {
    if (*alive && dra_server_) {
      dra_server_->Shutdown(context_.Pool(), std::move(finish));
    } else {
      finish();
    }
  };
  // Registration first: removing its socket deregisters us before the DRA socket goes.
  auto stop_servers = [this, alive = alive_, stop_dra = std::move(stop_dra)]() mutable {
    if (*alive && registration_server_) {
      registration_server_->Shutdown(context_.Pool(), std::move(stop_dra));
    } else {
      stop_dra();
    }
  };
  // Driver-managed daemons stop with us; their registrations stay for the next start.
  if (domains_) {
    domains_->Stop(std::move(stop_servers));
  } else {
    stop_servers();
  }
}

// ---------------------------------------------------------------------------------- jobs

void DraComputeDomainModule::Enqueue(Job job) {
  jobs_.push_back(std::move(job));
  if (!job_running_) RunNextJob();
}

void DraComputeDomainModule::RunNextJob() {
  if (stopping_ || jobs_.empty()) {
    job_running_ = false;
    return;
  }
  job_running_ = true;
  Job job = std::move(jobs_.front());
  jobs_.pop_front();
  job([this, alive = alive_] {
    if (!*alive) return;
    // Through the loop, so a long run of immediate answers does not recurse.
    context_.GetLoop().Post([this, alive] {
      if (*alive) RunNextJob();
    });
  });
}

void DraComputeDomainModule::After(milliseconds delay, std::function<void()> fn) {
  auto timer = std::make_shared<boost::asio::steady_timer>(context_.GetLoop().Io(), delay);
  timer->async_wait([timer, alive = alive_, fn = std::move(fn)](const boost::system::error_code& ec) {
    if (ec || !*alive) return;
    fn();
  });
}

void DraComputeDomainModule::FetchWithRetry(bool list, std::string path, std::chrono::steady_clock::time_point deadline,
                                            milliseconds delay, std::function<void(kube::Result)> done) {
  auto on_result = [this, alive = alive_, list, path, deadline, delay, done](kube::Result result) mutable {
    if (!*alive) return;
    if (kube::IsTransient(result) && !stopping_ && std::chrono::steady_clock::now() + delay < deadline) {
      context_.Log().debug("{} {}: {} (HTTP {}); retrying in {} ms", list ? "list" : "get", path, result.error,
                           result.http_status, delay.count());
      After(delay, [this, list, path, deadline, delay, done = std::move(done)]() mutable {
        FetchWithRetry(list, std::move(path), deadline, std::min(delay * 2, kMaxRetryDelay), std::move(done));
      });
      return;
    }
    done(std::move(result));
  };
  if (list) {
    kube::ListOptions options;
    client_->List(path, options, std::move(on_result));
  } else {
    client_->Get(path, std::move(on_result));
  }
}

// ---------------------------------------------------------------------------------- prepare

void DraComputeDomainModule::Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) {
  Enqueue([this, claims = std::move(claims), done = std::move(done)](std::function<void()> finished) mutable {
    auto batch = std::make_shared<PrepareBatch>();
    batch->claims = std::move(claims);
    batch->done = std::move(done);
    batch->finished = std::move(finished);
    PrepareNext(std::move(batch));
  });
}

void DraComputeDomainModule::PrepareNext(std::shared_ptr<PrepareBatch> batch) {
  if (stopping_) return;  // the DRA server's shutdown answers the call
  if (batch->next == batch->claims.size()) {
    if (!pending_prepares_.empty()) {
      CommitPrepares(std::move(batch));
      return;
    }
    batch->done(std::move(batch->results));
    batch->finished();
    return;
  }
  const ClaimRef claim = batch->claims[batch->next++];
  PrepareOne(claim, [this, alive = alive_, batch, uid = claim.uid](PrepareResult result) {
    if (!*alive) return;
    batch->results[uid] = std::move(result);
    PrepareNext(batch);
  });
}

void DraComputeDomainModule::PrepareOne(const ClaimRef& claim, std::function<void(PrepareResult)> done) {
  // A repeated Prepare (the kubelet lost our answer, or restarted) answers from the checkpoint.
  if (auto existing = CompletedPrepare(DecideView(), claim.uid)) {
    prepares_already_->Inc();
    done(ResultFrom(*existing));
    return;
  }
  if (!IsValidClaimUid(claim.uid) || claim.namespace_name.empty() || claim.name.empty()) {
    prepares_permanent_->Inc();
    done(ErrorResult(Ref(claim) + ": the kubelet sent an invalid claim reference (uid \"" + claim.uid + "\")"));
    return;
  }
  if (config_.require_imex_ready) {
    const auto* imex = context_.GetBus().Latest<imex_health::ImexHealth>();
    if (!imex || !imex->ready) {
      prepares_retryable_->Inc();
      const std::string why = imex ? imex->reason + ": " + imex->message : "imex-health has not judged host IMEX yet";
      SetError(Ref(claim) + ": host IMEX not ready: " + why);
      done(ErrorResult(Ref(claim) + ": host IMEX is not ready (" + why + "); the kubelet retries"));
      return;
    }
  }
  FetchClaim(claim, std::chrono::steady_clock::now() + config_.prepare_timeout, std::move(done));
}

// The claim and the ComputeDomains of its namespace, fetched at the same time (the namespace is
// the kubelet's; only the match on the domain UID needs the claim): one API round trip of
// latency per prepare instead of two. The list is wasted when the claim turns out not to need it.
struct DraComputeDomainModule::Fetches {
  std::optional<kube::Result> claim;
  std::optional<kube::Result> domains;
};

void DraComputeDomainModule::FetchClaim(const ClaimRef& claim, std::chrono::steady_clock::time_point deadline,
                                        std::function<void(PrepareResult)> done) {
  const std::string claim_path =
      kube::ResourcePath::Grouped("resource.k8s.io", std::string(VersionOnly(config_.api_version)), "resourceclaims",
                                  claim.namespace_name)
          .Object(claim.name);
  // A list per prepare (not an informer): prepares are rare, and the module then needs no
  // cluster-wide watch on ComputeDomains. A domain in another namespace is therefore "not found".
  const std::string domains_path =
      kube::ResourcePath::Grouped("resource.nvidia.com", "v1beta1", "computedomains", claim.namespace_name)
          .Collection();
  auto fetches = std::make_shared<Fetches>();
  auto pending = std::make_shared<std::function<void(PrepareResult)>>(std::move(done));
  FetchWithRetry(false, claim_path, deadline, kFirstRetryDelay,
                 [this, claim, deadline, fetches, pending](kube::Result result) {
                   fetches->claim = std::move(result);
                   if (fetches->domains) OnFetched(claim, deadline, std::move(*fetches), std::move(*pending));
                 });
  FetchWithRetry(true, domains_path, deadline, kFirstRetryDelay,
                 [this, claim, deadline, fetches, pending](kube::Result result) {
                   fetches->domains = std::move(result);
                   if (fetches->claim) OnFetched(claim, deadline, std::move(*fetches), std::move(*pending));
                 });
}

void DraComputeDomainModule::OnFetched(const ClaimRef& claim, std::chrono::steady_clock::time_point deadline,
                                       Fetches fetches, std::function<void(PrepareResult)> done) {
  if (stopping_) return;
  kube::Result& result = *fetches.claim;
  if (result.http_status == 404) {
    prepares_permanent_->Inc();
    SetError(Ref(claim) + ": not found");
    done(ErrorResult(Ref(claim) + ": not found (deleted?)"));
    return;
  }
  if (!result.Ok()) {
    prepares_retryable_->Inc();
    SetError(Ref(claim) + ": cannot fetch: " + result.error);
    done(ErrorResult(Ref(claim) + ": cannot fetch the claim: " + result.error));
    return;
  }
  const std::string domain_uid = DomainUidOf(result.object);
  if (domain_uid.empty()) {
    // DecidePrepare fails before it needs the ComputeDomain.
    DecideAndWrite(claim, result.object, DomainLookup::Error("not looked up"), deadline, std::move(done));
    return;
  }
  const kube::Result& domains = *fetches.domains;
  DomainLookup lookup = DomainLookup::NotFound();
  if (domains.http_status == 404) {
    lookup = DomainLookup::Error("the ComputeDomain resource (resource.nvidia.com/v1beta1) is not served; is the CRD "
                                 "installed?");
  } else if (!domains.Ok()) {
    lookup = DomainLookup::Error(domains.error);
  } else if (domains.object.contains("items") && domains.object["items"].is_array()) {
    for (const auto& item : domains.object["items"]) {
      if (StringAt(item, "/metadata/uid") != domain_uid) continue;
      lookup = DomainLookup::Found(
          {domain_uid, StringAt(item, "/metadata/namespace"), StringAt(item, "/metadata/name")});
      if (lookup.domain.namespace_name.empty()) lookup.domain.namespace_name = claim.namespace_name;
      break;
    }
  }
  DecideAndWrite(claim, result.object, lookup, deadline, std::move(done));
}

void DraComputeDomainModule::DecideAndWrite(const ClaimRef& claim, const json& object, const DomainLookup& domain,
                                            std::chrono::steady_clock::time_point deadline,
                                            std::function<void(PrepareResult)> done, bool attached) {
  PrepareContext prepare_context;
  prepare_context.node_name = node_name_;
  prepare_context.clique_id = clique_id_;
  prepare_context.clique_known = clique_known_;
  prepare_context.clique_reason = clique_reason_;
  prepare_context.host_managed = host_managed_;
  prepare_context.checkpoint = &DecideView();
  const PrepareDecision decision =
      DecidePrepare(object, claim.uid, prepare_context, [&domain](std::string_view) { return domain; });
  switch (decision.outcome) {
    case PrepareOutcome::kAlreadyPrepared:
      prepares_already_->Inc();
      done(ResultFrom(decision.existing));
      return;
    case PrepareOutcome::kPermanentError:
    case PrepareOutcome::kRetryableError: {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      if (decision.waits_for_clique && left > milliseconds(0)) {
        // Right after start NVML may not have reported the fabric yet: wait for gpu-inventory
        // (within this prepare's deadline) instead of answering "no clique" before we know.
        context_.Log().info("prepare {} (uid {}) waits up to {} ms for the node's clique to be known",
                            claim.namespace_name + "/" + claim.name, claim.uid, left.count());
        auto pending = std::make_shared<std::function<void(PrepareResult)>>(std::move(done));
        auto answered = std::make_shared<bool>(false);
        clique_waiters_.push_back([this, claim, object, domain, deadline, pending, answered] {
          if (*answered || stopping_) return;
          *answered = true;
          DecideAndWrite(claim, object, domain, deadline, std::move(*pending));
        });
        PublishState();
        After(left, [this, claim, object, domain, pending, answered] {
          if (*answered || stopping_) return;
          *answered = true;
          // Prepares run one at a time (the job queue): the only waiter is this one.
          clique_waiters_.clear();
          // Decided once more at the deadline: the answer names what is still missing.
          DecideAndWrite(claim, object, domain, std::chrono::steady_clock::time_point{}, std::move(*pending));
        });
        return;
      }
      const bool permanent = decision.outcome == PrepareOutcome::kPermanentError;
      (permanent ? prepares_permanent_ : prepares_retryable_)->Inc();
      context_.Log().warn("prepare {} (uid {}) failed ({}): {}", claim.namespace_name + "/" + claim.name, claim.uid,
                          permanent ? "permanent" : "retryable", decision.error);
      SetError(decision.error);
      done(ErrorResult(decision.error));
      return;
    }
    case PrepareOutcome::kPrepare:
      break;
  }
  if (domains_ && !attached) {
    // Driver-managed: the domain's verdict for this node decides (driver_managed.hpp).
    domains_->Attach(claim.uid, decision.claim_namespace, decision.claim_name, domain.domain,
                     [this, alive = alive_, claim, object, domain, deadline, done](DomainVerdict verdict) mutable {
                       if (!*alive || stopping_) return;
                       if (verdict.kind == DomainVerdict::Kind::kReady) {
                         DecideAndWrite(claim, object, domain, deadline, std::move(done), true);
                         return;
                       }
                       const bool permanent = verdict.kind == DomainVerdict::Kind::kRefused;
                       (permanent ? prepares_permanent_ : prepares_retryable_)->Inc();
                       const std::string error =
                           Ref(claim) + ": " + verdict.message + (permanent ? "" : "; the kubelet retries");
                       context_.Log().warn("prepare {} (uid {}) {}: {}", claim.namespace_name + "/" + claim.name,
                                           claim.uid, permanent ? "refused" : "waits for its ComputeDomain",
                                           verdict.message);
                       SetError(error);
                       done(ErrorResult(error));
                     });
    return;
  }

  PreparedClaim entry;
  entry.uid = claim.uid;
  entry.namespace_name = decision.claim_namespace;
  entry.name = decision.claim_name;
  entry.state = ClaimState::kPrepareCompleted;
  entry.domain_uid = decision.domain_uid;
  entry.device = decision.device_name;
  entry.pool_name = decision.pool_name;
  entry.request_names = decision.request_names;
  entry.cdi_spec_file = CdiSpecFileName(claim.uid);
  entry.cdi_device_id = CdiQualifiedDeviceId(claim.uid);
  entry.started_unix_ms = UnixMillis(context_.GetClock());
  entry.completed_unix_ms = entry.started_unix_ms;
  entry.channels = decision.allocation_mode == "All" ? config_.all_channels : 1u;
  // Not yet durable: the call's claims are committed together (CommitPrepares) before the
  // kubelet hears of any; the answer below stands only if that commit succeeds.
  pending_prepares_.push_back(entry);
  done(ResultFrom(entry));
}

const Checkpoint& DraComputeDomainModule::DecideView() {
  if (pending_prepares_.empty()) return checkpoint_;
  decide_view_ = checkpoint_;
  for (const auto& entry : pending_prepares_) decide_view_.claims[entry.uid] = entry;
  return decide_view_;
}

namespace {

// What the pool reports back from a commit: the records that reached the disk.
struct CommitOutcome {
  std::vector<std::string> committed;           // claim UIDs whose record is durable
  std::map<std::string, std::string> failed;    // claim UID → why (its own file step failed)
  std::string log_error;                        // the append failed: nothing is durable
  uint64_t last_seq = 0;
  std::size_t log_used = 0;
};

}  // namespace

// One durable write for the whole call: each claim's CDI spec (visible at once, no fsync: it is
// re-made from the record at start), then every record in one append + fdatasync.
void DraComputeDomainModule::CommitPrepares(std::shared_ptr<PrepareBatch> batch) {
  std::vector<PreparedClaim> entries = std::move(pending_prepares_);
  pending_prepares_.clear();
  context_.Pool().Run(
      [log = log_, cdi_dir = paths_.cdi_dir, major = channel_major_, entries, seq = next_seq_]() mutable {
        CommitOutcome out;
        std::string records;
        for (const auto& entry : entries) {
          if (auto r = WriteChannelCdiSpec(cdi_dir, entry.uid, major, entry.channels, SpecDurability::kVisibleOnly);
              !r) {
            out.failed[entry.uid] = "cannot write the CDI spec: " + r.error;
            continue;
          }
          records += EncodeClaimLogRecord({seq++, ClaimLogRecord::Op::kPrepared, entry});
          out.committed.push_back(entry.uid);
        }
        out.last_seq = seq - 1;
        if (!records.empty()) {
          if (auto r = log->Append(records); !r) out.log_error = "cannot append to the claim log: " + r.error;
        }
        out.log_used = log->Used();
        return out;
      },
      [this, alive = alive_, batch, entries](CommitOutcome out, std::exception_ptr error) {
        if (!*alive) return;
        if (error && out.log_error.empty()) out.log_error = "unexpected failure while committing";
        for (const auto& entry : entries) {
          const ClaimRef* claim = nullptr;
          for (const auto& c : batch->claims) {
            if (c.uid == entry.uid) claim = &c;
          }
          const std::string who = claim ? Ref(*claim) : "ResourceClaim uid " + entry.uid;
          std::string why;
          if (const auto it = out.failed.find(entry.uid); it != out.failed.end()) why = it->second;
          if (why.empty() && !out.log_error.empty()) why = out.log_error;
          if (!why.empty()) {
            prepares_retryable_->Inc();
            context_.Log().error("prepare {} (uid {}) failed: {}", entry.namespace_name + "/" + entry.name, entry.uid,
                                 why);
            SetError(who + ": " + why);
            batch->results[entry.uid] = ErrorResult(who + ": " + why);
            continue;
          }
          checkpoint_.claims[entry.uid] = entry;
          prepares_ok_->Inc();
          context_.Log().info("prepared {} (uid {}) for ComputeDomain {}: {}", entry.namespace_name + "/" + entry.name,
                              entry.uid, entry.domain_uid, entry.cdi_device_id);
        }
        CommitDone(out.log_error, out.last_seq, out.log_used, out.committed.size());
        batch->done(std::move(batch->results));
        batch->finished();
      });
}

// The loop's side of a commit: the sequence moves on, a failed append restarts the module (the
// file's state after a failed write or fdatasync is unknown: recover from what is on disk), a
// full log is compacted before the next call.
void DraComputeDomainModule::CommitDone(const std::string& log_error, uint64_t last_seq, std::size_t log_used,
                                        std::size_t committed) {
  UpdateCheckpointGauge();
  PublishState();
  if (!log_error.empty()) {
    context_.ReportFailure(log_error);
    return;
  }
  if (committed > 0) next_seq_ = last_seq + 1;
  if (log_used >= config_.claim_log_compact_at && !compaction_queued_ && !stopping_) {
    compaction_queued_ = true;
    Enqueue([this](std::function<void()> finished) { Compact(std::move(finished)); });
  }
}

// The checkpoint takes in the log (durably, atomically), then the log starts over. Runs as a job,
// between kubelet calls.
void DraComputeDomainModule::Compact(std::function<void()> finished) {
  Checkpoint snapshot = checkpoint_;
  snapshot.log_seq = next_seq_ - 1;
  context_.Pool().Run(
      [log = log_, path = paths_.checkpoint_file, snapshot]() {
        if (auto r = SaveCheckpoint(path, snapshot); !r) return r.error;
        log->Rewind();
        return std::string{};
      },
      [this, alive = alive_, finished = std::move(finished)](std::string error, std::exception_ptr exception) {
        if (!*alive) return;
        compaction_queued_ = false;
        if (exception && error.empty()) error = "unexpected failure";
        if (!error.empty()) {
          // The log keeps growing past its pre-zeroed size (slower appends); tried again after
          // the next commit.
          context_.Log().warn("claim log compaction failed: {}", error);
        } else {
          context_.Log().debug("claim log compacted into {} (up to seq {})", paths_.checkpoint_file, next_seq_ - 1);
        }
        finished();
      });
}

// ---------------------------------------------------------------------------------- unprepare

void DraComputeDomainModule::Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) {
  Enqueue([this, claims = std::move(claims), done = std::move(done)](std::function<void()> finished) mutable {
    auto batch = std::make_shared<UnprepareBatch>();
    batch->claims = std::move(claims);
    batch->done = std::move(done);
    batch->finished = std::move(finished);
    UnprepareNext(std::move(batch));
  });
}

void DraComputeDomainModule::UnprepareNext(std::shared_ptr<UnprepareBatch> batch) {
  if (stopping_) return;
  // Claims we hold a record of get one "unprepared" record each, all in one append; the spec of
  // every valid UID is deleted first (by UID even for an unknown claim: after a damaged claim
  // state, specs of claims we no longer know about are kept until their Unprepare). A crash
  // after the deletion and before the record: the entry is still there at start, its spec is
  // made again, and the kubelet's retry (it got no answer) deletes it.
  std::vector<ClaimRef> work;
  std::vector<bool> known;
  for (const auto& claim : batch->claims) {
    const UnprepareDecision decision = DecideUnprepare(checkpoint_, claim.uid);
    if (!decision.known && !IsValidClaimUid(claim.uid)) {
      unprepares_unknown_->Inc();
      batch->results[claim.uid] = {};
      continue;
    }
    work.push_back(claim);
    known.push_back(decision.known);
  }
  if (work.empty()) {
    FinishUnprepare(std::move(batch), {});
    return;
  }
  context_.Pool().Run(
      [log = log_, cdi_dir = paths_.cdi_dir, work, known, seq = next_seq_]() mutable {
        CommitOutcome out;
        std::string records;
        for (std::size_t i = 0; i < work.size(); ++i) {
          const std::string& uid = work[i].uid;
          if (auto r = DeleteCdiSpec(cdi_dir, uid); !r) {
            out.failed[uid] = "cannot delete the CDI spec: " + r.error;
            continue;
          }
          if (!known[i]) continue;
          ClaimLogRecord record;
          record.seq = seq++;
          record.op = ClaimLogRecord::Op::kUnprepared;
          record.claim.uid = uid;
          records += EncodeClaimLogRecord(record);
          out.committed.push_back(uid);
        }
        out.last_seq = seq - 1;
        if (!records.empty()) {
          if (auto r = log->Append(records); !r) out.log_error = "cannot append to the claim log: " + r.error;
        }
        out.log_used = log->Used();
        return out;
      },
      [this, alive = alive_, batch, work, known](CommitOutcome out, std::exception_ptr error) mutable {
        if (!*alive) return;
        if (error && out.log_error.empty()) out.log_error = "unexpected failure while committing";
        std::vector<ClaimRef> detach;
        for (std::size_t i = 0; i < work.size(); ++i) {
          const ClaimRef& claim = work[i];
          std::string why;
          if (const auto it = out.failed.find(claim.uid); it != out.failed.end()) why = it->second;
          if (why.empty() && known[i] && !out.log_error.empty()) why = out.log_error;
          UnprepareResult result;
          if (!why.empty()) {
            unprepares_error_->Inc();
            result.error = Ref(claim) + ": " + why;
            context_.Log().error("unprepare {} (uid {}) failed: {}", claim.namespace_name + "/" + claim.name,
                                 claim.uid, why);
            SetError(result.error);
          } else if (known[i]) {
            checkpoint_.claims.erase(claim.uid);
            unprepares_ok_->Inc();
            context_.Log().info("unprepared {} (uid {})", claim.namespace_name + "/" + claim.name, claim.uid);
            detach.push_back(claim);
          } else {
            unprepares_unknown_->Inc();
            detach.push_back(claim);
          }
          batch->results[claim.uid] = std::move(result);
        }
        CommitDone(out.log_error, out.last_seq, out.log_used, out.committed.size());
        FinishUnprepare(std::move(batch), std::move(detach));
      });
}

// Driver-managed: the domain's last claim stops its daemon and deregisters the node, claim by
// claim; then the kubelet gets the call's answer.
void DraComputeDomainModule::FinishUnprepare(std::shared_ptr<UnprepareBatch> batch, std::vector<ClaimRef> detach) {
  if (!domains_ || detach.empty()) {
    batch->done(std::move(batch->results));
    batch->finished();
    return;
  }
  const ClaimRef claim = detach.back();
  detach.pop_back();
  domains_->Detach(claim.uid, [this, alive = alive_, batch, detach = std::move(detach), claim](std::string error) mutable {
    if (!*alive) return;
    if (!error.empty()) batch->results[claim.uid].error = Ref(claim) + ": " + error;
    FinishUnprepare(std::move(batch), std::move(detach));
  });
}

// ---------------------------------------------------------------------------------- slice

std::string DraComputeDomainModule::SliceCollection() const {
  return kube::ResourcePath::Grouped("resource.k8s.io", std::string(VersionOnly(config_.api_version)),
                                     "resourceslices")
      .Collection();
}

json DraComputeDomainModule::DesiredSlice(int64_t generation) const {
  SliceInputs inputs;
  inputs.node_name = node_name_;
  inputs.node_uid = node_uid_;
  inputs.clique_id = clique_id_;
  inputs.host_managed = host_managed_;
  inputs.generation = std::max<int64_t>(generation, 1);
  inputs.api_version = config_.api_version;
  return BuildResourceSlice(inputs);
}

void DraComputeDomainModule::PublishSlice() {
  if (stopping_ || !client_) return;
  if (slice_busy_) {
    slice_again_ = true;
    return;
  }
  slice_busy_ = true;
  slice_retry_timer_.cancel();
  if (!node_uid_.empty()) {
    PublishSliceWithNode();
    return;
  }
  // The slice is owned by the Node (garbage-collected with it): its UID first.
  client_->Get(kube::ResourcePath::Core("nodes").Object(node_name_), [this, alive = alive_](kube::Result result) {
    if (!*alive || stopping_) return;
    if (!result.Ok()) {
      SliceDone(false, "cannot read Node " + node_name_ + ": " + result.error);
      return;
    }
    node_uid_ = StringAt(result.object, "/metadata/uid");
    PublishSliceWithNode();
  });
}

void DraComputeDomainModule::PublishSliceWithNode() {
  const std::string name = ResourceSliceName(node_name_);
  const std::string path = SliceCollection() + "/" + name;
  client_->Get(path, [this, alive = alive_, name, path](kube::Result current) {
    if (!*alive || stopping_) return;
    if (current.http_status == 404) {
      // A new slice starts a new pool generation, above any we wrote before.
      const int64_t generation = slice_generation_ + 1;
      client_->Create(SliceCollection(), DesiredSlice(generation),
                      [this, alive, name, generation](kube::Result created) {
                        if (!*alive || stopping_) return;
                        if (!created.Ok()) {
                          SliceDone(false, "cannot create ResourceSlice " + name + ": " + created.error);
                          return;
                        }
                        slice_generation_ = generation;
                        slice_created_->Inc();
                        context_.Log().info("created ResourceSlice {} (pool generation {}, clique {})", name,
                                            generation, clique_id_.empty() ? "(none)" : clique_id_);
                        SliceDone(true, {});
                      });
      return;
    }
    if (!current.Ok()) {
      SliceDone(false, "cannot read ResourceSlice " + name + ": " + current.error);
      return;
    }
    const json gen_ptr = current.object.value(json::json_pointer("/spec/pool/generation"), json(0));
    const int64_t current_generation = gen_ptr.is_number_integer() ? gen_ptr.get<int64_t>() : 0;
    if (!SliceNeedsUpdate(current.object, DesiredSlice(current_generation))) {
      slice_generation_ = current_generation;
      SliceDone(true, {});
      return;
    }
    const int64_t generation = std::max(current_generation, slice_generation_) + 1;
    json desired = DesiredSlice(generation);
    desired["metadata"]["resourceVersion"] = StringAt(current.object, "/metadata/resourceVersion");
    client_->Update(path, desired, [this, alive, name, generation](kube::Result updated) {
      if (!*alive || stopping_) return;
      if (!updated.Ok()) {
        SliceDone(false, "cannot update ResourceSlice " + name + ": " + updated.error);
        return;
      }
      slice_generation_ = generation;
      slice_updated_->Inc();
      context_.Log().info("updated ResourceSlice {} (pool generation {}, clique {})", name, generation,
                          clique_id_.empty() ? "(none)" : clique_id_);
      SliceDone(true, {});
    });
  });
}

void DraComputeDomainModule::SliceDone(bool ok, const std::string& error) {
  slice_busy_ = false;
  if (ok) {
    ++slice_publishes_;
    slice_retry_delay_ = kSliceRetryInitial;
  } else {
    slice_errors_->Inc();
    context_.Log().warn("{}; retrying in {} ms", error, slice_retry_delay_.count());
    SetError(error);
    if (!slice_again_) ScheduleSliceRetry();
  }
  if (slice_again_) {
    slice_again_ = false;
    PublishSlice();
  }
  PublishState();
}

void DraComputeDomainModule::ScheduleSliceRetry() {
  slice_retry_timer_.expires_after(slice_retry_delay_);
  slice_retry_delay_ = std::min(slice_retry_delay_ * 2, kSliceRetryMax);
  slice_retry_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive) return;
    PublishSlice();
  });
}

void DraComputeDomainModule::ScheduleResync() {
  resync_timer_.expires_after(config_.slice_resync);
  resync_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive || stopping_) return;
    PublishSlice();
    ScheduleResync();
  });
}

// ---------------------------------------------------------------------------------- state

void DraComputeDomainModule::UpdateCheckpointGauge() {
  checkpoint_entries_->Set(static_cast<double>(checkpoint_.claims.size()));
}

void DraComputeDomainModule::SetError(std::string error) { last_error_ = std::move(error); }

void DraComputeDomainModule::PublishState() {
  DraComputeDomainState state;
  state.host_managed = host_managed_;
  state.registered = registered_;
  state.registration_error = registration_error_;
  state.channel_major = channel_major_;
  state.clique_id = clique_id_;
  state.clique_known = clique_known_;
  state.waiting_for_clique = clique_waiters_.size();
  for (const auto& [uid, entry] : checkpoint_.claims) {
    state.prepared_claims.push_back(
        {uid, entry.namespace_name, entry.name, std::string(ToString(entry.state)), entry.domain_uid});
  }
  state.slice_generation = slice_generation_;
  state.slice_publishes = slice_publishes_;
  state.last_error = last_error_;
  context_.GetBus().Publish(std::move(state));
}

}  // namespace gns::dra
