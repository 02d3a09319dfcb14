#pragma once
// One reader of the journal: an sd_journal handle with its matches, positioned once (after a
// saved position, or at the head of the current boot) and then read on the loop whenever its
// fd or the timeout sd-journal asks for says there is more (journal_waiter.hpp). Each entry
// goes to the owner's `entry` hook with the fields the journald module publishes.
//
// The journald module runs two of them: the health stream (kernel lines and reset
// acknowledgements), positioned by its consumer's request, and the units stream, positioned by
// journald's own cursor file. One handle each, so that moving one never replays the other.
//
// Loop thread only. Reading goes in batches and yields to the loop between them.

#include "loop/clock.hpp"
#include "loop/gate.hpp"
#include "modules/journald/journal_waiter.hpp"
#include "modules/journald/messages.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct sd_journal;

namespace gns::journald {

// The fields of one entry that the module publishes.
struct JournalEntry {
  std::string message;  // MESSAGE, cut at maxMessageBytes
  bool truncated = false;
  std::string boot_id;
  uint64_t realtime_usec = 0;
  uint64_t monotonic_usec = 0;
  int priority = -1;
  std::string cursor;
  std::string transport;   // _TRANSPORT
  std::string unit;        // _SYSTEMD_UNIT
  std::string identifier;  // SYSLOG_IDENTIFIER
};

class JournalStream {
 public:
  struct Options {
    std::string name;       // "health" or "units": for logs and state
    std::string directory;  // empty: the system journal
    // Each group ORs its matches; groups are joined by disjunctions (sd_journal_add_match(3)).
    std::vector<std::vector<std::string>> match_groups;
    std::size_t max_message_bytes = 16384;
    std::size_t batch = 512;
    std::chrono::milliseconds boot_lookback{std::chrono::hours(24)};
  };
  struct Hooks {
    std::function<void(JournalEntry&&)> entry;
    // Bad input (damaged entries, failed calls): counted and logged by the owner.
    std::function<void(std::string_view kind, std::string_view what)> bad;
    // The fd wait failed for good: the owner reports the module failed.
    std::function<void(const std::string& why)> failed;
    // Something in State() changed that the owner may want to publish.
    std::function<void()> changed;
    std::function<void(JournalWaiter::Cause)> woke;
    // An entry older than bootLookback skipped while catching up.
    std::function<void()> skipped_old;
  };

  JournalStream(boost::asio::io_context& io, const Clock& clock, Options options, Hooks hooks);
  ~JournalStream();
  JournalStream(const JournalStream&) = delete;
  JournalStream& operator=(const JournalStream&) = delete;

  // Opens the journal and adds the matches. Throws with the reason.
  void Open();
  // The boot whose entries are read: the kernel's when the journal has entries of it, else the
  // boot of the newest entry (a journal copied from another machine, the simulator's). Moves
  // the read position: call it before Position(), never between Position() and reading.
  std::string CurrentBoot();
  // The boot Position() found current.
  const std::string& PositionedBoot() const { return current_boot_; }
  // Where reading starts; returns the start mode ("cursor", "gap", "new-boot", "boot-head").
  //  - `after` of the current boot still in the journal: right after it;
  //  - of the current boot but rotated or vacuumed away: after its monotonic time (a gap);
  //  - of another boot, or none: the current boot from its head, entries older than
  //    bootLookback skipped.
  std::string Position(const std::optional<JournalPosition>& after, std::string_view why);
  // Starts (or goes on) reading; Pause() stops until the next Resume().
  void Resume();
  void Pause();
  // Stops waiting on the fd; the handle stays open until destruction.
  void Close();

  const StreamState& State() const { return state_; }
  // The last entry read (empty before the first).
  const JournalPosition& Last() const { return last_; }

 private:
  struct JournalCloser {
    void operator()(sd_journal* j) const;
  };

  void SeekBoot(const std::string& boot_id, uint64_t after_monotonic_usec);
  void ReadSome();
  void Arm();
  uint64_t Timeout();
  void OnWake(JournalWaiter::Cause cause);
  void HandleEntry();
  std::optional<std::string> Field(std::string_view name, std::size_t max, bool* truncated);

  boost::asio::io_context& io_;
  const Clock& clock_;
  Options options_;
  Hooks hooks_;
  std::unique_ptr<sd_journal, JournalCloser> journal_;
  std::unique_ptr<JournalWaiter> waiter_;  // after journal_: releases its fd before the close
  StreamState state_;
  JournalPosition last_;
  std::string current_boot_;
  uint64_t skip_before_realtime_ = 0;  // catch-up filter (bootLookback); 0: none
  bool running_ = false;
  bool read_posted_ = false;
  bool woken_ = false;
  bool closed_ = false;
  Gate lifetime_;
};

}  // namespace gns::journald
