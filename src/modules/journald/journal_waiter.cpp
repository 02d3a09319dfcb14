// Waiting on sd-journal's fd and timeout together (see journal_waiter.hpp).
#include "modules/journald/journal_waiter.hpp"

#include <boost/asio/error.hpp>

#include <algorithm>
#include <ctime>

namespace gns::journald {
namespace {

// A timeout further out than this is re-asked for after this long (no overflow, no harm:
// a wake only makes sd-journal look at its files).
constexpr uint64_t kMaxDelayUsec = 24ull * 3600 * 1'000'000;

}  // namespace

uint64_t MonotonicUsec() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000;
}

JournalWaiter::JournalWaiter(boost::asio::io_context& io, int fd, Callbacks callbacks,
                             std::chrono::milliseconds min_timeout_interval)
    : descriptor_(io, fd), timer_(io), callbacks_(std::move(callbacks)), min_timeout_interval_(min_timeout_interval) {}

JournalWaiter::~JournalWaiter() {
  lifetime_.Close();
  Close();
}

void JournalWaiter::Close() {
  if (closed_) return;
  closed_ = true;
  armed_ = false;
  timer_.cancel();
  if (descriptor_.is_open()) {
    boost::system::error_code ignored;  // cancel on a descriptor with nothing pending is harmless
    descriptor_.cancel(ignored);
    (void)descriptor_.release();  // the fd is sd-journal's: never close it here
  }
}

void JournalWaiter::Arm() {
  if (armed_ || closed_) return;
  armed_ = true;
  ++round_;
  // The fd wait of an earlier round may still be outstanding (the timer woke that round):
  // it serves this one too.
  if (!fd_waiting_) WaitFd();
  ArmTimer();
}

void JournalWaiter::WaitFd() {
  fd_waiting_ = true;
  descriptor_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                         lifetime_.Guard([this](const boost::system::error_code& ec) {
                           fd_waiting_ = false;
                           if (closed_ || ec == boost::asio::error::operation_aborted) return;
                           if (ec) {
                             Close();
                             callbacks_.failed("waiting on the journal fd: " + ec.message());
                             return;
                           }
                           // Readable while a round woken by the timer is still being
                           // processed: the next Arm() waits again, and the fd, if still
                           // readable then, completes that wait at once.
                           if (!armed_) return;
                           Fire(Cause::kFd);
                         }));
}

void JournalWaiter::ArmTimer() {
  const uint64_t timeout = callbacks_.timeout();
  if (timeout == kNoTimeout) {
    timer_delay_.reset();
    timer_.cancel();
    return;
  }
  const uint64_t now = MonotonicUsec();
  uint64_t at = timeout;
  if (last_timeout_wake_usec_) {
    const auto floor = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(min_timeout_interval_).count());
    at = std::max(at, *last_timeout_wake_usec_ + floor);
  }
  const uint64_t delay = std::min(at > now ? at - now : 0, kMaxDelayUsec);
  timer_delay_ = std::chrono::microseconds(delay);
  // A delay of 0 expires at once, but through the loop's queue like any other handler.
  timer_.expires_after(*timer_delay_);
  timer_.async_wait(lifetime_.Guard([this, round = round_](const boost::system::error_code& ec) {
    if (ec || closed_ || !armed_ || round != round_) return;  // cancelled or stale
    Fire(Cause::kTimeout);
  }));
}

void JournalWaiter::Fire(Cause cause) {
  armed_ = false;
  timer_.cancel();  // the fd won: the timer of this round is void (a no-op when it fired)
  if (cause == Cause::kTimeout) last_timeout_wake_usec_ = MonotonicUsec();
  callbacks_.wake(cause);  // last: it may Arm() again or Close()
}

}  // namespace gns::journald
