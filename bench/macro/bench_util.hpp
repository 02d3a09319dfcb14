#pragma once
// Small pieces the whole-module benchmarks share: milliseconds from a duration, one printed
// line of percentiles, and running a function on a loop that another thread turns.

#include "loop/loop.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
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

}  // namespace gns::bench
