#pragma once
// The `gkm-agent` module (seed 002): GPU kernel caches declared in GKMCache (namespaced) and
// ClusterGKMCache objects are pulled from their OCI images, extracted, checked against each
// GPU of this node and kept under <cacheRoot>/namespaced/<namespace>/<name>/ (cluster caches:
// <cacheRoot>/cluster/<name>/; layout.hpp) when at least one GPU can use them; each (node,
// cache) is reported in a GKMCacheNode / ClusterGKMCacheNode object named
// <len(cache)>.<cache>.<node>, written with server-side apply when it changes.

#include "loop/backoff.hpp"
#include "loop/bus.hpp"
#include "loop/dir_watcher.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/gkm_agent/compat.hpp"
#include "modules/gkm_agent/layout.hpp"
#include "modules/gkm_agent/messages.hpp"
#include "modules/gkm_agent/registry_client.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace gns::gkm {

inline constexpr std::string_view kGroup = "gkm.io";
inline constexpr std::string_view kVersion = "v1alpha1";

class GkmAgentModule final : public Module {
 public:
  static constexpr std::string_view kName = "gkm-agent";
  static constexpr std::string_view kSummary =
      "GPU kernel caches: OCI images pulled, extracted, checked per GPU, reported per node";
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    std::string cache_root = "/var/lib/gkm/caches";
    std::string usage_root = "/run/gkm/usage";
    std::string registry_ca_file;             // PEM; empty: the system's trust store only
    std::vector<std::string> pull_secrets;    // Secret names looked up in the cache's namespace
    std::string cluster_secret_namespace;     // where ClusterGKMCache pull secrets live
    uint64_t max_image_bytes = 8ull << 30;
    uint64_t max_cache_bytes = 16ull << 30;
    std::chrono::milliseconds request_timeout{30000};
    int max_attempts = 4;
    // A failed pull is tried again after about this (drawn from [½, 1]×), doubling for each
    // failure in a row up to kMaxRetryFactor× (a success starts again from here).
    std::chrono::milliseconds retry_interval{300000};
    // Pulls under way at once (each its own connection, extraction job and staging directory):
    // a registry that never answers holds back only its own caches.
    int max_concurrent_pulls = 2;
    // The whole pull of one image (every request and retry): past it, it fails with
    // DeadlineExceeded and is retried like any failed pull.
    std::chrono::milliseconds pull_timeout{1800000};
    std::string architecture = "amd64";                // which manifest of an image index
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GkmAgentModule(ModuleContext& context, const Config& config);
  ~GkmAgentModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  // One cache as this node sees it (also shown in /debug/state through the metrics).
  static constexpr int kMaxRetryFactor = 8;
  static constexpr BackoffPolicy kStatusRetry{std::chrono::milliseconds(1000), std::chrono::milliseconds(60000), 2.0, 0.5};

  struct Cache {
    bool cluster = false;
    std::string ns;  // empty for cluster caches
    std::string name;
    std::string image;
    std::string resolved_digest;  // from the object's status; empty: resolve the tag
    std::string state = "Pending";  // Pending, Pulling, Ready, Incompatible, Failed
    std::string reason;
    std::string message;
    std::string digest;  // what was pulled
    uint64_t size_bytes = 0;
    std::vector<GpuVerdict> verdicts;
    // The installed copy new volumes get while the cache is not Ready (CacheView::serving_*):
    // set when a copy is installed or found Ready, kept through a later pull and a failed one,
    // dropped when the directory goes or may have been changed by a failed install.
    std::string serving_digest;
    std::vector<uint32_t> serving_gpus;
    std::string written;  // the status last applied (without timestamps)
    std::unique_ptr<boost::asio::steady_timer> retry;
    std::optional<Backoff> retry_backoff;  // failed pulls in a row (made with the first failure)
    // A status write that failed is written again after this backoff (or the server's
    // Retry-After); reset by a write that lands.
    std::unique_ptr<boost::asio::steady_timer> status_retry;
    Backoff status_backoff{kStatusRetry};
    std::unique_ptr<DirWatcher> usage_watch;
    // usage.json as last read (on the pool): the pods in the status; one read at a time, a
    // change during it reads again.
    nlohmann::json pods = nlohmann::json::array();
    bool usage_reading = false;
    bool usage_changed = false;
    bool queued = false;
    // A newer image waits: the installed copy is in use by pods and is not replaced under them;
    // pulled again once usage.json names no pod.
    bool update_deferred = false;
  };
  const std::map<std::string, Cache>& Caches() const { return caches_; }

 private:
  void OnEvent(const kube::ResourceEvent& event);
  void OnSynced();
  // Both watches listed: migrate an old layout, remove what no object refers to.
  void Sweep();
  // Both watches listed: delete this node's status objects that no cache of ours is written
  // to (names of the old scheme, caches deleted while we were down).
  void SweepStatusObjects();
  void Enqueue(const std::string& key);
  void PumpQueue();
  // At a (re)start, a cache whose installed copy already has the digest the object names is
  // checked again on disk instead of pulled (a pull would replace the directory under its pods).
  void Pull(const std::string& key);
  // The pull of `key` is over, whatever its outcome: its slot goes to the next in the queue.
  void EndPull(const std::string& key);
  void PullFromRegistry(const std::string& key);
  void PullWithCredentials(const std::string& key, std::optional<Credentials> credentials);
  void Finish(const std::string& key, const std::string& image, const std::string& digest, std::string state,
              std::string reason, std::string message);
  void Forget(const std::string& key, const nlohmann::json& last);
  void WriteStatus(const std::string& key);
  // The status write of `key` failed: forget what was written and write it again later.
  void RetryStatus(const std::string& key, std::chrono::milliseconds retry_after);
  void WatchUsage(const std::string& key);
  // Reads usage.json on the pool (never on the loop: the CSI side writes it, anything may stand
  // there), then writes the status with the pods it names.
  void RefreshUsage(const std::string& key);
  std::string UsagePath(const Cache& cache) const;
  // Blocking: the pods usage.json names ([] for anything unusable).
  static nlohmann::json ReadUsage(const std::string& path);
  std::string CacheDir(const Cache& cache) const;
  std::string ObjectName(const Cache& cache) const;
  kube::ResourcePath NodePath(const Cache& cache) const;
  void UpdateGauges();
  // Publishes CacheStates (messages.hpp) when what the CSI side sees changed.
  void PublishStates();
  std::vector<GpuFacts> Gpus() const;
  // usage.json of `key` changed: the status of a cache, or the removal of a deleted one in use.
  void OnUsageChanged(const std::string& key);
  // A deleted cache's directory goes only when no pod uses it (api/usage.hpp: under the lock);
  // while one does, it waits in draining_ and is tried again on each change of its usage.json.
  void RemoveWhenUnused(const std::string& key, const std::string& dir, const std::string& usage_dir);

  ModuleContext& context_;
  Config config_;
  std::string node_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> registry_;
  std::unique_ptr<RegistryClient> puller_;
  std::shared_ptr<kube::Informer> namespaced_;
  std::shared_ptr<kube::Informer> clustered_;
  std::optional<gpu_inventory::GpuInventory> inventory_;
  std::map<std::string, Cache> caches_;
  std::deque<std::string> queue_;
  struct Draining {
    std::string dir;
    std::string usage_dir;
    std::unique_ptr<DirWatcher> watch;
    bool removing = false;
    bool again = false;  // usage changed during a try: try once more
  };
  std::map<std::string, Draining> draining_;  // deleted caches still mounted by pods
  std::optional<CacheStates> published_;
  std::set<std::string> pulling_;  // caches whose pull is under way (at most maxConcurrentPulls)
  bool sweep_started_ = false;
  bool swept_ = false;  // no pull before the start's sweep is done
  Gate lifetime_;
  MetricsRegistry::Series* bytes_pulled_;
  // A cache image is pulled and unpacked in seconds to many minutes (multi-GB images).
  static constexpr double kExtractBuckets[] = {0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800};
  MetricsRegistry::HistogramSeries* extract_seconds_;
  Subscription events_sub_;
  Subscription synced_sub_;
  Subscription inventory_sub_;
};

}  // namespace gns::gkm
