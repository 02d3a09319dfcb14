// Lease-based leader election (see leader_election.hpp).
#include "modules/kube/api/leader_election.hpp"

#include "loop/awaitables.hpp"
#include "loop/wake_grid.hpp"
#include "modules/kube/messages.hpp"

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as dra_module.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>

namespace gns::kube {

namespace asio = boost::asio;

class ElectorTimer {
 public:
  explicit ElectorTimer(asio::io_context& io) : timer_(io) {}
  asio::steady_timer timer_;
};

std::string FormatMicroTime(Clock::WallTime time) {
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(time.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%s.%06lldZ", buf, static_cast<long long>(micros % 1000000));
  return out;
}

LeaderElectionConfig ParseLeaderElectionConfig(ConfigMap& le, const std::string& default_lease_name) {
  using std::chrono::milliseconds;
  LeaderElectionConfig lease;  // its members hold the defaults
  lease.ns = le.String("namespace", lease.ns);
  lease.lease_name = le.String("leaseName", default_lease_name);
  if (lease.ns.empty()) le.Fail("namespace", "must not be empty");
  if (lease.lease_name.empty()) le.Fail("leaseName", "must not be empty");
  lease.lease_duration = le.Duration("leaseDuration", milliseconds(100), milliseconds(600000), lease.lease_duration);
  lease.renew_deadline = le.Duration("renewDeadline", milliseconds(50), milliseconds(600000), lease.renew_deadline);
  lease.retry_period = le.Duration("retryPeriod", milliseconds(10), milliseconds(600000), lease.retry_period);
  if (lease.renew_deadline >= lease.lease_duration) {
    le.Fail("renewDeadline", "must be shorter than leaseDuration (a leader must give up before others take over)");
  }
  if (lease.retry_period >= lease.renew_deadline) le.Fail("retryPeriod", "must be shorter than renewDeadline");
  lease.identity = le.OptionalString("identity").value_or("");
  if (lease.identity.empty()) lease.identity = DefaultIdentity();
  return lease;
}

std::string DefaultIdentity() {
  if (const char* pod = std::getenv("POD_NAME"); pod && *pod) return pod;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0 && host[0]) return host;
  return "unknown";
}

LeaderElector::LeaderElector(std::shared_ptr<KubeClient> client, asio::io_context& io, const Clock& clock, Bus* bus,
                             MetricsRegistry& metrics, std::shared_ptr<spdlog::logger> log,
                             LeaderElectionConfig config, Callbacks callbacks)
    : client_(std::move(client)),
      clock_(clock),
      bus_(bus),
      metrics_(metrics),
      log_(std::move(log)),
      config_(std::move(config)),
      callbacks_(std::move(callbacks)),
      io_(io),
      timer_(std::make_unique<ElectorTimer>(io)) {}

LeaderElector::~LeaderElector() {
  gate_.Close();
  timer_->timer_.cancel();
  metrics_.Remove("gpu_node_supervisor_kube_leader", {{"lease", config_.ns + "/" + config_.lease_name}});
}

std::string LeaderElector::LeasePath() const {
  return ResourcePath::Grouped("coordination.k8s.io", "v1", "leases", config_.ns).Object(config_.lease_name);
}

void LeaderElector::Start() {
  if (running_) return;
  running_ = true;
  Publish();
  // A run still winding down after a Stop (a request in flight) goes on as this one.
  if (run_active_) return;
  run_active_ = true;
  // A bug that throws in the run ends it and is rethrown on the loop, as from a callback.
  asio::co_spawn(io_, Run(gate_.Watch()), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

// acquire → renew every retryPeriod → (lose: another took it, or renewDeadline passed) → acquire
// ..., until Stop. Every wait takes the gate's ticket: once the elector is gone, the run is
// dropped where it waits.
asio::awaitable<void> LeaderElector::Run(Gate::Ticket ticket) {
  // co_spawn begins the run one loop turn after Start: an elector stopped (or destroyed) in
  // between must not be touched.
  if (!ticket) co_return;
  while (running_) {
    const std::optional<std::chrono::milliseconds> wait = co_await Round(ticket);
    if (!wait) break;
    co_await Sleep(SnappedWait(*wait), ticket);  // Stop cancels it
  }
  run_active_ = false;
}

asio::awaitable<std::optional<std::chrono::milliseconds>> LeaderElector::Round(Gate::Ticket ticket) {
  const std::string path = LeasePath();
  Result written;
  std::string what;
  in_flight_ = true;
  if (leading_ && lease_.is_object()) {
    // Renew: the lease as we last wrote it, so a concurrent writer makes this a 409.
    nlohmann::json renewed = Renewed(lease_, /*taking_over=*/false);
    const Deadline deadline = RequestDeadline();
    written = co_await client_->Update(path, renewed, deadline, ticket);
    what = "update lease: ";
  } else {
    const Deadline read_deadline = RequestDeadline();
    Result read = co_await client_->Get(path, read_deadline, ticket);
    if (!running_) {
      in_flight_ = false;
      AfterStop(nullptr);
      co_return std::nullopt;
    }
    if (read.http_status == 404) {
      // None yet: create it, held by us.
      const std::string collection =
          ResourcePath::Grouped("coordination.k8s.io", "v1", "leases", config_.ns).Collection();
      nlohmann::json lease = NewLease();
      const Deadline deadline = RequestDeadline();
      written = co_await client_->Create(collection, lease, deadline, ticket);
      what = "create lease: ";
    } else if (!read.Ok() || !read.object.is_object()) {
      in_flight_ = false;
      co_return Failed("get lease: " + read.error);
    } else if (!ObserveLease(read.object)) {
      in_flight_ = false;
      if (leading_) SetLeading(false);  // someone else holds a live lease
      co_return config_.retry_period;
    } else {
      // Free, expired or ours: take it, with the resourceVersion read (a 409 if it moved).
      const bool taking_over = read.object.value("spec", nlohmann::json::object()).value("holderIdentity", "") !=
                               config_.identity;
      nlohmann::json taken = Renewed(std::move(read.object), taking_over);
      const Deadline deadline = RequestDeadline();
      written = co_await client_->Update(path, taken, deadline, ticket);
      what = "update lease: ";
    }
  }
  in_flight_ = false;
  if (!running_) {
    AfterStop(&written);
    co_return std::nullopt;
  }
  if (written.Ok()) co_return Succeeded(written.object);
  if (written.http_status == 409) lease_ = nullptr;  // somebody else wrote: read again
  co_return Failed(what + written.error);
}

bool LeaderElector::ObserveLease(const nlohmann::json& lease) {
  const auto now = clock_.Now();
  const auto& spec = lease.value("spec", nlohmann::json::object());
  const std::string holder = spec.value("holderIdentity", "");
  const auto meta = ObjectMeta::From(lease);
  const std::string record = holder + "|" + spec.value("renewTime", "") + "|" + (meta ? meta->resource_version : "");
  if (record != observed_record_) {
    observed_record_ = record;
    observed_time_ = now;
  }
  if (holder != observed_holder_) {
    observed_holder_ = holder;
    if (callbacks_.on_new_leader) callbacks_.on_new_leader(holder);
    Publish();
  }
  // Our identity with a renewTime we never sent: another process writes under our name.
  const std::string renew_time = spec.value("renewTime", "");
  if (holder == config_.identity && !sent_renew_times_.empty() && !renew_time.empty() &&
      std::find(sent_renew_times_.begin(), sent_renew_times_.end(), renew_time) == sent_renew_times_.end() &&
      !identity_shared_) {
    identity_shared_ = true;
    log_->error("lease {}/{}: renewed as \"{}\" at {} by another process (not by this one): two candidates share "
                "one identity and both lead; give each its own (POD_NAME, as the DaemonSet sets it)",
                config_.ns, config_.lease_name, config_.identity, renew_time);
    Publish();
  }
  const bool held_by_other = !holder.empty() && holder != config_.identity;
  return !(held_by_other && observed_time_ + config_.lease_duration > now);
}

nlohmann::json LeaderElector::NewLease() const {
  const auto wall = FormatMicroTime(clock_.WallNow());
  return {{"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", config_.lease_name}, {"namespace", config_.ns}}},
          {"spec",
           {{"holderIdentity", config_.identity},
            {"leaseDurationSeconds",
             std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(config_.lease_duration).count())},
            {"acquireTime", wall},
            {"renewTime", wall},
            {"leaseTransitions", 0}}}};
}

nlohmann::json LeaderElector::Renewed(nlohmann::json lease, bool taking_over) {
  const auto wall = FormatMicroTime(clock_.WallNow());
  auto& spec = lease["spec"];
  if (!spec.is_object()) spec = nlohmann::json::object();
  if (taking_over) {
    spec["acquireTime"] = wall;
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  spec["holderIdentity"] = config_.identity;
  spec["leaseDurationSeconds"] =
      std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(config_.lease_duration).count());
  spec["renewTime"] = wall;
  sent_renew_times_.push_back(wall);
  if (sent_renew_times_.size() > 4) sent_renew_times_.pop_front();
  return lease;
}

Deadline LeaderElector::RequestDeadline() const {
  // The client's own bounds (requestTimeout per attempt, RetryPolicy), as before the coroutine.
  // A renewal cut at what is left of renewDeadline was tried: on a loaded 2-core machine the
  // leader then lost the lease on every slow PUT (compute_domain_controller_test), so that
  // change of behaviour waits for its own issue.
  return Deadline{};
}

// A steady round's wait (retryPeriod: renewed, or another holds a live lease) ends on the loop's
// wake grid, with the heartbeat (src/loop/wake_grid.hpp): at rest a renewal then costs no timer
// wake-up of its own. Only where retryPeriod plus half a grid stays inside renewDeadline (the
// defaults: 10 s + 5 s < 20 s); a failed renewal's quicker retry keeps its exact wait.
std::chrono::milliseconds LeaderElector::SnappedWait(std::chrono::milliseconds wait) const {
  if (wait != config_.retry_period || config_.retry_period + kWakeGrid / 2 >= config_.renew_deadline) return wait;
  const auto now = clock_.Now();
  return std::chrono::duration_cast<std::chrono::milliseconds>(SnapToWakeGrid(now + wait, wait) - now);
}

asio::awaitable<void> LeaderElector::Sleep(std::chrono::milliseconds delay, Gate::Ticket ticket) {
  timer_->timer_.expires_after(delay);
  // Cancelled only by Stop (the run then sees running_ false) and the destructor (which closes
  // the gate first): the error code says nothing more, so it is not read.
  auto wait = [timer = &timer_->timer_](auto resume) {
    timer->async_wait([resume](const boost::system::error_code&) mutable { resume(); });
  };
  co_await AwaitCallback<void>(std::move(wait), std::move(ticket));
}

std::chrono::milliseconds LeaderElector::Succeeded(const nlohmann::json& lease) {
  lease_ = lease;
  last_renew_ = clock_.Now();
  const auto meta = ObjectMeta::From(lease);
  observed_record_ = config_.identity + "|" + lease["spec"].value("renewTime", "") + "|" +
                     (meta ? meta->resource_version : "");
  observed_time_ = last_renew_;
  if (observed_holder_ != config_.identity) {
    observed_holder_ = config_.identity;
    if (callbacks_.on_new_leader) callbacks_.on_new_leader(observed_holder_);
  }
  if (!leading_) SetLeading(true);
  return config_.retry_period;
}

std::chrono::milliseconds LeaderElector::Failed(const std::string& why) {
  if (leading_) {
    log_->warn("lease {}/{}: renew failed: {}", config_.ns, config_.lease_name, why);
    if (clock_.Now() - last_renew_ > config_.renew_deadline) {
      log_->error("lease {}/{}: not renewed within {} ms; stopping leading", config_.ns, config_.lease_name,
                  config_.renew_deadline.count());
      SetLeading(false);
      lease_ = nullptr;
    }
  } else {
    log_->debug("lease {}/{}: {}", config_.ns, config_.lease_name, why);
  }
  return leading_ ? config_.retry_period / 2 : config_.retry_period;
}

void LeaderElector::SetLeading(bool leading) {
  if (leading_ == leading) return;
  leading_ = leading;
  if (!leading) lease_ = nullptr;
  log_->info("lease {}/{}: {} ({})", config_.ns, config_.lease_name, leading ? "started leading" : "stopped leading",
             config_.identity);
  metrics_.Gauge("gpu_node_supervisor_kube_leader", "1 while this process holds the lease",
                 {{"lease", config_.ns + "/" + config_.lease_name}})
      .Set(leading ? 1 : 0);
  Publish();
  if (leading && callbacks_.on_started_leading) callbacks_.on_started_leading();
  if (!leading && callbacks_.on_stopped_leading) callbacks_.on_stopped_leading();
}

void LeaderElector::Publish() {
  if (!bus_) return;
  bus_->Publish(
      LeaderStatus{config_.ns + "/" + config_.lease_name, config_.identity, leading_, observed_holder_, identity_shared_});
}

void LeaderElector::Stop(std::function<void()> done, bool release) {
  running_ = false;
  timer_->timer_.cancel();
  if (!leading_ || !release || !lease_.is_object()) {
    SetLeading(false);
    done();
    return;
  }
  // Stop the work first, then hand the lease back (holder cleared, 1 s duration, as client-go).
  // A renew still in flight would change the resourceVersion under the release: wait for it.
  release_lease_ = lease_;
  release_done_ = std::move(done);
  SetLeading(false);
  if (!in_flight_) ReleaseNow();
}

void LeaderElector::AfterStop(const Result* written) {
  if (!release_done_) return;
  if (written && written->Ok() && written->object.is_object()) release_lease_ = written->object;
  ReleaseNow();
}

namespace {

// A release outlives the elector if need be: Stop's `done` runs once the lease is handed back
// (or the attempt failed), whoever still holds the elector.
struct ReleaseJob {
  std::shared_ptr<KubeClient> client;
  std::string path;
  nlohmann::json lease;
  Deadline deadline;
  std::function<void()> done;
  std::shared_ptr<spdlog::logger> log;
  std::string name;
};

// A coroutine with a plain shared_ptr parameter (no closure: the g++ 12 pitfall).
asio::awaitable<void> Release(std::shared_ptr<ReleaseJob> job) {
  Result r = co_await job->client->Update(job->path, job->lease, job->deadline);
  if (!r.Ok()) job->log->warn("lease {}: release failed: {}", job->name, r.error);
  job->done();
}

}  // namespace

void LeaderElector::ReleaseNow() {
  auto done = std::move(release_done_);
  release_done_ = nullptr;
  if (!done) return;
  nlohmann::json lease = std::move(release_lease_);
  release_lease_ = nullptr;
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["renewTime"] = FormatMicroTime(clock_.WallNow());
  auto job = std::make_shared<ReleaseJob>(ReleaseJob{client_, LeasePath(), std::move(lease),
                                                     Deadline(config_.renew_deadline), std::move(done), log_,
                                                     config_.ns + "/" + config_.lease_name});
  asio::co_spawn(io_, Release(std::move(job)), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

}  // namespace gns::kube
