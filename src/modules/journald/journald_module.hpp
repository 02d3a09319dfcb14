#pragma once
// The `journald` module: tails the journal (the system journal, or a directory such as the
// host's /var/log/journal mounted into the container) for kernel messages, the units named
// in its config and an acknowledgement SYSLOG_IDENTIFIER, and publishes them as KernelLine /
// UnitLine. The journal's inotify fd (sd_journal_get_fd) is waited on with an Asio
// stream_descriptor, raced with a timer for the timeout sd-journal asks for
// (sd_journal_get_timeout; journal_waiter.hpp): where inotify does not work (network and
// some FUSE file systems) that timeout is what makes it look for new entries. Either wake
// runs sd_journal_process and reads; no polling thread, and no timer when sd-journal gives
// no timeout. Wakes are counted by cause (gpu_node_supervisor_journald_wakeups_total).
//
// The position survives restarts: the cursor of the last entry read is written atomically
// (debounced) to <stateDir>/journald/cursor.json together with its boot ID and monotonic
// time. On start:
//  - same boot, cursor still in the journal: resume right after it;
//  - same boot, cursor gone (rotated, vacuumed): count a gap and resume after the saved
//    monotonic time of that boot (the head of the boot if that is gone too);
//  - another boot, or no (or a corrupt) cursor file: read the current boot from its head,
//    skipping entries older than `bootLookback`.

#include "loop/module.hpp"
#include "modules/journald/journal_waiter.hpp"
#include "modules/journald/messages.hpp"
#include "modules/journald/rate_limited_log.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

struct sd_journal;

namespace gns::journald {

// What cursor.json holds.
struct SavedPosition {
  std::string boot_id;
  std::string cursor;
  uint64_t monotonic_usec = 0;
  uint64_t realtime_usec = 0;
};

// Parses cursor.json; nullopt (with `error`) for anything malformed.
std::optional<SavedPosition> ParseSavedPosition(std::string_view text, std::string& error);
std::string SerializeSavedPosition(const SavedPosition& position);

class JournaldModule final : public Module {
 public:
  static constexpr std::string_view kName = "journald";
  static constexpr std::string_view kSummary = "tails the journal: kernel lines, configured units, reset acks";

  struct Config {
    std::string directory;  // empty: the system journal
    bool kernel = true;
    std::vector<std::string> units;
    std::string ack_identifier = "gpu-reset";
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

 private:
  struct JournalCloser {
    void operator()(sd_journal* j) const;
  };

  void Open();
  std::string CurrentBoot();
  void Position();
  void SeekBoot(const std::string& boot_id, uint64_t after_monotonic_usec);
  void ReadSome();
  void Arm();
  uint64_t JournalTimeout();
  void OnWake(JournalWaiter::Cause cause);
  void HandleEntry();
  std::optional<std::string> Field(std::string_view name, std::size_t max, bool* truncated);
  void Bad(std::string_view kind, std::string_view what);
  void MarkDirty();
  void Flush();
  void FinishStop();
  void PublishState();

  ModuleContext& context_;
  Config config_;
  std::string cursor_path_;
  std::unique_ptr<sd_journal, JournalCloser> journal_;
  std::unique_ptr<JournalWaiter> waiter_;  // after journal_: releases its fd before the close
  boost::asio::steady_timer flush_timer_;
  RateLimitedLog warn_;
  std::set<std::string, std::less<>> units_;
  JournalState state_;
  SavedPosition last_;
  uint64_t skip_before_realtime_ = 0;  // catch-up filter (bootLookback); 0: none
  bool dirty_ = false;
  bool flush_armed_ = false;
  bool writing_ = false;
  bool read_posted_ = false;
  bool woken_ = false;  // a wake since the state was last published
  bool stopping_ = false;
  std::function<void()> stop_done_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
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
};

}  // namespace gns::journald
