// gRPC callback service for the device plugin.
#include "modules/device_plugin/plugin_server.hpp"

#include <stdexcept>

namespace gns::device_plugin {

struct PluginServer::Shared {
  Handlers handlers;
  bool alive = true;
  std::set<class ListAndWatchStream*> streams;
};

namespace {

grpc::Status Guarded(const std::function<grpc::Status()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("device plugin error: ") + e.what());
  }
}

}  // namespace

// One kubelet ListAndWatch stream. Reactions only post to the loop; the loop owns the state.
class ListAndWatchStream final : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
 public:
  ListAndWatchStream(Loop& loop, std::shared_ptr<PluginServer::Shared> shared)
      : loop_(loop), shared_(std::move(shared)) {
    loop_.Post([this] {
      if (!shared_->alive) {
        FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "device plugin is stopping"));
        return;
      }
      shared_->streams.insert(this);
      Send(shared_->handlers.current_list());
    });
  }

  // Loop thread.
  void Send(const v1beta1::ListAndWatchResponse& list) {
    if (finished_ || closing_) return;
    if (writing_) {
      pending_ = list;  // only the newest full list matters
      has_pending_ = true;
      return;
    }
    current_ = list;
    writing_ = true;
    StartWrite(&current_);
  }

  // Loop thread: the server is stopping. A stream left open would hold the gRPC server's
  // Shutdown until its deadline (1 s per endpoint on every SIGTERM); end it now, after the
  // write in flight if there is one.
  void Close() {
    closing_ = true;
    has_pending_ = false;
    if (!writing_) FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "device plugin is stopping"));
  }

  void FinishOnce(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  void OnWriteDone(bool ok) override {
    loop_.Post([this, ok] {
      writing_ = false;
      if (!ok) {
        FinishOnce(grpc::Status::OK);  // the kubelet went away
        return;
      }
      if (closing_) {
        FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "device plugin is stopping"));
        return;
      }
      if (has_pending_) {
        has_pending_ = false;
        Send(pending_);
      }
    });
  }

  void OnCancel() override {
    loop_.Post([this] { FinishOnce(grpc::Status::CANCELLED); });
  }

  void OnDone() override {
    loop_.Post([this] {
      shared_->streams.erase(this);
      delete this;
    });
  }

 private:
  Loop& loop_;
  std::shared_ptr<PluginServer::Shared> shared_;
  v1beta1::ListAndWatchResponse current_;
  v1beta1::ListAndWatchResponse pending_;
  bool has_pending_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool closing_ = false;
};

class PluginServer::Service final : public v1beta1::DevicePlugin::CallbackService {
 public:
  Service(Loop& loop, std::shared_ptr<Shared> shared) : loop_(loop), shared_(std::move(shared)) {}

  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* context, const v1beta1::Empty*,
                                                   v1beta1::DevicePluginOptions* response) override {
    auto* reactor = context->DefaultReactor();
    // Options are fixed at construction: no loop state involved.
    *response = shared_->handlers.options;
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(grpc::CallbackServerContext*,
                                                                         const v1beta1::Empty*) override {
    return new ListAndWatchStream(loop_, shared_);
  }

  grpc::ServerUnaryReactor* GetPreferredAllocation(grpc::CallbackServerContext* context,
                                                   const v1beta1::PreferredAllocationRequest* request,
                                                   v1beta1::PreferredAllocationResponse* response) override {
    auto* reactor = context->DefaultReactor();
    loop_.Post([shared = shared_, request, response, reactor] {
      if (!shared->alive) {
        reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "device plugin is stopping"));
        return;
      }
      reactor->Finish(Guarded([&] { return shared->handlers.preferred(*request, response); }));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context, const v1beta1::AllocateRequest* request,
                                     v1beta1::AllocateResponse* response) override {
    auto* reactor = context->DefaultReactor();
    loop_.Post([shared = shared_, request, response, reactor] {
      if (!shared->alive) {
        reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "device plugin is stopping"));
        return;
      }
      reactor->Finish(Guarded([&] { return shared->handlers.allocate(*request, response); }));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* PreStartContainer(grpc::CallbackServerContext* context,
                                              const v1beta1::PreStartContainerRequest*,
                                              v1beta1::PreStartContainerResponse*) override {
    // We never ask for it (pre_start_required = false); accept it anyway.
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
};

PluginServer::PluginServer(Loop& loop, Handlers handlers) : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->handlers = std::move(handlers);
}

PluginServer::~PluginServer() { shared_->alive = false; }

void PluginServer::Start(const std::string& path) {
  service_ = std::make_shared<Service>(loop_, shared_);
  server_.Start(path, {service_.get()}, "the device plugin");
}

void PluginServer::Broadcast(const v1beta1::ListAndWatchResponse& list) {
  for (auto* stream : shared_->streams) stream->Send(list);
}

std::size_t PluginServer::OpenStreams() const { return shared_->streams.size(); }

void PluginServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  shared_->alive = false;
  for (auto* stream : shared_->streams) stream->Close();
  server_.Shutdown(pool, loop_, std::move(service_), std::move(done));
}

void RegisterWithKubelet(Loop& loop, const std::string& kubelet_socket, const v1beta1::RegisterRequest& request,
                         std::chrono::milliseconds timeout, std::function<void(const grpc::Status&)> done) {
  struct Call {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1beta1::Registration::Stub> stub;
    grpc::ClientContext context;
    v1beta1::RegisterRequest request;
    v1beta1::Empty response;
  };
  auto call = std::make_shared<Call>();
  // The caller dials only once kubelet.sock listens; should the kubelet go away in between, the
  // next try comes after gRPC's shortest reconnect backoff (100 ms), not its default second. A
  // channel of its own: no subchannel (and backoff state) shared with an earlier call's.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  call->channel = grpc::CreateCustomChannel("unix://" + kubelet_socket, grpc::InsecureChannelCredentials(), args);
  call->stub = v1beta1::Registration::NewStub(call->channel);
  call->request = request;
  call->context.set_deadline(std::chrono::system_clock::now() + timeout);
  call->context.set_wait_for_ready(true);  // the kubelet may be a moment from serving
  call->stub->async()->Register(&call->context, &call->request, &call->response,
                                [&loop, call, done = std::move(done)](grpc::Status status) mutable {
                                  // gRPC thread: hand the result to the loop; the call
                                  // object dies with this lambda there.
                                  loop.Post([call, status, done = std::move(done)] { done(status); });
                                });
}

}  // namespace gns::device_plugin
