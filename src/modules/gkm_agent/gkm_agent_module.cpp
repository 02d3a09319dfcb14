// The gkm-agent module: watches, the pull queue, extraction on the pool, per-node status.
#include "modules/gkm_agent/gkm_agent_module.hpp"

#include "loop/exception_text.hpp"
#include "loop/state_file.hpp"

#include "modules/gkm_agent/api/usage.hpp"
#include "modules/gkm_agent/extract.hpp"

#include <sys/stat.h>
#include <sys/xattr.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

namespace gns::gkm {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

constexpr std::string_view kFieldManager = "gkm-agent";

std::string Now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string Text(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* key : path) {
    if (!at->is_object()) return {};
    const auto it = at->find(key);
    if (it == at->end()) return {};
    at = &*it;
  }
  return at->is_string() ? at->get<std::string>() : std::string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What a pool job hands back to the loop.
struct Installed {
  std::string reason;
  std::string message;
  std::vector<GpuVerdict> verdicts;
  uint64_t bytes = 0;
  double seconds = 0;
  // The installed copy was kept because pods use it: how many volumes, and its digest.
  std::size_t kept_for = 0;
  std::string kept_digest;
  bool incompatible = false;  // no GPU here can use it (reason: the GPUs')
  // The install began (the older copy moved aside): a failure after it may have left the
  // directory changed or gone, so the copy is no longer vouched for.
  bool install_began = false;
};

// The digest an installed cache directory was pulled as: an extended attribute on the directory
// (no file inside it, where a pod would see it). Empty when unknown (not set, or a file system
// without user xattrs: such a cache is pulled again at each start, as before).
constexpr const char* kDigestXattr = "user.gkm.digest";

std::string InstalledDigest(const std::string& dir) {
  char buf[160];
  const ssize_t n = ::getxattr(dir.c_str(), kDigestXattr, buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

void MarkInstalledDigest(const std::string& dir, const std::string& digest) {
  // Best effort: without it the next start pulls again (the old behaviour), nothing worse.
  (void)::setxattr(dir.c_str(), kDigestXattr, digest.data(), digest.size(), 0);
}

uint64_t TreeBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) total += it->file_size(size_ec);
  }
  return total;
}

}  // namespace

GkmAgentModule::Config GkmAgentModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config c;
  c.cache_root = section.String("cacheRoot", c.cache_root);
  c.usage_root = section.String("usageRoot", c.usage_root);
  for (const auto& [key, value] : {std::pair{"cacheRoot", c.cache_root}, {"usageRoot", c.usage_root}}) {
    if (value.empty() || value.front() != '/') section.Fail(key, "must be an absolute path");
  }
  c.registry_ca_file = section.String("registryCaFile", "");
  if (!c.registry_ca_file.empty() && c.registry_ca_file.front() != '/') {
    section.Fail("registryCaFile", "must be an absolute path");
  }
  c.pull_secrets = section.StringList("pullSecrets", std::vector<std::string>{});
  c.cluster_secret_namespace = section.String("clusterPullSecretNamespace", "");
  c.max_image_bytes = static_cast<uint64_t>(section.Int("maxImageBytes", 1024, int64_t{1} << 44, int64_t{8} << 30));
  c.max_cache_bytes = static_cast<uint64_t>(section.Int("maxCacheBytes", 1024, int64_t{1} << 44, int64_t{16} << 30));
  c.request_timeout = section.Duration("requestTimeout", milliseconds(100), milliseconds(600000), milliseconds(30000));
  c.max_attempts = static_cast<int>(section.Int("maxAttempts", 1, 20, 4));
  c.retry_interval = section.Duration("retryInterval", milliseconds(100), milliseconds(86400000), milliseconds(300000));
  c.max_concurrent_pulls = static_cast<int>(section.Int("maxConcurrentPulls", 1, 16, c.max_concurrent_pulls));
  c.pull_timeout = section.Duration("pullTimeout", milliseconds(100), milliseconds(86400000), c.pull_timeout);
  c.architecture = section.Enum("architecture", {"amd64", "arm64"}, "amd64");
  (void)site;
  return c;
}

GkmAgentModule::GkmAgentModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      node_(context.Site().node_name),
      bytes_pulled_(&context.Metrics().Counter("gpu_node_supervisor_gkm_bytes_pulled_total",
                                               "Bytes received from OCI registries for kernel caches")),
      extract_seconds_(&context.Metrics().Histogram(
          "gpu_node_supervisor_gkm_extract_seconds",
          "Time from a pull's start to its cache extracted (while it streams), checked and installed",
          kExtractBuckets)) {}

GkmAgentModule::~GkmAgentModule() { lifetime_.Close(); }

void GkmAgentModule::Start() {
  if (node_.empty()) throw std::runtime_error("gkm-agent needs the node name (site nodeName)");
  auto& services = context_.GetServices();
  client_ = services.Find<kube::KubeClient>();
  registry_ = services.Find<kube::InformerRegistry>();
  if (!client_ || !registry_) throw std::runtime_error("gkm-agent needs the kube module");
  RegistryOptions options;
  if (!config_.registry_ca_file.empty()) options.ca_pem = ReadFile(config_.registry_ca_file);  // a few KB, at start
  options.max_image_bytes = config_.max_image_bytes;
  options.request_timeout = config_.request_timeout;
  options.max_attempts = config_.max_attempts;
  options.architecture = config_.architecture;
  // Each pull's extraction holds a thread while the pull streams: on the shared pool,
  // maxConcurrentPulls pulls would take every thread of it (blockingThreads: 2) from the other
  // modules for minutes. They get threads of their own, one per pull that may run at once.
  options.extraction_threads = static_cast<std::size_t>(config_.max_concurrent_pulls);
  puller_ = std::make_unique<RegistryClient>(context_.GetLoop(), context_.Pool(), context_.Logger(), options);
  fs::create_directories(config_.cache_root);

  auto& bus = context_.GetBus();
  const kube::InformerSpec ns_spec{
      kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), "gkmcaches").Collection(), {}, {}};
  const kube::InformerSpec cluster_spec{
      kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), "clustergkmcaches").Collection(), {}, {}};
  events_sub_ = bus.Subscribe<kube::ResourceEvent>([this, a = ns_spec.Key(), b = cluster_spec.Key()](
                                                       const kube::ResourceEvent& e) {
    if ((e.informer_key == a || e.informer_key == b) && e.object) OnEvent(e);
  });
  synced_sub_ = bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced&) { OnSynced(); });
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory& inv) {
    const bool was_available = inventory_ && inventory_->available;
    inventory_ = inv;
    if (!was_available && inv.available) PumpQueue();
  });
  namespaced_ = registry_->Acquire(ns_spec);
  clustered_ = registry_->Acquire(cluster_spec);
  UpdateGauges();
}

void GkmAgentModule::Stop(std::function<void()> done) {
  lifetime_.Renew();
  if (puller_) puller_->Shutdown();
  for (auto& [key, cache] : caches_) {
    if (cache.retry) cache.retry->cancel();
    if (cache.status_retry) cache.status_retry->cancel();
    if (cache.usage_watch) cache.usage_watch->Stop();
  }
  for (auto& [key, d] : draining_) {
    if (d.watch) d.watch->Stop();
  }
  draining_.clear();
  caches_.clear();
  queue_.clear();
  pulling_.clear();
  // The CSI side stops mounting what a stopped agent no longer vouches for.
  swept_ = false;
  PublishStates();
  namespaced_.reset();
  clustered_.reset();
  done();
}

std::vector<GpuFacts> GkmAgentModule::Gpus() const {
  std::vector<GpuFacts> out;
  if (!inventory_) return out;
  for (const auto& g : inventory_->gpus) out.push_back(GpuFacts{g.index, g.name, g.cc_major, g.cc_minor});
  return out;
}

std::string GkmAgentModule::CacheDir(const Cache& cache) const {
  return config_.cache_root + "/" + CacheRelPath(cache.cluster, cache.ns, cache.name);
}

std::string GkmAgentModule::ObjectName(const Cache& cache) const { return StatusObjectName(cache.name, node_); }

kube::ResourcePath GkmAgentModule::NodePath(const Cache& cache) const {
  return kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion),
                                     cache.cluster ? "clustergkmcachenodes" : "gkmcachenodes", cache.ns);
}

void GkmAgentModule::OnEvent(const kube::ResourceEvent& e) {
  const auto meta = kube::ObjectMeta::From(*e.object);
  if (!meta) return;
  const bool cluster = meta->ns.empty();
  const std::string key = CacheRelPath(cluster, meta->ns, meta->name);
  if (e.type == kube::ResourceEvent::Type::kDeleted) {
    Forget(key, *e.object);
    return;
  }
  const std::string image = Text(*e.object, {"spec", "image"});
  const std::string resolved = Text(*e.object, {"status", "resolvedDigest"});
  if (auto d = draining_.find(key); d != draining_.end()) {
    // Created again while its old directory was still in use: the directory is the cache's
    // again (a pull replaces it only as any pull does).
    if (d->second.watch) d->second.watch->Stop();
    draining_.erase(d);
  }
  auto [it, added] = caches_.try_emplace(key);
  Cache& c = it->second;
  if (!added && c.image == image && c.resolved_digest == resolved) return;
  c.cluster = cluster;
  c.ns = meta->ns;
  c.name = meta->name;
  c.image = image;
  c.resolved_digest = resolved;
  context_.Log().info("cache {}: image {}{}", key, image, resolved.empty() ? "" : " @ " + resolved);
  Enqueue(key);
  PublishStates();
}

void GkmAgentModule::OnSynced() {
  if (sweep_started_ || !namespaced_ || !clustered_ || !namespaced_->Synced() || !clustered_->Synced()) return;
  sweep_started_ = true;
  Sweep();
  SweepStatusObjects();
}

// At start, once both watches have listed: an old layout is migrated (layout.hpp), caches on
// disk that no object refers to are removed, and so is what an interrupted pull left behind.
// No pull starts before it is done.
void GkmAgentModule::Sweep() {
  WantedCaches wanted;
  for (const auto& [key, object] : namespaced_->Items()) wanted.namespaced.insert(key);
  for (const auto& [key, object] : clustered_->Items()) wanted.cluster.insert(key);
  const std::string root = config_.cache_root;
  const std::string usage_root = config_.usage_root;
  // Caches whose objects went while we were down but that pods still mount stay (as a deletion
  // while running would leave them): they go when their last pod lets go.
  auto in_use = std::make_shared<std::vector<std::string>>();
  context_.Pool().Run(
      [root, usage_root, wanted, in_use]() mutable {
        for (const auto& key : CacheKeysInUse(usage_root)) {
          const bool cluster = key.rfind("cluster/", 0) == 0;
          const std::string rest = key.substr(key.find('/') + 1);
          auto& set = cluster ? wanted.cluster : wanted.namespaced;
          if (set.insert(rest).second) in_use->push_back(key);
        }
        auto report = MigrateLayout(root, wanted);
        for (auto& key : SweepLayout(root, wanted)) report.removed.push_back(std::move(key));
        return report;
      },
      lifetime_.Guard([this, in_use](LayoutReport report, std::exception_ptr error) {
        swept_ = true;
        for (const auto& key : *in_use) {
          if (caches_.count(key)) continue;  // created again meanwhile
          context_.Log().info("cache {}: its object is gone but pods still use it: removed when the last lets go", key);
          RemoveWhenUnused(key, config_.cache_root + "/" + key, config_.usage_root + "/" + key);
        }
        PublishStates();  // listed: a cache not named now does not exist
        if (error) context_.Log().warn("migrating and sweeping {}: {}", config_.cache_root, DescribeException(error));
        for (const auto& move : report.moved) context_.Log().info("cache moved to the new layout: {}", move);
        for (const auto& key : report.removed) context_.Log().info("removed stale cache {}", key);
        PumpQueue();
      }));
}

void GkmAgentModule::SweepStatusObjects() {
  for (const bool cluster : {false, true}) {
    const auto collection =
        kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion),
                                    cluster ? "clustergkmcachenodes" : "gkmcachenodes")
            .Collection();
    kube::ListOptions options;
    options.label_selector = "gkm.node=" + node_;
    client_->List(collection, options, [this, cluster, alive = lifetime_.Watch()](kube::Result r) {
      if (!alive) return;
      if (!r.Ok()) {
        context_.Log().warn("listing this node's {} status objects: {}", cluster ? "cluster cache" : "cache", r.error);
        return;
      }
      const auto items = r.object.value("items", json::array());
      for (const auto& item : items.is_array() ? items : json::array()) {
        const auto meta = kube::ObjectMeta::From(item);
        if (!meta || meta->ns.empty() != cluster) continue;
        const std::string cache = Text(item, {"spec", "cacheName"});
        const auto it = caches_.find(CacheRelPath(cluster, meta->ns, cache));
        if (!cache.empty() && it != caches_.end() && ObjectName(it->second) == meta->name) continue;
        // Ours by its label, and no cache of ours is written to it: gone, unless it changed
        // since we listed it (another node's agent of the old scheme may have taken it).
        Cache gone;
        gone.cluster = cluster;
        gone.ns = meta->ns;
        context_.Log().info("deleting stale status object {}", meta->Key());
        client_->Delete(NodePath(gone).Object(meta->name), kube::Preconditions{meta->uid, meta->resource_version},
                        [this, key = meta->Key(), alive = lifetime_.Watch()](kube::Result d) {
                          if (alive && !d.Ok() && d.http_status != 404 && d.http_status != 409) {
                            context_.Log().warn("delete stale status object {}: {}", key, d.error);
                          }
                        });
      }
    });
  }
}

void GkmAgentModule::Enqueue(const std::string& key) {
  auto it = caches_.find(key);
  if (it == caches_.end() || it->second.queued) return;
  if (it->second.retry) it->second.retry->cancel();
  it->second.queued = true;
  queue_.push_back(key);
  PumpQueue();
}

void GkmAgentModule::PumpQueue() {
  // Up to maxConcurrentPulls at once (a node's link and disk are shared), in queue order; none
  // before the GPUs are known. A cache whose previous pull is still under way (changed or
  // created again meanwhile) waits in the queue for it.
  if (!swept_ || !inventory_ || !inventory_->available) return;
  for (auto next = queue_.begin();
       next != queue_.end() && pulling_.size() < static_cast<std::size_t>(config_.max_concurrent_pulls);) {
    if (pulling_.count(*next)) {
      ++next;
      continue;
    }
    const std::string key = *next;
    next = queue_.erase(next);
    auto it = caches_.find(key);
    if (it == caches_.end()) continue;
    it->second.queued = false;
    Pull(key);
  }
}

void GkmAgentModule::EndPull(const std::string& key) {
  pulling_.erase(key);
  PumpQueue();
}

void GkmAgentModule::Pull(const std::string& key) {
  Cache& c = caches_.at(key);
  pulling_.insert(key);
  c.state = "Pulling";
  c.reason.clear();
  c.message.clear();
  UpdateGauges();
  if (!c.digest.empty()) {
    // Pulled by this run already (a new image or digest, or a retry): the registry decides, and
    // the copy this run installed keeps serving meanwhile (serving_*).
    PullFromRegistry(key);
    return;
  }
  // The first pull of this run: what an earlier run installed is checked on disk. The digest the
  // object names, installed and usable here: not pulled again. Another digest (or a tag, which
  // only the registry resolves): pulled, and the installed copy, when a GPU here can use it,
  // serves new volumes until the pull ends (a restart does not stop pods from mounting it).
  const std::string dir = CacheDir(c);
  const std::string want = c.resolved_digest;
  const auto gpus = Gpus();
  const int cuda = inventory_ ? inventory_->cuda_driver_version : 0;
  auto check = [dir, gpus, cuda]() -> std::optional<Installed> {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return std::nullopt;
    Installed out;
    out.kept_digest = InstalledDigest(dir);
    out.verdicts = CheckCompatibility(ScanTritonCache(dir), gpus, cuda);
    out.bytes = TreeBytes(dir);
    return out;
  };
  context_.Pool().Run(std::move(check), lifetime_.Guard([this, key, want, image = c.image](
                                                            std::optional<Installed> found, std::exception_ptr error) {
    auto it = caches_.find(key);
    if (it == caches_.end() || it->second.image != image || it->second.resolved_digest != want) {
      EndPull(key);
      return;
    }
    std::vector<uint32_t> usable;
    if (found && !error) {
      for (const auto& v : found->verdicts) {
        if (v.compatible) usable.push_back(v.index);
      }
    }
    if (usable.empty()) {
      PullFromRegistry(key);  // not there, or no GPU can use it now: a real pull decides
      return;
    }
    if (want.empty() || found->kept_digest != want) {
      it->second.serving_digest = found->kept_digest;
      it->second.serving_gpus = std::move(usable);
      context_.Log().info("cache {}: the installed copy ({}) serves new volumes while {} is pulled", key,
                          found->kept_digest.empty() ? "digest unknown" : found->kept_digest,
                          want.empty() ? image : want);
      UpdateGauges();
      PullFromRegistry(key);
      return;
    }
    context_.Log().info("cache {}: {} already installed, not pulled again", key, want);
    it->second.verdicts = found->verdicts;
    it->second.size_bytes = found->bytes;
    Finish(key, image, want, "Ready", "", "");
  }));
}

void GkmAgentModule::PullFromRegistry(const std::string& key) {
  Cache& c = caches_.at(key);
  const std::string secret_ns = c.cluster ? config_.cluster_secret_namespace : c.ns;
  if (config_.pull_secrets.empty() || secret_ns.empty()) {
    PullWithCredentials(key, std::nullopt);
    return;
  }
  // The first pull secret that has credentials for the image's registry wins.
  struct Lookup {
    std::vector<std::string> names;
    std::size_t next = 0;
    std::string registry;
  };
  auto lookup = std::make_shared<Lookup>();
  lookup->names = config_.pull_secrets;
  try {
    lookup->registry = ImageRef::Parse(c.image).registry;
  } catch (const std::exception&) {
    PullWithCredentials(key, std::nullopt);  // the pull reports the bad reference
    return;
  }
  auto step = std::make_shared<std::function<void()>>();
  *step = [this, key, secret_ns, lookup, weak_step = std::weak_ptr<std::function<void()>>(step),
           alive = lifetime_.Watch()] {
    if (lookup->next >= lookup->names.size()) {
      PullWithCredentials(key, std::nullopt);
      return;
    }
    const std::string name = lookup->names[lookup->next++];
    client_->Get(kube::ResourcePath::Core("secrets", secret_ns).Object(name),
                 [this, key, name, lookup, keep = weak_step.lock(), alive](kube::Result r) {
                   if (!alive) return;
                   if (!caches_.count(key)) {
                     EndPull(key);  // deleted meanwhile
                     return;
                   }
                   if (r.Ok()) {
                     try {
                       const std::string data = Text(r.object, {"data", ".dockerconfigjson"});
                       if (!data.empty()) {
                         const auto creds = CredentialsFor(json::parse(Base64Decode(data)), lookup->registry);
                         if (creds) {
                           PullWithCredentials(key, creds);
                           return;
                         }
                       }
                     } catch (const std::exception& e) {
                       context_.Log().warn("pull secret {}: {}", name, e.what());
                     }
                   } else if (r.http_status != 404) {
                     context_.Log().warn("pull secret {}: {}", name, r.error);
                   }
                   if (keep) (*keep)();
                 });
  };
  (*step)();
}

void GkmAgentModule::PullWithCredentials(const std::string& key, std::optional<Credentials> credentials) {
  Cache& c = caches_.at(key);
  ImageRef ref;
  try {
    ref = ImageRef::Parse(c.image);
  } catch (const std::exception& e) {
    Finish(key, c.image, {}, "Failed", "BadImage", e.what());
    return;
  }
  std::random_device rd;
  const std::string work = config_.cache_root + "/.pull-" + std::to_string(rd()) + std::to_string(rd());
  const std::string image = c.image;
  const std::string resolved = c.resolved_digest;
  std::error_code ec;
  fs::create_directories(work, ec);  // a mkdir: cheap enough for the loop
  if (ec) {
    Finish(key, image, {}, "Failed", "WriteFailed", "cannot create " + work + ": " + ec.message());
    return;
  }
  context_.Log().info("cache {}: pulling {}", key, ref.ToString());
  // The status says Pulling once, as the pull starts (not per chunk): a pull that hangs is
  // seen as one, until its deadline.
  c.message = "pulling " + ref.ToString();
  WriteStatus(key);
  // The layers are extracted into work/cache as they stream; work/cache is installed only
  // after every byte was checked.
  const auto started = std::chrono::steady_clock::now();
  puller_->Pull(
      PullRequest{ref, resolved, std::move(credentials), work, work + "/cache", config_.max_cache_bytes,
                  config_.pull_timeout},
      [this, key, work, image, started, alive = lifetime_.Watch()](PullResult r) {
        if (!alive) return;
        bytes_pulled_->Inc(static_cast<double>(r.bytes_pulled));
        auto it = caches_.find(key);
        if (it == caches_.end() || it->second.image != image) {
          // Deleted or changed while pulling: drop what came.
          context_.Pool().Execute([work] { RemoveTree(work); });
          EndPull(key);
          return;
        }
        if (!r.Ok()) {
          context_.Pool().Execute([work] { RemoveTree(work); });
          Finish(key, image, r.digest, "Failed", r.reason, r.error);
          return;
        }
        const std::string final_dir = CacheDir(it->second);
        const std::string usage_dir = config_.usage_root + "/" + key;
        const auto gpus = Gpus();
        const int cuda = inventory_ ? inventory_->cuda_driver_version : 0;
        const std::string digest = r.digest;
        context_.Pool().Run(
            [bytes = r.extracted.bytes, work, final_dir, usage_dir, digest, gpus, cuda, started] {
              Installed out;
              out.bytes = bytes;
              try {
                const auto kernels = ScanTritonCache(work + "/cache");
                out.verdicts = CheckCompatibility(kernels, gpus, cuda);
                bool any = false;
                for (const auto& v : out.verdicts) any = any || v.compatible;
                // Under the cache-use lock (api/usage.hpp): the CSI side mounts the installed copy
                // under it, so it is replaced or removed only while no pod has it.
                CacheUseLock lock(usage_dir);
                const auto usage = ReadUsageFile(usage_dir);
                const std::size_t users = usage.ok ? usage.records.size() : 1;  // unreadable: assume used
                std::error_code ec;
                if (users > 0 && fs::is_directory(final_dir, ec)) {
                  // Never replaced or removed under a pod: the installed copy stays as it is, and
                  // its own kernels say which GPUs can use it (after a restart nothing else does).
                  out.kept_for = users;
                  out.kept_digest = InstalledDigest(final_dir);
                  out.verdicts = CheckCompatibility(ScanTritonCache(final_dir), gpus, cuda);
                  out.bytes = TreeBytes(final_dir);
                } else if (any) {
                  out.install_began = true;
                  InstallDirectory(work + "/cache", final_dir);
                  MarkInstalledDigest(final_dir, digest);
                } else {
                  // Nothing here can use it: it is not kept (seed 002), and an older copy goes too.
                  // The reason is the GPUs' (ArchitectureMismatch, …): the roll-up keys by it.
                  const auto why = IncompatibleReason(out.verdicts);
                  out.incompatible = true;
                  out.install_began = true;  // the older copy goes
                  out.reason = why.reason;
                  out.message = why.message;
                  RemoveTree(final_dir);
                }
              } catch (const PullError& e) {
                out.reason = e.reason;
                out.message = e.what();
              } catch (const std::exception& e) {
                out.reason = "ExtractFailed";
                out.message = e.what();
              }
              try {
                RemoveTree(work);
              } catch (const std::exception&) {
                // Left for the next start's sweep.
              }
              out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
              return out;
            },
            [this, key, image, digest, alive](Installed out, std::exception_ptr) {
              if (!alive) return;
              extract_seconds_->Observe(out.seconds);
              auto it = caches_.find(key);
              if (it == caches_.end()) {
                EndPull(key);
                return;
              }
              if (out.kept_for > 0 && out.reason.empty()) {
                Cache& c = it->second;
                c.verdicts = out.verdicts;
                c.size_bytes = out.bytes;
                if (!out.kept_digest.empty() && out.kept_digest == digest) {
                  // The same bytes: nothing to replace.
                  Finish(key, image, digest, "Ready", "", "");
                  return;
                }
                // Keep serving the installed copy (its verdicts); the new digest waits for
                // the last pod to let go (RefreshUsage enqueues it then).
                c.update_deferred = true;
                context_.Log().info("cache {}: {} not installed: the installed copy ({}) is in use by {} volume(s)",
                                    key, digest, out.kept_digest.empty() ? "digest unknown" : out.kept_digest,
                                    out.kept_for);
                Finish(key, image, out.kept_digest.empty() ? c.digest : out.kept_digest, "Ready", "UpdateDeferred",
                       digest + " waits: the installed copy is in use by " + std::to_string(out.kept_for) +
                           " volume(s)");
                return;
              }
              it->second.verdicts = out.verdicts;
              it->second.size_bytes = out.bytes;
              if (out.reason.empty()) {
                Finish(key, image, digest, "Ready", "", "");
              } else {
                // A new image that fails its checks before the install (no metadata, a scan
                // error) leaves the installed copy serving; one that failed mid-install does not.
                if (out.install_began) {
                  it->second.serving_digest.clear();
                  it->second.serving_gpus.clear();
                }
                Finish(key, image, digest, out.incompatible ? "Incompatible" : "Failed", out.reason, out.message);
              }
            });
      });
}

void GkmAgentModule::Finish(const std::string& key, const std::string& image, const std::string& digest,
                            std::string state, std::string reason, std::string message) {
  pulling_.erase(key);
  auto it = caches_.find(key);
  if (it != caches_.end() && it->second.image == image) {
    Cache& c = it->second;
    c.state = std::move(state);
    c.reason = std::move(reason);
    c.message = std::move(message);
    c.digest = digest;
    if (c.state == "Failed") {
      // Whatever failed (registry down, secret missing, bad image, a pull past its deadline)
      // may be fixed later: tried again with backoff.
      if (!c.retry_backoff) {
        c.retry_backoff.emplace(BackoffPolicy{config_.retry_interval, config_.retry_interval * kMaxRetryFactor, 2.0, 0.5});
      }
      const auto delay = c.retry_backoff->Next();
      context_.Log().warn("cache {}: {}: {} (tried again in {} s)", key, c.reason, c.message, delay.count() / 1000);
      if (!c.retry) c.retry = std::make_unique<boost::asio::steady_timer>(context_.GetLoop().Io());
      c.retry->expires_after(delay);
      c.retry->async_wait(lifetime_.Guard([this, key](const boost::system::error_code& ec) {
        if (!ec) Enqueue(key);
      }));
    } else {
      if (c.retry_backoff) c.retry_backoff->Reset();
      context_.Log().info("cache {}: {}{}", key, c.state, c.reason.empty() ? "" : " (" + c.reason + ")");
    }
    if (c.state == "Ready") {
      // This copy now serves new volumes, also through a later pull of another image.
      c.serving_digest = c.digest;
      c.serving_gpus.clear();
      for (const auto& v : c.verdicts) {
        if (v.compatible) c.serving_gpus.push_back(v.index);
      }
    } else if (c.state == "Incompatible") {
      c.serving_digest.clear();  // removed: nothing a GPU here can use
      c.serving_gpus.clear();
    }
    if (c.state == "Ready") {
      WatchUsage(key);
      RefreshUsage(key);  // writes the status once usage.json is read
    } else {
      WriteStatus(key);
    }
  }
  UpdateGauges();
  PumpQueue();
}

void GkmAgentModule::Forget(const std::string& key, const json& last) {
  auto it = caches_.find(key);
  Cache c;
  if (it != caches_.end()) {
    c = std::move(it->second);
    caches_.erase(it);
  } else {
    const auto meta = kube::ObjectMeta::From(last);
    if (!meta) return;
    c.cluster = meta->ns.empty();
    c.ns = meta->ns;
    c.name = meta->name;
  }
  if (c.retry) c.retry->cancel();
  if (c.status_retry) c.status_retry->cancel();
  if (c.usage_watch) c.usage_watch->Stop();
  const std::string dir = CacheDir(c);
  context_.Log().info("cache {} deleted: removing {} once no pod uses it", key, dir);
  RemoveWhenUnused(key, dir, config_.usage_root + "/" + key);
  if (const std::string name = ObjectName(c); !name.empty()) {
    client_->Delete(NodePath(c).Object(name), {}, lifetime_.Guard([this, key](kube::Result r) {
      if (!r.Ok() && r.http_status != 404) context_.Log().warn("delete status of {}: {}", key, r.error);
    }));
  }
  UpdateGauges();
}

void GkmAgentModule::RemoveWhenUnused(const std::string& key, const std::string& dir, const std::string& usage_dir) {
  Draining& d = draining_[key];
  d.dir = dir;
  d.usage_dir = usage_dir;
  if (d.removing) {
    d.again = true;
    return;
  }
  d.removing = true;
  // Under the cache-use lock (api/usage.hpp): the CSI side cannot record and mount a volume of
  // this cache between the check and the removal.
  context_.Pool().Run(
      [dir, usage_dir]() -> std::size_t {
        CacheUseLock lock(usage_dir);
        const auto usage = ReadUsageFile(usage_dir);
        if (!usage.ok) throw std::runtime_error(usage.error);  // unreadable: keep the files
        if (!usage.records.empty()) return usage.records.size();
        RemoveTree(dir);
        return 0;
      },
      lifetime_.Guard([this, key](std::size_t pods, std::exception_ptr error) {
        auto it = draining_.find(key);
        if (it == draining_.end()) return;  // created again meanwhile
        Draining& d = it->second;
        d.removing = false;
        if (error) {
          // The next start's sweep tries again (with the same check).
          context_.Log().warn("cache {}: cannot remove {}: {}", key, d.dir, DescribeException(error));
        } else if (pods == 0) {
          context_.Log().info("cache {}: removed {}", key, d.dir);
          if (d.watch) d.watch->Stop();
          draining_.erase(it);
          return;
        } else {
          context_.Log().info("cache {}: {} kept while {} volume(s) use it", key, d.dir, pods);
        }
        if (d.again) {
          d.again = false;
          RemoveWhenUnused(key, d.dir, d.usage_dir);
          return;
        }
        if (!d.watch && !error) {
          d.watch = std::make_unique<DirWatcher>(context_.GetLoop().Io(), d.usage_dir,
                                                 [this, key](DirWatcher::Change, const std::string& name) {
                                                   if (name.empty() || name == "usage.json") OnUsageChanged(key);
                                                 });
          try {
            d.watch->Start();
          } catch (const std::exception& e) {
            context_.Log().warn("cannot watch {}: {} (removed at the next start)", d.usage_dir, e.what());
            d.watch.reset();
          }
        }
      }));
}

void GkmAgentModule::OnUsageChanged(const std::string& key) {
  if (caches_.count(key)) {
    RefreshUsage(key);
  } else if (auto d = draining_.find(key); d != draining_.end()) {
    RemoveWhenUnused(key, d->second.dir, d->second.usage_dir);
  }
}

std::string GkmAgentModule::UsagePath(const Cache& cache) const {
  return config_.usage_root + "/" + CacheRelPath(cache.cluster, cache.ns, cache.name) + "/usage.json";
}

void GkmAgentModule::RefreshUsage(const std::string& key) {
  auto it = caches_.find(key);
  if (it == caches_.end()) return;
  Cache& c = it->second;
  if (c.usage_reading) {
    c.usage_changed = true;  // read again once this read is back
    return;
  }
  c.usage_reading = true;
  context_.Pool().Run([path = UsagePath(c)] { return ReadUsage(path); },
                      lifetime_.Guard([this, key](json pods, std::exception_ptr error) {
                        auto it = caches_.find(key);
                        if (it == caches_.end()) return;  // deleted meanwhile
                        Cache& c = it->second;
                        c.usage_reading = false;
                        // ReadUsage does not throw; a throw (a bug) keeps the pods last read.
                        if (!error) c.pods = std::move(pods);
                        if (c.usage_changed) {
                          c.usage_changed = false;
                          RefreshUsage(key);
                          return;
                        }
                        if (c.update_deferred && c.pods.empty()) {
                          c.update_deferred = false;
                          Enqueue(key);  // the newer image can go in now
                        }
                        WriteStatus(key);
                      }));
}

json GkmAgentModule::ReadUsage(const std::string& path) {
  // Written by the CSI side for pods: bounded, regular files only (loop/state_file.hpp).
  const auto read = ReadStateFile(path, 1u << 20);
  if (read.status != StateFileRead::Status::kRead) return json::array();
  const auto j = json::parse(read.content, nullptr, false);
  json pods = json::array();
  if (!j.is_object()) return pods;
  for (const auto& [pod, entries] : j.items()) {
    if (!entries.is_array()) continue;
    for (const auto& e : entries) {
      if (!e.is_object()) continue;
      json p = json::object();
      for (const char* k : {"podName", "podNamespace", "volumeId"}) {
        if (const auto f = e.find(k); f != e.end() && f->is_string()) p[k] = *f;
      }
      if (!p.empty()) pods.push_back(std::move(p));
    }
  }
  return pods;
}

// The CSI driver records pod usage in <usageRoot>/<CacheRelPath>/usage.json (replaced by rename):
// watched with inotify, re-read on every change, reported with the cache's status.
void GkmAgentModule::WatchUsage(const std::string& key) {
  Cache& c = caches_.at(key);
  if (c.usage_watch) return;
  const std::string dir = config_.usage_root + "/" + CacheRelPath(c.cluster, c.ns, c.name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    context_.Log().warn("cannot create {}: {} (pod usage not reported)", dir, ec.message());
    return;
  }
  c.usage_watch = std::make_unique<DirWatcher>(context_.GetLoop().Io(), dir,
                                               [this, key](DirWatcher::Change, const std::string& name) {
                                                 if (name.empty() || name == "usage.json") OnUsageChanged(key);
                                               });
  try {
    c.usage_watch->Start();
  } catch (const std::exception& e) {
    context_.Log().warn("cannot watch {}: {}", dir, e.what());
    c.usage_watch.reset();
  }
}

void GkmAgentModule::WriteStatus(const std::string& key) {
  auto it = caches_.find(key);
  if (it == caches_.end()) return;
  Cache& c = it->second;
  // GPUs grouped by type and driver (seed 002's status.gpus), and the verdict sets.
  json gpus = json::array();
  if (inventory_) {
    std::map<std::string, json> by_type;
    for (const auto& g : inventory_->gpus) {
      auto& entry = by_type[g.name];
      if (entry.is_null()) entry = {{"gpuType", g.name}, {"driverVersion", inventory_->driver_version}, {"ids", json::array()}};
      entry["ids"].push_back(g.index);
    }
    for (auto& [type, entry] : by_type) gpus.push_back(std::move(entry));
  }
  json compatible = json::array();
  json incompatible = json::array();
  std::map<std::pair<std::string, std::string>, json> groups;
  json ok_ids = json::array();
  for (const auto& v : c.verdicts) {
    if (v.compatible) {
      ok_ids.push_back(v.index);
      continue;
    }
    auto& g = groups[{v.reason, v.message}];
    if (g.is_null()) g = {{"ids", json::array()}, {"reason", v.reason}, {"message", v.message}};
    g["ids"].push_back(v.index);
  }
  if (!ok_ids.empty()) compatible.push_back({{"ids", ok_ids}});
  for (auto& [k, g] : groups) incompatible.push_back(std::move(g));
  json entry = {{"digest", c.digest},
                {"state", c.state},
                {"compatibleGPUs", compatible},
                {"incompatibleGPUs", incompatible}};
  if (!c.reason.empty()) entry["reason"] = c.reason;
  if (!c.message.empty()) entry["message"] = c.message;
  if (c.state == "Ready") {
    entry["volumeSize"] = c.size_bytes;
    entry["pods"] = c.pods;
  }
  json status = {{"nodeName", node_}, {"gpus", gpus}, {"caches", {{c.name, entry}}}};
  const std::string text = status.dump();
  if (text == c.written) return;  // only on change
  c.written = text;
  if (ObjectName(c).empty()) {
    context_.Log().warn("cache {}: no status object: \"{}.{}.{}\" would be longer than an object name may be (253)",
                        key, c.name.size(), c.name, node_);
    return;
  }
  const std::string now = Now();
  status["caches"][c.name]["lastUpdated"] = now;
  const std::string kind = c.cluster ? "ClusterGKMCacheNode" : "GKMCacheNode";
  const std::string api_version = std::string(kGroup) + "/" + std::string(kVersion);
  json metadata = {{"name", ObjectName(c)},
                   {"labels", {{"gkm.node", node_}, {"gkm.io/cache", c.name}}},
                   {"annotations", {{"gkm.io/lastUpdated", now}}}};
  if (!c.cluster) metadata["namespace"] = c.ns;
  const json object = {{"apiVersion", api_version}, {"kind", kind}, {"metadata", metadata},
                       {"spec", {{"nodeName", node_}, {"cacheName", c.name}}}};
  json status_object = {{"apiVersion", api_version}, {"kind", kind}, {"metadata", {{"name", ObjectName(c)}}},
                        {"status", status}};
  if (!c.cluster) status_object["metadata"]["namespace"] = c.ns;
  const std::string path = NodePath(c).Object(ObjectName(c));
  const std::string manager(kFieldManager);
  client_->Patch(path, kube::PatchType::kApply, object, manager,
                 [this, key, path, status_object, manager, alive = lifetime_.Watch()](kube::Result r) {
                   if (!alive) return;
                   if (!r.Ok()) {
                     context_.Log().warn("apply {}: {}", path, r.error);
                     RetryStatus(key, r.retry_after);
                     return;
                   }
                   client_->PatchStatus(path, kube::PatchType::kApply, status_object, manager,
                                        [this, key, path, alive](kube::Result s) {
                                          if (!alive) return;
                                          if (s.Ok()) {
                                            if (auto it = caches_.find(key); it != caches_.end()) {
                                              it->second.status_backoff.Reset();
                                            }
                                            return;
                                          }
                                          context_.Log().warn("apply {}/status: {}", path, s.error);
                                          RetryStatus(key, s.retry_after);
                                        },
                                        true);
                 },
                 true);
}

void GkmAgentModule::RetryStatus(const std::string& key, std::chrono::milliseconds retry_after) {
  auto it = caches_.find(key);
  if (it == caches_.end()) return;
  Cache& c = it->second;
  c.written.clear();
  const auto delay = kube::RetryDelay(retry_after, c.status_backoff, client_->Retry().max_retry_after);
  context_.Log().info("cache {}: status written again in {} ms", key, delay.count());
  if (!c.status_retry) c.status_retry = std::make_unique<boost::asio::steady_timer>(context_.GetLoop().Io());
  c.status_retry->expires_after(delay);
  c.status_retry->async_wait(lifetime_.Guard([this, key](const boost::system::error_code& ec) {
    if (!ec) WriteStatus(key);
  }));
}

void GkmAgentModule::PublishStates() {
  CacheStates states;
  states.cache_root = config_.cache_root;
  states.usage_root = config_.usage_root;
  states.listed = swept_;
  for (const auto& [key, c] : caches_) {
    CacheView v;
    v.cluster = c.cluster;
    v.ns = c.ns;
    v.name = c.name;
    v.state = c.state;
    v.reason = c.reason;
    v.message = c.message;
    v.digest = c.digest;
    v.size_bytes = c.size_bytes;
    v.directory = CacheDir(c);
    v.usage_dir = config_.usage_root + "/" + key;
    for (const auto& verdict : c.verdicts) {
      if (verdict.compatible) v.compatible_gpus.push_back(verdict.index);
    }
    v.serving_digest = c.serving_digest;
    v.serving_gpus = c.serving_gpus;
    states.caches.emplace(key, std::move(v));
  }
  if (published_ && *published_ == states) return;
  published_ = states;
  context_.GetBus().Publish(std::move(states));
}

void GkmAgentModule::UpdateGauges() {
  PublishStates();
  std::map<std::string, int> by_state{{"Pending", 0}, {"Pulling", 0}, {"Ready", 0}, {"Incompatible", 0}, {"Failed", 0}};
  for (const auto& [key, c] : caches_) ++by_state[c.state];
  for (const auto& [state, n] : by_state) {
    context_.Metrics()
        .Gauge("gpu_node_supervisor_gkm_caches", "Kernel caches on this node by state", {{"state", state}})
        .Set(n);
  }
}

}  // namespace gns::gkm
