#pragma once
// A client of the kubelet's PodResourcesLister v1 on its unix socket (WIRE-FACTS §5). Calls use
// gRPC's completion-queue API on the client's own queue (loop/grpc_queue.hpp: one thread blocks
// on it), so they never block the loop; each has a deadline; the outcome is posted to the loop.
// A channel is held only while calls are in flight, so a restarted kubelet is found by the next
// call; destroying the client cancels the calls in flight and drops their outcomes
// (loop/grpc_idle_channel_client.hpp).

#include "loop/loop.hpp"
#include "podresources/v1/api.pb.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace v1 {
class PodResourcesLister;
}  // namespace v1

namespace gns {
template <typename Service>
class IdleChannelClient;
}  // namespace gns

namespace gns::pod_resources {

template <typename Response>
struct CallOutcome {
  bool ok = false;
  std::string error;  // "UNAVAILABLE: connections to all backends failing; ..." when !ok
  Response response;
};

class ListerClient {
 public:
  ListerClient(Loop& loop, std::string socket_path, std::chrono::milliseconds timeout);
  ~ListerClient();
  ListerClient(const ListerClient&) = delete;
  ListerClient& operator=(const ListerClient&) = delete;

  // `done` runs on the loop (never inline), unless the client was destroyed first.
  void List(std::function<void(CallOutcome<v1::ListPodResourcesResponse>)> done);
  void GetAllocatableResources(std::function<void(CallOutcome<v1::AllocatableResourcesResponse>)> done);

  const std::string& SocketPath() const { return socket_path_; }

 private:
  std::string socket_path_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<IdleChannelClient<v1::PodResourcesLister>> client_;
};

}  // namespace gns::pod_resources
