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
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

void UnixGrpcServer::Start(const std::string& socket_path, const std::vector<grpc::Service*>& services,
                           std::string_view what) {
  PrepareUnixSocketPath(socket_path);
  // Bound where nobody else can reach it, made 0600 (the kubelet, root, is the only client), then
  // renamed into place: there is no moment at which the socket is at its path with a wider mode.
  PrivateSocketBind bind(socket_path);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + bind.BindPath(), grpc::InsecureServerCredentials());
  for (auto* service : services) builder.RegisterService(service);
  auto server = builder.BuildAndStart();
  if (!server) throw std::runtime_error("cannot serve " + std::string(what) + " on " + socket_path);
  try {
    bind.Publish(0600);
  } catch (...) {
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    throw;
  }
  server_ = std::move(server);
  socket_path_ = socket_path;
}

void UnixGrpcServer::Shutdown(BlockingPool& pool, Loop& loop, std::shared_ptr<void> keep_alive,
                              std::function<void()> done) {
  if (!server_) {
    loop.Post(std::move(done));
    return;
  }
  ::unlink(socket_path_.c_str());  // ours; a missing file is fine (someone cleaned up already)
  std::shared_ptr<grpc::Server> server = std::move(server_);
  pool.Run(
      [server, keep_alive = std::move(keep_alive)]() mutable {
        // RPCs posted to the loop but not run yet finish there (each server's "alive" gate).
        server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
        server->Wait();
        server.reset();
        keep_alive.reset();
      },
      [done = std::move(done)](std::exception_ptr) { done(); });
}

}  // namespace gns
