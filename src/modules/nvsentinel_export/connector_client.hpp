#pragma once
// A client of NVSentinel's PlatformConnector on its unix socket: one HealthEventOccurredV1
// call at a time, on gRPC's completion-queue API (loop/grpc_queue.hpp: a thread of the client's
// own blocks on the queue), so a call never blocks the loop. Every call has a deadline and
// fails fast when nothing listens (no wait_for_ready): the module's backoff decides when to try
// again. A channel is held only while a call is in flight: an idle gRPC channel costs timer
// wake-ups, and a new channel finds a restarted connector at once. Destroying the client
// cancels the call in flight; its outcome is then dropped.

#include "loop/loop.hpp"
#include "nvsentinel/v1/api.pb.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace datamodels {
class PlatformConnector;
}  // namespace datamodels

namespace gns {
template <typename Service>
class IdleChannelClient;
}  // namespace gns

namespace gns::nvsentinel_export {

class ConnectorClient {
 public:
  // `target`: "unix:///path", "unix:/path" or a plain path.
  ConnectorClient(Loop& loop, const std::string& target);
  ~ConnectorClient();
  ConnectorClient(const ConnectorClient&) = delete;
  ConnectorClient& operator=(const ConnectorClient&) = delete;

  // `done(ok, error)` runs on the loop (never inline) unless the client was destroyed first.
  // False (and `done` never runs) when the client's queue is shut down.
  bool Send(const datamodels::HealthEvents& events, std::chrono::milliseconds deadline,
            std::function<void(bool ok, std::string error)> done);

  const std::string& Target() const { return target_; }

 private:
  std::string target_;
  std::unique_ptr<IdleChannelClient<datamodels::PlatformConnector>> client_;
};

// "unix:///var/run/x.sock" → "/var/run/x.sock"; a plain path stays; "" for anything else.
std::string SocketPathOf(const std::string& target);

}  // namespace gns::nvsentinel_export
