// PodResourcesLister client over gRPC's completion-queue API.
#include "modules/pod_resources/lister_client.hpp"

#include "podresources/v1/api.grpc.pb.h"

#include "loop/grpc_unary.hpp"

#include <grpcpp/grpcpp.h>

#include <set>

namespace gns::pod_resources {

// Loop thread only, but held by the calls in flight too (the channel must outlive them).
struct ListerClient::Shared {
  std::string target;
  std::set<grpc::ClientContext*> in_flight;
  bool alive = true;  // outcomes are dropped once the client is gone
  // Only while calls are in flight (see Stub()).
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub;

  // The channel for the next call, made when none is held. It is let go once no call is in
  // flight: the module lists on events, so the channel would sit idle between them, and an idle
  // gRPC channel is not free: gRPC's backup poller runs a timer every 5 s for each channel
  // (about 0.45 wake-ups/s of the whole binary at rest, tools/idle-bench.sh). A new channel is
  // one connect on a local socket, and it finds a restarted kubelet at once.
  v1::PodResourcesLister::Stub& Stub() {
    if (!stub) {
      grpc::ChannelArguments args;
      // Our own subchannel; a short reconnect backoff for a call that waits for the socket.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // The kubelet's answers are small, but a node with many pods must not hit the 4 MiB
      // default silently: the kubelet itself allows 16 MiB (podresources server options).
      args.SetMaxReceiveMessageSize(16 * 1024 * 1024);
      channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
      stub = v1::PodResourcesLister::NewStub(channel);
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

}  // namespace

ListerClient::ListerClient(Loop& loop, std::string socket_path, std::chrono::milliseconds timeout)
    : loop_(loop), socket_path_(std::move(socket_path)), timeout_(timeout), shared_(std::make_shared<Shared>()) {
  shared_->target = "unix:" + socket_path_;
  queue_ = std::make_unique<GrpcQueue>(loop_, std::make_unique<grpc::CompletionQueue>());
}

ListerClient::~ListerClient() {
  shared_->alive = false;
  for (grpc::ClientContext* context : shared_->in_flight) context->TryCancel();
  // Cancellation completes on the queue thread without the loop: the queue's teardown (detach,
  // shut down, drain, join) waits only for that, and releases the calls there.
  queue_.reset();
}

// Starts one unary call through `prepare` on the client's queue; its outcome runs `done` on the
// loop unless the client is gone by then.
struct CallRunner {
  template <typename Response, typename Prepare>
  static void Run(GrpcQueue& queue, const std::shared_ptr<ListerClient::Shared>& shared,
                  std::chrono::milliseconds timeout, Prepare prepare,
                  std::function<void(CallOutcome<Response>)> done) {
    auto call = std::make_shared<ClientCall<Response>>();
    call->context.set_deadline(std::chrono::system_clock::now() + timeout);
    shared->in_flight.insert(&call->context);
    // The call holds its channel until gRPC has let go of it, even once Shared lets it go.
    v1::PodResourcesLister::Stub& stub = shared->Stub();
    const bool started = CallUnary<Response>(
        queue, call, [&stub, &prepare](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return prepare(stub, context, cq);
        },
        [shared, channel = shared->channel, done = std::move(done)](ClientCall<Response>& finished) mutable {
          shared->in_flight.erase(&finished.context);
          shared->LetChannelGoWhenIdle();
          if (!shared->alive) return;
          CallOutcome<Response> outcome;
          outcome.ok = finished.status.ok();
          if (!outcome.ok) outcome.error = Describe(finished.status);
          outcome.response = std::move(finished.response);
          done(std::move(outcome));
        });
    if (!started) {
      shared->in_flight.erase(&call->context);
      shared->LetChannelGoWhenIdle();
    }
  }
};

void ListerClient::List(std::function<void(CallOutcome<v1::ListPodResourcesResponse>)> done) {
  CallRunner::Run<v1::ListPodResourcesResponse>(
      *queue_, shared_, timeout_,
      [](v1::PodResourcesLister::Stub& stub, grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return stub.PrepareAsyncList(context, v1::ListPodResourcesRequest(), cq);
      },
      std::move(done));
}

void ListerClient::GetAllocatableResources(std::function<void(CallOutcome<v1::AllocatableResourcesResponse>)> done) {
  CallRunner::Run<v1::AllocatableResourcesResponse>(
      *queue_, shared_, timeout_,
      [](v1::PodResourcesLister::Stub& stub, grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return stub.PrepareAsyncGetAllocatableResources(context, v1::AllocatableResourcesRequest(), cq);
      },
      std::move(done));
}

}  // namespace gns::pod_resources
