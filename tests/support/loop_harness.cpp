// Test loop driver.
#include "support/loop_harness.hpp"

namespace gns::test {

LoopHarness::LoopHarness() {
  site.node_name = "test-node";
  loop.BindToCurrentThread();
}

LoopHarness::~LoopHarness() {
  pool.Join();
  Drain();
}

bool LoopHarness::RunUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto& io = loop.Io();
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(20));
  }
  return true;
}

void LoopHarness::Drain() {
  auto& io = loop.Io();
  if (io.stopped()) io.restart();
  io.poll();
  if (io.stopped()) io.restart();
}

}  // namespace gns::test
