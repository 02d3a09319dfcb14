#pragma once
// Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection: the holder
// renews every retryPeriod; a candidate takes the lease over only when the record it observes
// has not changed for leaseDuration (judged on its own clock, never by comparing clocks);
// every write is a PUT carrying the resourceVersion read (optimistic concurrency). A leader
// that cannot renew within renewDeadline stops leading before anyone else may take over.

#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/config.hpp"
#include "loop/gate.hpp"
#include "modules/kube/api/client.hpp"

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace gns::kube {

struct LeaderElectionConfig {
  std::string ns = "kube-system";
  std::string lease_name;
  std::string identity;  // the pod name (default POD_NAME, else the hostname)
  // client-go's 15 s / 10 s / 2 s, stretched for a process that runs on every GPU node: the
  // holder renews (a PUT) every retryPeriod and every other node reads the lease as often, each
  // read or renewal a loop wake-up and an API request. 10 s keeps an idle supervisor's loop under
  // half a wake-up a second (issue #23) and halves the candidates' reads; a failed renewal is
  // still retried (at half of retryPeriod) within renewDeadline. The price: a crashed leader is
  // replaced within leaseDuration + retryPeriod (<= 40 s) instead of ~17 s; a leader that stops
  // cleanly hands the lease back at once.
  std::chrono::milliseconds lease_duration{30000};
  std::chrono::milliseconds renew_deadline{20000};
  std::chrono::milliseconds retry_period{10000};
};

// RFC 3339 with microseconds, as a Kubernetes MicroTime.
std::string FormatMicroTime(Clock::WallTime time);
// POD_NAME, else the hostname.
std::string DefaultIdentity();

// Reads a `leaderElection` section's lease keys (namespace, leaseName, leaseDuration,
// renewDeadline, retryPeriod, identity) with their cross-checks. Other keys of the section
// (such as `enabled`) are the caller's, and so is Finish().
LeaderElectionConfig ParseLeaderElectionConfig(ConfigMap& section, const std::string& default_lease_name);

class LeaderElector {
 public:
  struct Callbacks {
    std::function<void()> on_started_leading;
    std::function<void()> on_stopped_leading;
    std::function<void(const std::string& holder)> on_new_leader;  // optional
  };

  // `bus` may be null; otherwise LeaderStatus is published on every change.
  LeaderElector(std::shared_ptr<KubeClient> client, boost::asio::io_context& io, const Clock& clock, Bus* bus,
                MetricsRegistry& metrics, std::shared_ptr<spdlog::logger> log, LeaderElectionConfig config,
                Callbacks callbacks);
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  void Start();
  // Stops trying. When leading and `release`: clears the holder so another candidate takes
  // over at once. on_stopped_leading runs (if leading) before `done`.
  void Stop(std::function<void()> done, bool release = true);

  bool IsLeader() const { return leading_; }
  // True once the lease was seen renewed under our identity by a writer that is not us: two
  // processes share one identity (both lead; client-go cannot tell either).
  bool IdentityShared() const { return identity_shared_; }
  const std::string& Holder() const { return observed_holder_; }
  const LeaderElectionConfig& Config() const { return config_; }

 private:
  // The elector's one coroutine, Start to Stop: rounds of acquire or renew, a wait between.
  boost::asio::awaitable<void> Run(Gate::Ticket ticket);
  // The wait after a round, moved onto the loop's wake grid where that is safe.
  std::chrono::milliseconds SnappedWait(std::chrono::milliseconds wait) const;
  // One round: renew the lease we hold, or read it and take it when it is free or expired.
  // Returns the wait before the next round; nullopt once Stop came during the round.
  boost::asio::awaitable<std::optional<std::chrono::milliseconds>> Round(Gate::Ticket ticket);
  // Records a lease read; false while another holder's lease is live.
  bool ObserveLease(const nlohmann::json& lease);
  // `lease` with us as holder, renewed now (and acquired now when `taking_over`).
  nlohmann::json Renewed(nlohmann::json lease, bool taking_over);
  nlohmann::json NewLease() const;
  // What a request may take (the client's own bounds: see the .cpp).
  Deadline RequestDeadline() const;
  boost::asio::awaitable<void> Sleep(std::chrono::milliseconds delay, Gate::Ticket ticket);
  // Both return the wait before the next round.
  std::chrono::milliseconds Succeeded(const nlohmann::json& lease);
  std::chrono::milliseconds Failed(const std::string& why);
  void SetLeading(bool leading);
  void Publish();
  std::string LeasePath() const;
  // Called when a request completes after Stop: hands the lease back if Stop asked for it.
  void AfterStop(const Result* written);
  void ReleaseNow();

  std::shared_ptr<KubeClient> client_;
  const Clock& clock_;
  Bus* bus_;
  MetricsRegistry& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  LeaderElectionConfig config_;
  Callbacks callbacks_;
  boost::asio::io_context& io_;
  std::unique_ptr<class ElectorTimer> timer_;
  bool running_ = false;     // between Start and Stop
  bool run_active_ = false;  // the coroutine is under way (it may outlive a Stop by one request)
  bool leading_ = false;
  bool in_flight_ = false;
  nlohmann::json lease_;  // the last lease we wrote or read
  std::deque<std::string> sent_renew_times_;  // the renewTimes of our last few writes
  bool identity_shared_ = false;
  std::string observed_holder_;
  std::string observed_record_;  // holder + renewTime + resourceVersion, to see change
  Clock::SteadyTime observed_time_{};
  Clock::SteadyTime last_renew_{};
  std::function<void()> release_done_;  // set by Stop(release) while a request was in flight
  nlohmann::json release_lease_;
  // Closed by the destructor: the coroutine is never resumed once the elector is gone.
  Gate gate_;
};

}  // namespace gns::kube
