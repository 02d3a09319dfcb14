// pluginregistration.Registration for the DRA driver.
#include "dra_plugin/registration_server.hpp"

#include "dra_plugin/plugin_paths.hpp"

#include "pluginregistration/v1/api.grpc.pb.h"

#include "loop/grpc_unary.hpp"

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

class RegistrationServer::Service final : public pluginregistration::Registration::AsyncService {};

RegistrationServer::RegistrationServer(Loop& loop, Info info, StatusSink on_status)
    : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->info = std::move(info);
  shared_->on_status = std::move(on_status);
}

RegistrationServer::~RegistrationServer() { shared_->alive = false; }

void RegistrationServer::Start(const std::string& socket_path) {
  service_ = std::make_shared<Service>();
  server_.Start(loop_, socket_path, {service_.get()}, "plugin registration");
  Service& service = *service_;
  grpc::ServerCompletionQueue* cq = server_.ServerCq();
  auto shared = shared_;
  // Info is fixed at construction: answered on the queue thread, without the loop, so the
  // kubelet's liveness probe never waits behind module work.
  ServeUnary<pluginregistration::InfoRequest, pluginregistration::PluginInfo>(
      server_.Queue(),
      [&service, cq](grpc::ServerContext* context, pluginregistration::InfoRequest* request,
                     grpc::ServerAsyncResponseWriter<pluginregistration::PluginInfo>* responder, void* tag) {
        service.RequestGetInfo(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        call->response.set_type(shared->info.type);
        call->response.set_name(shared->info.driver_name);
        call->response.set_endpoint(shared->info.endpoint);
        for (const auto& version : shared->info.supported_versions) call->response.add_supported_versions(version);
        call->Finish(grpc::Status::OK);
      },
      GrpcQueue::On::kQueueThread);
  ServeUnary<pluginregistration::RegistrationStatus, pluginregistration::RegistrationStatusResponse>(
      server_.Queue(),
      [&service, cq](grpc::ServerContext* context, pluginregistration::RegistrationStatus* request,
                     grpc::ServerAsyncResponseWriter<pluginregistration::RegistrationStatusResponse>* responder,
                     void* tag) { service.RequestNotifyRegistrationStatus(context, request, responder, cq, cq, tag); },
      [shared](const auto& call) {
        if (!shared->alive) {
          call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, shared->info.type + " is stopping"));
          return;
        }
        if (shared->on_status) shared->on_status(call->request.plugin_registered(), call->request.error());
        // As the upstream helper: a failed registration is answered with an error.
        if (!call->request.plugin_registered()) {
          call->Finish(grpc::Status(grpc::StatusCode::UNKNOWN, "failed registration process: " + call->request.error()));
          return;
        }
        call->Finish(grpc::Status::OK);
      });
}

void RegistrationServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  shared_->alive = false;
  // Removing the socket (done by the server) is how the plugin watcher learns we are gone.
  server_.Shutdown(pool, loop_, std::move(service_), std::move(done));
}

}  // namespace gns::dra
