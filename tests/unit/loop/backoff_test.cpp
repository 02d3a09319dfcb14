// Jittered exponential backoff with an injected random source.
#include "loop/backoff.hpp"

#include <gtest/gtest.h>

namespace gns {
namespace {

using std::chrono::milliseconds;

TEST(Backoff, DoublesUpToTheCapWithJitterDrawnFromInjectedSource) {
  double r = 1.0;  // top of the range: no reduction
  Backoff backoff({milliseconds(100), milliseconds(1000), 2.0, 0.5}, [&] { return r; });
  EXPECT_EQ(backoff.Next(), milliseconds(100));
  EXPECT_EQ(backoff.Next(), milliseconds(200));
  EXPECT_EQ(backoff.Next(), milliseconds(400));
  EXPECT_EQ(backoff.Next(), milliseconds(800));
  EXPECT_EQ(backoff.Next(), milliseconds(1000));
  EXPECT_EQ(backoff.Next(), milliseconds(1000));
  r = 0.0;  // bottom of the range: half the delay with jitter 0.5
  EXPECT_EQ(backoff.Next(), milliseconds(500));
  EXPECT_EQ(backoff.Attempts(), 7);
}

TEST(Backoff, ResetStartsOver) {
  Backoff backoff({milliseconds(10), milliseconds(1000), 3.0, 0.0}, [] { return 0.3; });
  EXPECT_EQ(backoff.Next(), milliseconds(10));
  EXPECT_EQ(backoff.Next(), milliseconds(30));
  backoff.Reset();
  EXPECT_EQ(backoff.Attempts(), 0);
  EXPECT_EQ(backoff.Next(), milliseconds(10));
}

TEST(Backoff, DefaultRandomStaysWithinTheJitterRange) {
  Backoff backoff({milliseconds(1000), milliseconds(1000), 2.0, 0.5});
  for (int i = 0; i < 200; ++i) {
    const auto d = backoff.Next();
    EXPECT_GE(d, milliseconds(500));
    EXPECT_LE(d, milliseconds(1000));
  }
}

}  // namespace
}  // namespace gns
