#pragma once
// Holds every thread of a BlockingPool until Release (or the end of the scope): work queued
// meanwhile waits, as a read from a slow disk would. For tests that show a module keeps the
// loop serving while its state is read on the pool.

#include "loop/blocking_pool.hpp"
#include "support/loop_harness.hpp"

#include <atomic>
#include <exception>
#include <future>
#include <thread>

namespace gns::test {

class HeldPool {
 public:
  // `threads`: the pool's size (LoopHarness: 2); returns once every one of them is held.
  explicit HeldPool(BlockingPool& pool, int threads = 2) {
    const std::shared_future<void> opened = open_.get_future().share();
    for (int i = 0; i < threads; ++i) {
      pool.Execute([this, open = opened] {
        ++held_;
        open.wait();
      });
    }
    while (held_.load() < threads) std::this_thread::yield();
  }
  ~HeldPool() { Release(); }
  HeldPool(const HeldPool&) = delete;
  HeldPool& operator=(const HeldPool&) = delete;

  void Release() {
    if (released_) return;
    released_ = true;
    open_.set_value();
  }

 private:
  std::promise<void> open_;
  std::atomic<int> held_{0};
  bool released_ = false;
};

// Queues a marker on the harness's pool and turns the loop until it is back, then runs what is
// ready: results of work queued before it (a late state read) have reached the loop by then.
inline bool FlushPool(LoopHarness& h) {
  bool back = false;
  h.pool.Run([] { return 0; }, [&back](int, std::exception_ptr) { back = true; });
  const bool ok = h.RunUntil([&] { return back; });
  h.Drain();
  return ok;
}

}  // namespace gns::test
