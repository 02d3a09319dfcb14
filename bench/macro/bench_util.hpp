#pragma once
// Small pieces the whole-module benchmarks share: milliseconds from a duration, one printed
// line of percentiles, a loop turned by a thread of its own, and running a function on it.

#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"

#include <boost/asio/executor_work_guard.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

namespace gns::bench {

inline double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// `sorted` must be sorted and non-empty.
inline double Percentile(const std::vector<double>& sorted, double p) {
  return sorted[std::min(sorted.size() - 1, static_cast<std::size_t>(p * static_cast<double>(sorted.size())))];
}

// Prints "WHAT over N samples: p50 …, p90 …, p99 …, max …" and returns the median.
inline double Report(const char* what, std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  std::printf("%s over %zu samples: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n", what, samples.size(),
              Percentile(samples, 0.50), Percentile(samples, 0.90), Percentile(samples, 0.99), samples.back());
  return Percentile(samples, 0.50);
}

// Runs `fn` on the loop thread (turned by another thread) and waits for it.
template <typename Fn>
void OnLoop(Loop& loop, Fn fn) {
  std::promise<void> done;
  loop.Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

// Turns `loop` on a thread of its own until Stop(), while the benchmark's main thread plays
// the kubelet, the journal writer or the API client. Stop() lets the pool finish first.
class LoopThread {
 public:
  LoopThread(Loop& loop, BlockingPool& pool)
      : loop_(loop), pool_(pool), guard_(boost::asio::make_work_guard(loop.Io())), thread_([this] {
          loop_.BindToCurrentThread();
          loop_.Io().run();
        }) {}
  ~LoopThread() { Stop(); }
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  void Stop() {
    if (!thread_.joinable()) return;
    guard_.reset();
    pool_.Join();
    loop_.Io().stop();
    thread_.join();
  }

 private:
  Loop& loop_;
  BlockingPool& pool_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

}  // namespace gns::bench
