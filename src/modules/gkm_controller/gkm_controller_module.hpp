#pragma once
// The `gkm-controller` module: seed 002's operator roll-up inside the node DaemonSet, active on
// exactly one node at a time (its own Lease, as compute-domain-controller). While it leads it
// watches the kernel caches (GKMCache, ClusterGKMCache) and the agents' per-node status objects
// (GKMCacheNode, ClusterGKMCacheNode), and writes into each cache's status the roll-up of its
// nodes (rollup.hpp) with server-side apply — only when it differs from what the status holds.
// Event-driven: a changed node object re-rolls only its cache; there is no periodic listing.

#include "loop/backoff.hpp"
#include "loop/bus.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/gkm_controller/rollup.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/api/leader_election.hpp"

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

namespace gns::gkm_controller {

class GkmControllerModule final : public Module {
 public:
  static constexpr std::string_view kName = "gkm-controller";
  static constexpr std::string_view kSummary =
      "leader-elected GKM roll-up: each kernel cache's status counts its nodes (total, ready, failed by reason)";
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    kube::LeaderElectionConfig lease;
    // A status write that failed is made again after this backoff (or the server's Retry-After).
    BackoffPolicy retry{std::chrono::milliseconds(500), std::chrono::milliseconds(60000), 2.0, 0.5};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GkmControllerModule(ModuleContext& context, const Config& config);
  ~GkmControllerModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  bool Leading() const { return leading_; }
  // Status writes this process made (tests: none when nothing changed).
  uint64_t Writes() const { return writes_; }

 private:
  struct CacheWrite {
    bool in_flight = false;
    bool again = false;  // changed while a write was in flight
    std::unique_ptr<boost::asio::steady_timer> retry;
    std::unique_ptr<Backoff> backoff;
  };

  void OnStartedLeading();
  void OnStoppedLeading();
  void StopWork();
  bool AllSynced() const;
  void OnSynced();
  void OnEvent(const kube::ResourceEvent& event);
  // A per-node object (of `cluster` scope) added, changed or deleted: recounted, its cache re-rolled.
  void Count(bool cluster, const std::string& object_key, const nlohmann::json* object);
  // A Node came or went: the caches it reports for are rolled up again.
  void NodeChanged(const std::string& node);
  void Schedule(bool cluster, const std::string& cache);
  void Flush();
  void Reconcile(bool cluster, const std::string& cache);
  void Retry(bool cluster, const std::string& cache, std::chrono::milliseconds retry_after);

  ModuleContext& context_;
  Config config_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> registry_;
  std::unique_ptr<kube::LeaderElector> elector_;
  bool leading_ = false;
  bool counted_ = false;  // every informer listed and the counts built from their caches
  // Caches and per-node objects, namespaced ([0]) and cluster-scoped ([1]).
  std::array<std::shared_ptr<kube::Informer>, 2> caches_;
  std::array<std::shared_ptr<kube::Informer>, 2> nodes_;
  std::array<std::string, 2> cache_keys_;
  std::array<std::string, 2> node_keys_;
  // The cluster's Nodes (names only): a status object counts only while its spec.nodeName is a
  // Node. A node gone for good leaves its agents' objects behind (nobody deletes them); counted,
  // they would keep totalNodes and failedNodes up forever.
  std::shared_ptr<kube::Informer> members_;
  std::string member_key_;
  // Per scope: the cache each per-node object counts for ("ns/name", or "name" for a
  // ClusterGKMCache), and each cache's reports by object.
  std::array<std::map<std::string, std::string>, 2> cache_of_;
  std::array<std::map<std::string, std::map<std::string, NodeReport>>, 2> reports_;
  std::set<std::pair<bool, std::string>> dirty_;
  bool flush_posted_ = false;
  std::map<std::pair<bool, std::string>, CacheWrite> writes_in_flight_;
  // The status each cache was last given by a write of ours that landed: the informer's copy
  // of the cache lags our writes (their watch events come later), so a roll-up equal to this
  // is not written again while the informer still shows an older status. Dropped when an
  // event shows other values in our fields (someone else's write, or one of ours before it).
  std::map<std::pair<bool, std::string>, nlohmann::json> applied_;
  uint64_t writes_ = 0;
  Gate work_;  // renewed when leadership ends: answers for the old term are dropped
  Gate lifetime_;
  Subscription events_sub_;
  Subscription synced_sub_;
};

}  // namespace gns::gkm_controller
