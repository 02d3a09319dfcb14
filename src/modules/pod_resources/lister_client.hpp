#pragma once
// A client of the kubelet's PodResourcesLister v1 on its unix socket (WIRE-FACTS §5). Calls use
// gRPC's completion-queue API on the client's own queue (loop/grpc_queue.hpp: one thread blocks
// on it), so they never block the loop; each has a deadline; the outcome is posted to the loop.
// A channel is held only while calls are in flight (none at rest: an idle gRPC channel costs
// timer wake-ups), so a restarted kubelet is found by the next call. Destroying the client cancels the calls in flight
// and waits (briefly: cancellation is local) until gRPC has let go of them; their outcomes are
// then dropped.

#include "loop/grpc_queue.hpp"
#include "loop/loop.hpp"
#include "podresources/v1/api.pb.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

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

  struct Shared;

 private:
  Loop& loop_;
  std::string socket_path_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<GrpcQueue> queue_;
};

}  // namespace gns::pod_resources
