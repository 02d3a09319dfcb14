// The controller's keyed work queue (see work_queue.hpp).
#include "modules/compute_domain_controller/work_queue.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

namespace gns::cd_controller {

namespace asio = boost::asio;

class KeyTimer {
 public:
  KeyTimer(asio::io_context& io, uint64_t serial) : timer(io), id(serial) {}
  asio::steady_timer timer;
  uint64_t id;
};

WorkQueue::WorkQueue(asio::io_context& io, BackoffPolicy policy, std::size_t max_in_flight, Handler handler,
                     Backoff::RandomSource random)
    : io_(io),
      policy_(policy),
      max_in_flight_(max_in_flight == 0 ? 1 : max_in_flight),
      handler_(std::move(handler)),
      random_(std::move(random)) {}

WorkQueue::~WorkQueue() {
  lifetime_.Close();
  for (auto& [key, timer] : timers_) timer->timer.cancel();
}

void WorkQueue::Add(const std::string& key) {
  if (const auto it = timers_.find(key); it != timers_.end()) {
    it->second->timer.cancel();
    timers_.erase(it);
  }
  if (in_flight_.contains(key)) {
    dirty_.insert(key);
    return;
  }
  if (!queued_.insert(key).second) return;
  queue_.push_back(key);
  // Work starts from a posted handler, never inside Add: callers may hold state mid-change.
  if (pump_posted_) return;
  pump_posted_ = true;
  asio::post(io_, lifetime_.Guard([this] {
    pump_posted_ = false;
    Pump();
  }));
}

void WorkQueue::Pump() {
  while (in_flight_.size() < max_in_flight_ && !queue_.empty()) {
    std::string key = std::move(queue_.front());
    queue_.pop_front();
    queued_.erase(key);
    in_flight_.insert(key);
    const uint64_t epoch = epoch_;
    handler_(key, lifetime_.Guard([this, key, epoch](bool ok) {
      Finished(key, epoch, ok);
    }));
  }
}

void WorkQueue::Finished(const std::string& key, uint64_t epoch, bool ok) {
  if (epoch != epoch_) return;  // cleared meanwhile: this work no longer counts
  in_flight_.erase(key);
  if (ok) {
    backoff_.erase(key);
  } else {
    RetryLater(key);
  }
  if (dirty_.erase(key) > 0) {
    Add(key);  // changed while it ran: run again now (this also supersedes the retry timer)
  } else {
    Pump();
  }
}

void WorkQueue::RetryLater(const std::string& key) {
  auto it = backoff_.find(key);
  if (it == backoff_.end()) it = backoff_.emplace(key, Backoff(policy_, random_)).first;
  const auto delay = it->second.Next();
  auto timer = std::make_unique<KeyTimer>(io_, ++next_timer_id_);
  timer->timer.expires_after(delay);
  timer->timer.async_wait([this, alive = lifetime_.Watch(), key, id = timer->id](
                              const boost::system::error_code& ec) {
    // operation_aborted: Add() or Clear() cancelled this retry and already dropped the timer.
    if (ec || !alive) return;
    // A timer that fired just as Add() replaced it is not ours to erase any more.
    const auto it = timers_.find(key);
    if (it == timers_.end() || it->second->id != id) return;
    timers_.erase(it);
    Add(key);
  });
  timers_.insert_or_assign(key, std::move(timer));
}

void WorkQueue::Clear() {
  ++epoch_;
  queue_.clear();
  queued_.clear();
  in_flight_.clear();
  dirty_.clear();
  backoff_.clear();
  for (auto& [key, timer] : timers_) timer->timer.cancel();
  timers_.clear();
}

int WorkQueue::Failures(const std::string& key) const {
  const auto it = backoff_.find(key);
  return it == backoff_.end() ? 0 : it->second.Attempts();
}

}  // namespace gns::cd_controller
