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

std::string_view VersionOnly(ResourceApiVersion version) {
  switch (version) {
    case ResourceApiVersion::kV1: return "v1";
    case ResourceApiVersion::kV1beta2: return "v1beta2";
    case ResourceApiVersion::kV1beta1: return "v1beta1";
  }
  return "v1";
}

std::string Ref(const ClaimRef& claim) { return "ResourceClaim " + claim.namespace_name + "/" + claim.name; }

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
    const uint32_t channels = ChannelsOf(entry);
    if (channels == 0) return FileWriteResult{false, "claim " + entry.uid + ": its record's channels are out of range"};
    return WriteChannelCdiSpec(cdi_dir, entry.uid, major, channels, durability);
  };
  io.remove = [cdi_dir](std::string_view uid) { return DeleteCdiSpec(cdi_dir, uid); };
  io.current = [cdi_dir, major](const PreparedClaim& entry) {
    const uint32_t channels = ChannelsOf(entry);
    return channels != 0 && CdiSpecIsCurrent(cdi_dir, entry.uid, major, channels);
  };
  return io;
}

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
  KubeletPlugin::Options options;
  options.driver_name = std::string(kDriverName);
  options.paths = paths_;
  options.spec_names = ChannelSpecNames();
  options.node_name = node_name_;
  options.api_version = config_.api_version;
  options.slice_resync = config_.slice_resync;
  options.node_events_on_corrupt_checkpoint = config_.node_events_on_corrupt_checkpoint;
  options.claim_log_compact_at = config_.claim_log_compact_at;
  options.unlabelled_reconcile_metrics = true;  // the names and labels of the first release
  plugin_ = std::make_unique<KubeletPlugin>(context_, std::move(options), static_cast<DraDriver&>(*this));
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
  host_managed_ = context_.Site().gates.Enabled(gates::kHostManagedIMEX);
  LogGates();
  if (node_name_.empty()) throw std::runtime_error("the node name is not set; it names the ResourceSlice pool");
  plugin_->FindServices();

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
      [paths = static_cast<const PluginPaths&>(paths_),
       record = host_managed_ ? std::string() : DriverManagedDomains::RecordFile(paths_.state_dir)] {
        StartFiles files;
        files.claims = KubeletPlugin::ReadClaimState(paths);
        if (!record.empty()) files.domains = LoadDomainRecord(record);
        return files;
      },
      [this](StartFiles files) {
        if (plugin_->Stopping()) return;
        loading_ = false;
        try {
          Serve(std::move(files));
        } catch (const std::exception& e) {
          context_.ReportFailure(std::string("start failed: ") + e.what());
        }
      });
}

void DraComputeDomainModule::Serve(StartFiles files) {
  // The core reconciles the claim state first; the domains and the clique are in place before
  // the kubelet can reach us.
  plugin_->Serve(std::move(files.claims), [this, &files] {
    if (!host_managed_) {
      DriverManagedSettings settings = config_.driver_managed;
      settings.node_name = node_name_;
      settings.state_dir = paths_.state_dir;
      settings.dns_names = context_.Site().gates.Enabled(gates::kIMEXDaemonsWithDNSNames);
      settings.cliques = context_.Site().gates.Enabled(gates::kComputeDomainCliques);
      domains_ = std::make_unique<DriverManagedDomains>(context_, settings, plugin_->Client(), plugin_->Informers());
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
      for (const auto& [uid, entry] : plugin_->Claims().claims) {
        if (entry.state == ClaimState::kPrepareCompleted) prepared.push_back(uid);
      }
      domains_->Resume(prepared);
    }
    clique_sub_ = bus.Subscribe<gpu_inventory::NodeClique>(
        [this](const gpu_inventory::NodeClique& clique) { OnClique(clique); });
  });
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
    plugin_->Slices().Publish();
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
  clique_sub_.Reset();
  clique_waiting_ = false;  // the waiting prepare's call is failed by the DRA server's shutdown
  clique_timer_.cancel();
  plugin_->Stop([this, alive = lifetime_.Watch(), done = std::move(done)] {
    if (alive) {
      domains_.reset();
      PublishState();
    }
    done();
  });
}

// Driver-managed daemons stop with us, before the servers; their registrations stay for the
// next start.
void DraComputeDomainModule::StopBeforeServers(std::function<void()> done) {
  if (domains_) {
    domains_->Stop(std::move(done));
  } else {
    done();
  }
}

// ---------------------------------------------------------------------------------- prepare

asio::awaitable<ClaimDecision> DraComputeDomainModule::DecideClaim(ClaimRef claim) {
  // Repeats and invalid references are the core's (KubeletPlugin::PrepareClaim).
  if (config_.require_imex_ready) {
    const auto* imex = context_.GetBus().Latest<imex_health::ImexHealth>();
    if (!imex || !imex->ready) {
      const std::string why = imex ? imex->reason + ": " + imex->message : "imex-health has not judged host IMEX yet";
      plugin_->SetError(Ref(claim) + ": host IMEX not ready: " + why);
      co_return ClaimDecision::Retryable(Ref(claim) + ": host IMEX is not ready (" + why + "); the kubelet retries");
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
  asio::awaitable<kube::Result> get_claim = plugin_->FetchWithRetry(lifetime_.Watch(), false, claim_path, deadline);
  asio::awaitable<kube::Result> list_domains =
      plugin_->FetchWithRetry(lifetime_.Watch(), true, domains_path, deadline);
  const std::pair<kube::Result, kube::Result> both =
      co_await Both(context_.GetLoop().Io(), std::move(get_claim), std::move(list_domains), lifetime_.Watch());
  const kube::Result& fetched = both.first;
  if (plugin_->Stopping()) co_return ClaimDecision::Stopped();
  if (fetched.http_status == 404) {
    plugin_->SetError(Ref(claim) + ": not found");
    co_return ClaimDecision::Permanent(Ref(claim) + ": not found (deleted?)");
  }
  if (!fetched.Ok()) {
    plugin_->SetError(Ref(claim) + ": cannot fetch: " + fetched.error);
    co_return ClaimDecision::Retryable(Ref(claim) + ": cannot fetch the claim: " + fetched.error);
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
      co_return ClaimDecision::Already(decision.existing);
    }
    if (decision.outcome != PrepareOutcome::kPrepare) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - context_.GetClock().Now());
      if (decision.waits_for_clique && left > milliseconds(0)) {
        // Right after start NVML may not have reported the fabric yet: wait for gpu-inventory
        // (within this prepare's deadline) instead of answering "no clique" before we know.
        context_.Log().info("prepare {} (uid {}) waits up to {} ms for the node's clique to be known",
                            claim.namespace_name + "/" + claim.name, claim.uid, left.count());
        const bool arrived = co_await WaitForClique(left);
        if (plugin_->Stopping()) co_return ClaimDecision::Stopped();
        // Run out: decided once more, without another wait; the answer names what is still missing.
        if (!arrived) deadline = Clock::SteadyTime{};
        attached = false;  // a verdict from before the wait is asked again
        continue;
      }
      const bool permanent = decision.outcome == PrepareOutcome::kPermanentError;
      context_.Log().warn("prepare {} (uid {}) failed ({}): {}", claim.namespace_name + "/" + claim.name, claim.uid,
                          permanent ? "permanent" : "retryable", decision.error);
      plugin_->SetError(decision.error);
      co_return permanent ? ClaimDecision::Permanent(decision.error) : ClaimDecision::Retryable(decision.error);
    }
    if (domains_ && !attached) {
      // Driver-managed: the domain's verdict for this node decides (driver_managed.hpp).
      // Found: the decision (kPrepare) has just matched it.
      ComputeDomainInfo domain = lookup(decision.domain_uid).domain;
      const DomainVerdict verdict =
          co_await Attach(claim.uid, decision.claim_namespace, decision.claim_name, std::move(domain));
      if (plugin_->Stopping()) co_return ClaimDecision::Stopped();
      if (verdict.kind == DomainVerdict::Kind::kReady) {
        attached = true;
        continue;
      }
      const bool permanent = verdict.kind == DomainVerdict::Kind::kRefused;
      const std::string error = Ref(claim) + ": " + verdict.message + (permanent ? "" : "; the kubelet retries");
      context_.Log().warn("prepare {} (uid {}) {}: {}", claim.namespace_name + "/" + claim.name, claim.uid,
                          permanent ? "refused" : "waits for its ComputeDomain", verdict.message);
      plugin_->SetError(error);
      co_return permanent ? ClaimDecision::Permanent(error) : ClaimDecision::Retryable(error);
    }

    PreparedClaim entry;
    entry.uid = claim.uid;
    entry.namespace_name = decision.claim_namespace;
    entry.name = decision.claim_name;
    entry.device = decision.device_name;
    entry.pool_name = decision.pool_name;
    entry.request_names = decision.request_names;
    entry.cdi_spec_file = CdiSpecFileName(claim.uid);
    entry.cdi_device_id = CdiQualifiedDeviceId(claim.uid);
    SetChannelClaimFields(entry, decision.domain_uid,
                          decision.allocation_mode == "All" ? config_.all_channels : 1u);
    // Not yet durable: the core commits the call's claims together before the kubelet hears.
    co_return ClaimDecision::Prepare(std::move(entry));
  }
}


PrepareDecision DraComputeDomainModule::Decide(const ClaimRef& claim, const json& object, const DomainLookupFn& lookup) {
  PrepareContext prepare_context;
  prepare_context.node_name = node_name_;
  prepare_context.clique_id = clique_id_;
  prepare_context.clique_known = clique_known_;
  prepare_context.clique_reason = clique_reason_;
  prepare_context.host_managed = host_managed_;
  prepare_context.checkpoint = &plugin_->DecideView();
  return DecidePrepare(object, claim.uid, prepare_context, lookup);
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

void DraComputeDomainModule::Prepared(const PreparedClaim& entry) {
  context_.Log().info("prepared {} (uid {}) for ComputeDomain {}: {}", entry.namespace_name + "/" + entry.name,
                      entry.uid, DomainUidOf(entry), entry.cdi_device_id);
}

ClaimSpecIo DraComputeDomainModule::SpecIo() const { return ChannelSpecIo(paths_.cdi_dir, channel_major_); }

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

// Driver-managed: the domain's last claim stops its daemon and deregisters the node, claim by
// claim (the core calls this the last first); then the kubelet gets the call's answer.
asio::awaitable<std::string> DraComputeDomainModule::AfterUnprepare(ClaimRef claim) {
  if (!domains_) co_return std::string();
  std::string error = co_await Detach(claim.uid);
  co_return error;
}

// ---------------------------------------------------------------------------------- slice

json DraComputeDomainModule::SliceDevices() const {
  return ChannelSliceDevices(clique_id_, host_managed_, config_.api_version);
}

std::string DraComputeDomainModule::SliceNote() const {
  return "clique " + (clique_id_.empty() ? std::string("(none)") : clique_id_);
}

// ---------------------------------------------------------------------------------- state

void DraComputeDomainModule::PublishState() {
  DraComputeDomainState state;
  state.host_managed = host_managed_;
  state.registered = plugin_->Registered();
  state.registration_error = plugin_->RegistrationError();
  state.channel_major = channel_major_;
  state.clique_id = clique_id_;
  state.clique_known = clique_known_;
  state.waiting_for_clique = clique_waiting_ ? 1 : 0;
  for (const auto& [uid, entry] : plugin_->Claims().claims) {
    state.prepared_claims.push_back(
        {uid, entry.namespace_name, entry.name, std::string(ToString(entry.state)), DomainUidOf(entry)});
  }
  state.slice_generation = plugin_->Slices().Generation();
  state.slice_publishes = plugin_->Slices().Publishes();
  state.last_error = plugin_->LastError();
  context_.GetBus().Publish(std::move(state));
}

}  // namespace gns::dra
