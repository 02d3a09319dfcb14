#pragma once
// Jittered exponential backoff ("full jitter" on the upper half: each delay is uniformly drawn
// from [d/2, d] where d doubles up to a cap), with an injectable random source so tests see
// exact delays.

#include <chrono>
#include <functional>
#include <random>

namespace gns {

struct BackoffPolicy {
  std::chrono::milliseconds initial{1000};
  std::chrono::milliseconds max{60000};
  double multiplier = 2.0;
  // Fraction of the delay that is randomised: 0.5 draws from [d/2, d].
  double jitter = 0.5;
};

class Backoff {
 public:
  // Returns a uniform number in [0, 1).
  using RandomSource = std::function<double()>;

  explicit Backoff(BackoffPolicy policy, RandomSource random = {});

  // The delay before the next attempt; each call grows the base delay.
  std::chrono::milliseconds Next();
  // Back to the initial delay (after a success that lasted).
  void Reset();
  int Attempts() const { return attempts_; }
  const BackoffPolicy& Policy() const { return policy_; }

 private:
  BackoffPolicy policy_;
  RandomSource random_;
  std::chrono::milliseconds current_;
  int attempts_ = 0;
};

}  // namespace gns
