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

RegistrationServer::RegistrationServer(Loop& loop, Info info, StatusSink on_status)
    : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->info = std::move(info);
  shared_->on_status = std::move(on_status);
}

RegistrationServer::~RegistrationServer() { shared_->alive = false; }

void RegistrationServer::Start(const std::string& socket_path) {
  service_ = std::make_shared<Service>(loop_, shared_);
  server_.Start(socket_path, {service_.get()}, "plugin registration");
}

void RegistrationServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  shared_->alive = false;
  // Removing the socket (done by the server) is how the plugin watcher learns we are gone.
  server_.Shutdown(pool, loop_, std::move(service_), std::move(done));
}

}  // namespace gns::dra
