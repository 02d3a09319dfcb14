#pragma once
// The `nvsentinel-export` module: every health verdict change of this node as one NVSentinel
// HealthEvent, sent to NVSentinel's platform connector (PlatformConnector.HealthEventOccurredV1
// on its unix socket). Off by default.
//
// Nothing lost, nothing doubled (README.md says how each source is covered):
//  - non-retained events (gpu-health's XID events and recoveries) are written to the on-disk
//    queue (event_store.hpp) before they count as taken; their ids are kept in the book, and
//    gpu-health's event log (its checkpoint's last events) gives at start those a kill -9 kept
//    from the queue;
//  - retained facts (check conditions, IMEX health, reset outcomes, GPU verdicts at start) are
//    diffed against the persisted book of what was last exported (event_mapping.hpp), so what
//    changed while we were down, or between a change and its enqueue, is found at the next start;
//  - events are sent in order, a batch per call, one call at a time, each with a deadline, and
//    removed from disk only after the call returned OK: a kill -9 between the two resends them
//    with the same id (stable per event), on which the receiver dedupes;
//  - the queue is bounded: the oldest event is dropped when full, and counted.

#include "loop/backoff.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_reset/messages.hpp"
#include "modules/imex_health/messages.hpp"
#include "modules/nvsentinel_export/messages.hpp"

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gns::nvsentinel_export {

struct StoredEvent;
struct ExportBook;
class ConnectorClient;
class EventStore;

class NvsentinelExportModule final : public Module {
 public:
  static constexpr std::string_view kName = "nvsentinel-export";
  static constexpr std::string_view kSummary =
      "health events to NVSentinel's platform connector (HealthEventOccurredV1), queued on disk, delivered once";

  struct Config {
    std::string socket = "unix:///var/run/nvsentinel.sock";
    std::string processing_strategy = "EXECUTE_REMEDIATION";  // or STORE_ONLY
    int64_t max_queued = 10000;     // events on disk; the oldest is dropped beyond
    int64_t max_batch = 100;        // events per call
    BackoffPolicy retry{std::chrono::milliseconds(500), std::chrono::milliseconds(30000), 2.0, 0.2};
    std::chrono::milliseconds call_deadline{5000};
    // Which facts are exported: xid (gpu-health's events: XIDs and recoveries), checks (the
    // polled checks' conditions), imex, resets, verdicts (GPU verdicts that changed while we
    // were not running).
    std::set<std::string> sources{"xid", "checks", "imex", "resets", "verdicts"};
    // An event of gpu-health's log we never took is sent at start only when it is younger than
    // this: a crash-looping process comes back within minutes; an event older than that was
    // made while this module was off, and acting on it now would act on history.
    std::chrono::milliseconds replay_window{std::chrono::minutes(15)};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  NvsentinelExportModule(ModuleContext& context, const Config& config);
  ~NvsentinelExportModule() override;
  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  void Loaded(std::vector<StoredEvent> events, std::optional<ExportBook> book, std::vector<std::string> problems);
  void Reconcile();
  void DiffStartVerdicts();
  void ReplayEventLog();
  bool Taken(const std::string& id) const { return taken_.count(id) != 0; }
  void NoteTaken(const std::string& id);
  template <typename Event>
  void Enqueue(std::vector<Event> events);
  void ScheduleFlush();
  void Flush();
  void Deliver();
  void Delivered(std::vector<uint64_t> seqs, bool ok, const std::string& error);
  void UpdateState();
  int64_t NowMs() const;
  bool Exports(const char* source) const { return config_.sources.count(source) != 0; }

  ModuleContext& context_;
  Config config_;
  std::string dir_;
  std::unique_ptr<EventStore> store_;
  std::unique_ptr<ExportBook> book_;
  std::unique_ptr<ConnectorClient> client_;
  bool loaded_ = false;
  bool stopping_ = false;
  std::function<void()> stop_done_;
  uint64_t next_seq_ = 1;
  std::deque<StoredEvent> queue_;     // on disk, in order, not yet delivered
  std::vector<StoredEvent> pending_;  // taken, being written or to be written
  std::vector<uint64_t> to_remove_;   // delivered or dropped, files still to remove
  std::set<std::string> queued_ids_;  // ids in queue_ and pending_ (a re-diff adds none twice)
  bool book_dirty_ = false;
  bool write_in_flight_ = false;
  bool flush_posted_ = false;
  bool call_in_flight_ = false;
  bool waiting_retry_ = false;
  // Latest retained facts (diffed once loaded).
  std::vector<gpu_health::DeviceHealth> verdicts_;  // gpu-health's latest state
  std::optional<std::vector<gpu_health::DeviceHealth>> start_verdicts_;  // gpu-health's first state
  bool verdicts_diffed_ = false;
  std::map<std::string, std::string> pci_of_;  // GPU UUID → PCI, from gpu-health's state
  std::optional<gpu_health::GpuHealthChecks> checks_;
  std::optional<imex_health::ImexHealth> imex_;
  std::optional<gpu_reset::GpuResetState> resets_;
  // gpu-health's event log, latest; what it holds that we never took is queued once loaded.
  std::optional<gpu_health::HealthEventLog> event_log_;
  std::set<std::string> taken_;             // the book's taken event ids, for lookup
  std::vector<std::string> taken_early_;    // taken before the book was read
  // Whether the log's untaken events are news: not for the first log after a book that never
  // recorded taken ids (a fresh node, or an upgrade from a build without them).
  bool replay_allowed_ = false;
  NvsentinelExportState state_;
  Backoff backoff_;
  boost::asio::steady_timer retry_timer_;        // the next delivery attempt
  boost::asio::steady_timer write_retry_timer_;  // the next write after a failed one
  Gate lifetime_;
  MetricsRegistry::Series* queued_;
  MetricsRegistry::Series* delivered_total_;
  MetricsRegistry::Series* failed_calls_total_;
  MetricsRegistry::Series* queued_total_;
  MetricsRegistry::Series* dropped_total_;
  MetricsRegistry::Series* damaged_total_;
  MetricsRegistry::Series* last_success_;
  MetricsRegistry::Series* replayed_total_;
  Subscription events_sub_;
  Subscription state_sub_;
  Subscription checks_sub_;
  Subscription imex_sub_;
  Subscription resets_sub_;
  Subscription log_sub_;
};

}  // namespace gns::nvsentinel_export
