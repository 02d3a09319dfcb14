#pragma once
// The `gpu-health` module: the one judge of GPU health. It wires its parts, each in a file of
// its own:
//  - xid_judge: kernel lines (journald's health stream) and NVML XIDs (gpu-inventory) → one
//    occurrence each → the XID catalog and site overrides (xid_policy) → verdicts
//    (verdict_book) and HealthEvents; reset acknowledgements, a new boot and set-healthy heal;
//  - health_checkpoint: verdicts, the position of the last health-stream line handled and the
//    XID counts, in one atomic write (<stateDir>/gpu-health/devices.json);
//  - operator_channel: the admin socket and the set-healthy Node annotation;
//  - health_report: the Node condition, Node Events, gauges and /debug/state;
//  - health_checks (memory, NVLink, fabric, PCIe, thermal, presence, host checks) and
//    check_book: gpu-inventory's GpuHealthSampler read on a schedule, each GPU's conditions
//    held with hysteresis (non-fatal) or latched (fatal) and laid over its XID verdict: the
//    published verdict is the combination (CombinedVerdict), one judge for both.
//
// Nothing lost, nothing doubled. The module is the consumer of record of journald's health
// stream: it asks each journald instance for the stream after the last line it handled
// (HealthStreamRequest), so lines already in the journal at start, lines that arrive while it
// restarts and lines a restarted journald would re-read all reach it exactly once. The
// position is persisted with the verdicts and counts it produced, and HealthEvents (and Node
// Events) leave the process only once the checkpoint that covers them is on disk: after kill
// -9 the lines after the checkpoint's position are handled again, and nothing they produced
// had left the process before. Verdicts themselves are published at once (the kubelet must
// stop scheduling on a failed GPU without waiting for a disk), which is safe because a
// verdict is state, not an event: deciding it again changes nothing.
//
// The verdicts of a boot survive restarts in that boot (the host's boot ID under hostRoot,
// else the first boot journald reports); another boot restores nothing.

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "loop/rate_limited_log.hpp"
#include "loop/state_file.hpp"
#include "modules/gpu_health/check_book.hpp"
#include "modules/gpu_health/health_checkpoint.hpp"
#include "modules/gpu_health/health_checks.hpp"
#include "modules/gpu_health/health_report.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_health/operator_channel.hpp"
#include "modules/gpu_health/sxid_catalog.hpp"
#include "modules/gpu_health/xid_catalog.hpp"
#include "modules/gpu_health/xid_judge.hpp"
#include "modules/gpu_inventory/api/health_events.hpp"
#include "modules/gpu_inventory/api/health_sample.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/journald/messages.hpp"
#include "modules/pod_resources/messages.hpp"
#include "preflight/unit_watcher.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

class GpuHealthModule final : public Module {
 public:
  static constexpr std::string_view kName = "gpu-health";
  static constexpr std::string_view kSummary = "XID classification, per-device health, recovery, Node condition and Events";
  // Runs without the API server; uses kube's services when kube runs (restarted when it comes).
  static constexpr std::array<std::string_view, 1> kFollows{"kube"};
  static constexpr std::string_view kSetHealthyAnnotation = OperatorChannel::kSetHealthyAnnotation;

  struct Config {
    std::string catalog_path;  // a site catalog laid over the built-in one; empty: built-in only
    XidCatalog catalog;        // the built-in catalog with catalog_path's entries laid over it
    std::string catalog_source;
    SiteOverrides overrides;
    std::string sxid_catalog_path;  // a site SXid catalog laid over the built-in one; empty: built-in
    SxidCatalog sxid_catalog;       // the built-in SXid catalog with sxid_catalog_path's entries laid over
    std::string sxid_catalog_source;
    std::string check_name = "SysLogsXIDError";
    std::string condition_type = "GpuXidHealthy";
    std::string agent = "gpu-node-supervisor";
    bool admin_socket = true;          // <stateDir>/admin.sock
    bool watch_annotation = true;      // the set-healthy Node annotation, when kube is there
    std::size_t recent_events = 32;    // kept for /debug/state
    // Kept in the checkpoint for consumers that take every event once (HealthEventLog).
    std::size_t event_log = 64;
    // How long the position of lines that changed nothing may wait before it is written (the
    // most that is read again after kill -9; lines that change something are written at once).
    std::chrono::milliseconds checkpoint_interval{5000};
    ChecksConfig checks;  // the polled checks (`checks:`)
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GpuHealthModule(ModuleContext& context, const Config& config);
  ~GpuHealthModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  const std::string& StatePath() const { return state_path_; }
  // devices.json (and the host's boot ID) are being read on the pool: nothing is judged yet.
  bool Loading() const { return loading_; }
  // set-healthy <uuid>|all: what the admin socket and the annotation call. Returns the answer.
  std::string SetHealthy(std::string_view target, std::string_view who);
  // The admin request line handler.
  std::string HandleAdminLine(std::string_view line) { return operator_.HandleLine(line); }
  const std::string& AdminSocketPath() const { return admin_path_; }
  // The conditions of the polled checks (tests, /debug/state).
  const CheckBook& Conditions() const { return check_book_; }

 private:
  // The health stream (journald).
  void OnJournalState(const journald::JournalState& state);
  void RequestStream(const std::string& reader);
  void OnHealthLine(const journald::JournalLine& line, bool acknowledgement);
  void OnBoot(const std::string& boot_id);
  // Outputs of the judge.
  void OnVerdict(const DeviceHealth& health);
  void OnEvent(HealthEvent event, XidJudge::KubeEvent k8s);
  void OnCounted(std::string_view gpu, uint32_t xid, uint64_t total);
  void OnSxid(uint32_t sxid, bool fatal, bool mapped);
  void Bad(std::string_view kind, std::string_view what);
  void Report();
  // The verdicts as published: the XID verdicts with the checks' conditions laid over them.
  std::vector<DeviceHealth> Published() const;
  // The polled checks: started once the sampler is there (the inventory's messages look again).
  void StartChecks();
  boost::asio::awaitable<void> RunChecks(Gate::Ticket alive);
  void OnSample(const gpu_inventory::HealthSample& sample);
  // NVML's ECC or clock event (gpu-inventory): that group is read and judged at once.
  void OnNvmlEvent(const gpu_inventory::NvmlHealthEvent& event);
  // Conditions that appeared or cleared: HealthEvents, then the GPUs' verdicts again.
  void ConditionsChanged(const std::vector<CheckBook::Change>& changes);
  // Publishes the GPU's combined verdict when it differs from the one published.
  // `why`: what cleared the last condition ("" when the XID judge decided).
  void Republish(const std::string& uuid, std::string_view why = {});
  void PublishChecks();
  // Start, continued once the checkpoint is back: everything that may change a verdict.
  void Serve();
  // The checkpoint, read on the pool (what the loop gets back).
  struct StartFiles {
    std::string boot_path;
    bool boot_read = false;
    std::string boot_text;
    StateFileRead state;
  };
  static StartFiles ReadStartFiles(const std::string& boot_path, const std::string& state_path);
  void LoadCheckpoint(StartFiles files);
  void ResolveBoot(const std::string& boot_id);
  void Restore(const HealthCheckpoint& saved);
  [[nodiscard]] bool CanPersist() const { return !state_path_.empty() && !persist_boot_.empty(); }
  void Persist();
  void PositionMoved();
  CheckpointWriter::Snapshot TakeSnapshot();
  void OnWritten(uint64_t covers, bool ok, const std::string& error);
  void Release(uint64_t covers);
  // The module's health for /readyz: not persisted (unhealthy), no admin socket (degraded).
  void UpdateModuleHealth();
  void FinishStop();
  // The host services (host_services.hpp): one unit watcher each, judged on every change of
  // its unit and in every pass of the polled checks (the hysteresis counts passes).
  void StartHostServices();
  void JudgeHostServices();
  int64_t NowMs() const;
  std::size_t KnownGpus() const;

  ModuleContext& context_;
  Config config_;
  RateLimitedLog warn_;
  XidJudge judge_;
  HealthChecks checks_;
  CheckBook check_book_;
  CheckSchedule schedule_;
  // The whole-GPU verdicts as last published (the combination), by UUID.
  std::map<std::string, DeviceHealth, std::less<>> published_;
  boost::asio::steady_timer check_timer_;
  bool checks_running_ = false;
  // gpu-inventory publishes its first inventory once NVML is open and its events armed (or
  // with the reason it is not): a pass before that could only fail with "not open yet".
  bool inventory_seen_ = false;
  // Groups an NVML event asked for, not read yet; when the last such pass ran.
  static constexpr std::chrono::seconds kEventPassGap{1};
  uint32_t event_groups_ = 0;
  std::optional<CheckSchedule::Time> last_event_pass_;
  GpuHealthChecks checks_state_;
  HealthReport report_;
  OperatorChannel operator_;
  std::string state_path_;
  std::string admin_path_;
  std::string admin_problem_;    // why the admin socket could not be started ("" when it runs)
  std::string persist_problem_;  // why the last checkpoint write failed ("" after a good one)
  std::unique_ptr<CheckpointWriter> writer_;
  boost::asio::steady_timer position_timer_;
  bool position_timer_armed_ = false;

  // The health stream: the reader asked, the request's generation, the last line handled.
  std::string reader_;
  uint64_t generation_ = 0;
  uint64_t requests_ = 0;
  uint64_t generation_base_ = 0;  // random per instance: generations never repeat across restarts
  journald::JournalPosition consumed_;
  std::string boot_id_;
  // The boot the persisted verdicts belong to: the host's, else the first one journald reports.
  std::string persist_boot_;
  bool boot_from_host_ = false;
  bool loading_ = false;
  std::optional<HealthCheckpoint> awaiting_boot_;  // loaded while the boot was unknown
  std::string corrupt_note_;  // the state file was moved aside: said in a Node Event at start

  // Events wait here until a checkpoint that covers them is on disk.
  struct Outgoing {
    uint64_t seq;
    HealthEvent event;
    XidJudge::KubeEvent k8s;
  };
  std::deque<Outgoing> outbox_;
  // The last events made, newest last, at most config_.event_log: the newest outbox_.size() of
  // them are still in the outbox. Persisted with the checkpoint; published as HealthEventLog.
  std::deque<HealthEvent> event_log_;
  void KeepInEventLog(const HealthEvent& event);
  void PublishEventLog();
  std::vector<std::string> inventory_pci_;  // the PCI addresses of the inventory's GPUs (GpuMissingFromNvml)
  pod_resources::GpuPodMap pods_;  // who holds which GPU (pod-resources), when that module runs
  uint64_t change_ = 0;  // bumped by every change the checkpoint must cover
  bool stopping_ = false;
  std::function<void()> stop_done_;
  // (GPU, XID) → its xid_errors_total series; looked up without building a key string (every
  // Xid line counts).
  struct XidSeriesLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      const std::string_view ga(a.first);
      const std::string_view gb(b.first);
      if (ga != gb) return ga < gb;
      return a.second < b.second;
    }
  };
  std::map<std::pair<std::string, uint32_t>, MetricsRegistry::Series*, XidSeriesLess> xid_series_;
  Gate lifetime_;
  MetricsRegistry::Series* events_total_;
  MetricsRegistry::Series* suppressed_total_;
  MetricsRegistry::Series* recoveries_total_;
  MetricsRegistry::Series* duplicates_total_;
  MetricsRegistry::Series* stale_lines_total_;
  MetricsRegistry::Series* state_writes_failed_;
  MetricsRegistry::Series* state_corrupt_;
  MetricsRegistry::Series* restored_total_;
  MetricsRegistry::Series* beyond_lookback_total_;
  MetricsRegistry::Series* check_passes_;
  MetricsRegistry::Series* check_passes_failed_;
  MetricsRegistry::Series* check_event_passes_;
  MetricsRegistry::Series* check_pass_seconds_;
  struct FollowedService {
    HostService service;
    imex_health::UnitState unit;  // as the watcher last reported it
    std::unique_ptr<imex_health::SystemdUnitWatcher> watcher;
  };
  std::vector<FollowedService> host_services_;
  Subscription inventory_sub_;
  Subscription kernel_sub_;
  Subscription unit_sub_;
  Subscription journal_state_sub_;
  Subscription nvml_sub_;
  Subscription nvml_health_sub_;
  Subscription pods_sub_;
};

}  // namespace gns::gpu_health
