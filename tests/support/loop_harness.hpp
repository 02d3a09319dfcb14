#pragma once
// A runtime for tests: the real Loop, Bus, pool, metrics and services, driven by the test
// thread. RunUntil turns the loop until a condition holds (or a generous real-time limit
// passes), so tests wait on events, never on sleeps.

#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/module.hpp"
#include "loop/services.hpp"
#include "loop/site.hpp"

#include <chrono>
#include <functional>
#include <future>

namespace gns::test {

class LoopHarness {
 public:
  LoopHarness();
  ~LoopHarness();

  Loop loop;
  SystemClock clock;
  Bus bus{loop};
  MetricsRegistry metrics;
  Services services;
  SiteConfig site;
  BlockingPool pool{loop, 2};

  RuntimeParts Parts() { return RuntimeParts{loop, bus, pool, clock, site, metrics, services}; }

  // Runs loop handlers until `done()` is true; false if `limit` passed first.
  bool RunUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(20));
  // Runs every handler that is ready now (and those they make ready), without waiting.
  void Drain();

  // Runs `fn` on another thread while this one turns the loop (for blocking clients of
  // servers that live on the loop); returns its result.
  template <typename Fn>
  auto OffLoop(Fn fn, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    auto future = std::async(std::launch::async, std::move(fn));
    RunUntil([&] { return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }, limit);
    return future.get();
  }
};

}  // namespace gns::test
