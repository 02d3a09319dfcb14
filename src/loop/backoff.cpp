// Jittered exponential backoff.
#include "loop/backoff.hpp"

#include <algorithm>
#include <memory>

namespace gns {

namespace {
Backoff::RandomSource DefaultRandom() {
  auto engine = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [engine] { return std::uniform_real_distribution<double>(0.0, 1.0)(*engine); };
}
}  // namespace

Backoff::Backoff(BackoffPolicy policy, RandomSource random)
    : policy_(policy), random_(random ? std::move(random) : DefaultRandom()), current_(policy.initial) {
  policy_.jitter = std::clamp(policy_.jitter, 0.0, 1.0);
  policy_.multiplier = std::max(policy_.multiplier, 1.0);
}

std::chrono::milliseconds Backoff::Next() {
  const auto base = std::min(current_, policy_.max);
  const double r = std::clamp(random_(), 0.0, 1.0);
  const double scaled = static_cast<double>(base.count()) * (1.0 - policy_.jitter * (1.0 - r));
  const auto next = static_cast<double>(current_.count()) * policy_.multiplier;
  current_ = std::chrono::milliseconds(
      static_cast<long long>(std::min(next, static_cast<double>(policy_.max.count()))));
  ++attempts_;
  return std::chrono::milliseconds(static_cast<long long>(scaled));
}

void Backoff::Reset() {
  current_ = policy_.initial;
  attempts_ = 0;
}

}  // namespace gns
