#pragma once
// One module instance driven as the supervisor drives it: its own ModuleContext over the
// harness, Start(), and Stop(done) waited for on the loop. What the module reports to the
// supervisor (ReportFailure, SetHealth) is recorded for the test to read.

#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace gns::test {

template <typename M>
class ModuleUnderTest {
 public:
  explicit ModuleUnderTest(LoopHarness& h) : h_(h) {}
  ~ModuleUnderTest() { Stop(); }
  ModuleUnderTest(const ModuleUnderTest&) = delete;
  ModuleUnderTest& operator=(const ModuleUnderTest&) = delete;

  // Constructs without starting: for a test that expects Start() to throw.
  M& Build(const typename M::Config& config) {
    Stop();
    failures.clear();
    context_ = std::make_unique<ModuleContext>(
        h_.Parts(), std::string(M::kName), [this](std::string why) { failures.push_back(std::move(why)); },
        [this](ModuleHealth h, std::string detail) {
          health = h;
          health_detail = std::move(detail);
        });
    module_ = std::make_unique<M>(*context_, config);
    return *module_;
  }
  M& Start(const typename M::Config& config) {
    Build(config).Start();
    return *module_;
  }
  // Stops (waiting for done) and destroys the instance; nothing when there is none.
  void Stop() {
    if (!module_) return;
    bool stopped = false;
    module_->Stop([&] { stopped = true; });
    EXPECT_TRUE(h_.RunUntil([&] { return stopped; })) << M::kName << " did not finish stopping";
    Discard();
  }
  // Destroys the instance without Stop (after a failed Start, as the supervisor does).
  void Discard() {
    module_.reset();
    context_.reset();
  }

  explicit operator bool() const { return module_ != nullptr; }
  M* operator->() const { return module_.get(); }
  M& operator*() const { return *module_; }

  std::vector<std::string> failures;  // ReportFailure() calls of the current instance
  ModuleHealth health = ModuleHealth::kOk;
  std::string health_detail;

 private:
  LoopHarness& h_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<M> module_;
};

}  // namespace gns::test
