// One thread per completion queue, forwarding completions to the loop.
#include "loop/grpc_queue.hpp"

#include <pthread.h>

namespace gns {

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
