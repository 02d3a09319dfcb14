#pragma once
// The `journald` module: tails the journal (the system journal, or a directory such as the
// host's /var/log/journal mounted into the container) and publishes what it reads on the bus,
// as two streams with a journal handle each (journal_stream.hpp):
//
//  - The health stream: kernel lines (KernelLine) and the acknowledgement SYSLOG_IDENTIFIER's
//    lines (UnitLine, acknowledgement = true). No line of it may be lost or acted on twice, so
//    its position is its consumer's: gpu-health persists the position of the last line it
//    handled together with the verdicts, and asks for the stream with a HealthStreamRequest
//    naming that position and this journald instance (JournalState::reader). The stream is
//    read only while such a request is in force (not before the consumer runs, not while it
//    restarts), from the position it names. A journald restarted alone gets a fresh request
//    with the consumer's position at that moment; a consumer restarted alone asks again from
//    what it persisted when it stopped; after kill -9 both come back from the consumer's file.
//  - The units stream: the lines of the units named in the config (UnitLine), for watchers
//    that can afford to lose or repeat a line at a crash. Its position is journald's own:
//    the cursor of the last entry read is written atomically (debounced) to
//    <stateDir>/journald/cursor.json together with its boot ID and monotonic time.
//
// Positioning (both streams): same boot and the entry still in the journal: right after it;
// same boot but rotated or vacuumed: a gap, counted, resumed after its monotonic time; another
// boot or none: the current boot from its head, entries older than `bootLookback` skipped.
//
// Each journal's inotify fd (sd_journal_get_fd) is waited on with an Asio stream_descriptor,
// raced with a timer for the timeout sd-journal asks for (journal_waiter.hpp): where inotify
// does not work that timeout is what makes it look for new entries. No polling thread, and no
// timer when sd-journal gives no timeout. Wakes are counted by cause.

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/journald/journal_stream.hpp"
#include "modules/journald/messages.hpp"
#include "loop/rate_limited_log.hpp"
#include "loop/state_file.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gns::journald {

// What cursor.json holds (the units stream's position).
using SavedPosition = JournalPosition;

// Parses cursor.json; nullopt (with `error`) for anything malformed.
std::optional<SavedPosition> ParseSavedPosition(std::string_view text, std::string& error);
std::string SerializeSavedPosition(const SavedPosition& position);

class JournaldModule final : public Module {
 public:
  static constexpr std::string_view kName = "journald";
  static constexpr std::string_view kSummary =
      "tails the journal: kernel lines and reset acks (at its consumer's position), configured units";

  struct Config {
    std::string directory;  // empty: the system journal
    bool kernel = true;
    std::vector<std::string> units;
    std::string ack_identifier{kDefaultAckIdentifier};
    std::chrono::milliseconds cursor_flush_interval{5000};
    std::chrono::milliseconds boot_lookback{std::chrono::hours(24)};
    std::size_t max_message_bytes = 16384;
    std::size_t batch = 512;  // entries read per loop turn before yielding
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  JournaldModule(ModuleContext& context, const Config& config);
  ~JournaldModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  // The cursor file (empty when the site has no state dir).
  const std::string& CursorPath() const { return cursor_path_; }
  // cursor.json is being read on the pool: the units stream has not started reading.
  bool Loading() const { return loading_; }

 private:
  JournalStream::Hooks HooksFor(bool health);
  void OnHealthRequest(const HealthStreamRequest& request);
  void OnHealthEntry(JournalEntry&& entry);
  void OnUnitEntry(JournalEntry&& entry);
  void SeenBoot(const std::string& boot_id);
  // cursor.json as read (on the pool): the saved position, or none (a bad file moved aside).
  std::optional<SavedPosition> CursorFrom(StateFileRead read);
  void PositionUnits(const std::optional<SavedPosition>& saved);
  void UpdateHealth();
  void Bad(std::string_view kind, std::string_view what);
  // cursor.json cannot be written (read-only or full state dir): degraded, the streams go on.
  void CursorNotPersisted(const std::string& why);
  void MarkDirty();
  void Flush();
  void FinishStop();
  void PublishState();

  ModuleContext& context_;
  Config config_;
  std::string cursor_path_;
  std::string cursor_problem_;  // why cursor.json is not being written ("" while it is)
  std::unique_ptr<JournalStream> health_;  // kernel + acks: positioned by its consumer
  std::unique_ptr<JournalStream> units_;   // configured units: positioned by cursor.json
  boost::asio::steady_timer flush_timer_;
  RateLimitedLog warn_;
  std::set<std::string, std::less<>> unit_names_;
  JournalState state_;
  uint64_t generation_ = 0;  // of the health request in force; 0: none
  bool dirty_ = false;
  bool flush_armed_ = false;
  bool writing_ = false;
  bool stopping_ = false;
  bool loading_ = false;
  std::function<void()> stop_done_;
  Gate lifetime_;
  MetricsRegistry::Series* kernel_lines_;
  MetricsRegistry::Series* unit_lines_;
  MetricsRegistry::Series* ack_lines_;
  MetricsRegistry::Series* skipped_old_;
  MetricsRegistry::Series* gaps_;
  MetricsRegistry::Series* truncated_;
  MetricsRegistry::Series* boot_changes_;
  MetricsRegistry::Series* cursor_writes_failed_;
  MetricsRegistry::Series* fd_wakeups_;
  MetricsRegistry::Series* timeout_wakeups_;
  MetricsRegistry::Series* health_requests_;
  Subscription request_sub_;
};

}  // namespace gns::journald
