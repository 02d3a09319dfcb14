#pragma once
// The `compute-domain-controller` module: the cluster-wide ComputeDomain controller (seed 000
// §6) inside the node DaemonSet, active on exactly one node at a time. It runs its own
// LeaderElector on its own Lease (not the kube module's optional one: the controller needs the
// start/stop callbacks, and the node-local modules must not depend on who leads). While it
// leads it watches ComputeDomains in all namespaces and reconciles them through a keyed work
// queue; when the lease is lost (or the module stops) it stops at once: the queue is cleared,
// the reconcile in flight is abandoned (answers to requests already sent are ignored), the
// watch is dropped. A reconcile reads everything fresh, so the next leader just runs it again.

#include "loop/backoff.hpp"
#include "loop/bus.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/compute_domain_controller/reconciler.hpp"
#include "modules/compute_domain_controller/work_queue.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/api/leader_election.hpp"

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <vector>
#include <string>
#include <string_view>

namespace gns::cd_controller {

class ComputeDomainControllerModule final : public Module {
 public:
  static constexpr std::string_view kName = "compute-domain-controller";
  static constexpr std::string_view kSummary =
      "leader-elected ComputeDomain controller: finalizer, workload ResourceClaimTemplate, status";
  // Holds the kube module's client and informers: waits for it, restarts after it.
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    kube::LeaderElectionConfig lease;
    BackoffPolicy retry{std::chrono::milliseconds(500), std::chrono::milliseconds(60000), 2.0, 0.5};
    std::size_t workers = 4;
    int conflict_retries = 5;
    ResourceApi resource_api = ResourceApi::kV1;
    // Every cached domain is reconciled again this often while leading (0: never), so drift
    // no watch event reports is still repaired.
    std::chrono::milliseconds resync{600000};
    // Driver-managed delete: how long the finalizer waits for the nodes to deregister.
    std::chrono::milliseconds deregister_timeout{300000};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  ComputeDomainControllerModule(ModuleContext& context, const Config& config);
  ~ComputeDomainControllerModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  // For tests and /debug.
  bool Leading() const { return leading_; }
  const Reconciler* GetReconciler() const { return reconciler_.get(); }
  const WorkQueue* Queue() const { return queue_.get(); }
  bool Watching() const { return informer_ != nullptr; }

 private:
  void OnStartedLeading();
  void OnStoppedLeading();
  void StopWork();
  void Enqueue(const nlohmann::json& object);
  void OnTemplateEvent(const kube::ResourceEvent& event);
  void OnNodeEvent(const kube::ResourceEvent& event);
  void OnCliqueEvent(const kube::ResourceEvent& event);
  std::optional<std::vector<nlohmann::json>> CliquesOf(const std::string& ns, const std::string& uid) const;
  void ArmResync();
  void Work(const std::string& key, std::function<void(bool)> done);
  void Record(const std::string& key, const Outcome& outcome, double seconds);
  void Forget(const std::string& key);

  ModuleContext& context_;
  Config config_;
  bool host_managed_ = true;
  bool cliques_gate_ = false;  // ComputeDomainCliques (driver-managed only)
  bool leading_ = false;
  std::shared_ptr<kube::InformerRegistry> registry_;
  std::unique_ptr<Reconciler> reconciler_;
  std::unique_ptr<WorkQueue> queue_;
  std::unique_ptr<kube::LeaderElector> elector_;
  std::shared_ptr<kube::Informer> informer_;
  std::string informer_key_;
  // Our workload templates (by label): one deleted or changed by hand sends its domain back to
  // the queue.
  std::shared_ptr<kube::Informer> templates_;
  std::string templates_key_;
  // Driver-managed: the Nodes (a node that disappears leaves its domains' status).
  std::shared_ptr<kube::Informer> nodes_;
  std::string nodes_key_;
  // ComputeDomainCliques: every clique object carrying a domain label (their changes send the
  // domain back to the queue; the reconcile reads them from this cache).
  std::shared_ptr<kube::Informer> cliques_;
  std::string cliques_key_;
  std::unique_ptr<boost::asio::steady_timer> resync_timer_;
  std::map<std::string, std::string, std::less<>> domain_state_;  // key -> Ready/NotReady/Deleting
  // A reconcile is a few API calls: milliseconds, seconds when the API server is slow.
  static constexpr double kLatencyBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  MetricsRegistry::HistogramSeries* latency_ = nullptr;
  MetricsRegistry::CollectorHandle collector_;
  Gate lifetime_;
  Subscription events_sub_;
  Subscription synced_sub_;
  Subscription templates_sub_;
  Subscription nodes_sub_;
  Subscription cliques_sub_;
  Subscription cliques_synced_sub_;
};

}  // namespace gns::cd_controller
