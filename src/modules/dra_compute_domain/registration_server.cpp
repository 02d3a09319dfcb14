// pluginregistration.Registration for the DRA driver.
#include "modules/dra_compute_domain/registration_server.hpp"

#include "modules/dra_compute_domain/driver_paths.hpp"

#include "pluginregistration/v1/api.grpc.pb.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace gns::dra {

struct RegistrationServer::Shared {
  Info info;
  StatusSink on_status;
  bool alive = true;  // loop thread
};

class RegistrationServer::Service final : public pluginregistration::Registration::CallbackService {
 public:
  Service(Loop& loop, std::shared_ptr<Shared> shared) : loop_(loop), shared_(std::move(shared)) {}

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context, const pluginregistration::InfoRequest*,
                                    pluginregistration::PluginInfo* response) override {
    auto* reactor = context->DefaultReactor();
    // Info is fixed at construction: answer here, without the loop, so the kubelet's liveness
    // probe never waits behind module work.
    response->set_type("DRAPlugin");
    response->set_name(shared_->info.driver_name);
    response->set_endpoint(shared_->info.endpoint);
    for (const auto& version : shared_->info.supported_versions) response->add_supported_versions(version);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* NotifyRegistrationStatus(grpc::CallbackServerContext* context,
                                                     const pluginregistration::RegistrationStatus* request,
                                                     pluginregistration::RegistrationStatusResponse*) override {
    auto* reactor = context->DefaultReactor();
    loop_.Post([shared = shared_, request, reactor] {
      if (!shared->alive) {
        reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "DRA plugin is stopping"));
        return;
      }
      if (shared->on_status) shared->on_status(request->plugin_registered(), request->error());
      // As the upstream helper: a failed registration is answered with an error.
      if (!request->plugin_registered()) {
        reactor->Finish(grpc::Status(grpc::StatusCode::UNKNOWN, "failed registration process: " + request->error()));
        return;
      }
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

 private:
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
};

void PrepareSocketPath(const std::string& socket_path) {
  const auto slash = socket_path.rfind('/');
  if (slash == std::string::npos || slash == 0) throw std::runtime_error("socket path must be absolute: " + socket_path);
  std::string error;
  if (!EnsureDirectory(socket_path.substr(0, slash), 0750, error)) throw std::runtime_error(error);
  struct stat st {};
  if (::lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) throw std::runtime_error(socket_path + " exists and is not a socket");
    if (::unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
      throw std::runtime_error("unlink stale socket " + socket_path + ": " + std::strerror(errno));
    }
  }
}

RegistrationServer::RegistrationServer(Loop& loop, Info info, StatusSink on_status)
    : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->info = std::move(info);
  shared_->on_status = std::move(on_status);
}

RegistrationServer::~RegistrationServer() {
  shared_->alive = false;
  if (server_) {
    // Not shut down through Shutdown(): do it here, bounded, so no RPC outlives the service.
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

void RegistrationServer::Start(const std::string& socket_path) {
  PrepareSocketPath(socket_path);
  service_ = std::make_unique<Service>(loop_, shared_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket_path, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) {
    service_.reset();
    throw std::runtime_error("cannot serve plugin registration on " + socket_path);
  }
  socket_path_ = socket_path;
  // The kubelet (root) is the only client.
  if (::chmod(socket_path.c_str(), 0600) != 0) {
    throw std::runtime_error("chmod 0600 " + socket_path + ": " + std::strerror(errno));
  }
}

void RegistrationServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  shared_->alive = false;
  if (!server_) {
    loop_.Post(std::move(done));
    return;
  }
  // Removing the socket is how the plugin watcher learns we are gone (WIRE-FACTS §2). A missing
  // file is fine: someone cleaned up already.
  ::unlink(socket_path_.c_str());
  struct Running {
    std::unique_ptr<grpc::Server> server;
    std::unique_ptr<Service> service;
  };
  auto running = std::make_shared<Running>(Running{std::move(server_), std::move(service_)});
  pool.Run(
      [running] {
        running->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
        running->server->Wait();
        running->server.reset();
        running->service.reset();
      },
      [done = std::move(done)](std::exception_ptr) { done(); });
}

}  // namespace gns::dra
