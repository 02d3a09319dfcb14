// One thread per completion queue, forwarding completions to the loop.
#include "loop/grpc_queue.hpp"

#include <pthread.h>

#include <cstdlib>

namespace gns {

namespace {
// gRPC's "poll" engine, unless the operator chose one (GRPC_POLL_STRATEGY set, not empty). The
// default engine, epoll1, puts every socket of the process in one epoll set and hands the one
// poller's role from thread to thread: each connection to any of our servers (the kubelet's
// GetInfo probe every 10 s) woke all seven queue threads, about 1.8 wake-ups/s at rest of the
// 6.3 measured (tools/idle-bench.sh, shipped modules). With "poll" each queue's thread polls its
// own server's sockets: 0.2/s for all of them. Our servers carry a handful of kubelet calls, far
// below where epoll1's scaling matters. Set during static initialisation of this library, which
// every gRPC user of ours links, so before grpc_init reads it.
const bool kPollStrategyChosen = [] {
  const char* chosen = std::getenv("GRPC_POLL_STRATEGY");
  if (chosen != nullptr && *chosen != '\0') return true;
  return ::setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/1) == 0;
}();
}  // namespace

bool GrpcPollStrategyChosen() { return kPollStrategyChosen; }

struct GrpcQueue::Op {
  std::function<void(bool)> fn;
  On on;
};

GrpcQueue::GrpcQueue(Loop& loop, std::unique_ptr<grpc::CompletionQueue> cq)
    : cq_(std::move(cq)), link_(LoopLink::Make(loop)) {
  thread_ = std::thread([this] { Run(); });
  ::pthread_setname_np(thread_.native_handle(), "grpc-cq");
}

GrpcQueue::~GrpcQueue() {
  Detach();
  Shutdown();
  Join();
}

void* GrpcQueue::Tag(std::function<void(bool)> fn, On on) { return new Op{std::move(fn), on}; }

void GrpcQueue::Discard(void* tag) { delete static_cast<Op*>(tag); }

void GrpcQueue::Detach() {
  detached_->store(true);
  link_->Close();
}

void GrpcQueue::Shutdown() {
  std::lock_guard lock(mutex_);
  if (shut_down_) return;
  shut_down_ = true;
  cq_->Shutdown();
}

void GrpcQueue::Join() {
  if (thread_.joinable()) thread_.join();
}

void GrpcQueue::Run() {
  void* tag = nullptr;
  bool ok = false;
  // No deadline: this thread sleeps until an operation completes or the queue is shut down
  // and drained (Next returns false).
  while (cq_->Next(&tag, &ok)) {
    std::unique_ptr<Op> op(static_cast<Op*>(tag));
    if (op->on == On::kQueueThread) {
      op->fn(ok);
      continue;
    }
    // Dropped (and `fn` released here) once the owner detached from the loop.
    link_->Post([fn = std::move(op->fn), ok, detached = detached_] {
      if (!detached->load()) fn(ok);
    });
  }
}

}  // namespace gns
