#pragma once
// Driver-managed IMEX on this node (HostManagedIMEX off, issue #16; seed 001 §3.3–3.6 without
// the per-domain DaemonSet): the supervisor itself does what upstream's compute-domain-daemon
// pod does. A channel claim's prepare attaches the claim to its ComputeDomain here; the first
// claim of a domain labels the Node (`resource.nvidia.com/computeDomain=<uid>`), registers the
// node in the domain's status.nodes (name, IP, clique, stable index, NotReady; server-side
// apply of its own entry, so nodes never conflict), renders the
// domain's IMEX config and node map from the registered nodes of this node's clique, and starts
// the domain's nvidia-imex (ImexDaemon). The daemon's readiness goes into the node's entry;
// the controller judges the domain (status.status), and the prepare follows that verdict:
// Ready → the channels are injected; not yet → a retryable error (after waiting up to
// `readyWait`); a node of another clique than the domain's → a permanent error naming both.
// A changed peer set rewrites the map (SIGUSR1). The last claim's unprepare stops the daemon,
// deregisters the node and removes the label, in the background, retried until done; the
// record (domain_record.hpp) keeps the domain until then, so a restart finishes it.
//
// Under the ComputeDomainCliques gate the node's entry goes into the ComputeDomainClique object
// of its (domain, clique) instead (`daemons`, keyed by nodeName; the same apply under the
// node's own field manager, which creates the object when it is missing), the node map is
// rendered from that object (an informer on it beside the domain's), and the domain's
// status.nodes is the controller's mirror of the domain's clique objects: the node still reads
// the domain's clique and status.status there.
//
// Loop thread only. Attach and Detach come from the module's job queue (one at a time).

#include "loop/config.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/dra_compute_domain/domain_record.hpp"
#include "modules/dra_compute_domain/imex_daemon.hpp"
#include "modules/dra_compute_domain/imex_domain.hpp"
#include "modules/dra_compute_domain/prepare.hpp"

#include <utility>  // before awaitable.hpp: Boost 1.74's uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gns::kube {
class KubeClient;
class Informer;
class InformerRegistry;
struct ResourceEvent;
}  // namespace gns::kube

namespace gns::dra {

struct DriverManagedSettings {
  std::string node_name;
  std::string state_dir;     // <stateDir>/dra-compute-domain: domains.json and domains/<uid>/
  std::string node_address;  // "" → the Node's InternalIP
  bool dns_names = false;    // IMEXDaemonsWithDNSNames
  bool cliques = false;      // ComputeDomainCliques: register in the clique's object, not status.nodes
  uint16_t server_port = 50000;
  uint16_t cmd_port = 50005;
  ImexDaemonSettings daemon;  // paths, probe intervals, restart backoff (label/config per domain)
  // How long a prepare waits for its domain to become Ready before a retryable error.
  std::chrono::milliseconds ready_wait{10000};
  BackoffPolicy api_retry{std::chrono::milliseconds(200), std::chrono::milliseconds(10000), 2.0, 0.5};
};

// The `driverManaged:` section of modules.dra-compute-domain (every key optional).
DriverManagedSettings ParseDriverManagedSection(ConfigMap& module_section);

struct DomainVerdict {
  enum class Kind { kReady, kNotReady, kRefused };
  Kind kind = Kind::kNotReady;
  std::string message;
};

class DriverManagedDomains {
 public:
  DriverManagedDomains(ModuleContext& context, DriverManagedSettings settings,
                       std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::InformerRegistry> informers);
  ~DriverManagedDomains();
  DriverManagedDomains(const DriverManagedDomains&) = delete;
  DriverManagedDomains& operator=(const DriverManagedDomains&) = delete;

  // domains.json under `state_dir`: read (LoadDomainRecord, blocking) on the pool at start.
  static std::string RecordFile(const std::string& state_dir);
  // Takes domains.json as read. Throws when it exists but could not be read; a corrupt one is
  // moved aside (logged loudly) and the node starts with no domains.
  void Load(DomainRecordLoad loaded);
  // On the loop after Load: domains with claims resume (label, registration, files, daemon);
  // claims the DRA checkpoint does not hold as prepared are checked against the API (a deleted
  // claim is dropped); domains left without claims are torn down.
  void Resume(const std::vector<std::string>& prepared_claim_uids);
  void SetClique(const std::string& clique_id);

  // Attaches a channel claim to `domain` and answers with the domain's verdict for this node.
  void Attach(const std::string& claim_uid, const std::string& claim_namespace, const std::string& claim_name,
              const ComputeDomainInfo& domain, std::function<void(DomainVerdict)> done);
  // Detaches the claim (a claim we do not know is fine); the domain's last claim starts its
  // teardown. `done("")` once the record says so.
  void Detach(const std::string& claim_uid, std::function<void(std::string error)> done);
  // Stops the daemons (their registrations stay: the next start resumes them).
  void Stop(std::function<void()> done);

  nlohmann::json DebugState() const;
  std::size_t Domains() const { return domains_.size(); }
  // API requests this node made for driver-managed IMEX (an informer's list + watch count 2).
  uint64_t ApiRequests() const { return api_requests_; }

 private:
  struct Domain;
  struct Waiter;
  using DomainPtr = std::shared_ptr<Domain>;

  DomainPtr Ensure(const std::string& uid, const std::string& ns, const std::string& name);
  void Activate(const DomainPtr& d);
  // Each chain of API calls below is a coroutine spawned on the loop with a ticket of
  // lifetime_: `if (!ticket) co_return;` first (a run that begins after the owner is gone does
  // not touch it), and every co_await takes the ticket, so none resumes once the owner is gone.
  void Spawn(boost::asio::awaitable<void> run);
  boost::asio::awaitable<void> Register(DomainPtr d, Gate::Ticket ticket);
  void OnEvent(const kube::ResourceEvent& event);
  void OnDomainObject(const DomainPtr& d, std::shared_ptr<const nlohmann::json> object);
  void WatchClique(const DomainPtr& d);
  void OnCliqueObject(const DomainPtr& d, std::shared_ptr<const nlohmann::json> object);
  // The list this node's entry lives in: the clique object's daemons (gate on) or the domain's
  // status.nodes (gate off).
  DomainNodesParse Registered(const Domain& d) const;
  DomainNode Me(const Domain& d) const;
  void CheckEntry(const DomainPtr& d);
  DomainVerdict Verdict(const Domain& d) const;
  void AnswerWaiters(const DomainPtr& d, bool at_deadline);

  // Claims recorded for `d` that the DRA checkpoint does not hold as prepared: each asked of
  // the API (all at once), the deleted ones dropped; then the domain resumes or is torn down.
  boost::asio::awaitable<void> ResumeDomain(DomainPtr d, std::vector<std::pair<std::string, RecordedClaim>> unsure,
                                            Gate::Ticket ticket);
  void ResumeOrTeardown(const DomainPtr& d);
  // "" once node_address_ is known (read from the Node when not configured), else why not.
  boost::asio::awaitable<std::string> EnsureAddress(Gate::Ticket ticket);
  void Label(const DomainPtr& d, bool set);
  boost::asio::awaitable<void> WriteLabel(DomainPtr d, bool set, Gate::Ticket ticket);
  void SyncEntry(const DomainPtr& d);
  boost::asio::awaitable<void> ApplyEntry(DomainPtr d, Gate::Ticket ticket);
  boost::asio::awaitable<void> ApplyCliqueEntry(DomainPtr d, Gate::Ticket ticket);
  boost::asio::awaitable<void> WithdrawFromCliques(DomainPtr d, Gate::Ticket ticket);
  // Removes an entry no apply manager owns (written by an update), by position, guarded by a
  // `test` of its name; "" when done (or nothing was left to remove), else why not.
  boost::asio::awaitable<std::string> RemoveForeignEntry(std::string path, bool status_subresource,
                                                         nlohmann::json object, const char* list_pointer,
                                                         const char* name_key, Gate::Ticket ticket);
  void SyncEntryDone(const DomainPtr& d, bool ok, const std::string& error);
  void RenderFiles(const DomainPtr& d);
  boost::asio::awaitable<void> WriteFiles(DomainPtr d, std::string config, std::string map, std::string hosts,
                                          Gate::Ticket ticket);
  void Teardown(const DomainPtr& d);
  void TeardownStep(const DomainPtr& d);
  void RetryLater(const DomainPtr& d, std::function<void()> fn);

  void Persist(std::function<void(std::string error)> done);
  void PersistNext();
  DomainRecord Snapshot() const;

  ModuleContext& context_;
  DriverManagedSettings settings_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::string field_manager_;  // this node's own: it owns the node's entry in status.nodes
  std::string clique_id_;
  std::string node_address_;
  std::string record_file_;
  DomainRecord loaded_;
  std::map<std::string, DomainPtr> domains_;  // by UID
  // Record writes: one in flight; callers wait for a write that includes their change.
  bool persist_busy_ = false;
  std::vector<std::function<void(std::string)>> persist_waiting_;
  std::vector<std::function<void(std::string)>> persist_inflight_;
  bool stopping_ = false;
  uint64_t api_requests_ = 0;
  Gate lifetime_;
  Subscription events_sub_;
};

}  // namespace gns::dra
