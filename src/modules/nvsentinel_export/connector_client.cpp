// PlatformConnector client over gRPC's completion-queue API: see connector_client.hpp.
#include "modules/nvsentinel_export/connector_client.hpp"

#include "loop/grpc_idle_channel_client.hpp"
#include "loop/grpc_status_text.hpp"
#include "nvsentinel/v1/api.grpc.pb.h"

#include <grpcpp/grpcpp.h>

namespace gns::nvsentinel_export {

std::string SocketPathOf(const std::string& target) {
  if (target.rfind("unix://", 0) == 0) return target.substr(7);
  if (target.rfind("unix:", 0) == 0) return target.substr(5);
  if (!target.empty() && target.front() == '/') return target;
  return {};
}

ConnectorClient::ConnectorClient(Loop& loop, const std::string& target)
    : target_("unix:" + SocketPathOf(target)),
      client_(std::make_unique<IdleChannelClient<datamodels::PlatformConnector>>(loop, target_)) {}

// Cancels the call in flight (IdleChannelClient's destructor).
ConnectorClient::~ConnectorClient() = default;

bool ConnectorClient::Send(const datamodels::HealthEvents& events, std::chrono::milliseconds deadline,
                           std::function<void(bool ok, std::string error)> done) {
  using Response = google::protobuf::Empty;
  return client_->Call<Response>(
      deadline,
      [&events](datamodels::PlatformConnector::Stub& stub, grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return stub.PrepareAsyncHealthEventOccurredV1(context, events, cq);
      },
      [done = std::move(done)](const grpc::Status& status, Response) {
        done(status.ok(), status.ok() ? std::string() : DescribeGrpcStatus(status));
      });
}

}  // namespace gns::nvsentinel_export
