#pragma once
// The reactor's identity: the one io_context that owns all module state, the thread that
// runs it, and the only sanctioned way for foreign threads (gRPC, the blocking pool, NVML
// waiters) to get work onto it.

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <utility>

namespace gns {

class Loop {
 public:
  Loop() = default;
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  boost::asio::io_context& Io() { return io_; }

  // Thread-safe: queue `fn` to run on the loop thread. The only cross-thread entry.
  template <typename Fn>
  void Post(Fn&& fn) {
    boost::asio::post(io_, std::forward<Fn>(fn));
  }

  // Records the calling thread as the loop thread (done by whoever calls io.run()).
  void BindToCurrentThread() { owner_.store(std::this_thread::get_id()); }

  // True on the loop thread, and before any thread was bound (construction-time wiring).
  bool OnLoopThread() const {
    const auto owner = owner_.load();
    return owner == std::thread::id{} || owner == std::this_thread::get_id();
  }

 private:
  boost::asio::io_context io_{1};
  std::atomic<std::thread::id> owner_{};
};

// Debug-build check that module state is only touched on the loop thread. Compiled out with
// NDEBUG; the sanitizer test build keeps it.
#ifndef NDEBUG
#define GNS_ASSERT_ON_LOOP(loop)                                                     \
  do {                                                                               \
    if (!(loop).OnLoopThread()) ::gns::detail::OffLoopAbort(__FILE__, __LINE__);     \
  } while (false)
#else
#define GNS_ASSERT_ON_LOOP(loop) \
  do {                           \
  } while (false)
#endif

namespace detail {
[[noreturn]] void OffLoopAbort(const char* file, int line);
}  // namespace detail

}  // namespace gns
