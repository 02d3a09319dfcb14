// Non-template parts of the typed bus.
#include "loop/bus.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace gns {

namespace detail {

std::size_t TopicBase::SubscriberCount() const {
  return static_cast<std::size_t>(std::count_if(subscribers_.begin(), subscribers_.end(),
                                                [](const auto& s) { return s->active; }));
}

void TopicBase::Remove(SubscriberBase* sub) {
  sub->active = false;
  if (delivering_ > 0) {
    // Erasing now would shift the vector under the delivery loop: compact afterwards.
    needs_compaction_ = true;
    return;
  }
  Compact();
}

void TopicBase::Compact() {
  std::erase_if(subscribers_, [](const auto& s) { return !s->active; });
  needs_compaction_ = false;
}

void TopicBase::RunOne(SubscriberBase& sub, const std::function<void(SubscriberBase&)>& invoke) {
  ++delivering_;
  try {
    invoke(sub);
    ++counters_.delivered;
  } catch (const std::exception& e) {
    ++counters_.handler_errors;
    ReportHandlerError(name_, e.what());
  } catch (...) {
    ++counters_.handler_errors;
    ReportHandlerError(name_, "non-standard exception");
  }
  if (--delivering_ == 0 && needs_compaction_) Compact();
}

void TopicBase::ForEachEligible(uint64_t seq,
                                const std::function<void(SubscriberBase&)>& invoke) {
  ++delivering_;
  // Index loop: a handler may subscribe (push_back) while we iterate; new subscribers have
  // from_seq > seq and are skipped. Holding a reference keeps a subscriber alive even if
  // its handle is dropped inside its own handler.
  for (std::size_t i = 0; i < subscribers_.size(); ++i) {
    std::shared_ptr<SubscriberBase> sub = subscribers_[i];
    if (!sub->active || sub->from_seq > seq) continue;
    RunOne(*sub, invoke);
  }
  if (--delivering_ == 0 && needs_compaction_) Compact();
}

void ReportHandlerError(std::string_view topic, std::string_view what) {
  spdlog::error("bus: handler for topic '{}' threw: {}", topic, what);
}

}  // namespace detail

void Subscription::Reset() {
  if (!sub_) return;
  if (sub_->active && sub_->topic != nullptr) sub_->topic->Remove(sub_.get());
  sub_->active = false;
  sub_.reset();
}

Bus::~Bus() {
  // Handles that outlive the bus must not reach into freed topics.
  for (auto& topic : topics_) {
    if (!topic) continue;
    for (auto& sub : topic->subscribers_) {
      sub->active = false;
      sub->topic = nullptr;
    }
  }
}

std::size_t Bus::NextTypeSlot() {
  static std::atomic<std::size_t> next{0};
  return next++;
}

std::vector<Bus::TopicView> Bus::Topics() const {
  std::vector<TopicView> out;
  for (const auto& topic : topics_) {
    if (!topic) continue;
    out.push_back({topic->Name(), topic->Retained(), topic->Counters(), topic->SubscriberCount()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

nlohmann::json Bus::RetainedState() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& topic : topics_) {
    if (!topic || !topic->Retained()) continue;
    auto value = topic->RetainedJson();
    if (!value.is_null()) out[std::string(topic->Name())] = std::move(value);
  }
  return out;
}

}  // namespace gns
