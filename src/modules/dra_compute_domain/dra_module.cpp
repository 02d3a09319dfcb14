// The dra-compute-domain module.
#include "modules/dra_compute_domain/dra_module.hpp"
#include "loop/awaitables.hpp"
#include "loop/exception_text.hpp"
#include "loop/json_fields.hpp"
#include "loop/state_file.hpp"
#include "loop/state_load.hpp"

// GCC 12 at -O2 (GCC bug 109224): once Asio's coroutine frame allocation (operator new through
// thread_info_base) and the frame's own sized operator delete are both inlined into a coroutine,
// it reports them as mismatched. They are Asio's matched pair.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "modules/dra_compute_domain/cdi_spec.hpp"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/claim_commit.hpp"
#include "modules/dra_compute_domain/messages.hpp"
#include "modules/dra_compute_domain/proc_devices.hpp"
#include "dra_plugin/registration_server.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/imex_health/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace gns::dra {

namespace asio = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kFirstRetryDelay{200};
constexpr milliseconds kMaxRetryDelay{2000};

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

// The claim's ComputeDomain in the list of its namespace's domains.
DomainLookup FindDomain(const kube::Result& domains, const std::string& domain_uid,
                        const std::string& claim_namespace) {
  if (domains.http_status == 404) {
    return DomainLookup::Error("the ComputeDomain resource (resource.nvidia.com/v1beta1) is not served; is the CRD "
                               "installed?");
  }
  if (!domains.Ok()) return DomainLookup::Error(domains.error);
  if (domains.object.contains("items") && domains.object["items"].is_array()) {
    for (const auto& item : domains.object["items"]) {
      if (JsonStringAt(item, "/metadata/uid") != domain_uid) continue;
      DomainLookup lookup =
          DomainLookup::Found({domain_uid, JsonStringAt(item, "/metadata/namespace"), JsonStringAt(item, "/metadata/name")});
      if (lookup.domain.namespace_name.empty()) lookup.domain.namespace_name = claim_namespace;
      return lookup;
    }
  }
  return DomainLookup::NotFound();
}

// This driver's per-claim specs as the core's commits write them (dra_plugin/claim_commit.hpp):
// the channel spec a record implies, for the channel major read at start.
ClaimSpecIo ChannelSpecIo(const std::string& cdi_dir, uint32_t major) {
  ClaimSpecIo io;
  io.write = [cdi_dir, major](const PreparedClaim& entry, SpecDurability durability) {
    return WriteChannelCdiSpec(cdi_dir, entry.uid, major, entry.channels, durability);
  };
  io.remove = [cdi_dir](std::string_view uid) { return DeleteCdiSpec(cdi_dir, uid); };
  return io;
}

// The pool side of the commits (no module state travels to the pool), as named callables: they
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

// The callback APIs (kube client, pool, driver-managed domains, timers) are awaited through
// loop/awaitables.hpp, with the module's gate: a completion that arrives once the module is gone
// resumes nothing (the coroutine is dropped without touching the module).

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
      clique_timer_(context.GetLoop().Io()) {
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
  SlicePublisher::Hooks hooks;
  hooks.devices = [this] { return SliceDevices(); };
  hooks.note = [this] { return "clique " + (clique_id_.empty() ? std::string("(none)") : clique_id_); };
  hooks.on_error = [this](const std::string& error) { SetError(error); };
  hooks.on_attempt = [this] { PublishState(); };
  slices_ = std::make_unique<SlicePublisher>(
      context_,
      SlicePublisher::Options{std::string(kDriverName), node_name_, config_.api_version, config_.slice_resync},
      SlicePublisher::Counters{slice_created_, slice_updated_, slice_errors_}, std::move(hooks));
}

DraComputeDomainModule::~DraComputeDomainModule() { lifetime_.Close(); }

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
  informers_ = services.Find<kube::InformerRegistry>();
  if (!client_ || !informers_) {
    throw std::runtime_error("the kube module's client is not available (is the `kube` module enabled?)");
  }
  events_ = services.Find<kube::EventRecorder>();

  // Seed 000 §11: without the channel major there is nothing to inject; fail the start, the
  // supervisor retries with backoff once the driver is loaded.
  const auto major = ReadImexChannelMajor(paths_.proc_devices);
  if (!major.ok()) throw std::runtime_error("cannot start without the IMEX channel major: " + major.error);
  channel_major_ = *major.major;
  context_.Log().info("IMEX channel major {} (from {})", channel_major_, paths_.proc_devices);

  // The claim state (and the domain record) are read on the pool: a large claim log or a slow
  // disk must not stall the loop. Nothing is served before they are back: the DRA and
  // registration sockets are not even there, so the kubelet cannot call NodePrepare early.
  loading_ = true;
  LoadStateOffLoop(
      context_, lifetime_.Watch(), paths_.checkpoint_file + " and " + paths_.claim_log_file,
      [checkpoint = paths_.checkpoint_file, log = paths_.claim_log_file,
       record = host_managed_ ? std::string() : DriverManagedDomains::RecordFile(paths_.state_dir)] {
        StartFiles files;
        files.claims = LoadClaimState(checkpoint, log);
        if (!record.empty()) files.domains = LoadDomainRecord(record);
        return files;
      },
      [this](StartFiles files) {
        if (stopping_) return;
        loading_ = false;
        try {
          Serve(std::move(files));
        } catch (const std::exception& e) {
          context_.ReportFailure(std::string("start failed: ") + e.what());
        }
      });
}

void DraComputeDomainModule::Serve(StartFiles files) {
  LoadAndReconcile(std::move(files.claims));
  if (!host_managed_) {
    DriverManagedSettings settings = config_.driver_managed;
    settings.node_name = node_name_;
    settings.state_dir = paths_.state_dir;
    settings.dns_names = context_.Site().gates.Enabled(gates::kIMEXDaemonsWithDNSNames);
    settings.cliques = context_.Site().gates.Enabled(gates::kComputeDomainCliques);
    domains_ = std::make_unique<DriverManagedDomains>(context_, settings, client_, informers_);
    domains_->Load(std::move(files.domains));
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
      lifetime_.Guard([this](bool registered, const std::string& error) {
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
      }));
  registration_server_->Start(paths_.registration_socket);
  context_.SetHealth(ModuleHealth::kUnhealthy, "waiting for the kubelet's plugin watcher");
  context_.Log().info("serving DRA v1/v1beta1 on {}, registration on {}", paths_.dra_socket,
                      paths_.registration_socket);

  if (!corrupt_note_.empty()) RecordCorruptCheckpointEvent();
  // Keep the ResourceSlice true: the kubelet deletes a node's slices when it starts.
  slices_->Start(client_, informers_);
  PublishState();
}

void DraComputeDomainModule::LoadAndReconcile(ClaimStateLoad loaded) {
  checkpoint_ = {};
  corrupt_note_.clear();
  log_.reset();
  const auto& path = paths_.checkpoint_file;
  const auto& log_path = paths_.claim_log_file;
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
  node.uid = slices_->NodeUid();
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
    slices_->Publish();
  }
  if (known_now && clique_waiting_) {
    context_.Log().info("the node's clique is known ({}): deciding {} waiting prepare(s) again",
                        clique_id_.empty() ? "none" : clique_id_, 1);
    clique_waiting_ = false;
    clique_arrived_ = true;
    clique_timer_.cancel();  // wakes WaitForClique
  }
  if (known_now) PublishState();
}

// ---------------------------------------------------------------------------------- stop

void DraComputeDomainModule::Stop(std::function<void()> done) {
  stopping_ = true;
  slices_->Stop();
  clique_sub_.Reset();
  clique_waiting_ = false;  // the waiting prepare's call is failed by the DRA server's shutdown
  clique_timer_.cancel();
  jobs_.clear();  // their calls are failed by the DRA server's shutdown
  pending_prepares_.clear();  // never committed, never answered
  auto finish = [this, alive = lifetime_.Watch(), done = std::move(done)] {
    if (alive) {
      domains_.reset();
      dra_server_.reset();
      registration_server_.reset();
      registered_ = false;
      PublishState();
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
  // Driver-managed daemons stop with us; their registrations stay for the next start.
  if (domains_) {
    domains_->Stop(std::move(stop_servers));
  } else {
    stop_servers();
  }
}

// ---------------------------------------------------------------------------------- jobs

void DraComputeDomainModule::Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) {
  Enqueue(PrepareJob{std::move(claims), std::move(done)});
}

void DraComputeDomainModule::Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) {
  Enqueue(UnprepareJob{std::move(claims), std::move(done)});
}

void DraComputeDomainModule::Enqueue(Job job) {
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
asio::awaitable<void> DraComputeDomainModule::RunJobs(Gate::Ticket alive) {
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
asio::awaitable<void> DraComputeDomainModule::PrepareCall(PrepareJob job) {
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

asio::awaitable<std::optional<PrepareResult>> DraComputeDomainModule::PrepareClaim(ClaimRef claim) {
  // A repeated Prepare (the kubelet lost our answer, or restarted) answers from the checkpoint.
  if (auto existing = CompletedPrepare(DecideView(), claim.uid)) {
    prepares_already_->Inc();
    co_return ResultFrom(*existing);
  }
  if (!IsValidClaimUid(claim.uid) || claim.namespace_name.empty() || claim.name.empty()) {
    prepares_permanent_->Inc();
    co_return ErrorResult(Ref(claim) + ": the kubelet sent an invalid claim reference (uid \"" + claim.uid + "\")");
  }
  if (config_.require_imex_ready) {
    const auto* imex = context_.GetBus().Latest<imex_health::ImexHealth>();
    if (!imex || !imex->ready) {
      prepares_retryable_->Inc();
      const std::string why = imex ? imex->reason + ": " + imex->message : "imex-health has not judged host IMEX yet";
      SetError(Ref(claim) + ": host IMEX not ready: " + why);
      co_return ErrorResult(Ref(claim) + ": host IMEX is not ready (" + why + "); the kubelet retries");
    }
  }

  // The claim and the ComputeDomains of its namespace, fetched at the same time (the namespace is
  // the kubelet's; only the match on the domain UID needs the claim): one API round trip of
  // latency per prepare instead of two. The list is wasted when the claim turns out not to need it.
  // A list per prepare (not an informer): prepares are rare, and the module then needs no
  // cluster-wide watch on ComputeDomains. A domain in another namespace is therefore "not found".
  // The look-ups' retries and the clique wait end at this deadline, read on the injected clock's
  // steady time (the timers then wait the remaining duration).
  Clock::SteadyTime deadline = context_.GetClock().Now() + config_.prepare_timeout;
  const std::string claim_path =
      kube::ResourcePath::Grouped("resource.k8s.io", std::string(VersionOnly(config_.api_version)), "resourceclaims",
                                  claim.namespace_name)
          .Object(claim.name);
  const std::string domains_path =
      kube::ResourcePath::Grouped("resource.nvidia.com", "v1beta1", "computedomains", claim.namespace_name)
          .Collection();
  asio::awaitable<kube::Result> get_claim = FetchWithRetry(lifetime_.Watch(), false, claim_path, deadline);
  asio::awaitable<kube::Result> list_domains = FetchWithRetry(lifetime_.Watch(), true, domains_path, deadline);
  const std::pair<kube::Result, kube::Result> both =
      co_await Both(context_.GetLoop().Io(), std::move(get_claim), std::move(list_domains), lifetime_.Watch());
  const kube::Result& fetched = both.first;
  if (stopping_) co_return std::nullopt;
  if (fetched.http_status == 404) {
    prepares_permanent_->Inc();
    SetError(Ref(claim) + ": not found");
    co_return ErrorResult(Ref(claim) + ": not found (deleted?)");
  }
  if (!fetched.Ok()) {
    prepares_retryable_->Inc();
    SetError(Ref(claim) + ": cannot fetch: " + fetched.error);
    co_return ErrorResult(Ref(claim) + ": cannot fetch the claim: " + fetched.error);
  }
  const json& object = fetched.object;
  // The ComputeDomain is matched in the list on the UID the decision itself reads from the
  // claim's config, when it gets that far: no second reading of the claim that could disagree
  // with the decision's (one did: an allocationMode "All" claim was never looked up).
  const kube::Result& domains = both.second;
  const DomainLookupFn lookup = [&domains, &claim](std::string_view domain_uid) {
    return FindDomain(domains, std::string(domain_uid), claim.namespace_name);
  };

  // Decided again after each wait: for the clique, and in driver-managed mode for the domain's
  // verdict on this node (Ready attaches the claim; the state may have moved meanwhile).
  bool attached = false;
  for (;;) {
    const PrepareDecision decision = Decide(claim, object, lookup);
    if (decision.outcome == PrepareOutcome::kAlreadyPrepared) {
      prepares_already_->Inc();
      co_return ResultFrom(decision.existing);
    }
    if (decision.outcome != PrepareOutcome::kPrepare) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - context_.GetClock().Now());
      if (decision.waits_for_clique && left > milliseconds(0)) {
        // Right after start NVML may not have reported the fabric yet: wait for gpu-inventory
        // (within this prepare's deadline) instead of answering "no clique" before we know.
        context_.Log().info("prepare {} (uid {}) waits up to {} ms for the node's clique to be known",
                            claim.namespace_name + "/" + claim.name, claim.uid, left.count());
        const bool arrived = co_await WaitForClique(left);
        if (stopping_) co_return std::nullopt;
        // Run out: decided once more, without another wait; the answer names what is still missing.
        if (!arrived) deadline = Clock::SteadyTime{};
        attached = false;  // a verdict from before the wait is asked again
        continue;
      }
      const bool permanent = decision.outcome == PrepareOutcome::kPermanentError;
      (permanent ? prepares_permanent_ : prepares_retryable_)->Inc();
      context_.Log().warn("prepare {} (uid {}) failed ({}): {}", claim.namespace_name + "/" + claim.name, claim.uid,
                          permanent ? "permanent" : "retryable", decision.error);
      SetError(decision.error);
      co_return ErrorResult(decision.error);
    }
    if (domains_ && !attached) {
      // Driver-managed: the domain's verdict for this node decides (driver_managed.hpp).
      // Found: the decision (kPrepare) has just matched it.
      ComputeDomainInfo domain = lookup(decision.domain_uid).domain;
      const DomainVerdict verdict =
          co_await Attach(claim.uid, decision.claim_namespace, decision.claim_name, std::move(domain));
      if (stopping_) co_return std::nullopt;
      if (verdict.kind == DomainVerdict::Kind::kReady) {
        attached = true;
        continue;
      }
      const bool permanent = verdict.kind == DomainVerdict::Kind::kRefused;
      (permanent ? prepares_permanent_ : prepares_retryable_)->Inc();
      const std::string error = Ref(claim) + ": " + verdict.message + (permanent ? "" : "; the kubelet retries");
      context_.Log().warn("prepare {} (uid {}) {}: {}", claim.namespace_name + "/" + claim.name, claim.uid,
                          permanent ? "refused" : "waits for its ComputeDomain", verdict.message);
      SetError(error);
      co_return ErrorResult(error);
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
    // kubelet hears of any; this answer stands only if that commit succeeds.
    pending_prepares_.push_back(entry);
    co_return ResultFrom(entry);
  }
}

PrepareDecision DraComputeDomainModule::Decide(const ClaimRef& claim, const json& object, const DomainLookupFn& lookup) {
  PrepareContext prepare_context;
  prepare_context.node_name = node_name_;
  prepare_context.clique_id = clique_id_;
  prepare_context.clique_known = clique_known_;
  prepare_context.clique_reason = clique_reason_;
  prepare_context.host_managed = host_managed_;
  prepare_context.checkpoint = &DecideView();
  return DecidePrepare(object, claim.uid, prepare_context, lookup);
}

const Checkpoint& DraComputeDomainModule::DecideView() {
  if (pending_prepares_.empty()) return checkpoint_;
  decide_view_ = checkpoint_;
  for (const auto& entry : pending_prepares_) decide_view_.claims[entry.uid] = entry;
  return decide_view_;
}

asio::awaitable<bool> DraComputeDomainModule::WaitForClique(milliseconds left) {
  clique_waiting_ = true;
  clique_arrived_ = false;
  PublishState();
  clique_timer_.expires_after(left);
  // Ends at the deadline, or early when OnClique or Stop cancels the timer.
  co_await Expiry(clique_timer_);
  clique_waiting_ = false;
  co_return clique_arrived_;
}

// One durable write for the whole call: each claim's CDI spec (visible at once, no fsync: it is
// re-made from the record at start), then every record in one append + fdatasync.
asio::awaitable<PrepareResults> DraComputeDomainModule::CommitPrepares(std::vector<ClaimRef> claims,
                                                                       PrepareResults results) {
  std::vector<PreparedClaim> entries = std::move(pending_prepares_);
  pending_prepares_.clear();
  WritePrepares write{log_, ChannelSpecIo(paths_.cdi_dir, channel_major_), entries, next_seq_};
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
    context_.Log().info("prepared {} (uid {}) for ComputeDomain {}: {}", entry.namespace_name + "/" + entry.name,
                        entry.uid, entry.domain_uid, entry.cdi_device_id);
  }
  CommitDone(out.log_error, out.last_seq, out.log_used, out.committed.size());
  co_return results;
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
    Enqueue(CompactJob{});
  }
}

// The checkpoint takes in the log (durably, atomically), then the log starts over. Runs as a job,
// between kubelet calls.
asio::awaitable<void> DraComputeDomainModule::Compact() {
  Checkpoint snapshot = checkpoint_;
  snapshot.log_seq = next_seq_ - 1;
  CompactLog compact{log_, paths_.checkpoint_file, std::move(snapshot)};
  JobResult<std::string> compacted = co_await OnPool(context_.Pool(), std::move(compact), lifetime_.Watch());
  compaction_queued_ = false;
  std::string& error = compacted.value;
  if (compacted.failure && error.empty()) error = "unexpected failure";
  if (!error.empty()) {
    // The log keeps growing past its pre-zeroed size (slower appends); tried again after
    // the next commit.
    context_.Log().warn("claim log compaction failed: {}", error);
  } else {
    context_.Log().debug("claim log compacted into {} (up to seq {})", paths_.checkpoint_file, next_seq_ - 1);
  }
}

// `alive` by value: Both() co_spawns this, which starts it one loop turn later.
asio::awaitable<kube::Result> DraComputeDomainModule::FetchWithRetry(Gate::Ticket alive, bool list,
                                                                     std::string path, Clock::SteadyTime deadline) {
  if (!alive) co_return kube::Result{};  // Both() resumes nothing once the module is gone
  for (milliseconds delay = kFirstRetryDelay;; delay = std::min(delay * 2, kMaxRetryDelay)) {
    kube::Result result = co_await Fetch(list, path);
    if (!kube::IsTransient(result) || stopping_ || context_.GetClock().Now() + delay >= deadline) co_return result;
    context_.Log().debug("{} {}: {} (HTTP {}); retrying in {} ms", list ? "list" : "get", path, result.error,
                         result.http_status, delay.count());
    co_await Sleep(delay);
  }
}

// Not a coroutine: the client's awaited verbs copy what they need before they return. No
// deadline of their own: FetchWithRetry's deadline bounds the retries, the client each attempt.
asio::awaitable<kube::Result> DraComputeDomainModule::Fetch(bool list, std::string path) {
  if (list) return client_->List(path, kube::ListOptions{}, kube::Deadline{}, lifetime_.Watch());
  return client_->Get(path, kube::Deadline{}, lifetime_.Watch());
}

asio::awaitable<void> DraComputeDomainModule::Sleep(milliseconds delay) {
  // A timer of its own: nothing cancels a retry's wait (Stop lets it run out).
  asio::steady_timer timer(context_.GetLoop().Io(), delay);
  co_await Expiry(timer);
}

// The wrappers below build their callbacks outside any coroutine body, so coroutine bodies can
// await them directly (the g++ 12 co_await pitfall: loop/awaitables.hpp).

asio::awaitable<DomainVerdict> DraComputeDomainModule::Attach(std::string uid, std::string claim_namespace,
                                                              std::string claim_name, ComputeDomainInfo domain) {
  auto start = [domains = domains_.get(), uid = std::move(uid), claim_namespace = std::move(claim_namespace),
                claim_name = std::move(claim_name), domain = std::move(domain)](auto resume) {
    domains->Attach(uid, claim_namespace, claim_name, domain, std::move(resume));
  };
  return AwaitCallback<DomainVerdict>(std::move(start), lifetime_.Watch());
}

asio::awaitable<std::string> DraComputeDomainModule::Detach(std::string uid) {
  auto start = [domains = domains_.get(), uid = std::move(uid)](auto resume) {
    domains->Detach(uid, std::move(resume));
  };
  return AwaitCallback<std::string>(std::move(start), lifetime_.Watch());
}

asio::awaitable<boost::system::error_code> DraComputeDomainModule::Expiry(asio::steady_timer& timer) {
  auto start = [timer = &timer](auto resume) { timer->async_wait(std::move(resume)); };
  return AwaitCallback<boost::system::error_code>(std::move(start), lifetime_.Watch());
}

// ---------------------------------------------------------------------------------- unprepare

asio::awaitable<void> DraComputeDomainModule::UnprepareCall(UnprepareJob job) {
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
    const UnprepareDecision decision = DecideUnprepare(checkpoint_, claim.uid);
    if (!decision.known && !IsValidClaimUid(claim.uid)) {
      unprepares_unknown_->Inc();
      results[claim.uid] = {};
      continue;
    }
    work.push_back(claim);
    known.push_back(decision.known);
  }
  std::vector<ClaimRef> detach;
  if (!work.empty()) {
    std::vector<std::string> uids;
    for (const auto& claim : work) uids.push_back(claim.uid);
    WriteUnprepares write{log_, ChannelSpecIo(paths_.cdi_dir, channel_major_), std::move(uids), known, next_seq_};
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
        detach.push_back(claim);
      } else {
        unprepares_unknown_->Inc();
        detach.push_back(claim);
      }
      results[claim.uid] = std::move(result);
    }
    CommitDone(out.log_error, out.last_seq, out.log_used, out.committed.size());
  }
  // Driver-managed: the domain's last claim stops its daemon and deregisters the node, claim by
  // claim (the last first); then the kubelet gets the call's answer.
  while (domains_ && !detach.empty()) {
    const ClaimRef claim = detach.back();
    detach.pop_back();
    const std::string error = co_await Detach(claim.uid);
    if (!error.empty()) results[claim.uid].error = Ref(claim) + ": " + error;
  }
  job.done(std::move(results));
}

// ---------------------------------------------------------------------------------- slice

json DraComputeDomainModule::SliceDevices() const {
  return ChannelSliceDevices(clique_id_, host_managed_, config_.api_version);
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
  state.waiting_for_clique = clique_waiting_ ? 1 : 0;
  for (const auto& [uid, entry] : checkpoint_.claims) {
    state.prepared_claims.push_back(
        {uid, entry.namespace_name, entry.name, std::string(ToString(entry.state)), entry.domain_uid});
  }
  state.slice_generation = slices_->Generation();
  state.slice_publishes = slices_->Publishes();
  state.last_error = last_error_;
  context_.GetBus().Publish(std::move(state));
}

}  // namespace gns::dra
