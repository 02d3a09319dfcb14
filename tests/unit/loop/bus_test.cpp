// The typed bus: ordering, deferred delivery, retained topics, unsubscribe semantics,
// exception isolation and counters.
#include "loop/bus.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace gns {
namespace {

struct Tick {
  static constexpr std::string_view kTopic = "test.tick";
  int n = 0;
};

struct Tock {
  static constexpr std::string_view kTopic = "test.tock";
  int n = 0;
};

struct Level {
  static constexpr std::string_view kTopic = "test.level";
  static constexpr bool kRetained = true;
  int value = 0;
};
void to_json(nlohmann::json& j, const Level& l) { j = nlohmann::json{{"value", l.value}}; }

struct DeviceState {
  static constexpr std::string_view kTopic = "test.device-state";
  static constexpr bool kRetained = true;
  std::string device;
  bool healthy = true;
  std::string RetainKey() const { return device; }
};
void to_json(nlohmann::json& j, const DeviceState& d) { j = nlohmann::json{{"healthy", d.healthy}}; }

class BusTest : public ::testing::Test {
 protected:
  test::LoopHarness h;
  Bus& bus = h.bus;
};

TEST_F(BusTest, PublishNeverRunsHandlersInline) {
  int calls = 0;
  auto sub = bus.Subscribe<Tick>([&](const Tick&) { ++calls; });
  bus.Publish(Tick{1});
  EXPECT_EQ(calls, 0);
  h.Drain();
  EXPECT_EQ(calls, 1);
}

TEST_F(BusTest, DeliversInPublishOrderPerTopicAcrossInterleavedTopics) {
  std::vector<int> ticks, tocks;
  auto a = bus.Subscribe<Tick>([&](const Tick& t) { ticks.push_back(t.n); });
  auto b = bus.Subscribe<Tock>([&](const Tock& t) { tocks.push_back(t.n); });
  std::vector<int> expected;
  for (int i = 0; i < 1000; ++i) {
    bus.Publish(Tick{i});
    if (i % 3 == 0) bus.Publish(Tock{i});
    expected.push_back(i);
  }
  h.Drain();
  EXPECT_EQ(ticks, expected);
  ASSERT_EQ(tocks.size(), 334u);
  for (std::size_t i = 1; i < tocks.size(); ++i) EXPECT_LT(tocks[i - 1], tocks[i]);
}

TEST_F(BusTest, MessagesPublishedFromHandlersKeepOrder) {
  std::vector<int> seen;
  auto sub = bus.Subscribe<Tick>([&](const Tick& t) {
    seen.push_back(t.n);
    if (t.n < 5) bus.Publish(Tick{t.n + 10});
  });
  for (int i = 0; i < 3; ++i) bus.Publish(Tick{i});
  h.Drain();
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 10, 11, 12}));
}

TEST_F(BusTest, SubscriberSeesOnlyMessagesPublishedAfterSubscribing) {
  std::vector<int> seen;
  bus.Publish(Tick{1});
  auto sub = bus.Subscribe<Tick>([&](const Tick& t) { seen.push_back(t.n); });
  bus.Publish(Tick{2});
  h.Drain();
  EXPECT_EQ(seen, std::vector<int>{2});
}

TEST_F(BusTest, RetainedTopicHandsLatestValueToNewSubscriberFirst) {
  bus.Publish(Level{1});
  bus.Publish(Level{2});
  h.Drain();
  std::vector<int> seen;
  auto sub = bus.Subscribe<Level>([&](const Level& l) { seen.push_back(l.value); });
  bus.Publish(Level{3});
  h.Drain();
  EXPECT_EQ(seen, (std::vector<int>{2, 3}));
  ASSERT_NE(bus.Latest<Level>(), nullptr);
  EXPECT_EQ(bus.Latest<Level>()->value, 3);
}

TEST_F(BusTest, RetainedValueIsNotDeliveredTwiceWhenSubscribingBeforeItsDelivery) {
  bus.Publish(Level{7});  // queued, not yet delivered
  std::vector<int> seen;
  auto sub = bus.Subscribe<Level>([&](const Level& l) { seen.push_back(l.value); });
  h.Drain();
  EXPECT_EQ(seen, std::vector<int>{7});
}

TEST_F(BusTest, KeyedRetainedTopicKeepsLatestPerKey) {
  bus.Publish(DeviceState{"GPU-a", true});
  bus.Publish(DeviceState{"GPU-b", true});
  bus.Publish(DeviceState{"GPU-a", false});
  h.Drain();
  std::map<std::string, bool> seen;
  int calls = 0;
  auto sub = bus.Subscribe<DeviceState>([&](const DeviceState& d) {
    seen[d.device] = d.healthy;
    ++calls;
  });
  h.Drain();
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(seen.at("GPU-a"));
  EXPECT_TRUE(seen.at("GPU-b"));
  EXPECT_EQ(bus.LatestByKey<DeviceState>().size(), 2u);
}

TEST_F(BusTest, UnsubscribeWhileDeliveryIsQueuedDropsIt) {
  int calls = 0;
  auto sub = bus.Subscribe<Tick>([&](const Tick&) { ++calls; });
  bus.Publish(Tick{1});
  sub.Reset();
  h.Drain();
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(sub.Active());
}

TEST_F(BusTest, UnsubscribeWhileRetainedSnapshotIsQueuedDropsIt) {
  bus.Publish(Level{1});
  h.Drain();
  int calls = 0;
  auto sub = bus.Subscribe<Level>([&](const Level&) { ++calls; });
  sub = Subscription();
  h.Drain();
  EXPECT_EQ(calls, 0);
}

TEST_F(BusTest, HandlerCanDropAnotherSubscriptionDuringDelivery) {
  std::vector<std::string> calls;
  Subscription second;
  auto first = bus.Subscribe<Tick>([&](const Tick&) {
    calls.push_back("first");
    second.Reset();
  });
  second = bus.Subscribe<Tick>([&](const Tick&) { calls.push_back("second"); });
  bus.Publish(Tick{1});
  bus.Publish(Tick{2});
  h.Drain();
  EXPECT_EQ(calls, (std::vector<std::string>{"first", "first"}));
}

TEST_F(BusTest, HandlerCanDropItsOwnSubscription) {
  int calls = 0;
  Subscription sub;
  sub = bus.Subscribe<Tick>([&](const Tick&) {
    ++calls;
    sub.Reset();
  });
  bus.Publish(Tick{1});
  bus.Publish(Tick{2});
  h.Drain();
  EXPECT_EQ(calls, 1);
}

TEST_F(BusTest, ThrowingHandlerIsCountedAndOthersStillReceive) {
  std::vector<std::string> calls;
  auto a = bus.Subscribe<Tick>([&](const Tick&) { calls.push_back("a"); });
  auto b = bus.Subscribe<Tick>([&](const Tick&) -> void { throw std::runtime_error("boom"); });
  auto c = bus.Subscribe<Tick>([&](const Tick&) { calls.push_back("c"); });
  bus.Publish(Tick{1});
  bus.Publish(Tick{2});
  h.Drain();
  EXPECT_EQ(calls, (std::vector<std::string>{"a", "c", "a", "c"}));
  const auto topics = bus.Topics();
  auto it = std::find_if(topics.begin(), topics.end(), [](const auto& t) { return t.name == "test.tick"; });
  ASSERT_NE(it, topics.end());
  EXPECT_EQ(it->counters.published, 2u);
  EXPECT_EQ(it->counters.delivered, 4u);
  EXPECT_EQ(it->counters.handler_errors, 2u);
  EXPECT_EQ(it->subscribers, 3u);
}

TEST_F(BusTest, RetainedStateIsJson) {
  bus.Publish(Level{42});
  bus.Publish(DeviceState{"GPU-x", false});
  bus.Publish(Tick{1});  // events are not state
  const auto state = bus.RetainedState();
  EXPECT_EQ(state.at("test.level").at("value"), 42);
  EXPECT_EQ(state.at("test.device-state").at("GPU-x").at("healthy"), false);
  EXPECT_FALSE(state.contains("test.tick"));
}

TEST(BusLifetime, SubscriptionMayOutliveTheBus) {
  Subscription sub;
  {
    test::LoopHarness h;
    sub = h.bus.Subscribe<Tick>([](const Tick&) {});
  }
  sub.Reset();  // must not touch the freed topic
  EXPECT_FALSE(sub.Active());
}

}  // namespace
}  // namespace gns
