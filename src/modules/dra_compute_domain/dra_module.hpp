#pragma once
// The `dra-compute-domain` module: the DRA kubelet plugin for compute-domain.nvidia.com under
// HostManagedIMEX (seed 000 §5, §7, §11, §13; issue #5). It wires the core library (checkpoint,
// CDI spec, prepare decision, ResourceSlice, the two gRPC servers) to the kube services, the
// bus (NodeClique in, DraComputeDomainState out) and the supervisor.
//
// Start (throws → the supervisor retries with backoff): the IMEX channel major from
// <hostRoot>/proc/devices, the checkpoint and the claim log replayed over it (damage → moved aside +
// Node Event, serve what is valid),
// the reconcile of checkpoint and CDI specs, the DRA server, then the registration server; the
// ResourceSlice is published and kept true asynchronously. Prepare and Unprepare run one
// kubelet call at a time per node (a FIFO of jobs), so the claim state never races; each call's
// durable record is one claim-log append (claim_log.hpp) on the BlockingPool, and the loop's
// state follows what reached the disk.

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/dra_server.hpp"
#include "modules/dra_compute_domain/driver_managed.hpp"
#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/dra_compute_domain/prepare.hpp"
#include "modules/dra_compute_domain/resource_slice.hpp"
#include "dra_plugin/slice_publisher.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gns::kube {
class KubeClient;
class Informer;
class EventRecorder;
class InformerRegistry;
struct Result;
}  // namespace gns::kube

namespace gns::dra {

class RegistrationServer;

class DraComputeDomainModule final : public Module, private DraHandler {
 public:
  static constexpr std::string_view kName = "dra-compute-domain";
  static constexpr std::string_view kSummary =
      "DRA kubelet plugin for compute-domain.nvidia.com (IMEX channel 0, HostManagedIMEX)";
  // Holds the kube module's client and informers: waits for it, restarts after it.
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    ResourceApiVersion api_version = ResourceApiVersion::kV1;
    // How long a claim's API look-ups (ResourceClaim, ComputeDomain) are retried on transport
    // errors, 429 and 5xx before the claim is answered with a retryable error; below the
    // kubelet's 45 s call deadline so the kubelet gets an answer, not a timeout.
    std::chrono::milliseconds prepare_timeout{20000};
    // Period of the ResourceSlice check (read it back, write it if it drifted); the informer
    // catches deletions at once, this catches anything the watch missed.
    std::chrono::milliseconds slice_resync{600000};
    bool node_events_on_corrupt_checkpoint = true;
    // Upstream's host-managed parity gate: while imex-health says host IMEX is not ready (or
    // has not said anything yet), Prepare answers with a retryable error naming the reason.
    bool require_imex_ready = false;
    // HostManagedIMEX off (issue #16): the supervisor runs each domain's nvidia-imex
    // (`driverManaged:` section; node name, state dir and the DNS-names gate come from the site).
    DriverManagedSettings driver_managed;
    // allocationMode "All": channels 0..allChannels-1 go into the container (upstream's 2048).
    uint32_t all_channels = 2048;
    // Bytes of claim log after which it is compacted into the checkpoint. Not a YAML key (the
    // default suits every node); tests lower it to reach the compaction.
    std::size_t claim_log_compact_at = kClaimLogCompactAt;
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  DraComputeDomainModule(ModuleContext& context, const Config& config);
  ~DraComputeDomainModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;
  // The claim state is being read on the pool: the kubelet plugin is not served yet.
  bool Loading() const { return loading_; }

 private:
  // DraHandler (loop thread).
  void Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) override;
  void Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) override;

  // Start steps (blocking, small files).
  // What Start reads on the pool (never on the loop): the claim state, domains.json.
  struct StartFiles {
    ClaimStateLoad claims;
    DomainRecordLoad domains;  // driver-managed only
  };
  // Start, continued once they are back: reconcile, then serve (the kubelet reaches us only then).
  void Serve(StartFiles files);
  void LoadAndReconcile(ClaimStateLoad loaded);
  void LogGates();

  // The per-node serialisation of kubelet calls and compactions: a FIFO drained in order, one job
  // at a time, by one coroutine (RunJobs), so the claim state never races. It is co_spawned when a
  // job arrives and none runs, and ends when the queue is empty or the module stops.
  struct PrepareJob {
    std::vector<ClaimRef> claims;
    std::function<void(PrepareResults)> done;
  };
  struct UnprepareJob {
    std::vector<ClaimRef> claims;
    std::function<void(UnprepareResults)> done;
  };
  struct CompactJob {};
  using Job = std::variant<PrepareJob, UnprepareJob, CompactJob>;
  void Enqueue(Job job);
  boost::asio::awaitable<void> RunJobs(Gate::Ticket alive);

  // One NodePrepareResources call: each claim decided in turn, then one commit, then the answer.
  // Coroutines take their parameters by value: their frames outlive the caller's arguments.
  boost::asio::awaitable<void> PrepareCall(PrepareJob job);
  // One claim's answer; nullopt when Stop cut it (the DRA server's shutdown answers the call).
  boost::asio::awaitable<std::optional<PrepareResult>> PrepareClaim(ClaimRef claim);
  PrepareDecision Decide(const ClaimRef& claim, const nlohmann::json& object, const DomainLookupFn& lookup);
  // The checkpoint the next decision reads: the loop's, plus this call's claims not yet committed.
  const Checkpoint& DecideView();
  // Until OnClique says the clique is known (true), the wait runs out (false) or Stop.
  boost::asio::awaitable<bool> WaitForClique(std::chrono::milliseconds left);
  void OnClique(const gpu_inventory::NodeClique& clique);
  // The call's decided claims made durable in one append; `results` comes back with the failures.
  boost::asio::awaitable<PrepareResults> CommitPrepares(std::vector<ClaimRef> claims, PrepareResults results);
  void CommitDone(const std::string& log_error, uint64_t last_seq, std::size_t log_used, std::size_t committed);
  boost::asio::awaitable<void> Compact();
  boost::asio::awaitable<void> UnprepareCall(UnprepareJob job);

  // A GET (or LIST) retried on transport errors, 429 and 5xx until `deadline`.
  boost::asio::awaitable<kube::Result> FetchWithRetry(Gate::Ticket alive, bool list, std::string path,
                                                      Clock::SteadyTime deadline);
  boost::asio::awaitable<void> Sleep(std::chrono::milliseconds delay);
  // Callback APIs as awaitables (plain functions, not coroutines: see dra_module.cpp).
  boost::asio::awaitable<kube::Result> Fetch(bool list, std::string path);
  boost::asio::awaitable<DomainVerdict> Attach(std::string uid, std::string claim_namespace, std::string claim_name,
                                               ComputeDomainInfo domain);
  boost::asio::awaitable<std::string> Detach(std::string uid);
  boost::asio::awaitable<boost::system::error_code> Expiry(boost::asio::steady_timer& timer);

  // The ResourceSlice's devices (the core's SlicePublisher keeps the slice true).
  nlohmann::json SliceDevices() const;

  void RecordCorruptCheckpointEvent();
  void UpdateCheckpointGauge();
  void SetError(std::string error);
  void PublishState();

  ModuleContext& context_;
  Config config_;
  DriverPaths paths_;
  std::string node_name_;
  bool host_managed_ = false;
  uint32_t channel_major_ = 0;
  std::string clique_id_;
  bool clique_known_ = false;  // gpu-inventory has read the fabric (NodeClique::known)
  std::string clique_reason_;
  // The prepare that waits for the clique to become known (at most one: prepares run one at a
  // time) sleeps on this timer until its deadline; OnClique wakes it early.
  boost::asio::steady_timer clique_timer_;
  bool clique_waiting_ = false;
  bool clique_arrived_ = false;  // set by OnClique for the waiting prepare
  // The durable claim state: the checkpoint with the claim log replayed over it (start), then
  // every committed record. Only what reached the disk.
  Checkpoint checkpoint_;
  std::shared_ptr<ClaimLog> log_;  // used on the pool, by one job at a time
  uint64_t next_seq_ = 1;
  bool compaction_queued_ = false;
  std::vector<PreparedClaim> pending_prepares_;  // decided in the running call, not yet committed
  Checkpoint decide_view_;
  std::string corrupt_note_;  // set when the checkpoint was moved aside; the Node Event's note

  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::shared_ptr<kube::EventRecorder> events_;
  std::unique_ptr<DraServer> dra_server_;
  std::unique_ptr<RegistrationServer> registration_server_;
  std::unique_ptr<DriverManagedDomains> domains_;  // gate off only

  std::deque<Job> jobs_;
  bool jobs_running_ = false;  // RunJobs is spawned and has not ended
  bool stopping_ = false;
  bool loading_ = false;  // the claim state is being read on the pool: nothing is served yet

  // Slice publishing (dra_plugin/slice_publisher.hpp): one write in flight, retries, resync.
  std::unique_ptr<SlicePublisher> slices_;

  bool registered_ = false;
  std::string registration_error_;
  std::string last_error_;
  Gate lifetime_;  // closed first thing in the destructor: late callbacks and resumptions are dropped

  MetricsRegistry::Series* prepares_ok_;
  MetricsRegistry::Series* prepares_already_;
  MetricsRegistry::Series* prepares_permanent_;
  MetricsRegistry::Series* prepares_retryable_;
  MetricsRegistry::Series* unprepares_ok_;
  MetricsRegistry::Series* unprepares_unknown_;
  MetricsRegistry::Series* unprepares_error_;
  MetricsRegistry::Series* checkpoint_entries_;
  MetricsRegistry::Series* slice_created_;
  MetricsRegistry::Series* slice_updated_;
  MetricsRegistry::Series* slice_errors_;
  MetricsRegistry::Series* reconcile_rollbacks_;
  MetricsRegistry::Series* reconcile_orphans_;
  MetricsRegistry::Series* reconcile_respecs_;
  MetricsRegistry::Series* corrupt_checkpoints_;
  Subscription clique_sub_;
};

}  // namespace gns::dra
