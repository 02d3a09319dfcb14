#pragma once
// The typed in-process bus. Topics are message types: a message struct names its topic with
// `static constexpr std::string_view kTopic` and may declare `static constexpr bool kRetained
// = true` (state, not events: the latest value is kept and handed to new subscribers) and,
// for state kept per entity, `std::string RetainKey() const` (one latest value per key).
//
// Rules that modules rely on:
//  - Publish never runs a handler inline: delivery is queued on the loop, and subscribers of a
//    topic see its messages in publish order.
//  - A subscriber only sees messages published after it subscribed (plus, for a retained
//    topic, the latest value at subscription time, delivered first).
//  - Dropping the Subscription handle unsubscribes, even with deliveries already queued.
//  - A handler that throws is counted and logged; the others still get the message.
// The bus lives on the loop thread: Publish and Subscribe are loop-thread only.

#include "loop/loop.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace gns {

template <typename T>
concept BusMessage = std::is_copy_constructible_v<T> && requires {
  { T::kTopic } -> std::convertible_to<std::string_view>;
};

template <typename T>
concept KeyedMessage = requires(const T& t) {
  { t.RetainKey() } -> std::convertible_to<std::string>;
};

template <typename T>
constexpr bool IsRetained() {
  if constexpr (requires { T::kRetained; }) {
    return T::kRetained;
  } else {
    return false;
  }
}

template <typename T>
concept JsonSerializable = requires(nlohmann::json& j, const T& t) {
  nlohmann::adl_serializer<T>::to_json(j, t);
};

struct TopicCounters {
  uint64_t published = 0;
  uint64_t delivered = 0;
  uint64_t handler_errors = 0;
};

class Bus;

namespace detail {

class TopicBase;

struct SubscriberBase {
  virtual ~SubscriberBase() = default;
  TopicBase* topic = nullptr;
  uint64_t from_seq = 0;  // first sequence number this subscriber may see
  bool active = true;
};

template <typename T>
struct Subscriber final : SubscriberBase {
  std::function<void(const T&)> handler;
};

class TopicBase {
 public:
  TopicBase(std::string_view name, bool retained) : name_(name), retained_(retained) {}
  virtual ~TopicBase() = default;

  std::string_view Name() const { return name_; }
  bool Retained() const { return retained_; }
  const TopicCounters& Counters() const { return counters_; }
  std::size_t SubscriberCount() const;
  // The retained value(s) as JSON (null when nothing retained or not serialisable).
  virtual nlohmann::json RetainedJson() const = 0;

  void Remove(SubscriberBase* sub);

  // Runs `invoke` for every subscriber allowed to see sequence `seq`, isolating exceptions.
  void ForEachEligible(uint64_t seq, const std::function<void(SubscriberBase&)>& invoke);
  // Runs `invoke` for one subscriber, isolating exceptions.
  void RunOne(SubscriberBase& sub, const std::function<void(SubscriberBase&)>& invoke);
  void Compact();

  // Detail class: the Bus template code reads and writes these directly.

  std::string_view name_;
  bool retained_;
  TopicCounters counters_;
  std::vector<std::shared_ptr<SubscriberBase>> subscribers_;
  uint64_t next_seq_ = 1;
  int delivering_ = 0;
  bool needs_compaction_ = false;
};

void ReportHandlerError(std::string_view topic, std::string_view what);

template <typename T>
class Topic final : public TopicBase {
 public:
  Topic() : TopicBase(T::kTopic, IsRetained<T>()) {}

  nlohmann::json RetainedJson() const override {
    if constexpr (JsonSerializable<T>) {
      if constexpr (KeyedMessage<T>) {
        if (by_key_.empty()) return nullptr;
        nlohmann::json out = nlohmann::json::object();
        for (const auto& [key, value] : by_key_) out[key] = value;
        return out;
      } else {
        if (!latest_) return nullptr;
        return nlohmann::json(*latest_);
      }
    } else {
      return retained_ && HasRetained() ? nlohmann::json("<not serialisable>") : nlohmann::json();
    }
  }

  bool HasRetained() const {
    if constexpr (KeyedMessage<T>) return !by_key_.empty();
    return latest_.has_value();
  }

  std::deque<std::pair<uint64_t, T>> pending_;
  std::optional<T> latest_;
  std::map<std::string, T, std::less<>> by_key_;

  void DeliverNext() {
    auto [seq, message] = std::move(pending_.front());
    pending_.pop_front();
    ForEachEligible(seq, [&message](SubscriberBase& sub) {
      static_cast<Subscriber<T>&>(sub).handler(message);
    });
  }
};

}  // namespace detail

// RAII subscription: destroying or resetting it unsubscribes. Declare these as the last
// members of a module so they go first.
class [[nodiscard]] Subscription {
 public:
  Subscription() = default;
  ~Subscription() { Reset(); }
  Subscription(Subscription&& other) noexcept : sub_(std::move(other.sub_)) {}
  Subscription& operator=(Subscription&& other) noexcept {
    if (this != &other) {
      Reset();
      sub_ = std::move(other.sub_);
    }
    return *this;
  }
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;

  void Reset();
  bool Active() const { return sub_ && sub_->active; }

 private:
  friend class Bus;
  explicit Subscription(std::shared_ptr<detail::SubscriberBase> sub) : sub_(std::move(sub)) {}
  std::shared_ptr<detail::SubscriberBase> sub_;
};

class Bus {
 public:
  explicit Bus(Loop& loop) : loop_(loop) {}
  ~Bus();
  Bus(const Bus&) = delete;
  Bus& operator=(const Bus&) = delete;

  template <BusMessage T>
  void Publish(T message) {
    GNS_ASSERT_ON_LOOP(loop_);
    auto& topic = TopicFor<T>();
    ++topic.counters_.published;
    if constexpr (IsRetained<T>()) {
      if constexpr (KeyedMessage<T>) {
        topic.by_key_.insert_or_assign(std::string(message.RetainKey()), message);
      } else {
        topic.latest_ = message;
      }
    }
    topic.pending_.emplace_back(topic.next_seq_++, std::move(message));
    loop_.Post([t = &topic] { t->DeliverNext(); });
  }

  template <BusMessage T, typename Fn>
  Subscription Subscribe(Fn&& handler) {
    GNS_ASSERT_ON_LOOP(loop_);
    auto& topic = TopicFor<T>();
    auto sub = std::make_shared<detail::Subscriber<T>>();
    sub->topic = &topic;
    sub->from_seq = topic.next_seq_;
    sub->handler = std::forward<Fn>(handler);
    topic.subscribers_.push_back(sub);
    if constexpr (IsRetained<T>()) {
      // The snapshot is copied now: a later publish reaches this subscriber through the
      // ordinary queue, after the snapshot, so it never sees a value twice or out of order.
      std::vector<T> snapshot;
      if constexpr (KeyedMessage<T>) {
        for (const auto& [key, value] : topic.by_key_) snapshot.push_back(value);
      } else if (topic.latest_) {
        snapshot.push_back(*topic.latest_);
      }
      if (!snapshot.empty()) {
        loop_.Post([sub, t = &topic, snapshot = std::move(snapshot)] {
          for (const auto& value : snapshot) {
            if (!sub->active) return;
            t->RunOne(*sub, [&value](detail::SubscriberBase& s) {
              static_cast<detail::Subscriber<T>&>(s).handler(value);
            });
          }
        });
      }
    }
    return Subscription(std::move(sub));
  }

  // Latest value of a retained, unkeyed topic (nullptr if none yet).
  template <BusMessage T>
  const T* Latest() {
    static_assert(IsRetained<T>() && !KeyedMessage<T>);
    auto& topic = TopicFor<T>();
    return topic.latest_ ? &*topic.latest_ : nullptr;
  }

  // Latest values of a retained, keyed topic.
  template <BusMessage T>
  const std::map<std::string, T, std::less<>>& LatestByKey() {
    static_assert(IsRetained<T>() && KeyedMessage<T>);
    return TopicFor<T>().by_key_;
  }

  struct TopicView {
    std::string_view name;
    bool retained;
    TopicCounters counters;
    std::size_t subscribers;
  };
  std::vector<TopicView> Topics() const;
  // Every retained topic that holds a value, as {topic: value}.
  nlohmann::json RetainedState() const;

 private:
  template <BusMessage T>
  detail::Topic<T>& TopicFor() {
    const std::size_t id = TypeSlot<T>();
    if (id >= topics_.size()) topics_.resize(id + 1);
    auto& slot = topics_[id];
    if (!slot) slot = std::make_unique<detail::Topic<T>>();
    return static_cast<detail::Topic<T>&>(*slot);
  }

  // A dense per-type index, shared by every Bus instance, so lookup is a vector index.
  static std::size_t NextTypeSlot();
  template <typename T>
  static std::size_t TypeSlot() {
    static const std::size_t slot = NextTypeSlot();
    return slot;
  }

  Loop& loop_;
  std::vector<std::unique_ptr<detail::TopicBase>> topics_;
};

}  // namespace gns
