#pragma once
// A keyed work queue in the manner of client-go's rate-limited workqueue: a key added while it
// waits is not queued twice; a key added while its work runs is run once more after it (never
// two at a time for one key); a failed key comes back after its own jittered backoff, reset
// by a success. At most `max_in_flight` keys run at once. Loop thread only.

#include "loop/backoff.hpp"
#include "loop/gate.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace gns::cd_controller {

class WorkQueue {
 public:
  // Runs the work for `key` and calls `done(ok)` exactly once (on the loop), unless the queue
  // was cleared meanwhile (then the call is ignored).
  using Handler = std::function<void(const std::string& key, std::function<void(bool ok)> done)>;

  WorkQueue(boost::asio::io_context& io, BackoffPolicy policy, std::size_t max_in_flight, Handler handler,
            Backoff::RandomSource random = {});
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `key` now (a pending retry timer for it is cancelled).
  void Add(const std::string& key);
  // Drops everything: queued keys, retry timers, backoff state; work in flight is forgotten
  // (its done() does nothing). The queue stays usable.
  void Clear();

  std::size_t Queued() const { return queue_.size(); }
  std::size_t InFlight() const { return in_flight_.size(); }
  std::size_t WaitingRetry() const { return timers_.size(); }
  // The number of failures in a row for `key` (0 after a success).
  int Failures(const std::string& key) const;

 private:
  void Pump();
  void Finished(const std::string& key, uint64_t epoch, bool ok);
  void RetryLater(const std::string& key);

  boost::asio::io_context& io_;
  BackoffPolicy policy_;
  std::size_t max_in_flight_;
  Handler handler_;
  Backoff::RandomSource random_;
  std::deque<std::string> queue_;
  std::set<std::string, std::less<>> queued_;
  std::set<std::string, std::less<>> in_flight_;
  std::set<std::string, std::less<>> dirty_;  // added again while in flight
  std::map<std::string, Backoff, std::less<>> backoff_;
  std::map<std::string, std::unique_ptr<class KeyTimer>, std::less<>> timers_;
  uint64_t epoch_ = 0;
  uint64_t next_timer_id_ = 0;
  bool pump_posted_ = false;
  Gate lifetime_;
};

}  // namespace gns::cd_controller
