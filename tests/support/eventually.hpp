#pragma once
// A bounded wait for a condition that another thread or process makes true: polls `done`
// until it holds or `limit` passes. For state the test cannot be told about (a child process,
// a file, a server on its own thread); work on the test's own loop uses LoopHarness::RunUntil.

#include <chrono>
#include <thread>

namespace gns::test {

template <typename Pred>
bool Eventually(Pred&& done, std::chrono::milliseconds limit = std::chrono::seconds(30),
                std::chrono::milliseconds poll = std::chrono::milliseconds(50)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(poll);
  }
  return done();  // one last look: the limit may have passed while it became true
}

}  // namespace gns::test
