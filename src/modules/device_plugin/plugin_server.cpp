// gRPC async (completion-queue) service for the device plugin.
#include "modules/device_plugin/plugin_server.hpp"

#include "loop/grpc_unary.hpp"

#include <stdexcept>

namespace gns::device_plugin {

class ListAndWatchStream;

struct PluginServer::Shared {
  Handlers handlers;
  bool alive = true;  // loop thread, as everything below
  std::set<ListAndWatchStream*> streams;
  // The Register call in flight, to cancel at shutdown.
  std::shared_ptr<ClientCall<v1beta1::Empty>> registering;
};

namespace {

grpc::Status Guarded(const std::function<grpc::Status()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("device plugin error: ") + e.what());
  }
}

const grpc::Status kStopping(grpc::StatusCode::UNAVAILABLE, "device plugin is stopping");

}  // namespace

// One kubelet ListAndWatch stream, loop thread only. Each operation in flight (the write, the
// finish, the call's end) holds the stream through its tag; the stream goes with the last one.
class ListAndWatchStream final : public std::enable_shared_from_this<ListAndWatchStream> {
 public:
  ListAndWatchStream(GrpcQueue& queue, std::shared_ptr<PluginServer::Shared> shared)
      : queue_(queue), shared_(std::move(shared)) {}

  // Requests the next ListAndWatch call on `server_cq`; re-armed as each one arrives.
  static void Serve(GrpcQueue& queue, grpc::ServerCompletionQueue* server_cq, v1beta1::DevicePlugin::AsyncService& service,
                    const std::shared_ptr<PluginServer::Shared>& shared) {
    auto stream = std::make_shared<ListAndWatchStream>(queue, shared);
    // The end of the call (finished, cancelled, the kubelet gone). gRPC delivers it only for a
    // call that arrived; for a request that ends without one it is ours to give back.
    void* done_tag = GrpcQueue::Tag([stream](bool) { stream->OnDone(); });
    stream->context_.AsyncNotifyWhenDone(done_tag);
    void* tag = GrpcQueue::Tag([&queue, server_cq, &service, shared, stream, done_tag](bool ok) {
      if (!ok) {
        GrpcQueue::Discard(done_tag);  // the server is shutting down: no call
        return;
      }
      Serve(queue, server_cq, service, shared);
      stream->OnStarted();
    });
    const bool started = queue.Begin([&] {
      service.RequestListAndWatch(&stream->context_, &stream->request_, &stream->writer_, server_cq, server_cq, tag);
    });
    if (!started) {
      GrpcQueue::Discard(tag);
      GrpcQueue::Discard(done_tag);
    }
  }

  void Send(const v1beta1::ListAndWatchResponse& list) {
    if (finished_ || closing_ || done_) return;
    if (writing_) {
      pending_ = list;  // only the newest full list matters
      has_pending_ = true;
      return;
    }
    current_ = list;
    writing_ = true;
    auto self = shared_from_this();
    void* tag = GrpcQueue::Tag([self](bool ok) { self->OnWriteDone(ok); });
    if (!queue_.Begin([&] { writer_.Write(current_, tag); })) {
      GrpcQueue::Discard(tag);
      writing_ = false;
      finished_ = true;  // the queue is shut down: nothing more goes out
    }
  }

  // The server is stopping. A stream left open would hold the gRPC server's Shutdown until its
  // deadline (1 s per endpoint on every SIGTERM); end it now, after the write in flight if any.
  void Close() {
    closing_ = true;
    has_pending_ = false;
    if (!writing_) FinishOnce(kStopping);
  }

 private:
  void OnStarted() {
    if (!shared_->alive) {
      FinishOnce(kStopping);
      return;
    }
    shared_->streams.insert(this);
    Send(shared_->handlers.current_list());
  }

  // At most one write or finish in flight: Finish waits for the write to complete.
  void FinishOnce(const grpc::Status& status) {
    if (finished_ || done_) return;
    finished_ = true;
    auto self = shared_from_this();
    void* tag = GrpcQueue::Tag([self](bool) {});
    if (!queue_.Begin([&] { writer_.Finish(status, tag); })) GrpcQueue::Discard(tag);
  }

  void OnWriteDone(bool ok) {
    writing_ = false;
    if (!ok) {
      FinishOnce(grpc::Status::OK);  // the kubelet went away
      return;
    }
    if (closing_) {
      FinishOnce(kStopping);
      return;
    }
    if (has_pending_) {
      has_pending_ = false;
      Send(pending_);
    }
  }

  // The call is over (our Finish went out, or the kubelet cancelled or went away): no more
  // operations start; a write in flight completes with ok = false.
  void OnDone() {
    done_ = true;
    shared_->streams.erase(this);
  }

  GrpcQueue& queue_;
  std::shared_ptr<PluginServer::Shared> shared_;
  grpc::ServerContext context_;
  v1beta1::Empty request_;
  grpc::ServerAsyncWriter<v1beta1::ListAndWatchResponse> writer_{&context_};
  v1beta1::ListAndWatchResponse current_;
  v1beta1::ListAndWatchResponse pending_;
  bool has_pending_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool closing_ = false;
  bool done_ = false;
};

class PluginServer::Service final : public v1beta1::DevicePlugin::AsyncService {};

PluginServer::PluginServer(Loop& loop, Handlers handlers) : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->handlers = std::move(handlers);
}

PluginServer::~PluginServer() {
  shared_->alive = false;
  shared_->streams.clear();
  if (shared_->registering) shared_->registering->context.TryCancel();
}

void PluginServer::Start(const std::string& path) {
  service_ = std::make_shared<Service>();
  server_.Start(loop_, path, {service_.get()}, "the device plugin");
  GrpcQueue& queue = server_.Queue();
  grpc::ServerCompletionQueue* cq = server_.ServerCq();
  Service& service = *service_;
  auto shared = shared_;
  constexpr auto kQueueThread = GrpcQueue::On::kQueueThread;

  // Fixed answers: on the queue thread, without the loop.
  ServeUnary<v1beta1::Empty, v1beta1::DevicePluginOptions>(
      queue,
      [&service, cq](grpc::ServerContext* context, v1beta1::Empty* request,
                     grpc::ServerAsyncResponseWriter<v1beta1::DevicePluginOptions>* responder, void* tag) {
        service.RequestGetDevicePluginOptions(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        call->response = shared->handlers.options;  // fixed at construction
        call->Finish(grpc::Status::OK);
      },
      kQueueThread);
  ServeUnary<v1beta1::PreStartContainerRequest, v1beta1::PreStartContainerResponse>(
      queue,
      [&service, cq](grpc::ServerContext* context, v1beta1::PreStartContainerRequest* request,
                     grpc::ServerAsyncResponseWriter<v1beta1::PreStartContainerResponse>* responder, void* tag) {
        service.RequestPreStartContainer(context, request, responder, cq, cq, tag);
      },
      // We never ask for it (pre_start_required = false); accept it anyway.
      [](const auto& call) { call->Finish(grpc::Status::OK); }, kQueueThread);

  // Module state: on the loop.
  ServeUnary<v1beta1::AllocateRequest, v1beta1::AllocateResponse>(
      queue,
      [&service, cq](grpc::ServerContext* context, v1beta1::AllocateRequest* request,
                     grpc::ServerAsyncResponseWriter<v1beta1::AllocateResponse>* responder, void* tag) {
        service.RequestAllocate(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        if (!shared->alive) return call->Finish(kStopping);
        call->Finish(Guarded([&] { return shared->handlers.allocate(call->request, &call->response); }));
      });
  ServeUnary<v1beta1::PreferredAllocationRequest, v1beta1::PreferredAllocationResponse>(
      queue,
      [&service, cq](grpc::ServerContext* context, v1beta1::PreferredAllocationRequest* request,
                     grpc::ServerAsyncResponseWriter<v1beta1::PreferredAllocationResponse>* responder, void* tag) {
        service.RequestGetPreferredAllocation(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        if (!shared->alive) return call->Finish(kStopping);
        call->Finish(Guarded([&] { return shared->handlers.preferred(call->request, &call->response); }));
      });
  ListAndWatchStream::Serve(queue, cq, service, shared_);
}

void PluginServer::Broadcast(const v1beta1::ListAndWatchResponse& list) {
  for (auto* stream : shared_->streams) stream->Send(list);
}

std::size_t PluginServer::OpenStreams() const { return shared_->streams.size(); }

void PluginServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  shared_->alive = false;
  // Close may end a stream (and take it out of the set): iterate over a copy.
  const auto streams = shared_->streams;
  for (auto* stream : streams) stream->Close();
  if (shared_->registering) shared_->registering->context.TryCancel();
  server_.Shutdown(pool, loop_, std::move(service_), std::move(done));
}

void PluginServer::Register(const std::string& kubelet_socket, const v1beta1::RegisterRequest& request,
                            std::chrono::milliseconds timeout, std::function<void(const grpc::Status&)> done) {
  if (!server_.Running()) {
    loop_.Post([done = std::move(done)] { done(kStopping); });
    return;
  }
  struct Client {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1beta1::Registration::Stub> stub;
  };
  auto client = std::make_shared<Client>();
  // The caller dials only once kubelet.sock listens; should the kubelet go away in between, the
  // next try comes after gRPC's shortest reconnect backoff (100 ms), not its default second. A
  // channel of its own: no subchannel (and backoff state) shared with an earlier call's.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  client->channel = grpc::CreateCustomChannel("unix://" + kubelet_socket, grpc::InsecureChannelCredentials(), args);
  client->stub = v1beta1::Registration::NewStub(client->channel);
  auto call = std::make_shared<ClientCall<v1beta1::Empty>>();
  call->context.set_deadline(std::chrono::system_clock::now() + timeout);
  call->context.set_wait_for_ready(true);  // the kubelet may be a moment from serving
  shared_->registering = call;
  auto finish = std::make_shared<std::function<void(const grpc::Status&)>>(std::move(done));
  const bool started = CallUnary<v1beta1::Empty>(
      server_.Queue(), call,
      [client, request](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
        return client->stub->PrepareAsyncRegister(context, request, cq);
      },
      // The channel and stub die with this function, on the loop, once the call is over.
      [shared = shared_, client, finish](ClientCall<v1beta1::Empty>& finished) {
        if (shared->registering.get() == &finished) shared->registering.reset();
        (*finish)(finished.status);
      });
  if (!started) {
    shared_->registering.reset();
    loop_.Post([finish] { (*finish)(kStopping); });
  }
}

}  // namespace gns::device_plugin
