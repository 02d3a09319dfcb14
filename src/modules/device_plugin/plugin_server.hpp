#pragma once
// The kubelet-facing gRPC side of the device plugin: the v1beta1.DevicePlugin service on our
// unix socket and the Register call to kubelet.sock, both on the server's completion queue
// (loop/grpc_queue.hpp: one thread of ours blocks on it and posts each completion to the loop).
// Module state is touched on the loop only: Allocate and GetPreferredAllocation run there and the
// loop finishes the RPC; GetDevicePluginOptions and PreStartContainer answer from fixed data on
// the queue thread. ListAndWatch streams keep at most one write in flight and coalesce to the
// newest list.

#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "loop/unix_grpc_server.hpp"

#include "deviceplugin/v1beta1/api.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>

namespace gns::device_plugin {

class PluginServer {
 public:
  // Run on the loop. A handler returning a non-OK status fails the RPC with it.
  struct Handlers {
    std::function<grpc::Status(const v1beta1::AllocateRequest&, v1beta1::AllocateResponse*)> allocate;
    std::function<grpc::Status(const v1beta1::PreferredAllocationRequest&, v1beta1::PreferredAllocationResponse*)>
        preferred;
    std::function<v1beta1::ListAndWatchResponse()> current_list;
    v1beta1::DevicePluginOptions options;
  };

  PluginServer(Loop& loop, Handlers handlers);
  ~PluginServer();
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Serves on the unix socket `path` (mode 0600). Throws std::runtime_error on failure.
  void Start(const std::string& path);
  // Sends `list` to every open ListAndWatch stream. Loop thread.
  void Broadcast(const v1beta1::ListAndWatchResponse& list);
  // Shuts down off the loop (gRPC's Shutdown blocks); `done` runs on the loop. A registration
  // in flight is cancelled (its `done` sees CANCELLED first).
  void Shutdown(BlockingPool& pool, std::function<void()> done);
  std::size_t OpenStreams() const;

  // While serving: calls v1beta1.Registration/Register on `kubelet_socket`; `done(status)` runs on
  // the loop (also when Shutdown cancels the call).
  void Register(const std::string& kubelet_socket, const v1beta1::RegisterRequest& request,
                std::chrono::milliseconds timeout, std::function<void(const grpc::Status&)> done);

  // State shared with gRPC reactors, which may outlive this object by a few posted handlers.
  struct Shared;

 private:
  class Service;
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Service> service_;
  UnixGrpcServer server_;
};

}  // namespace gns::device_plugin
