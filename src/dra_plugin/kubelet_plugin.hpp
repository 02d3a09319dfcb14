#pragma once
// The kubelet-facing half of a DRA driver, driver-neutral: a module owns one KubeletPlugin and
// drives it with its DraDriver (driver.hpp).
//
//   Start:  FindServices (the kube client and informers; throws without them), the driver's own
//           checks, the claim state read on the pool (ReadClaimState, beside whatever else the
//           driver reads there), then Serve: the start-up reconcile of claim state and CDI specs
//           (roll back, re-make stale specs, sweep, delete orphans, compact; throws → the
//           supervisor retries), the driver's `before_servers`, the DRA server, then the
//           registration server (the kubelet reaches us only then), the ResourceSlice.
//   Calls:  NodePrepareResources / NodeUnprepareResources and the log's compaction run one at a
//           time per driver, from a FIFO drained by one coroutine, so the claim state never
//           races. Prepare: each claim decided in turn (DraDriver::DecideClaim), the call's
//           decided claims committed in one claim-log append, then the answer. Unprepare: specs
//           deleted, records appended, the driver's AfterUnprepare, then the answer. The loop's
//           claim state follows what reached the disk.
//   Stop:   no new job; the driver's StopBeforeServers; the registration server (removing its
//           socket deregisters us), then the DRA server (its shutdown answers pending calls).
//
// Counters (`driver` label: the driver name): gpu_node_supervisor_dra_prepares_total{result},
// …_unprepares_total{result}, …_checkpoint_entries, …_slice_publishes_total{result};
// …_reconciled_total{action} and …_corrupt_checkpoints_total, labelled by driver unless
// Options::unlabelled_reconcile_metrics (compute-domain.nvidia.com: its released names).

#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_commit.hpp"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/claim_specs.hpp"
#include "dra_plugin/dra_server.hpp"
#include "dra_plugin/driver.hpp"
#include "dra_plugin/plugin_paths.hpp"
#include "dra_plugin/slice.hpp"
#include "dra_plugin/slice_publisher.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace gns::kube {
class KubeClient;
class InformerRegistry;
class EventRecorder;
struct Result;
}  // namespace gns::kube

namespace gns::dra {

class RegistrationServer;

class KubeletPlugin final : private DraHandler {
 public:
  struct Options {
    std::string driver_name;
    PluginPaths paths;
    ClaimSpecNames spec_names;
    std::string node_name;
    ResourceApiVersion api_version = ResourceApiVersion::kV1;
    std::chrono::milliseconds slice_resync{600000};
    // A driver that says its devices' health: how often every open health stream gets the whole
    // list again (health_service.hpp: the kubelet forgets a report after its timeout).
    std::chrono::milliseconds health_resend = kDefaultHealthResend;
    bool node_events_on_corrupt_checkpoint = true;
    std::size_t claim_log_compact_at = kClaimLogCompactAt;
    // compute-domain.nvidia.com keeps the reconcile/corrupt counters it was released with (no
    // driver label); every later driver labels them.
    bool unlabelled_reconcile_metrics = false;
  };

  // `driver` must outlive the plugin.
  KubeletPlugin(ModuleContext& context, Options options, DraDriver& driver);
  ~KubeletPlugin() override;
  KubeletPlugin(const KubeletPlugin&) = delete;
  KubeletPlugin& operator=(const KubeletPlugin&) = delete;

  // Start, step 1 (loop): clears the stop flag, finds the kube client, informers and event
  // recorder. Throws when the kube module's client is missing.
  void FindServices();
  // Start, the pool step: the checkpoint with the claim log replayed over it. Blocking.
  static ClaimStateLoad ReadClaimState(const PluginPaths& paths) {
    return LoadClaimState(paths.checkpoint_file, paths.claim_log_file);
  }
  // Start, last step (loop): reconcile, `before_servers`, serve. Throws on a start failure.
  void Serve(ClaimStateLoad loaded, const std::function<void()>& before_servers = {});
  // Stop (loop): `done` on the loop once both servers are down.
  void Stop(std::function<void()> done);

  // For the driver (loop thread).
  bool Stopping() const { return stopping_; }
  // The claim state the next decision reads: the durable one plus the running call's claims
  // decided but not committed yet.
  const Checkpoint& DecideView();
  const Checkpoint& Claims() const { return checkpoint_; }
  bool Registered() const { return registered_; }
  const std::string& RegistrationError() const { return registration_error_; }
  const std::string& LastError() const { return last_error_; }
  void SetError(std::string error) { last_error_ = std::move(error); }
  // The driver's device health changed (DraDriver::DeviceHealth): open health streams get the
  // new list if it differs from the last one sent. Nothing without a health service.
  void DeviceHealthChanged();
  // Open NodeWatchResources streams (0 without a health service).
  std::size_t HealthStreams() const;
  SlicePublisher& Slices() { return *slices_; }
  const SlicePublisher& Slices() const { return *slices_; }
  const std::shared_ptr<kube::KubeClient>& Client() const { return client_; }
  const std::shared_ptr<kube::InformerRegistry>& Informers() const { return informers_; }
  const PluginPaths& Paths() const { return options_.paths; }
  // For a driver's DecideClaim: GET `path` (a LIST with `list`) through the kube client, again
  // after a transient failure (transport error, 429, 5xx: kube::IsTransient) with a backoff of
  // 200 ms doubling to 2 s, until the next wait would pass `deadline` (the module clock's steady
  // time) or the plugin stops; the last answer is returned. `alive` is the caller's ticket, by
  // value (a caller that co_spawns this starts it a loop turn later): gone, nothing is fetched.
  // Each attempt has no deadline of its own: `deadline` bounds the retries, the client each one.
  boost::asio::awaitable<kube::Result> FetchWithRetry(Gate::Ticket alive, bool list, std::string path,
                                                      Clock::SteadyTime deadline);
  const std::string& DriverName() const { return options_.driver_name; }
  // The jobs FIFO is empty and nothing runs (tests and benches wait on it).
  bool Idle() const { return !jobs_running_ && jobs_.empty(); }

 private:
  void Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) override;
  void Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) override;

  void Reconcile(ClaimStateLoad loaded);
  void RecordCorruptCheckpointEvent();

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
  boost::asio::awaitable<void> PrepareCall(PrepareJob job);
  boost::asio::awaitable<std::optional<PrepareResult>> PrepareClaim(ClaimRef claim);
  boost::asio::awaitable<PrepareResults> CommitPrepares(std::vector<ClaimRef> claims, PrepareResults results);
  void CommitDone(const std::string& log_error, uint64_t last_seq, std::size_t log_used, std::size_t committed);
  boost::asio::awaitable<void> Compact();
  boost::asio::awaitable<void> UnprepareCall(UnprepareJob job);

  boost::asio::awaitable<kube::Result> Fetch(bool list, std::string path);
  boost::asio::awaitable<void> Sleep(std::chrono::milliseconds delay);
  boost::asio::awaitable<boost::system::error_code> Expiry(boost::asio::steady_timer& timer);

  void UpdateCheckpointGauge();
  void Changed() { driver_.StateChanged(); }

  ModuleContext& context_;
  Options options_;
  DraDriver& driver_;

  Checkpoint checkpoint_;
  std::shared_ptr<ClaimLog> log_;  // used on the pool, by one job at a time
  uint64_t next_seq_ = 1;
  bool compaction_queued_ = false;
  std::vector<PreparedClaim> pending_prepares_;
  Checkpoint decide_view_;
  std::string corrupt_note_;

  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::shared_ptr<kube::EventRecorder> events_;
  std::unique_ptr<DraServer> dra_server_;
  std::unique_ptr<RegistrationServer> registration_server_;
  std::unique_ptr<SlicePublisher> slices_;

  std::deque<Job> jobs_;
  bool jobs_running_ = false;
  bool stopping_ = false;
  bool registered_ = false;
  std::string registration_error_;
  std::string last_error_;
  Gate lifetime_;

  MetricsRegistry::Series* prepares_ok_;
  MetricsRegistry::Series* prepares_already_;
  MetricsRegistry::Series* prepares_permanent_;
  MetricsRegistry::Series* prepares_retryable_;
  MetricsRegistry::Series* unprepares_ok_;
  MetricsRegistry::Series* unprepares_unknown_;
  MetricsRegistry::Series* unprepares_error_;
  MetricsRegistry::Series* checkpoint_entries_;
  MetricsRegistry::Series* reconcile_rollbacks_;
  MetricsRegistry::Series* reconcile_orphans_;
  MetricsRegistry::Series* reconcile_respecs_;
  MetricsRegistry::Series* corrupt_checkpoints_;
};

}  // namespace gns::dra
