// The compute-domain-controller module: config, leader gating, the work queue and metrics.
#include "modules/compute_domain_controller/compute_domain_controller_module.hpp"

#include "loop/feature_gates.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/messages.hpp"

#include <stdexcept>

namespace gns::cd_controller {

using std::chrono::milliseconds;

namespace {
constexpr std::string_view kErrorsFamily = "gpu_node_supervisor_compute_domain_reconcile_errors_total";
}  // namespace

ComputeDomainControllerModule::Config ComputeDomainControllerModule::ParseConfig(ConfigMap& section,
                                                                                const SiteConfig& site) {
  Config config;
  const auto api = section.Enum("resourceApiVersion", {"v1", "v1beta2", "v1beta1"}, "v1");
  config.resource_api = api == "v1beta1"   ? ResourceApi::kV1beta1
                        : api == "v1beta2" ? ResourceApi::kV1beta2
                                           : ResourceApi::kV1;
  config.workers = static_cast<std::size_t>(section.Int("workers", 1, 64, 4));
  config.conflict_retries = static_cast<int>(section.Int("conflictRetries", 0, 100, 5));
  config.resync = section.Duration("resyncPeriod", milliseconds(0), milliseconds(86400000), milliseconds(600000));
  config.deregister_timeout =
      section.Duration("deregisterTimeout", milliseconds(0), milliseconds(86400000), milliseconds(300000));

  auto backoff = section.Section("retryBackoff");
  config.retry.initial = backoff.Duration("initial", milliseconds(1), milliseconds(60000), milliseconds(500));
  config.retry.max = backoff.Duration("max", config.retry.initial, milliseconds(3600000), milliseconds(60000));
  backoff.Finish();

  auto le = section.Section("leaderElection");
  config.lease = kube::ParseLeaderElectionConfig(le, "gpu-node-supervisor-compute-domain-controller");
  le.Finish();
  (void)site;
  return config;
}

ComputeDomainControllerModule::ComputeDomainControllerModule(ModuleContext& context, const Config& config)
    : context_(context), config_(config) {}

ComputeDomainControllerModule::~ComputeDomainControllerModule() {
  lifetime_.Close();
  elector_.reset();  // before the queue and reconciler its callbacks reach
}

void ComputeDomainControllerModule::Start() {
  auto& services = context_.GetServices();
  auto client = services.Find<kube::KubeClient>();
  registry_ = services.Find<kube::InformerRegistry>();
  if (!client || !registry_) throw std::runtime_error("no Kubernetes client: the kube module is not running");
  auto events = services.Find<kube::EventRecorder>();  // optional: no Events without it

  host_managed_ = context_.Site().gates.Enabled(gates::kHostManagedIMEX);
  // Resolved gates: HostManagedIMEX forces ComputeDomainCliques off.
  cliques_gate_ = !host_managed_ && context_.Site().gates.Enabled(gates::kComputeDomainCliques);
  ReconcileSettings settings;
  settings.host_managed = host_managed_;
  settings.resource_api = config_.resource_api;
  settings.conflict_retries = config_.conflict_retries;
  settings.field_manager = std::string(kName);
  settings.deregister_timeout = config_.deregister_timeout;
  settings.node_exists = [this](const std::string& node) {
    // Until the Node list is in, every node counts as present.
    return !nodes_ || !nodes_->Synced() || nodes_->Get(node) != nullptr;
  };
  settings.cliques = cliques_gate_;
  settings.cliques_of = [this](const std::string& ns, const std::string& uid) { return CliquesOf(ns, uid); };
  reconciler_ = std::make_unique<Reconciler>(client, events, context_.Logger(), settings);
  queue_ = std::make_unique<WorkQueue>(context_.GetLoop().Io(), config_.retry, config_.workers,
                                       [this](const std::string& key, std::function<void(bool)> done) {
                                         Work(key, std::move(done));
                                       });

  auto& m = context_.Metrics();
  latency_ = &m.Histogram("gpu_node_supervisor_compute_domain_reconcile_duration_seconds",
                          "Time spent in ComputeDomain reconciles (finished ones)", kLatencyBuckets);
  collector_ = m.AddCollector([this](MetricsWriter& w) {
    std::map<std::string, int> by_status{{"Ready", 0}, {"NotReady", 0}};
    for (const auto& [key, status] : domain_state_) ++by_status[status];
    for (const auto& [status, count] : by_status) {
      w.Sample("gpu_node_supervisor_compute_domains", MetricType::kGauge,
               "ComputeDomains by status, as last reconciled (reported by the leader only)", {{"status", status}},
               count);
    }
    w.Sample("gpu_node_supervisor_compute_domain_controller_leading", MetricType::kGauge,
             "1 while this process runs the ComputeDomain controller", {}, leading_ ? 1 : 0);
  });

  kube::LeaderElector::Callbacks callbacks;
  callbacks.on_started_leading = [this] { OnStartedLeading(); };
  callbacks.on_stopped_leading = [this] { OnStoppedLeading(); };
  elector_ = std::make_unique<kube::LeaderElector>(client, context_.GetLoop().Io(), context_.GetClock(),
                                                   &context_.GetBus(), context_.Metrics(), context_.Logger(),
                                                   config_.lease, std::move(callbacks));
  std::string gates_line;
  for (const auto& [name, value] : context_.Site().gates.Values()) {
    gates_line += (gates_line.empty() ? "" : ", ") + name + "=" + (value ? "true" : "false");
  }
  context_.Log().info("feature gates (resolved): {}; {}", gates_line,
                      host_managed_ ? "host-managed IMEX: finalizer, workload template, Ready at once"
                    : cliques_gate_ ? "driver-managed IMEX: finalizer, workload template, no DaemonSet; status.nodes "
                                      "mirrors the ComputeDomainClique objects, Ready from them"
                                    : "driver-managed IMEX: finalizer, workload template, no DaemonSet; Ready from "
                                      "the nodes' registrations in status.nodes");
  context_.Log().info("candidate for lease {}/{} as {}", config_.lease.ns, config_.lease.lease_name,
                      config_.lease.identity);
  elector_->Start();
}

void ComputeDomainControllerModule::Stop(std::function<void()> done) {
  if (!elector_) {
    StopWork();
    done();
    return;
  }
  // Stops the work first (on_stopped_leading), then hands the lease back so a peer takes over.
  elector_->Stop(
      lifetime_.Guard([this, done = std::move(done)] {
        StopWork();
        done();
      }),
      /*release=*/true);
}

void ComputeDomainControllerModule::OnStartedLeading() {
  leading_ = true;
  context_.Log().info("leading: reconciling ComputeDomains in all namespaces ({} mode)",
                      host_managed_ ? "host-managed IMEX" : "driver-managed IMEX");
  const kube::InformerSpec spec{
      kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kResource)).Collection(),
      {}, {}};
  informer_key_ = spec.Key();
  auto& bus = context_.GetBus();
  events_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& e) {
    if (!leading_ || e.informer_key != informer_key_ || !e.object) return;
    Enqueue(*e.object);
  });
  // Also covers an informer that another holder had already synced (its ADDED events are past).
  // Once per term: a relist publishes its changes as events, so reading every domain again
  // would cost two GETs per domain for nothing.
  synced_sub_ = bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced& s) {
    if (!leading_ || s.informer_key != informer_key_ || !s.synced || !informer_) return;
    synced_sub_.Reset();
    for (const auto& [key, object] : informer_->Items()) queue_->Add(key);
  });
  informer_ = registry_->Acquire(spec);

  const kube::InformerSpec templates{
      kube::ResourcePath::Grouped("resource.k8s.io", std::string(ResourceApiVersion(config_.resource_api)),
                                  "resourceclaimtemplates")
          .Collection(),
      std::string(kDomainLabel) + "," + std::string(kTargetLabel) + "=" + std::string(kTargetWorkload),
      {}};
  templates_key_ = templates.Key();
  templates_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& e) { OnTemplateEvent(e); });
  templates_ = registry_->Acquire(templates);
  if (!host_managed_) {
    const kube::InformerSpec nodes{kube::ResourcePath::Core("nodes").Collection(), {}, {}};
    nodes_key_ = nodes.Key();
    nodes_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& e) { OnNodeEvent(e); });
    nodes_ = registry_->Acquire(nodes);
  }
  if (cliques_gate_) {
    const kube::InformerSpec cliques{
        kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kCliqueResource))
            .Collection(),
        std::string(kDomainLabel), {}};
    cliques_key_ = cliques.Key();
    cliques_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& e) { OnCliqueEvent(e); });
    // Reconciles that ran before this cache listed did nothing with the cliques: run them again.
    cliques_synced_sub_ = bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced& s) {
      if (!leading_ || s.informer_key != cliques_key_ || !s.synced || !informer_) return;
      cliques_synced_sub_.Reset();
      for (const auto& [key, object] : informer_->Items()) queue_->Add(key);
    });
    cliques_ = registry_->Acquire(cliques);
  }
  ArmResync();
}

void ComputeDomainControllerModule::OnNodeEvent(const kube::ResourceEvent& event) {
  if (!leading_ || event.informer_key != nodes_key_ || !event.object ||
      event.type != kube::ResourceEvent::Type::kDeleted || !informer_) {
    return;
  }
  const auto meta = kube::ObjectMeta::From(*event.object);
  if (!meta) return;
  static const nlohmann::json::json_pointer kNodes("/status/nodes");
  for (const auto& [key, domain] : informer_->Items()) {
    if (!domain->contains(kNodes) || !domain->at(kNodes).is_array()) continue;
    for (const auto& entry : domain->at(kNodes)) {
      if (entry.is_object() && entry.value("name", "") == meta->name) {
        context_.Log().info("{}: its node {} was deleted", key, meta->name);
        queue_->Add(key);
        break;
      }
    }
  }
}

void ComputeDomainControllerModule::OnCliqueEvent(const kube::ResourceEvent& event) {
  if (!leading_ || event.informer_key != cliques_key_ || !event.object || !informer_) return;
  const auto meta = kube::ObjectMeta::From(*event.object);
  const nlohmann::json labels = event.object->value(nlohmann::json::json_pointer("/metadata/labels"), nlohmann::json());
  if (!meta || !labels.is_object()) return;
  const std::string uid = labels.value(std::string(kDomainLabel), std::string());
  for (const auto& [key, domain] : informer_->Items()) {
    const auto domain_meta = kube::ObjectMeta::From(*domain);
    if (domain_meta && domain_meta->ns == meta->ns && domain_meta->uid == uid) {
      queue_->Add(key);
      return;
    }
  }
}

std::optional<std::vector<nlohmann::json>> ComputeDomainControllerModule::CliquesOf(const std::string& ns,
                                                                                   const std::string& uid) const {
  if (!cliques_ || !cliques_->Synced()) return std::nullopt;
  std::vector<nlohmann::json> out;
  for (const auto& [key, clique] : cliques_->Items()) {
    const auto meta = kube::ObjectMeta::From(*clique);
    const nlohmann::json labels = clique->value(nlohmann::json::json_pointer("/metadata/labels"), nlohmann::json());
    if (meta && meta->ns == ns && labels.is_object() && labels.value(std::string(kDomainLabel), std::string()) == uid) {
      out.push_back(*clique);
    }
  }
  return out;
}

void ComputeDomainControllerModule::OnTemplateEvent(const kube::ResourceEvent& event) {
  // Added: our own creation, or the initial list (the domains' own sync covers those).
  if (!leading_ || event.informer_key != templates_key_ || !event.object ||
      event.type == kube::ResourceEvent::Type::kAdded) {
    return;
  }
  const auto meta = kube::ObjectMeta::From(*event.object);
  if (!meta || !informer_) return;
  for (const auto& [key, domain] : informer_->Items()) {
    const auto domain_meta = kube::ObjectMeta::From(*domain);
    if (!domain_meta || domain_meta->ns != meta->ns) continue;
    static const nlohmann::json::json_pointer kTemplateName("/spec/channel/resourceClaimTemplate/name");
    if (domain->contains(kTemplateName) && domain->at(kTemplateName) == meta->name) {
      context_.Log().info("{}: its ResourceClaimTemplate {} was {}", key, meta->name,
                          event.type == kube::ResourceEvent::Type::kDeleted ? "deleted" : "changed");
      queue_->Add(key);
    }
  }
}

void ComputeDomainControllerModule::ArmResync() {
  if (config_.resync.count() == 0) return;
  if (!resync_timer_) resync_timer_ = std::make_unique<boost::asio::steady_timer>(context_.GetLoop().Io());
  resync_timer_->expires_after(config_.resync);
  resync_timer_->async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec || !leading_ || !informer_) return;
    for (const auto& [key, object] : informer_->Items()) queue_->Add(key);
    ArmResync();
  }));
}

void ComputeDomainControllerModule::OnStoppedLeading() {
  const bool was = leading_;
  leading_ = false;
  StopWork();
  if (was) context_.Log().info("stopped leading: ComputeDomain work stopped");
}

void ComputeDomainControllerModule::StopWork() {
  events_sub_.Reset();
  synced_sub_.Reset();
  informer_.reset();
  templates_sub_.Reset();
  templates_.reset();
  nodes_sub_.Reset();
  nodes_.reset();
  cliques_sub_.Reset();
  cliques_synced_sub_.Reset();
  cliques_.reset();
  if (resync_timer_) resync_timer_->cancel();
  if (reconciler_) reconciler_->Cancel();
  if (queue_) queue_->Clear();
  // Domain state is the leader's to report.
  domain_state_.clear();
}

void ComputeDomainControllerModule::Enqueue(const nlohmann::json& object) {
  const auto meta = kube::ObjectMeta::From(object);
  if (meta && !meta->ns.empty()) queue_->Add(meta->Key());
}

void ComputeDomainControllerModule::Work(const std::string& key, std::function<void(bool)> done) {
  const auto start = context_.GetClock().Now();
  reconciler_->Reconcile(key, [this, key, start, done = std::move(done)](Outcome outcome) {
    const double seconds = std::chrono::duration<double>(context_.GetClock().Now() - start).count();
    Record(key, outcome, seconds);
    done(outcome.ok);
  });
}

void ComputeDomainControllerModule::Record(const std::string& key, const Outcome& outcome, double seconds) {
  latency_->Observe(seconds);
  if (!outcome.ok) {
    context_.Metrics()
        .Counter(std::string(kErrorsFamily), "ComputeDomain reconciles that failed and will be retried",
                 {{"domain", key}, {"reason", outcome.reason}})
        .Inc();
    context_.Log().warn("{}: reconcile failed ({}): {}; retrying after backoff (attempt {})", key, outcome.reason,
                        outcome.error, queue_->Failures(key) + 1);
  }
  switch (outcome.state) {
    case Outcome::State::kReady:
      domain_state_.insert_or_assign(key, "Ready");
      break;
    case Outcome::State::kNotReady:
      if (outcome.ok || outcome.reason == "ResourceClaimTemplateConflict") {
        domain_state_.insert_or_assign(key, "NotReady");
      } else {
        domain_state_.try_emplace(key, "NotReady");
      }
      break;
    case Outcome::State::kDeleted:
    case Outcome::State::kGone:
      Forget(key);
      break;
  }
}

void ComputeDomainControllerModule::Forget(const std::string& key) {
  domain_state_.erase(key);
  context_.Metrics().RemoveMatching(kErrorsFamily, {"domain", key});
}

}  // namespace gns::cd_controller
