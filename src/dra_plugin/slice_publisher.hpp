#pragma once
// Keeps a DRA driver's ResourceSlice for this node true in the API (slice.hpp builds the object):
// reads the Node's UID once (the slice is owned by the Node), then GET → create (404) or update
// when SliceNeedsUpdate, bumping the pool generation above any written before. One write in
// flight; a request during it is remembered and runs after it. A failure retries with backoff
// (500 ms doubling to 30 s); a resync timer re-checks now and then; an informer on this node's
// slices of the driver recreates the slice at once when it is deleted (a kubelet start wipes the
// node's slices) and rewrites it when it drifted. Loop thread only.
//
// The driver supplies the devices (asked at every write and every check) and is told of errors
// and of every finished attempt, so its state message can follow. Its counters are its own (the
// metric names live where the driver registers them).

#include "dra_plugin/slice.hpp"
#include "loop/bus.hpp"
#include "loop/gate.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/module.hpp"

#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace gns::kube {
class KubeClient;
class Informer;
class InformerRegistry;
}  // namespace gns::kube

namespace gns::dra {

class SlicePublisher {
 public:
  struct Options {
    std::string driver_name;
    std::string node_name;
    ResourceApiVersion api_version = ResourceApiVersion::kV1;
    std::chrono::milliseconds resync{600000};
  };
  struct Counters {
    MetricsRegistry::Series* created = nullptr;
    MetricsRegistry::Series* updated = nullptr;
    MetricsRegistry::Series* errors = nullptr;
  };
  struct Hooks {
    std::function<nlohmann::json()> devices;            // the SliceDevice entries wanted now
    std::function<std::string()> note;                  // appended to the log lines, e.g. "clique X"
    std::function<void(const std::string&)> on_error;  // a write or read failed (before its retry)
    std::function<void()> on_attempt;                   // after every finished attempt
  };

  SlicePublisher(ModuleContext& context, Options options, Counters counters, Hooks hooks);
  ~SlicePublisher();
  SlicePublisher(const SlicePublisher&) = delete;
  SlicePublisher& operator=(const SlicePublisher&) = delete;

  // Watches the node's slices of the driver, publishes, and starts the resync. The Node's UID,
  // the pool generation and the counts carry over from an earlier Start.
  void Start(std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::InformerRegistry> informers);
  // Cancels the timers and the watch; callbacks still under way find it stopped and do nothing.
  void Stop();
  // Asks for a check-and-write (the devices changed).
  void Publish();

  nlohmann::json Desired(int64_t generation) const;
  const std::string& SliceName() const { return slice_name_; }
  const std::string& NodeUid() const { return node_uid_; }
  int64_t Generation() const { return generation_; }
  uint64_t Publishes() const { return publishes_; }

 private:
  std::string Collection() const;
  void PublishWithNode();
  void Done(bool ok, const std::string& error);
  void ScheduleRetry();
  void ScheduleResync();

  ModuleContext& context_;
  Options options_;
  Counters counters_;
  Hooks hooks_;
  std::string slice_name_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::shared_ptr<kube::Informer> informer_;
  std::string informer_key_;
  Subscription sub_;
  bool stopping_ = true;
  std::string node_uid_;
  bool busy_ = false;
  bool again_ = false;
  int64_t generation_ = 0;
  uint64_t publishes_ = 0;
  std::chrono::milliseconds retry_delay_;
  boost::asio::steady_timer retry_timer_;
  boost::asio::steady_timer resync_timer_;
  Gate lifetime_;  // closed first thing in the destructor: late callbacks are dropped
};

}  // namespace gns::dra
