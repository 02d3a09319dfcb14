#pragma once
// How long each nvmlEventSetWait_v2 of the XID waiter blocks. NVML cannot interrupt a wait, and
// a GPU can only be let go of (its handles closed by nvmlShutdown) once the wait on the event
// set that holds it has returned, so the timeout is how long a per-GPU release may have to wait.
// At rest the waits are long (an event wakes one at once, so the length costs nothing but
// release latency, and a long wait means few wake-ups). They are short while a release is ahead
// or in force (a GPU reset was accepted; the loop says so), and for a while after each XID:
// a reset usually follows an XID, and without this the wait begun right after the XID would
// hold the release for up to a whole long wait.
//
// Shared by the module (loop thread) and every waiter thread it starts; lock-free.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gns::gpu_inventory {

class WaitPace {
 public:
  using Clock = std::chrono::steady_clock;

  // short_after_xid 0: an XID does not shorten the waits.
  WaitPace(std::chrono::milliseconds long_wait, std::chrono::milliseconds short_wait,
           std::chrono::milliseconds short_after_xid)
      : long_ms_(ToMs(long_wait)), short_ms_(ToMs(short_wait)), short_after_xid_(short_after_xid) {}

  // Any thread: short waits from the next wait on, until SetShort(false).
  void SetShort(bool on) { short_.store(on, std::memory_order_relaxed); }
  // Waiter thread, after it saw an XID: short waits for `short_after_xid` from now.
  void AfterXid(Clock::time_point now = Clock::now()) {
    if (short_after_xid_.count() <= 0) return;
    const int64_t until = (now + short_after_xid_).time_since_epoch().count();
    int64_t seen = short_until_.load(std::memory_order_relaxed);
    while (seen < until && !short_until_.compare_exchange_weak(seen, until, std::memory_order_relaxed)) {
    }
  }
  // Waiter thread: the timeout of the next wait, in NVML's unit.
  unsigned int NextTimeoutMs(Clock::time_point now = Clock::now()) const {
    const bool quick = short_.load(std::memory_order_relaxed) ||
                       now.time_since_epoch().count() < short_until_.load(std::memory_order_relaxed);
    return quick ? short_ms_ : long_ms_;
  }
  bool Short() const { return short_.load(std::memory_order_relaxed); }

 private:
  static unsigned int ToMs(std::chrono::milliseconds d) {
    return static_cast<unsigned int>(d.count() < 1 ? 1 : d.count());
  }

  const unsigned int long_ms_;
  const unsigned int short_ms_;
  const std::chrono::milliseconds short_after_xid_;
  std::atomic<bool> short_{false};
  std::atomic<int64_t> short_until_{0};  // steady clock ticks
};

}  // namespace gns::gpu_inventory
