#pragma once
// Unary RPCs over a GrpcQueue, served and called: the pieces every kubelet-facing server and
// client of ours repeats (arm a request, re-arm it when a call arrives, finish once; start a
// client call, hand its status and response to the loop). Library gns_grpc_server.

#include "loop/grpc_queue.hpp"

#include <grpcpp/server_context.h>
#include <grpcpp/support/async_unary_call.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <utility>

namespace gns {

// One unary call on the server side. The handler fills `response` and calls Finish once.
template <typename Request, typename Response>
class UnaryCall : public std::enable_shared_from_this<UnaryCall<Request, Response>> {
 public:
  explicit UnaryCall(GrpcQueue& queue) : queue_(queue) {}

  grpc::ServerContext context;
  Request request;
  Response response;

  // Sends `response` (status OK) or `status` alone. The thread that runs the handler, once;
  // a second call, or one after the server stopped, does nothing.
  void Finish(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    auto self = this->shared_from_this();
    // Keeps the call until gRPC is done with it. Released on the queue thread: waking the loop
    // only to drop a reference cost a loop wake-up per call (the kubelet's GetInfo probes).
    void* tag = GrpcQueue::Tag([self](bool) {}, GrpcQueue::On::kQueueThread);
    if (!queue_.Begin([&] { responder_.Finish(response, status, tag); })) GrpcQueue::Discard(tag);
  }
  bool Finished() const { return finished_; }

  grpc::ServerAsyncResponseWriter<Response>* Responder() { return &responder_; }

 private:
  GrpcQueue& queue_;
  grpc::ServerAsyncResponseWriter<Response> responder_{&context};
  bool finished_ = false;
};

// Keeps one call of a unary method requested on `queue`. `request(context, request, responder,
// cq, tag)` is the generated service's Request<Method> with the queue's ServerCompletionQueue
// bound in; `handle(call)` runs where `on` says for each call that arrives (after the next one
// is requested), and must Finish it. Stops when the server shuts down.
template <typename Request, typename Response, typename RequestFn, typename Handle>
void ServeUnary(GrpcQueue& queue, RequestFn request, Handle handle, GrpcQueue::On on = GrpcQueue::On::kLoop) {
  auto call = std::make_shared<UnaryCall<Request, Response>>(queue);
  void* tag = GrpcQueue::Tag(
      [&queue, call, request, handle, on](bool ok) {
        if (!ok) return;  // the server is shutting down: no call, nothing to re-arm
        ServeUnary<Request, Response>(queue, request, handle, on);
        handle(call);
      },
      on);
  if (!queue.Begin([&] { request(&call->context, &call->request, call->Responder(), tag); })) {
    GrpcQueue::Discard(tag);
  }
}

// One unary call on the client side: set up `context` (deadline, wait_for_ready) before Call.
template <typename Response>
struct ClientCall {
  grpc::ClientContext context;
  Response response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
};

// Starts `call` on `queue`: `prepare(context, cq)` is the stub's PrepareAsync<Method> with the
// request bound in; `done(call)` runs on the loop with `status` and `response` set. False (and
// `done` never runs) when the queue is shut down.
template <typename Response, typename Prepare, typename Done>
bool CallUnary(GrpcQueue& queue, std::shared_ptr<ClientCall<Response>> call, Prepare prepare, Done done) {
  void* tag = GrpcQueue::Tag([call, done = std::move(done)](bool) mutable { done(*call); });
  const bool started = queue.Begin([&] {
    call->reader = prepare(&call->context, queue.Cq());
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, tag);
  });
  if (!started) GrpcQueue::Discard(tag);
  return started;
}

}  // namespace gns
