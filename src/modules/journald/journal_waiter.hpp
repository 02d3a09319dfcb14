#pragma once
// Waiting for sd-journal to want processing, on the loop: its fd (sd_journal_get_fd) becoming
// readable, or the timeout it asks for (sd_journal_get_timeout) passing, whichever comes
// first. sd-journal asks for a timeout when its files live where inotify does not work
// (network and some FUSE file systems; sd_journal_get_fd(3)): only the timeout then says
// that the files may have grown.
//
// Each Arm() ends in at most one call of `wake`, by the fd or by the timer; the other is
// cancelled (the timer) or kept for the next Arm() (the fd wait). The timeout is asked for at
// every Arm(); (uint64_t)-1 arms no timer, so nothing runs without fd activity. A timeout
// already due still goes through the loop's queue (a timer expiring now), never a
// synchronous call, and timeout wakes are at least `min_timeout_interval` apart, so a
// timeout that keeps being "now" cannot become a hot loop.
//
// Loop thread only, no thread of its own. The fd belongs to the caller (sd-journal): it is
// released, never closed.

#include "loop/gate.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace gns::journald {

// CLOCK_MONOTONIC in µs: the clock of sd_journal_get_timeout.
uint64_t MonotonicUsec();

class JournalWaiter {
 public:
  enum class Cause { kFd, kTimeout };
  static constexpr uint64_t kNoTimeout = UINT64_MAX;
  // libsystemd asks to be polled every 2 s (250 ms in older versions); this floor only bites
  // on a timeout asked for less than this after the previous timeout wake, such as one that
  // keeps being "now".
  static constexpr std::chrono::milliseconds kMinTimeoutInterval{100};

  struct Callbacks {
    // The absolute CLOCK_MONOTONIC time (µs) by which to wake at the latest, or kNoTimeout.
    std::function<uint64_t()> timeout;
    // Runs on the loop, once per Arm(); may call Arm() again (or Close()).
    std::function<void(Cause)> wake;
    // Waiting on the fd failed; nothing more is delivered.
    std::function<void(const std::string&)> failed;
  };

  JournalWaiter(boost::asio::io_context& io, int fd, Callbacks callbacks,
                std::chrono::milliseconds min_timeout_interval = kMinTimeoutInterval);
  ~JournalWaiter();
  JournalWaiter(const JournalWaiter&) = delete;
  JournalWaiter& operator=(const JournalWaiter&) = delete;

  // Waits for the next wake (a no-op while already armed or after Close()).
  void Arm();
  // Cancels both waits and releases the fd; `wake` is not called after this.
  void Close();

  bool Armed() const { return armed_; }
  // The delay of the timer armed by the last Arm(); nullopt when sd-journal gave no timeout.
  std::optional<std::chrono::microseconds> TimerDelay() const { return timer_delay_; }

  static std::string_view CauseName(Cause cause) { return cause == Cause::kFd ? "fd" : "timeout"; }

 private:
  void WaitFd();
  void ArmTimer();
  void Fire(Cause cause);

  boost::asio::posix::stream_descriptor descriptor_;
  boost::asio::steady_timer timer_;
  Callbacks callbacks_;
  std::chrono::milliseconds min_timeout_interval_;
  bool armed_ = false;
  bool fd_waiting_ = false;  // an async_wait on the fd is outstanding
  bool closed_ = false;
  uint64_t round_ = 0;       // Arm() count: a timer of an older round is stale
  std::optional<std::chrono::microseconds> timer_delay_;
  std::optional<uint64_t> last_timeout_wake_usec_;
  Gate lifetime_;
};

}  // namespace gns::journald
