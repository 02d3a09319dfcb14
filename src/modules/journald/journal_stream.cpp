// One journal reader on the loop (see journal_stream.hpp).
#include "modules/journald/journal_stream.hpp"

#include <systemd/sd-id128.h>
#include <systemd/sd-journal.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace gns::journald {
namespace {

std::string BootString(const sd_id128_t& id) {
  char text[SD_ID128_STRING_MAX];
  return sd_id128_to_string(id, text);
}

std::string Errno(int negative_errno) { return std::strerror(-negative_errno); }

}  // namespace

void JournalStream::JournalCloser::operator()(sd_journal* j) const { sd_journal_close(j); }

JournalStream::JournalStream(boost::asio::io_context& io, const Clock& clock, Options options, Hooks hooks)
    : io_(io), clock_(clock), options_(std::move(options)), hooks_(std::move(hooks)) {}

JournalStream::~JournalStream() {
  lifetime_.Close();
  // The fd belongs to sd_journal: the waiter hands it back (releases, never closes it).
  waiter_.reset();
}

void JournalStream::Open() {
  sd_journal* j = nullptr;
  const int r = options_.directory.empty() ? sd_journal_open(&j, SD_JOURNAL_LOCAL_ONLY)
                                           : sd_journal_open_directory(&j, options_.directory.c_str(), 0);
  if (r < 0) {
    throw std::runtime_error("opening the journal (" + (options_.directory.empty() ? "system" : options_.directory) +
                             ") for the " + options_.name + " stream: " + Errno(r));
  }
  journal_.reset(j);
  // Decompression of a field stops at this size: an enormous field cannot make us allocate.
  sd_journal_set_data_threshold(j, options_.max_message_bytes + 16);
  bool first_group = true;
  for (const auto& group : options_.match_groups) {
    if (group.empty()) continue;
    if (!first_group) {
      if (const int rr = sd_journal_add_disjunction(j); rr < 0) {
        throw std::runtime_error("sd_journal_add_disjunction: " + Errno(rr));
      }
    }
    first_group = false;
    for (const auto& m : group) {
      if (const int rr = sd_journal_add_match(j, m.data(), m.size()); rr < 0) {
        throw std::runtime_error("sd_journal_add_match(" + m + "): " + Errno(rr));
      }
    }
  }
  const int fd = sd_journal_get_fd(j);
  if (fd < 0) throw std::runtime_error("sd_journal_get_fd: " + Errno(fd));
  waiter_ = std::make_unique<JournalWaiter>(
      io_, fd,
      JournalWaiter::Callbacks{[this] { return Timeout(); }, [this](JournalWaiter::Cause cause) { OnWake(cause); },
                               [this](const std::string& why) {
                                 if (!closed_ && hooks_.failed) hooks_.failed(why);
                               }});
}

std::string JournalStream::CurrentBoot() {
  sd_journal* j = journal_.get();
  sd_id128_t kernel_boot{};
  const bool have_kernel_boot = sd_id128_get_boot(&kernel_boot) >= 0;
  if (have_kernel_boot && sd_journal_seek_monotonic_usec(j, kernel_boot, 0) >= 0 && sd_journal_next(j) > 0) {
    uint64_t mono = 0;
    sd_id128_t boot{};
    if (sd_journal_get_monotonic_usec(j, &mono, &boot) >= 0 && sd_id128_equal(boot, kernel_boot)) {
      return BootString(kernel_boot);
    }
  }
  if (sd_journal_seek_tail(j) >= 0 && sd_journal_previous(j) > 0) {
    uint64_t mono = 0;
    sd_id128_t boot{};
    if (sd_journal_get_monotonic_usec(j, &mono, &boot) >= 0) return BootString(boot);
  }
  return have_kernel_boot ? BootString(kernel_boot) : std::string(32, '0');
}

void JournalStream::SeekBoot(const std::string& boot_id, uint64_t after_monotonic_usec) {
  sd_id128_t boot{};
  if (sd_id128_from_string(boot_id.c_str(), &boot) < 0 ||
      sd_journal_seek_monotonic_usec(journal_.get(), boot, after_monotonic_usec) < 0) {
    sd_journal_seek_head(journal_.get());
  }
}

std::string JournalStream::Position(const std::optional<JournalPosition>& after, std::string_view why) {
  sd_journal* j = journal_.get();
  current_boot_ = CurrentBoot();
  skip_before_realtime_ = 0;
  state_.live = false;
  if (after && !after->cursor.empty() && after->boot_id == current_boot_) {
    last_ = *after;
    if (sd_journal_seek_cursor(j, after->cursor.c_str()) >= 0 && sd_journal_next(j) > 0 &&
        sd_journal_test_cursor(j, after->cursor.c_str()) > 0) {
      // Standing on the last entry read: the next sd_journal_next() is the first new one.
      state_.start_mode = "cursor";
      return state_.start_mode;
    }
    // Rotated or vacuumed away. Within one boot the monotonic clock orders entries, so
    // everything at or before the saved time was read: resume after it.
    ++state_.gaps;
    state_.start_mode = "gap";
    if (hooks_.bad) {
      hooks_.bad("cursor_gap", options_.name + " stream (" + std::string(why) +
                                   "): the position is no longer in the journal (rotated or vacuumed): entries "
                                   "between it and the oldest one kept may be lost; resuming boot " +
                                   current_boot_ + " after monotonic " + std::to_string(after->monotonic_usec) +
                                   " us");
    }
    SeekBoot(current_boot_, after->monotonic_usec + 1);
    return state_.start_mode;
  }
  state_.start_mode = after && !after->cursor.empty() ? "new-boot" : "boot-head";
  const uint64_t now_usec = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(clock_.WallNow().time_since_epoch()).count());
  const uint64_t lookback =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(options_.boot_lookback).count());
  skip_before_realtime_ = now_usec > lookback ? now_usec - lookback : 0;
  SeekBoot(current_boot_, 0);
  return state_.start_mode;
}

void JournalStream::Resume() {
  if (!journal_ || closed_) return;
  running_ = true;
  state_.open = true;
  // Files added while nobody waited on the fd (before the first request, paused) are found at
  // the first wake: the fd is readable with the events queued meanwhile. (Not processed here:
  // sd_journal_process can reset the read position set by Position().)
  if (!read_posted_) {
    read_posted_ = true;
    boost::asio::post(io_, lifetime_.Guard([this] { ReadSome(); }));
  }
}

void JournalStream::Pause() {
  running_ = false;
  state_.open = false;
  state_.live = false;
}

void JournalStream::Close() {
  closed_ = true;
  running_ = false;
  if (waiter_) waiter_->Close();
}

void JournalStream::ReadSome() {
  read_posted_ = false;
  if (!running_ || !journal_) return;
  sd_journal* j = journal_.get();
  for (std::size_t n = 0; n < options_.batch; ++n) {
    const int r = sd_journal_next(j);
    if (r < 0) {
      // A corrupt region sd-journal could not step over: wait for the journal to change
      // rather than spin on the same error.
      if (hooks_.bad) hooks_.bad("journal_next_failed", Errno(r));
      Arm();
      return;
    }
    if (r == 0) {
      skip_before_realtime_ = 0;  // caught up: the lookback only filters the catch-up
      Arm();
      const bool timeout_wait = waiter_ && waiter_->TimerDelay().has_value();
      // Reported at the end of each woken round too, so that /debug/state shows the wake
      // counts (and entries, cursor) as of the last round, not as of the last transition.
      if (!state_.live || state_.timeout_wait != timeout_wait || woken_) {
        state_.live = true;
        state_.timeout_wait = timeout_wait;
        woken_ = false;
        if (hooks_.changed) hooks_.changed();
      }
      return;
    }
    HandleEntry();
    if (!running_) return;  // the entry's consumer paused or moved us
  }
  if (state_.live) {
    state_.live = false;
    if (hooks_.changed) hooks_.changed();
  }
  // More to read: let other work run first.
  read_posted_ = true;
  boost::asio::post(io_, lifetime_.Guard([this] { ReadSome(); }));
}

void JournalStream::Arm() {
  if (closed_ || !waiter_) return;
  waiter_->Arm();
}

uint64_t JournalStream::Timeout() {
  uint64_t timeout = JournalWaiter::kNoTimeout;
  if (const int r = sd_journal_get_timeout(journal_.get(), &timeout); r < 0) {
    if (hooks_.bad) hooks_.bad("journal_get_timeout_failed", Errno(r));
    return JournalWaiter::kNoTimeout;  // the fd alone
  }
  return timeout;
}

void JournalStream::OnWake(JournalWaiter::Cause cause) {
  (cause == JournalWaiter::Cause::kFd ? state_.fd_wakeups : state_.timeout_wakeups)++;
  woken_ = true;
  if (hooks_.woke) hooks_.woke(cause);
  if (closed_ || !journal_) return;
  // Consumes the inotify events; files added or removed are picked up here. After a timeout
  // it is what makes sd-journal look at files inotify cannot watch.
  if (const int r = sd_journal_process(journal_.get()); r < 0 && hooks_.bad) {
    hooks_.bad("journal_process_failed", Errno(r));
  }
  if (!running_) {
    Arm();  // paused: keep consuming inotify events so the fd does not stay readable
    return;
  }
  if (!read_posted_) ReadSome();
}

std::optional<std::string> JournalStream::Field(std::string_view name, std::size_t max, bool* truncated) {
  const void* data = nullptr;
  size_t length = 0;
  const std::string key(name);
  const int r = sd_journal_get_data(journal_.get(), key.c_str(), &data, &length);
  if (r < 0) return std::nullopt;
  const auto* bytes = static_cast<const char*>(data);
  // "NAME=value"; anything else is a damaged entry.
  if (length < key.size() + 1 || std::memcmp(bytes, key.data(), key.size()) != 0 || bytes[key.size()] != '=') {
    if (hooks_.bad) hooks_.bad("malformed_field", key + " does not start with its name");
    return std::nullopt;
  }
  std::size_t value_length = length - key.size() - 1;
  if (value_length > max) {
    value_length = max;
    if (truncated) *truncated = true;
  }
  return std::string(bytes + key.size() + 1, value_length);
}

void JournalStream::HandleEntry() {
  sd_journal* j = journal_.get();
  uint64_t realtime = 0;
  uint64_t monotonic = 0;
  sd_id128_t boot{};
  if (sd_journal_get_realtime_usec(j, &realtime) < 0 || sd_journal_get_monotonic_usec(j, &monotonic, &boot) < 0) {
    if (hooks_.bad) hooks_.bad("entry_without_timestamps", "an entry without realtime/monotonic timestamps was skipped");
    return;
  }
  char* cursor_raw = nullptr;
  if (const int r = sd_journal_get_cursor(j, &cursor_raw); r < 0 || cursor_raw == nullptr) {
    if (hooks_.bad) hooks_.bad("entry_without_cursor", Errno(r < 0 ? r : -EINVAL));
    return;
  }
  JournalEntry entry;
  entry.cursor = cursor_raw;
  std::free(cursor_raw);
  entry.boot_id = BootString(boot);
  entry.realtime_usec = realtime;
  entry.monotonic_usec = monotonic;
  last_ = JournalPosition{entry.boot_id, entry.cursor, monotonic, realtime};
  ++state_.entries;
  state_.cursor = entry.cursor;
  if (skip_before_realtime_ != 0 && realtime < skip_before_realtime_) {
    if (hooks_.skipped_old) hooks_.skipped_old();
    return;
  }
  auto message = Field("MESSAGE", options_.max_message_bytes, &entry.truncated);
  if (!message) {
    if (hooks_.bad) hooks_.bad("entry_without_message", "an entry without MESSAGE was skipped");
    return;
  }
  entry.message = std::move(*message);
  if (const auto p = Field("PRIORITY", 8, nullptr); p && p->size() == 1 && (*p)[0] >= '0' && (*p)[0] <= '7') {
    entry.priority = (*p)[0] - '0';
  }
  entry.transport = Field("_TRANSPORT", 64, nullptr).value_or("");
  if (entry.transport != "kernel") {
    entry.unit = Field("_SYSTEMD_UNIT", 256, nullptr).value_or("");
    entry.identifier = Field("SYSLOG_IDENTIFIER", 256, nullptr).value_or("");
  }
  hooks_.entry(std::move(entry));
}

}  // namespace gns::journald
