// PodResourcesLister client over gRPC's callback API.
#include "modules/pod_resources/lister_client.hpp"

#include "podresources/v1/api.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <set>

namespace gns::pod_resources {

// What gRPC's threads and the loop share: the calls in flight (to cancel them) and whether the
// client still wants their outcomes.
struct ListerClient::Shared {
  std::mutex mutex;
  std::condition_variable idle;
  std::set<grpc::ClientContext*> in_flight;
  bool closed = false;
  // Loop-thread only: outcomes are dropped once the client is gone.
  bool alive = true;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub;
};

namespace {

std::string Describe(const grpc::Status& status) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  std::string text = code >= 0 && code <= 16 ? kNames[code] : "code " + std::to_string(code);
  if (!status.error_message().empty()) text += ": " + status.error_message();
  return text;
}

template <typename Response>
struct Call {
  grpc::ClientContext context;
  Response response;
};

}  // namespace

ListerClient::ListerClient(Loop& loop, std::string socket_path, std::chrono::milliseconds timeout)
    : loop_(loop), socket_path_(std::move(socket_path)), timeout_(timeout), shared_(std::make_shared<Shared>()) {
  grpc::ChannelArguments args;
  // Our own subchannel, and a short reconnect backoff: after a kubelet restart the socket is
  // back within seconds, and gRPC's default (1 s growing to 120 s) would keep us failing.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // The kubelet's answers are small, but a node with many pods must not hit the 4 MiB default
  // silently: the kubelet itself allows 16 MiB (podresources server options).
  args.SetMaxReceiveMessageSize(16 * 1024 * 1024);
  shared_->channel = grpc::CreateCustomChannel("unix:" + socket_path_, grpc::InsecureChannelCredentials(), args);
  shared_->stub = v1::PodResourcesLister::NewStub(shared_->channel);
}

ListerClient::~ListerClient() {
  shared_->alive = false;
  std::unique_lock lock(shared_->mutex);
  shared_->closed = true;
  for (grpc::ClientContext* context : shared_->in_flight) context->TryCancel();
  // Cancellation completes on gRPC's threads without the loop; the calls must end before the
  // channel (and the contexts they point at) can go.
  shared_->idle.wait(lock, [&] { return shared_->in_flight.empty(); });
  shared_->stub.reset();
  shared_->channel.reset();
}

// Starts one unary call through `start` and posts its outcome to the loop; the call leaves
// `in_flight` only after the post, so a destroyed client has no thread left touching the loop.
struct CallRunner {
  template <typename Response, typename Start>
  static void Run(Loop& loop, const std::shared_ptr<ListerClient::Shared>& shared, std::chrono::milliseconds timeout,
                  Start start, std::function<void(CallOutcome<Response>)> done) {
    auto call = std::make_shared<Call<Response>>();
    call->context.set_deadline(std::chrono::system_clock::now() + timeout);
    {
      std::lock_guard lock(shared->mutex);
      if (shared->closed) return;
      shared->in_flight.insert(&call->context);
    }
    start(&call->context, &call->response,
          [&loop, shared, call, done = std::move(done)](grpc::Status status) mutable {
            CallOutcome<Response> outcome;
            outcome.ok = status.ok();
            if (!status.ok()) outcome.error = Describe(status);
            outcome.response = std::move(call->response);
            loop.Post([shared, outcome = std::move(outcome), done = std::move(done)]() mutable {
              if (shared->alive) done(std::move(outcome));
            });
            std::lock_guard lock(shared->mutex);
            shared->in_flight.erase(&call->context);
            if (shared->in_flight.empty()) shared->idle.notify_all();
          });
  }
};

void ListerClient::List(std::function<void(CallOutcome<v1::ListPodResourcesResponse>)> done) {
  auto shared = shared_;
  CallRunner::Run<v1::ListPodResourcesResponse>(
      loop_, shared_, timeout_,
      [shared](grpc::ClientContext* context, v1::ListPodResourcesResponse* response,
               std::function<void(grpc::Status)> on_done) {
        static const v1::ListPodResourcesRequest kRequest;
        shared->stub->async()->List(context, &kRequest, response, std::move(on_done));
      },
      std::move(done));
}

void ListerClient::GetAllocatableResources(std::function<void(CallOutcome<v1::AllocatableResourcesResponse>)> done) {
  auto shared = shared_;
  CallRunner::Run<v1::AllocatableResourcesResponse>(
      loop_, shared_, timeout_,
      [shared](grpc::ClientContext* context, v1::AllocatableResourcesResponse* response,
               std::function<void(grpc::Status)> on_done) {
        static const v1::AllocatableResourcesRequest kRequest;
        shared->stub->async()->GetAllocatableResources(context, &kRequest, response, std::move(on_done));
      },
      std::move(done));
}

}  // namespace gns::pod_resources
