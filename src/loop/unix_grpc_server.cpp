// gRPC on a unix socket, shut down off the loop.
#include "loop/unix_grpc_server.hpp"

#include "loop/atomic_file.hpp"
#include "loop/socket_path.hpp"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace gns {

void PrepareUnixSocketPath(const std::string& socket_path) {
  const auto slash = socket_path.rfind('/');
  if (slash == std::string::npos || slash == 0) throw std::runtime_error("socket path must be absolute: " + socket_path);
  const std::string dir = socket_path.substr(0, slash);
  std::string error;
  // 0750 whatever the umask (and every parent created with it).
  if (!EnsureDirectory(dir, 0750, error)) throw std::runtime_error("cannot create " + dir + ": " + error);
  struct stat st {};
  if (::lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) throw std::runtime_error(socket_path + " exists and is not a socket");
    if (::unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
      throw std::runtime_error("unlink stale socket " + socket_path + ": " + std::strerror(errno));
    }
  }
}

UnixGrpcServer::~UnixGrpcServer() {
  if (server_) {
    // Nothing reaches the loop any more: completions release their calls on the queue thread.
    queue_->Detach();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    queue_.reset();  // shuts the queue down, drains it, joins its thread
  }
}

void UnixGrpcServer::Start(Loop& loop, const std::string& socket_path, const std::vector<grpc::Service*>& services,
                           std::string_view what) {
  PrepareUnixSocketPath(socket_path);
  // Bound where nobody else can reach it, made 0600 (the kubelet, root, is the only client), then
  // renamed into place: there is no moment at which the socket is at its path with a wider mode.
  PrivateSocketBind bind(socket_path);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + bind.BindPath(), grpc::InsecureServerCredentials());
  // No bandwidth-delay probing: it sizes flow-control windows for bulk transfers, and our
  // callers are the kubelet's small calls on a local socket, which it only adds timers to
  // (the kubelet's GetInfo probe every 10 s: 3.2-3.9 → 3.0-3.1 wake-ups/s of the whole binary
  // at rest, tools/idle-bench.sh).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  for (auto* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  auto server = builder.BuildAndStart();
  if (!server) {
    cq->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
    }
    throw std::runtime_error("cannot serve " + std::string(what) + " on " + socket_path);
  }
  grpc::ServerCompletionQueue* server_cq = cq.get();
  auto queue = std::make_unique<GrpcQueue>(loop, std::move(cq));
  try {
    bind.Publish(0600);
  } catch (...) {
    queue->Detach();
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    server.reset();
    queue.reset();
    throw;
  }
  server_ = std::move(server);
  queue_ = std::move(queue);
  server_cq_ = server_cq;
  socket_path_ = socket_path;
}

void UnixGrpcServer::Shutdown(BlockingPool& pool, Loop& loop, std::shared_ptr<void> keep_alive,
                              std::function<void()> done) {
  if (!server_) {
    loop.Post(std::move(done));
    return;
  }
  ::unlink(socket_path_.c_str());  // ours; a missing file is fine (someone cleaned up already)
  struct Parts {
    std::unique_ptr<grpc::Server> server;
    std::unique_ptr<GrpcQueue> queue;
    std::shared_ptr<void> keep_alive;
  };
  auto parts = std::make_shared<Parts>(Parts{std::move(server_), std::move(queue_), std::move(keep_alive)});
  server_cq_ = nullptr;
  pool.Run(
      [parts] {
        // RPCs posted to the loop but not run yet finish there (each server's "alive" gate); after
        // the deadline gRPC cancels what is left, and those completions reach the loop too.
        parts->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
        parts->server->Wait();
        // No call is left to start an operation: shut the queue down and let its thread drain it.
        parts->queue->Shutdown();
        parts->queue->Join();
      },
      // On the loop, after every completion the queue thread posted: nothing posted can still
      // point at the queue or the services.
      [parts, done = std::move(done)](std::exception_ptr) {
        parts->server.reset();
        parts->queue.reset();
        parts->keep_alive.reset();
        done();
      });
}

}  // namespace gns
