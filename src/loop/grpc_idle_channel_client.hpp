#pragma once
// A client of one gRPC service for a module that calls now and then (the kubelet's pod
// resources on events, NVSentinel's connector per event): unary calls on gRPC's completion-queue
// API (loop/grpc_queue.hpp: a thread of the client's own blocks on the queue), so a call never
// blocks the loop; each with a deadline; the outcome posted to the loop.
//
// The channel is held only while calls are in flight. An idle gRPC channel is not free: gRPC's
// backup poller runs a timer every 5 s for each channel (about 0.45 wake-ups/s of the whole
// binary at rest, tools/idle-bench.sh). A new channel is one connect on a local socket, and it
// finds a restarted peer at once.
//
// Destroying the client cancels the calls in flight and waits (briefly: cancellation is local)
// until gRPC has let go of them; their outcomes are dropped. Loop thread only.
// Library gns_grpc_server (header-only template).

#include "loop/grpc_queue.hpp"
#include "loop/grpc_unary.hpp"
#include "loop/loop.hpp"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>

namespace gns {

template <typename Service>
class IdleChannelClient {
 public:
  using Stub = typename Service::Stub;
  // Adds the caller's channel arguments (message sizes, reconnect backoff) to ours.
  using TuneChannel = std::function<void(grpc::ChannelArguments&)>;

  // `target`: a gRPC target, "unix:/path".
  IdleChannelClient(Loop& loop, std::string target, TuneChannel tune = {}) : shared_(std::make_shared<Shared>()) {
    shared_->target = std::move(target);
    shared_->tune = std::move(tune);
    queue_ = std::make_unique<GrpcQueue>(loop, std::make_unique<grpc::CompletionQueue>());
  }

  ~IdleChannelClient() {
    shared_->alive = false;
    for (grpc::ClientContext* context : shared_->in_flight) context->TryCancel();
    // Cancellation completes on the queue thread without the loop: the queue's teardown (detach,
    // shut down, drain, join) waits only for that, and releases the calls there.
    queue_.reset();
  }

  IdleChannelClient(const IdleChannelClient&) = delete;
  IdleChannelClient& operator=(const IdleChannelClient&) = delete;

  // Starts one call that must end within `timeout`. `prepare(stub, context, cq)` is the stub's
  // PrepareAsync<Method> with the request bound in; `done(status, response)` runs on the loop
  // (never inline) unless the client is gone by then. False, and `done` never runs, when the
  // client's queue is shut down.
  template <typename Response, typename Prepare>
  bool Call(std::chrono::milliseconds timeout, Prepare prepare,
            std::function<void(const grpc::Status&, Response)> done) {
    auto call = std::make_shared<ClientCall<Response>>();
    call->context.set_deadline(std::chrono::system_clock::now() + timeout);
    const std::shared_ptr<Shared> shared = shared_;
    shared->in_flight.insert(&call->context);
    Stub& stub = shared->GetStub();
    const bool started = CallUnary<Response>(
        *queue_, call,
        [&stub, &prepare](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return prepare(stub, context, cq);
        },
        // The call holds its channel until gRPC has let go of it, even once Shared lets it go.
        [shared, channel = shared->channel, done = std::move(done)](ClientCall<Response>& finished) mutable {
          shared->in_flight.erase(&finished.context);
          shared->LetChannelGoWhenIdle();
          if (!shared->alive) return;
          done(finished.status, std::move(finished.response));
        });
    if (!started) {
      shared->in_flight.erase(&call->context);
      shared->LetChannelGoWhenIdle();
    }
    return started;
  }

  // Whether a channel is held now (tests: none at rest).
  bool HoldsChannel() const { return shared_->channel != nullptr; }

 private:
  // Loop thread only, but held by the calls in flight too (the channel must outlive them).
  struct Shared {
    std::string target;
    TuneChannel tune;
    std::set<grpc::ClientContext*> in_flight;
    bool alive = true;  // outcomes are dropped once the client is gone
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<Stub> stub;

    Stub& GetStub() {
      if (!stub) {
        grpc::ChannelArguments args;
        // Our own subchannel: a peer's restart is not hidden behind another client's backoff.
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        if (tune) tune(args);
        channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
        stub = Service::NewStub(channel);
      }
      return *stub;
    }
    void LetChannelGoWhenIdle() {
      if (!in_flight.empty()) return;
      stub.reset();
      channel.reset();
    }
  };

  std::shared_ptr<Shared> shared_;
  std::unique_ptr<GrpcQueue> queue_;
};

}  // namespace gns
