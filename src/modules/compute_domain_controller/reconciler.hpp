#pragma once
// One reconcile of one ComputeDomain (seed 000 §6), as a chain of API calls with no state kept
// between reconciles: everything is read fresh, so a restart or a new leader simply runs it
// again (idempotent).
//
// Add/update (§6.1, HostManagedIMEX): GET the domain → add the finalizer
// resource.nvidia.com/computeDomain (PUT with the resourceVersion read) → GET the workload
// ResourceClaimTemplate named by spec.channel.resourceClaimTemplate.name; create it if missing;
// if it exists but its labels do not name this domain (uid) and target Workload, it is not ours:
// an Event and NotReady status on the domain, never overwritten → status.status=Ready through
// the status subresource. Nothing else is created; spec.numNodes is ignored.
//
// Delete (§6.2, whatever the gate): DELETE the template (precondition: its uid) → remove its
// finalizer → GET it again until it is gone → remove the domain's finalizer → the caller forgets
// the domain's metrics.
//
// Driver-managed (gate off, issue #16): the same finalizer and workload template, no DaemonSet
// and no daemon claim template (the supervisors run the IMEX daemons). status.status is Ready
// when the Ready nodes of the domain's clique (the clique of the first node in status.nodes, as
// the node side reads it) reach spec.numNodes; entries of Nodes that no longer exist are
// removed from status.nodes. The delete path waits for the nodes to deregister (up to
// `deregister_timeout` after the deletionTimestamp) before it removes the finalizer.
//
// ComputeDomainCliques (gate on, driver-managed): the nodes register in the domain's
// ComputeDomainClique objects (one per clique, in the domain's namespace, labelled
// resource.nvidia.com/computeDomain=<uid>), and status.nodes is their mirror, as upstream's
// controller builds it (cdstatus.go): the same verdict is then taken over it. Entries of Nodes
// that no longer exist are left out and removed from the clique objects. The delete path waits
// for the clique objects to empty (same timeout), deletes them, then removes the finalizer.
//
// A 409 restarts the reconcile from the GET (fresh resourceVersion), a few times in a row.
// Cancel() abandons every reconcile in flight: callbacks of requests already sent are ignored
// and no further request is made (used when the lease is lost).

#include "loop/gate.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gns::cd_controller {

inline constexpr std::string_view kGroup = "resource.nvidia.com";
inline constexpr std::string_view kVersion = "v1beta1";
inline constexpr std::string_view kResource = "computedomains";
// The ComputeDomain finalizer; upstream reuses the node-label key (computeDomainFinalizer =
// computeDomainLabelKey), and so does its workload-template manager for the template's own.
inline constexpr std::string_view kFinalizer = "resource.nvidia.com/computeDomain";
inline constexpr std::string_view kTemplateFinalizer = "resource.nvidia.com/computeDomain";
inline constexpr std::string_view kDomainLabel = "resource.nvidia.com/computeDomain";
inline constexpr std::string_view kTargetLabel = "resource.nvidia.com/computeDomainTarget";
inline constexpr std::string_view kTargetWorkload = "Workload";
inline constexpr std::string_view kChannelRequest = "channel";
inline constexpr std::string_view kChannelDeviceClass = "compute-domain-default-channel.nvidia.com";
inline constexpr std::string_view kDriverName = "compute-domain.nvidia.com";
inline constexpr std::string_view kChannelConfigKind = "ComputeDomainChannelConfig";
inline constexpr std::string_view kCliqueResource = "computedomaincliques";

// resource.k8s.io versions the template can be written in: v1 and v1beta2 nest the device class
// under `exactly`; v1beta1 has flat requests (WIRE-FACTS §4.1).
enum class ResourceApi { kV1, kV1beta2, kV1beta1 };
std::string_view ResourceApiVersion(ResourceApi api);  // "v1", "v1beta2", "v1beta1"

// The workload ResourceClaimTemplate for a domain (uid, allocationMode as in its spec; an empty
// mode is left out of the opaque config).
nlohmann::json WorkloadTemplate(ResourceApi api, const std::string& ns, const std::string& name,
                                const std::string& domain_uid, const std::string& allocation_mode);
// True when `tmpl` carries the labels this controller puts on the template of `domain_uid`.
bool MadeForDomain(const nlohmann::json& tmpl, const std::string& domain_uid);

struct ReconcileSettings {
  bool host_managed = true;  // the HostManagedIMEX gate
  ResourceApi resource_api = ResourceApi::kV1;
  int conflict_retries = 5;  // 409s in a row restarted at once before backing off
  std::string field_manager = "compute-domain-controller";
  // Driver-managed only. Whether a Node exists (unset: every node does).
  std::function<bool(const std::string& node)> node_exists;
  std::chrono::milliseconds deregister_timeout{300000};
  // ComputeDomainCliques: the domain's clique objects (namespace, domain UID), from a cache;
  // nullopt while that cache has not listed yet.
  bool cliques = false;
  std::function<std::optional<std::vector<nlohmann::json>>(const std::string& ns, const std::string& uid)> cliques_of;
  std::function<std::chrono::system_clock::time_point()> wall_now = [] { return std::chrono::system_clock::now(); };
};

// The driver-managed status verdict over a domain object (pure): status.nodes without the
// entries of vanished Nodes, and Ready when the domain clique's Ready nodes reach numNodes.
struct DriverManagedStatus {
  nlohmann::json nodes = nlohmann::json::array();  // kept entries, in order
  std::size_t removed = 0;
  std::string clique;
  std::size_t ready = 0;       // Ready nodes of `clique`
  std::size_t registered = 0;  // kept entries
  int64_t num_nodes = 0;
  bool domain_ready = false;
};
DriverManagedStatus JudgeDriverManaged(const nlohmann::json& domain,
                                       const std::function<bool(const std::string&)>& node_exists);

// ComputeDomainCliques (pure): status.nodes as the mirror of the domain's clique objects. An
// entry already in status.nodes keeps its place (so the first entry, whose clique is the
// domain's, stays first); new ones are appended in the order of their clique object's
// creationTimestamp, then name, then the object's list order. Daemons of Nodes that no longer
// exist are left out and listed per clique object (with their positions) for removal.
struct StaleDaemons {
  std::string clique;  // the clique object's name
  std::string uid;     // its metadata.uid
  std::vector<std::pair<std::size_t, std::string>> entries;  // (position in daemons, nodeName)
};
struct CliqueMirror {
  nlohmann::json nodes = nlohmann::json::array();
  std::vector<StaleDaemons> stale;
  std::map<std::string, std::pair<std::size_t, std::size_t>> per_clique;  // cliqueID -> (Ready, registered)
};
CliqueMirror MirrorCliques(const nlohmann::json& domain, const std::vector<nlohmann::json>& cliques,
                           const std::function<bool(const std::string&)>& node_exists);

struct Outcome {
  enum class State {
    kReady,         // template present, status Ready
    kNotReady,      // left NotReady (bad spec, template conflict, driver-managed mode)
    kDeleted,       // finalizers removed: the domain is gone or going
    kGone,          // no such domain (already deleted)
  };
  bool ok = true;      // false: try again after backoff
  State state = State::kNotReady;
  std::string reason;  // a CamelCase reason for errors and NotReady (metrics label, Event reason)
  std::string error;   // what went wrong, for the log
};
std::string_view ToString(Outcome::State state);

class Reconciler {
 public:
  struct Stats {
    uint64_t started = 0;
    uint64_t finished = 0;
    uint64_t abandoned = 0;  // cancelled while a request was in flight
    uint64_t conflicts = 0;  // 409s seen
    uint64_t templates_created = 0;
    uint64_t templates_deleted = 0;
    uint64_t status_writes = 0;
    uint64_t cliques_deleted = 0;
    uint64_t clique_entries_removed = 0;  // daemons of vanished Nodes
  };

  // `events` may be null (no Events are recorded then).
  Reconciler(std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::EventRecorder> events,
             std::shared_ptr<spdlog::logger> log, ReconcileSettings settings);
  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Reconciles the domain "namespace/name"; `done` runs on the loop unless Cancel() came first.
  void Reconcile(const std::string& key, std::function<void(Outcome)> done);
  // Abandons every reconcile in flight.
  void Cancel();

  const Stats& GetStats() const { return stats_; }

 private:
  struct Run;
  using RunPtr = std::shared_ptr<Run>;
  using Step = void (Reconciler::*)(const RunPtr&);

  // Sends through the client; `next` runs only if this run is still current.
  template <typename Send>
  void Call(const RunPtr& run, Send send, std::function<void(kube::Result)> next);
  bool Current(const RunPtr& run) const;

  void FetchDomain(const RunPtr& run);
  void OnDomain(const RunPtr& run, kube::Result r);
  void Restart(const RunPtr& run, const kube::Result& r, std::string_view what);
  void Finish(const RunPtr& run, Outcome outcome);
  void Fail(const RunPtr& run, std::string reason, std::string error);

  // add/update
  void EnsureFinalizer(const RunPtr& run);
  void EnsureTemplate(const RunPtr& run);
  void CreateTemplate(const RunPtr& run);
  void WriteStatus(const RunPtr& run, bool ready, std::string reason, std::string message,
                   std::function<void()> then);
  void NotReady(const RunPtr& run, std::string reason, std::string message, bool retry);
  void Settle(const RunPtr& run);
  void DriverManagedSettle(const RunPtr& run);
  void PruneCliques(const RunPtr& run, std::shared_ptr<std::vector<StaleDaemons>> stale, Outcome outcome);
  // Driver-managed delete: true when the wait for `registered` nodes is over (timed out);
  // otherwise the run is finished with a retry.
  bool DeregisterWaitOver(const RunPtr& run, std::size_t registered);
  void DeleteCliques(const RunPtr& run, std::shared_ptr<std::vector<nlohmann::json>> cliques);

  // delete
  void DeleteTemplateStep(const RunPtr& run);
  void RemoveDomainFinalizer(const RunPtr& run);

  void Event(const RunPtr& run, std::string_view type, std::string_view reason, std::string_view note);

  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::EventRecorder> events_;
  std::shared_ptr<spdlog::logger> log_;
  ReconcileSettings settings_;
  uint64_t epoch_ = 0;
  std::set<Run*> runs_;  // in flight, for the abandoned count
  Gate lifetime_;
  Stats stats_;
};

}  // namespace gns::cd_controller
