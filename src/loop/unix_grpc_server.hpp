#pragma once
// A gRPC server on a unix socket for services whose work runs on the loop (device plugin, DRA
// plugin, plugin registration). Two rules every such server shares live here once:
//  - the socket: a stale socket at the path is replaced, anything else there is refused, the
//    directory is created 0750 when missing (whatever the umask), the socket is 0600 (the
//    kubelet is the client) from the moment it appears at its path (socket_path.hpp);
//  - the completion queue: the services are async (completion-queue API, grpc_queue.hpp); the
//    server owns one queue and the one thread that waits on it;
//  - shutting down: grpc::Server::Shutdown blocks until every RPC is finished, and finishing RPCs
//    needs the loop, so it runs on the blocking pool, then the queue is shut down and drained
//    there; the server, the queue and the services are released on the loop afterwards (after
//    every completion the queue posted).
// Library gns_grpc_server (gRPC stays out of gns_loop).

#include "loop/blocking_pool.hpp"
#include "loop/grpc_queue.hpp"

#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns {

class UnixGrpcServer {
 public:
  UnixGrpcServer() = default;
  // Still running (a failed start, a test): a bounded, blocking shutdown here.
  ~UnixGrpcServer();
  UnixGrpcServer(const UnixGrpcServer&) = delete;
  UnixGrpcServer& operator=(const UnixGrpcServer&) = delete;

  // Serves the async `services` on `socket_path`; their completions reach `loop` through Queue().
  // Throws std::runtime_error naming `what` and the path.
  void Start(Loop& loop, const std::string& socket_path, const std::vector<grpc::Service*>& services,
             std::string_view what);
  // Removes the socket (how the kubelet learns we are gone), then shuts the server and its queue
  // down on the pool, and releases them and `keep_alive` (the services) on the loop before `done`.
  void Shutdown(BlockingPool& pool, Loop& loop, std::shared_ptr<void> keep_alive, std::function<void()> done);

  bool Running() const { return server_ != nullptr; }
  const std::string& SocketPath() const { return socket_path_; }
  // While running: the queue the services request their calls on.
  GrpcQueue& Queue() const { return *queue_; }
  grpc::ServerCompletionQueue* ServerCq() const { return server_cq_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcQueue> queue_;
  grpc::ServerCompletionQueue* server_cq_ = nullptr;  // owned by queue_
  std::string socket_path_;
};

// The socket rules alone: parent directory (0750 when created), stale socket removed, any other
// file refused. Throws std::runtime_error.
void PrepareUnixSocketPath(const std::string& socket_path);

}  // namespace gns
