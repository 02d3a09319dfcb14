// The gkm-controller module: leader gating, the four informers, the per-cache counts and the
// status writes (only on change).
#include "modules/gkm_controller/gkm_controller_module.hpp"

#include "modules/kube/messages.hpp"

#include <stdexcept>

namespace gns::gkm_controller {

using nlohmann::json;
using std::chrono::milliseconds;

namespace {

constexpr const char* kGroup = "gkm.io";
constexpr const char* kVersion = "v1alpha1";
constexpr std::array<const char*, 2> kCachePlural = {"gkmcaches", "clustergkmcaches"};
constexpr std::array<const char*, 2> kNodePlural = {"gkmcachenodes", "clustergkmcachenodes"};
constexpr std::array<const char*, 2> kCacheKind = {"GKMCache", "ClusterGKMCache"};

kube::InformerSpec Spec(const char* plural) {
  return kube::InformerSpec{kube::ResourcePath::Grouped(kGroup, kVersion, plural).Collection(), {}, {}};
}

// Whether a Node exists is all we read of it: the cache keeps the identity fields only (a Node
// object is tens of KiB; a large cluster's would cost the leader that much per node).
kube::InformerSpec MembersSpec() {
  return kube::InformerSpec{kube::ResourcePath::Core("nodes").Collection(), {}, {}, {"metadata.name"}};
}

}  // namespace

GkmControllerModule::Config GkmControllerModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  auto backoff = section.Section("retryBackoff");
  config.retry.initial = backoff.Duration("initial", milliseconds(1), milliseconds(60000), config.retry.initial);
  config.retry.max = backoff.Duration("max", config.retry.initial, milliseconds(3600000), config.retry.max);
  backoff.Finish();
  auto le = section.Section("leaderElection");
  config.lease = kube::ParseLeaderElectionConfig(le, "gpu-node-supervisor-gkm-controller");
  le.Finish();
  (void)site;
  return config;
}

GkmControllerModule::GkmControllerModule(ModuleContext& context, const Config& config)
    : context_(context), config_(config) {}

GkmControllerModule::~GkmControllerModule() {
  lifetime_.Close();
  work_.Close();
  elector_.reset();  // before what its callbacks reach
}

void GkmControllerModule::Start() {
  auto& services = context_.GetServices();
  client_ = services.Find<kube::KubeClient>();
  registry_ = services.Find<kube::InformerRegistry>();
  if (!client_ || !registry_) throw std::runtime_error("no Kubernetes client: the kube module is not running");
  kube::LeaderElector::Callbacks callbacks;
  callbacks.on_started_leading = [this] { OnStartedLeading(); };
  callbacks.on_stopped_leading = [this] { OnStoppedLeading(); };
  elector_ = std::make_unique<kube::LeaderElector>(client_, context_.GetLoop().Io(), context_.GetClock(),
                                                   &context_.GetBus(), context_.Metrics(), context_.Logger(),
                                                   config_.lease, std::move(callbacks));
  context_.Log().info("candidate for lease {}/{} as {}", config_.lease.ns, config_.lease.lease_name,
                      config_.lease.identity);
  elector_->Start();
}

void GkmControllerModule::Stop(std::function<void()> done) {
  if (!elector_) {
    StopWork();
    done();
    return;
  }
  elector_->Stop(lifetime_.Guard([this, done = std::move(done)] {
                   StopWork();
                   done();
                 }),
                 /*release=*/true);
}

void GkmControllerModule::OnStartedLeading() {
  leading_ = true;
  context_.Log().info("leading: rolling up the kernel caches' node status");
  for (int i = 0; i < 2; ++i) {
    cache_keys_[i] = Spec(kCachePlural[i]).Key();
    node_keys_[i] = Spec(kNodePlural[i]).Key();
  }
  member_key_ = MembersSpec().Key();
  auto& bus = context_.GetBus();
  events_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& e) { OnEvent(e); });
  // Retained: an informer that another module had listed already is announced at once.
  synced_sub_ = bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced& s) {
    if (s.synced) OnSynced();
  });
  for (int i = 0; i < 2; ++i) {
    caches_[i] = registry_->Acquire(Spec(kCachePlural[i]));
    nodes_[i] = registry_->Acquire(Spec(kNodePlural[i]));
  }
  members_ = registry_->Acquire(MembersSpec());
  OnSynced();
}

void GkmControllerModule::OnStoppedLeading() {
  const bool was = leading_;
  leading_ = false;
  StopWork();
  if (was) context_.Log().info("stopped leading: kernel-cache roll-up stopped");
}

void GkmControllerModule::StopWork() {
  work_.Renew();  // writes in flight answer nobody
  events_sub_.Reset();
  synced_sub_.Reset();
  for (auto& [key, w] : writes_in_flight_) {
    if (w.retry) w.retry->cancel();
  }
  writes_in_flight_.clear();
  for (int i = 0; i < 2; ++i) {
    caches_[i].reset();
    nodes_[i].reset();
    cache_of_[i].clear();
    reports_[i].clear();
  }
  members_.reset();
  dirty_.clear();
  applied_.clear();
  counted_ = false;
}

bool GkmControllerModule::AllSynced() const {
  for (int i = 0; i < 2; ++i) {
    if (!caches_[i] || !nodes_[i] || !caches_[i]->Synced() || !nodes_[i]->Synced()) return false;
  }
  return members_ && members_->Synced();
}

void GkmControllerModule::OnSynced() {
  if (!leading_ || counted_ || !AllSynced()) return;
  counted_ = true;
  // The first count of this term, from the caches (later changes come as events).
  for (int i = 0; i < 2; ++i) {
    for (const auto& [key, object] : nodes_[i]->Items()) Count(i == 1, key, object.get());
    for (const auto& [key, object] : caches_[i]->Items()) Schedule(i == 1, key);
  }
}

void GkmControllerModule::OnEvent(const kube::ResourceEvent& e) {
  if (!leading_ || !counted_ || !e.object) return;
  if (e.informer_key == member_key_) {
    // Added or deleted: whether its objects count changes (an update changes nothing we read).
    if (e.type == kube::ResourceEvent::Type::kModified) return;
    if (const auto meta = kube::ObjectMeta::From(*e.object)) NodeChanged(meta->name);
    return;
  }
  for (int i = 0; i < 2; ++i) {
    const auto meta = kube::ObjectMeta::From(*e.object);
    if (!meta) return;
    if (e.informer_key == node_keys_[i]) {
      Count(i == 1, meta->Key(), e.type == kube::ResourceEvent::Type::kDeleted ? nullptr : e.object.get());
      return;
    }
    if (e.informer_key == cache_keys_[i]) {
      // Added (roll it up), changed (our own write comes back: nothing to do when it holds the
      // roll-up; someone else's change to our fields is put right), deleted (nothing to write).
      const auto key = std::make_pair(i == 1, meta->Key());
      if (e.type == kube::ResourceEvent::Type::kDeleted) {
        applied_.erase(key);
        return;
      }
      if (auto it = applied_.find(key); it != applied_.end() &&
                                         OwnedFields(e.object->value("status", json::object())) != OwnedFields(it->second)) {
        applied_.erase(it);
      }
      Schedule(i == 1, meta->Key());
      return;
    }
  }
}

void GkmControllerModule::Count(bool cluster, const std::string& object_key, const json* object) {
  const int i = cluster ? 1 : 0;
  auto& cache_of = cache_of_[i];
  if (auto it = cache_of.find(object_key); it != cache_of.end()) {
    Schedule(cluster, it->second);
    auto& reports = reports_[i][it->second];
    reports.erase(object_key);
    if (reports.empty()) reports_[i].erase(it->second);
    cache_of.erase(it);
  }
  if (!object) return;
  const auto meta = kube::ObjectMeta::From(*object);
  const std::string cache_name = object->value(json::json_pointer("/spec/cacheName"), std::string());
  if (!meta || cache_name.empty()) return;
  const std::string cache = cluster ? cache_name : meta->ns + "/" + cache_name;
  Schedule(cluster, cache);
  cache_of.emplace(object_key, cache);
  reports_[i][cache].insert_or_assign(object_key, ReportOf(*object));
}

void GkmControllerModule::NodeChanged(const std::string& node) {
  for (int i = 0; i < 2; ++i) {
    for (const auto& [cache, reports] : reports_[i]) {
      for (const auto& [object_key, report] : reports) {
        if (report.node == node) {
          Schedule(i == 1, cache);
          break;
        }
      }
    }
  }
}

void GkmControllerModule::Schedule(bool cluster, const std::string& cache) {
  dirty_.emplace(cluster, cache);
  if (flush_posted_) return;
  flush_posted_ = true;
  // A relist or a burst of node updates re-rolls each cache once.
  context_.GetLoop().Post(lifetime_.Guard([this] {
    flush_posted_ = false;
    Flush();
  }));
}

void GkmControllerModule::Flush() {
  auto dirty = std::move(dirty_);
  dirty_.clear();
  if (!leading_ || !counted_) return;
  for (const auto& [cluster, cache] : dirty) Reconcile(cluster, cache);
}

void GkmControllerModule::Reconcile(bool cluster, const std::string& cache) {
  const int i = cluster ? 1 : 0;
  auto object = caches_[i] ? caches_[i]->Get(cache) : nullptr;
  const auto key = std::make_pair(cluster, cache);
  if (!object) {
    writes_in_flight_.erase(key);  // deleted: its status went with it
    return;
  }
  auto& w = writes_in_flight_[key];
  if (w.in_flight) {
    w.again = true;  // rolled up again once the write in flight is answered
    return;
  }
  std::vector<NodeReport> reports;
  if (auto it = reports_[i].find(cache); it != reports_[i].end()) {
    for (const auto& [object_key, report] : it->second) {
      // Only nodes of the cluster: the objects of a node gone for good do not count.
      if (members_ && members_->Get(report.node)) reports.push_back(report);
    }
  }
  const json rollup = RollUp(reports);
  const auto applied = applied_.find(key);
  // What the cache's status holds now: our last write when the informer has not caught up.
  const json current = applied != applied_.end() ? applied->second : object->value("status", json::object());
  if (OwnedFields(current) == rollup) {
    writes_in_flight_.erase(key);  // (a retry waiting is moot)
    return;  // only on change
  }
  const auto meta = kube::ObjectMeta::From(*object);
  if (!meta) return;
  json body = {{"apiVersion", std::string(kGroup) + "/" + kVersion},
               {"kind", kCacheKind[i]},
               {"metadata", {{"name", meta->name}}},
               {"status", StatusToApply(rollup, current, kube::FormatMicroTime(context_.GetClock().WallNow()))}};
  if (!cluster) body["metadata"]["namespace"] = meta->ns;
  const std::string path = kube::ResourcePath::Grouped(kGroup, kVersion, kCachePlural[i], meta->ns).Object(meta->name);
  w.in_flight = true;
  ++writes_;
  context_.Log().info("{} {}: {} of {} nodes ready, {} failed", kCacheKind[i], cache, rollup["readyNodes"].get<int>(),
                      rollup["totalNodes"].get<int>(), rollup["failedNodes"].get<int>());
  client_->PatchStatus(path, kube::PatchType::kApply, body, std::string(kName),
                       work_.Guard([this, cluster, cache, path, status = body["status"]](kube::Result r) {
                         auto it = writes_in_flight_.find({cluster, cache});
                         if (it == writes_in_flight_.end()) return;
                         it->second.in_flight = false;
                         if (!r.Ok()) {
                           if (r.http_status == 404) {
                             writes_in_flight_.erase(it);  // deleted meanwhile
                             return;
                           }
                           context_.Log().warn("apply {}/status: {}", path, r.error);
                           Retry(cluster, cache, r.retry_after);
                           return;
                         }
                         if (it->second.backoff) it->second.backoff->Reset();
                         applied_.insert_or_assign({cluster, cache},
                                                  r.object.is_object() ? r.object.value("status", status) : status);
                         if (it->second.again) {
                           it->second.again = false;
                           Schedule(cluster, cache);
                         }
                       }),
                       /*force=*/true);
}

void GkmControllerModule::Retry(bool cluster, const std::string& cache, std::chrono::milliseconds retry_after) {
  auto& w = writes_in_flight_[{cluster, cache}];
  if (!w.backoff) w.backoff = std::make_unique<Backoff>(config_.retry);
  const auto delay = kube::RetryDelay(retry_after, *w.backoff, client_->Retry().max_retry_after);
  if (!w.retry) w.retry = std::make_unique<boost::asio::steady_timer>(context_.GetLoop().Io());
  w.retry->expires_after(delay);
  w.retry->async_wait(work_.Guard([this, cluster, cache](const boost::system::error_code& ec) {
    if (!ec) Schedule(cluster, cache);
  }));
}

}  // namespace gns::gkm_controller
