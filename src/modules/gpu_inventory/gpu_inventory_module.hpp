#pragma once
// The `gpu-inventory` module: loads NVML with dlopen (never linked, so the daemon starts on
// nodes without a driver), publishes the node's GPUs (GpuInventory) and NVLink clique
// (NodeClique) as retained state, NVML XID events (XidObservation) and NVML's ECC and clock
// events (NvmlHealthEvent, where the GPU supports them); a MIG reconfiguration
// NVML reports is read and republished at once. NVML trouble never
// fails the module: the inventory becomes unavailable, the module unhealthy, and NVML is opened
// again with jittered backoff. NvmlReleaseRequest lets go of NVML (or of one GPU) for a GPU
// reset and takes it back; releasing one GPU reopens the session without it, and the others stay
// available throughout.
//
// GpuHealthSampler (api/health_sample.hpp) is provided while the module runs: a health pass
// runs on the pool with the module's session, only when asked, one at a time, under a deadline
// (healthReadTimeout). A pass that outlives it makes the inventory unavailable with the reason,
// and no NVML read starts until it returns; then the inventory is read again.
//
// Threads and processes: NVML calls run on the blocking pool, one task at a time; NVML's events
// are waited for in a child process (EventWaiterProcess) whose lines the loop reads from a pipe.
// Module state lives on the loop thread only. Nothing ever waits for an event wait: closing a
// session kills the child (the kernel closes its handles once it is reaped) and shuts the
// session's NVML down on the pool, so a release, Stop and the process exit are all prompt.

#include "loop/backoff.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_inventory/event_waiter.hpp"
#include "modules/gpu_inventory/api/health_sample.hpp"
#include "modules/gpu_inventory/api/nvml_session.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

class GpuInventoryModule final : public Module {
 public:
  static constexpr std::string_view kName = "gpu-inventory";
  static constexpr std::string_view kSummary = "GPUs, NVLink peers, fabric clique and XID events from NVML";

  struct Config {
    // dlopen'd as is: a soname searched like the dynamic linker does, or a path.
    std::string nvml_library = nvml::kLibraryName;
    // How long one nvmlEventSetWait_v2 of the event waiter child blocks. An event wakes it at
    // once, and a release kills the child instead of waiting for it: the length only sets how
    // often it wakes at rest.
    std::chrono::milliseconds event_wait_timeout{60000};
    // The program run as `<it> nvml-events …` for the event waiter: this binary.
    std::string event_waiter_program = "/proc/self/exe";
    // Between attempts to open NVML again after it failed or was missing.
    BackoffPolicy retry_backoff{std::chrono::milliseconds(1000), std::chrono::milliseconds(60000), 2.0, 0.5};
    // How often the inventory is read again (fabric registration completes after boot). A MIG
    // reconfiguration that NVML reports (nvmlEventMigConfigChange) is read at once instead.
    std::chrono::milliseconds refresh_interval{60000};
    // How long one health pass (GpuHealthSampler) may take before NVML counts as hung.
    std::chrono::milliseconds health_read_timeout{10000};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GpuInventoryModule(ModuleContext& context, const Config& config);
  ~GpuInventoryModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  // Decides the next step from the state below; the one place that starts pool tasks.
  void Reconcile();
  void StartOpen();
  void OnOpened(uint64_t generation, NvmlSession::Opened opened, std::exception_ptr error);
  void OnArmed(uint64_t generation);
  void OnXid(XidEvent event);
  void OnHealthEvent(HealthEventLine event);
  static std::string DescribeEventTypes(uint64_t types);
  void OnMigChanged(std::string uuid);
  void OnWaiterFailed(uint64_t generation, const std::string& function, const std::string& message);
  void StartWaiter(uint64_t generation);
  // A read found GPUs whose MIG mode or event types differ from what the waiter registered by:
  // it is killed and, once reaped, started again (RestartWaiter), and what it may have missed
  // meanwhile is read again once the new one is armed.
  void CheckWaiterRegistrations(const ReadResult& read);
  void RestartWaiter(const std::vector<std::string>& gpus);
  void OnOldWaiterReaped(uint64_t generation);
  void StartClose();
  void OnClosed(NvmlSession::Closed closed);
  void ScheduleRetry();
  void CancelRetry();
  void ScheduleRefresh();
  void StartRefresh();
  void OnRefreshed(uint64_t generation, ReadResult read, std::exception_ptr error);
  void OnReleaseRequest(const NvmlReleaseRequest& request);
  void OnGpuReleaseRequest(const NvmlReleaseRequest& request);
  // Nothing holds any GPU's handles now: every requested per-GPU release is acknowledged.
  void AckGpuReleases();
  // Sets each GPU's `released` from acked_gpus_.
  void ApplyReleased(std::vector<GpuInfo>& gpus) const;
  void SetOkHealth();

  void RecordFailure(const std::string& error);
  void PublishAvailable(const ReadResult& read);
  void PublishUnavailable(const std::string& error);
  void PublishInventory(GpuInventory inventory);
  void PublishClique(NodeClique clique);
  void CountErrors(const std::vector<std::string>& functions);
  void LogWarnings(const std::vector<std::string>& warnings);
  void LogFailure(const std::string& error);
  EventWaiterProcess::Callbacks WaiterCallbacks(uint64_t generation);

  // GpuHealthSampler: the service object forwards to SampleHealth while the module runs.
  class HealthSamplerService;
  struct HealthRequest {
    uint32_t groups = 0;
    std::function<void(HealthSample)> done;
  };
  void SampleHealth(uint32_t groups, std::function<void(HealthSample)> done);
  void AnswerLater(std::function<void(HealthSample)> done, HealthSample sample);
  HealthSample FailedSample(uint32_t groups, std::string error) const;
  void StartHealthPass();
  boost::asio::awaitable<void> RunHealthPass(std::shared_ptr<NvmlSession> session, uint32_t groups,
                                             std::vector<GpuInfo> known, uint64_t seq);
  boost::asio::awaitable<HealthSample> HealthPoolPass(std::shared_ptr<NvmlSession> session, uint32_t groups,
                                                      std::vector<GpuInfo> known, uint64_t seq);
  void OnHealthPassReturned(uint64_t seq);
  void OnHealthPassDone(uint64_t seq, uint32_t groups, bool timed_out, std::optional<HealthSample> sample,
                        std::exception_ptr failure);

  ModuleContext& context_;
  Config config_;
  Backoff backoff_;
  boost::asio::steady_timer retry_timer_;
  boost::asio::steady_timer refresh_timer_;
  uint64_t retry_seq_ = 0;    // invalidates a retry timer that was cancelled
  uint64_t refresh_seq_ = 0;  // same for the refresh timer

  // The open NVML, if any (null while a task owns it or none is open), and the child that waits
  // for its GPUs' events.
  std::shared_ptr<NvmlSession> session_;
  std::shared_ptr<EventWaiterProcess> waiter_;
  // What waiter_ registered by, per GPU (its `registered` lines): compared with every read.
  std::map<std::string, GpuEventBasis> waiter_basis_;
  uint64_t generation_ = 0;       // of the newest open attempt; stale waiter reports are dropped
  bool task_in_flight_ = false;   // a pool task (open, refresh, close) runs: at most one
  bool session_failed_ = false;   // session_ failed: close it, then retry
  bool armed_ = false;            // session_'s waiter works and its inventory is published
  Clock::SteadyTime armed_at_{};
  ReadResult pending_read_;       // read at open, published once the waiter is armed
  bool retry_due_ = false;        // the last attempt failed: back off before the next
  // A refresh is owed (a MIG reconfiguration, or a refresh asked for while one ran): started as
  // soon as the session is armed and no task runs; an open (which reads everything) settles it.
  bool refresh_wanted_ = false;
  bool retry_pending_ = false;    // the retry timer runs
  bool released_ = false;         // NvmlReleaseRequest{release=true} (whole NVML) is in force
  bool release_published_ = false;
  std::string release_reason_;
  // Per-GPU releases, UUID → reason: requested; excluded by the open (or opening) session;
  // published as released (acknowledged: no session touches them; kept until re-read).
  std::map<std::string, std::string> released_gpus_;
  std::map<std::string, std::string> session_released_;
  std::map<std::string, std::string> acked_gpus_;
  bool stopping_ = false;

  // What was published last (republish only on change) and the last good read.
  std::optional<GpuInventory> published_inventory_;
  std::optional<NodeClique> published_clique_;
  std::vector<GpuInfo> last_gpus_;
  std::string last_driver_version_;
  bool clique_known_ = false;

  // Health passes: the requests the pass under way answers, those waiting for the next one.
  std::vector<HealthRequest> health_current_;
  std::vector<HealthRequest> health_waiting_;
  uint64_t health_seq_ = 0;           // of the newest pass; Stop moves it on (late answers are dropped)
  bool health_pass_running_ = false;  // a pass runs on the pool (in time or hung)
  bool health_pass_returned_ = false; // the running pass came back from the pool
  bool health_pass_hung_ = false;     // it outlived its deadline and has not come back yet
  std::string health_hung_error_;
  Clock::SteadyTime health_pass_started_{};

  // Log rate limits.
  std::string last_error_;
  Clock::SteadyTime last_error_at_{};
  int suppressed_errors_ = 0;
  std::vector<std::string> last_warnings_;
  std::map<std::string, std::pair<Clock::SteadyTime, int>> xid_log_;  // "uuid/xid" → last logged, suppressed

  Gate lifetime_;
  MetricsRegistry::Series* gpus_gauge_;
  MetricsRegistry::Series* nvml_up_gauge_;
  MetricsRegistry::Series* inventory_reads_;
  MetricsRegistry::Series* health_reads_;
  MetricsRegistry::Series* health_hangs_;
  MetricsRegistry::Series* waiter_restarts_;
  Subscription release_sub_;
};

}  // namespace gns::gpu_inventory
