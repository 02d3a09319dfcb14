#pragma once
// gRPC's completion-queue (async) API on our loop: one thread of ours blocks in
// CompletionQueue::Next() (no deadline: it sleeps until an operation completes) and hands each
// completion to the loop with a post, where the call's code runs as it did under the callback
// API. We do not use the callback API: with gRPC 1.51 it starts its own "nexting" threads
// (cores/2, 2..16) that wake about once a second each, at rest, and cannot be configured.
//
// Each operation we start carries a tag made by Tag(fn): `fn(ok)` runs on the loop when the
// operation completes (or, for the few answers that need no loop state, on the queue thread).
// Every tag handed to gRPC comes back exactly once from Next, also at shutdown (ok = false), so
// what `fn` holds (a shared_ptr to the call) is released exactly once: on the loop, or on the
// queue thread when the loop no longer takes posts (Detach, or a blocking teardown).
//
// Shutdown: no operation may start on a queue that is shut down (gRPC aborts), so every start
// goes through Begin(), which refuses once Shutdown() ran; Shutdown() is called only after the
// server (if any) is shut down, then Join() waits for the thread, which drains what is left.
// Library gns_grpc_server.

#include "loop/loop.hpp"
#include "loop/loop_link.hpp"

#include <grpcpp/completion_queue.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace gns {

// Whether this library set gRPC's poll engine (GRPC_POLL_STRATEGY=poll unless already set) before
// gRPC started; see grpc_queue.cpp for why.
bool GrpcPollStrategyChosen();

class GrpcQueue {
 public:
  // Where a tag's function runs.
  enum class On { kLoop, kQueueThread };

  // Takes `cq` (a server's ServerCompletionQueue or a plain one for clients) and starts the
  // thread that waits on it.
  GrpcQueue(Loop& loop, std::unique_ptr<grpc::CompletionQueue> cq);
  // Blocking: detaches from the loop, shuts the queue down and joins the thread. A server using
  // the queue must be shut down first.
  ~GrpcQueue();
  GrpcQueue(const GrpcQueue&) = delete;
  GrpcQueue& operator=(const GrpcQueue&) = delete;

  grpc::CompletionQueue* Cq() const { return cq_.get(); }

  // A tag for one operation: `fn(ok)` runs where `on` says once it completes. Hand it to gRPC
  // inside Begin(); a tag that is not handed to gRPC must be given back with Discard().
  static void* Tag(std::function<void(bool ok)> fn, On on = On::kLoop);
  static void Discard(void* tag);

  // Any thread: runs `start` (which starts gRPC operations on this queue) unless the queue is
  // shut down; returns whether it ran.
  template <typename Start>
  bool Begin(Start&& start) {
    std::lock_guard lock(mutex_);
    if (shut_down_) return false;
    std::forward<Start>(start)();
    return true;
  }

  // Any thread: no operation starts after this; the thread drains what is in flight and ends.
  void Shutdown();
  // Off the loop (it waits for completions the loop may have to react to): waits for the thread.
  void Join();
  // Completions after this are not run: those not posted yet are released on the queue thread,
  // those posted already are released on the loop without running.
  void Detach();

 private:
  struct Op;
  void Run();

  std::unique_ptr<grpc::CompletionQueue> cq_;
  std::shared_ptr<LoopLink> link_;
  std::shared_ptr<std::atomic<bool>> detached_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mutex_;
  bool shut_down_ = false;
  std::thread thread_;
};

}  // namespace gns
