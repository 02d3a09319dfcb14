// v1alpha1.DRAResourceHealth / NodeWatchResources (KEP-4680) on the DRA socket.
#include "dra_plugin/health_service.hpp"

#include "dra_health/v1alpha1/api.grpc.pb.h"

#include <set>

namespace gns::dra {

namespace {

namespace health_api = ::v1alpha1;

health_api::HealthStatus ToWire(DeviceHealthStatus status) {
  switch (status) {
    case DeviceHealthStatus::kHealthy:
      return health_api::HEALTHY;
    case DeviceHealthStatus::kUnhealthy:
      return health_api::UNHEALTHY;
    case DeviceHealthStatus::kUnknown:
      break;
  }
  return health_api::UNKNOWN;
}

health_api::NodeWatchResourcesResponse ToWire(const DeviceHealthList& list) {
  health_api::NodeWatchResourcesResponse out;
  for (const auto& entry : list) {
    auto* device = out.add_devices();
    device->mutable_device()->set_pool_name(entry.pool_name);
    device->mutable_device()->set_device_name(entry.device_name);
    device->set_health(ToWire(entry.status));
    device->set_last_updated_time(entry.last_updated_unix_s);
  }
  return out;
}

class HealthStream;

}  // namespace

class HealthService::AsyncService final : public health_api::DRAResourceHealth::AsyncService {};

struct HealthService::Shared {
  std::function<DeviceHealthList()> current;
  bool alive = true;  // loop thread, as everything below
  std::set<HealthStream*> streams;
  bool have_last = false;
  DeviceHealthList last;  // the list the open streams were last sent
  uint64_t sent = 0;
};

namespace {

// One kubelet NodeWatchResources stream, loop thread only. Each operation in flight (the write,
// the finish, the call's end) holds the stream through its tag; the stream goes with the last.
class HealthStream final : public std::enable_shared_from_this<HealthStream> {
 public:
  HealthStream(GrpcQueue& queue, std::shared_ptr<HealthService::Shared> shared)
      : queue_(queue), shared_(std::move(shared)) {}

  // Requests the next call on `server_cq`; re-armed as each one arrives.
  static void Serve(GrpcQueue& queue, grpc::ServerCompletionQueue* server_cq, health_api::DRAResourceHealth::AsyncService& service,
                    const std::shared_ptr<HealthService::Shared>& shared) {
    auto stream = std::make_shared<HealthStream>(queue, shared);
    // gRPC delivers the end of a call only for a call that arrived: for a request that ends
    // without one the tag is ours to give back.
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
      service.RequestNodeWatchResources(&stream->context_, &stream->request_, &stream->writer_, server_cq, server_cq,
                                        tag);
    });
    if (!started) {
      GrpcQueue::Discard(tag);
      GrpcQueue::Discard(done_tag);
    }
  }

  void Send(const health_api::NodeWatchResourcesResponse& list) {
    if (finished_ || closing_ || done_) return;
    if (writing_) {
      pending_ = list;  // only the newest complete list matters
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
    } else {
      ++shared_->sent;
    }
  }

  // The DRA server is stopping: an open stream would hold Server::Shutdown until its deadline.
  // The kubelet reads a clean end and dials again once we are back.
  void Close() {
    closing_ = true;
    has_pending_ = false;
    if (!writing_) FinishOnce(grpc::Status::OK);
  }

 private:
  void OnStarted() {
    if (!shared_->alive) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    shared_->streams.insert(this);
    DeviceHealthList list = shared_->current();
    if (!shared_->have_last) {
      shared_->last = list;
      shared_->have_last = true;
    }
    Send(ToWire(list));
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
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (has_pending_) {
      has_pending_ = false;
      Send(pending_);
    }
  }

  // The call is over (our Finish went out, or the kubelet cancelled or went away).
  void OnDone() {
    done_ = true;
    shared_->streams.erase(this);
  }

  GrpcQueue& queue_;
  std::shared_ptr<HealthService::Shared> shared_;
  grpc::ServerContext context_;
  health_api::NodeWatchResourcesRequest request_;
  grpc::ServerAsyncWriter<health_api::NodeWatchResourcesResponse> writer_{&context_};
  health_api::NodeWatchResourcesResponse current_;
  health_api::NodeWatchResourcesResponse pending_;
  bool has_pending_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool closing_ = false;
  bool done_ = false;
};

}  // namespace

HealthService::HealthService(std::function<DeviceHealthList()> current)
    : shared_(std::make_shared<Shared>()), service_(std::make_unique<AsyncService>()) {
  shared_->current = std::move(current);
}

HealthService::~HealthService() { Detach(); }

grpc::Service* HealthService::Service() { return service_.get(); }

void HealthService::Serve(GrpcQueue& queue, grpc::ServerCompletionQueue* server_cq) {
  HealthStream::Serve(queue, server_cq, *service_, shared_);
}

void HealthService::Update() {
  if (!shared_->alive) return;
  DeviceHealthList list = shared_->current();
  if (shared_->have_last && list == shared_->last) return;
  shared_->last = list;
  shared_->have_last = true;
  const auto message = ToWire(list);
  for (auto* stream : shared_->streams) stream->Send(message);
}

void HealthService::Close() {
  shared_->alive = false;
  // Close may end a stream (and take it out of the set): iterate over a copy.
  const auto streams = shared_->streams;
  for (auto* stream : streams) stream->Close();
}

void HealthService::Detach() {
  shared_->alive = false;
  shared_->streams.clear();
}

std::size_t HealthService::OpenStreams() const { return shared_->streams.size(); }

uint64_t HealthService::MessagesSent() const { return shared_->sent; }

}  // namespace gns::dra
