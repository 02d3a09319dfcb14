// PodResourcesLister client over gRPC's completion-queue API.
#include "modules/pod_resources/lister_client.hpp"

#include "podresources/v1/api.grpc.pb.h"

#include "loop/grpc_idle_channel_client.hpp"
#include "loop/grpc_status_text.hpp"

#include <grpcpp/grpcpp.h>

namespace gns::pod_resources {

namespace {

// Starts one call through `prepare`; its outcome runs `done` on the loop unless the client is
// gone by then.
template <typename Response, typename Prepare>
void Run(IdleChannelClient<v1::PodResourcesLister>& client, std::chrono::milliseconds timeout, Prepare prepare,
         std::function<void(CallOutcome<Response>)> done) {
  client.Call<Response>(timeout, std::move(prepare),
                        [done = std::move(done)](const grpc::Status& status, Response response) {
                          CallOutcome<Response> outcome;
                          outcome.ok = status.ok();
                          if (!outcome.ok) outcome.error = DescribeGrpcStatus(status);
                          outcome.response = std::move(response);
                          done(std::move(outcome));
                        });
}

}  // namespace

ListerClient::ListerClient(Loop& loop, std::string socket_path, std::chrono::milliseconds timeout)
    : socket_path_(std::move(socket_path)), timeout_(timeout) {
  client_ = std::make_unique<IdleChannelClient<v1::PodResourcesLister>>(
      loop, "unix:" + socket_path_, [](grpc::ChannelArguments& args) {
        // A short reconnect backoff for a call that waits for the socket.
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
        args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        // The kubelet's answers are small, but a node with many pods must not hit the 4 MiB
        // default silently: the kubelet itself allows 16 MiB (podresources server options).
        args.SetMaxReceiveMessageSize(16 * 1024 * 1024);
      });
}

// Cancels the calls in flight (IdleChannelClient's destructor).
ListerClient::~ListerClient() = default;

void ListerClient::List(std::function<void(CallOutcome<v1::ListPodResourcesResponse>)> done) {
  Run<v1::ListPodResourcesResponse>(
      *client_, timeout_,
      [](v1::PodResourcesLister::Stub& stub, grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return stub.PrepareAsyncList(context, v1::ListPodResourcesRequest(), cq);
      },
      std::move(done));
}

void ListerClient::GetAllocatableResources(std::function<void(CallOutcome<v1::AllocatableResourcesResponse>)> done) {
  Run<v1::AllocatableResourcesResponse>(
      *client_, timeout_,
      [](v1::PodResourcesLister::Stub& stub, grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return stub.PrepareAsyncGetAllocatableResources(context, v1::AllocatableResourcesRequest(), cq);
      },
      std::move(done));
}

}  // namespace gns::pod_resources
