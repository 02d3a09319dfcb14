#pragma once
// A way back to the loop for a thread that may outlive the module that started it (a detached
// NVML event waiter): Post() reaches the loop until the owner calls Close(), and is dropped
// after. The owner closes it before it (or the loop) goes away; the thread holds it by
// shared_ptr, so the link itself outlives both.

#include "loop/loop.hpp"

#include <memory>
#include <mutex>
#include <utility>

namespace gns {

class LoopLink {
 public:
  explicit LoopLink(Loop& loop) : loop_(&loop) {}
  static std::shared_ptr<LoopLink> Make(Loop& loop) { return std::make_shared<LoopLink>(loop); }

  // Thread-safe: posts `fn` to the loop; false (and `fn` dropped) once closed.
  template <typename Fn>
  bool Post(Fn&& fn) {
    std::lock_guard lock(mutex_);
    if (loop_ == nullptr) return false;
    loop_->Post(std::forward<Fn>(fn));
    return true;
  }
  // Thread-safe; after it returns no Post reaches the loop.
  void Close() {
    std::lock_guard lock(mutex_);
    loop_ = nullptr;
  }

 private:
  std::mutex mutex_;
  Loop* loop_;
};

}  // namespace gns
