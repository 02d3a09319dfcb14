// PlatformConnector client over gRPC's completion-queue API: see connector_client.hpp.
#include "modules/nvsentinel_export/connector_client.hpp"

#include "loop/grpc_unary.hpp"
#include "nvsentinel/v1/api.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <set>

namespace gns::nvsentinel_export {

// Loop thread only, but held by the call in flight too (the channel must outlive it).
struct ConnectorClient::Shared {
  std::string target;
  std::set<grpc::ClientContext*> in_flight;
  bool alive = true;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<datamodels::PlatformConnector::Stub> stub;

  datamodels::PlatformConnector::Stub& Stub() {
    if (!stub) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
      stub = datamodels::PlatformConnector::NewStub(channel);
    }
    return *stub;
  }
  void LetChannelGoWhenIdle() {
    if (!in_flight.empty()) return;
    stub.reset();
    channel.reset();
  }
};

namespace {

std::string Describe(const grpc::Status& status) {
  static constexpr const char* kNames[] = {"OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS",    "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
                                           "UNIMPLEMENTED", "INTERNAL",        "UNAVAILABLE",       "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  std::string text = code >= 0 && code <= 16 ? kNames[code] : "code " + std::to_string(code);
  if (!status.error_message().empty()) text += ": " + status.error_message();
  return text;
}

}  // namespace

std::string SocketPathOf(const std::string& target) {
  if (target.rfind("unix://", 0) == 0) return target.substr(7);
  if (target.rfind("unix:", 0) == 0) return target.substr(5);
  if (!target.empty() && target.front() == '/') return target;
  return {};
}

ConnectorClient::ConnectorClient(Loop& loop, const std::string& target)
    : target_("unix:" + SocketPathOf(target)), shared_(std::make_shared<Shared>()) {
  shared_->target = target_;
  queue_ = std::make_unique<GrpcQueue>(loop, std::make_unique<grpc::CompletionQueue>());
}

ConnectorClient::~ConnectorClient() {
  shared_->alive = false;
  for (grpc::ClientContext* context : shared_->in_flight) context->TryCancel();
  // Cancellation completes on the queue thread: the queue's teardown waits only for that.
  queue_.reset();
}

bool ConnectorClient::Send(const datamodels::HealthEvents& events, std::chrono::milliseconds deadline,
                           std::function<void(bool ok, std::string error)> done) {
  using Response = google::protobuf::Empty;
  auto call = std::make_shared<ClientCall<Response>>();
  call->context.set_deadline(std::chrono::system_clock::now() + deadline);
  auto& shared = shared_;
  shared->in_flight.insert(&call->context);
  datamodels::PlatformConnector::Stub& stub = shared->Stub();
  const bool started = CallUnary<Response>(
      *queue_, call,
      [&stub, &events](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return stub.PrepareAsyncHealthEventOccurredV1(context, events, cq);
      },
      [shared, channel = shared->channel, done = std::move(done)](ClientCall<Response>& finished) mutable {
        shared->in_flight.erase(&finished.context);
        shared->LetChannelGoWhenIdle();
        if (!shared->alive) return;
        done(finished.status.ok(), finished.status.ok() ? std::string() : Describe(finished.status));
      });
  if (!started) {
    shared->in_flight.erase(&call->context);
    shared->LetChannelGoWhenIdle();
  }
  return started;
}

}  // namespace gns::nvsentinel_export
