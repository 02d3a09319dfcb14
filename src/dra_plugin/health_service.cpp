// DRAResourceHealth / NodeWatchResources (KEP-4680) on the DRA socket, in v1, v1beta1 and v1alpha1.
#include "dra_plugin/health_service.hpp"

#include "dra_health/v1/api.grpc.pb.h"
#include "dra_health/v1alpha1/api.grpc.pb.h"
#include "dra_health/v1beta1/api.grpc.pb.h"
#include "loop/wake_grid.hpp"

#include <boost/asio/steady_timer.hpp>

#include <set>

namespace gns::dra {

namespace {

// One version of the service: its generated types, and whether its reports carry a timeout and a
// message (v1beta1 and v1 do).
template <typename AsyncServiceT, typename RequestT, typename ResponseT, typename StatusT, StatusT kUnknownV,
          StatusT kHealthyV, StatusT kUnhealthyV, bool kDetailsV>
struct HealthApi {
  using AsyncService = AsyncServiceT;
  using Request = RequestT;
  using Response = ResponseT;
  static constexpr bool kDetails = kDetailsV;
  static StatusT ToWire(DeviceHealthStatus status) {
    switch (status) {
      case DeviceHealthStatus::kHealthy:
        return kHealthyV;
      case DeviceHealthStatus::kUnhealthy:
        return kUnhealthyV;
      case DeviceHealthStatus::kUnknown:
        break;
    }
    return kUnknownV;
  }
};

using HealthV1 = HealthApi<::v1::DRAResourceHealth::AsyncService, ::v1::NodeWatchResourcesRequest, ::v1::NodeWatchResourcesResponse,
               ::v1::HealthStatus, ::v1::UNKNOWN, ::v1::HEALTHY, ::v1::UNHEALTHY, true>;
using HealthV1beta1 = HealthApi<::v1beta1::DRAResourceHealth::AsyncService, ::v1beta1::NodeWatchResourcesRequest,
                    ::v1beta1::NodeWatchResourcesResponse, ::v1beta1::HealthStatus, ::v1beta1::UNKNOWN,
                    ::v1beta1::HEALTHY, ::v1beta1::UNHEALTHY, true>;
using HealthV1alpha1 = HealthApi<::v1alpha1::DRAResourceHealth::AsyncService, ::v1alpha1::NodeWatchResourcesRequest,
                     ::v1alpha1::NodeWatchResourcesResponse, ::v1alpha1::HealthStatus, ::v1alpha1::UNKNOWN,
                     ::v1alpha1::HEALTHY, ::v1alpha1::UNHEALTHY, false>;

template <typename A>
typename A::Response ToWire(const DeviceHealthList& list, int64_t timeout_s) {
  typename A::Response out;
  for (const auto& entry : list) {
    auto* device = out.add_devices();
    device->mutable_device()->set_pool_name(entry.pool_name);
    device->mutable_device()->set_device_name(entry.device_name);
    device->set_health(A::ToWire(entry.status));
    device->set_last_updated_time(entry.last_updated_unix_s);
    if constexpr (A::kDetails) {
      device->set_health_check_timeout_seconds(timeout_s);
      if (!entry.message.empty()) device->set_message(KubeletHealthMessage(entry.message));
    }
  }
  return out;
}

// What the service's set of open streams needs of a stream, whatever its version.
class OpenStream {
 public:
  virtual ~OpenStream() = default;
  virtual void Send(const DeviceHealthList& list) = 0;
  virtual void Close() = 0;
};

}  // namespace

struct HealthService::AsyncServices {
  HealthV1::AsyncService v1;
  HealthV1beta1::AsyncService v1beta1;
  HealthV1alpha1::AsyncService v1alpha1;
};

struct HealthService::Shared {
  Loop* loop = nullptr;
  std::function<DeviceHealthList()> current;
  std::chrono::milliseconds resend{kDefaultHealthResend};
  int64_t timeout_s = 0;
  bool alive = true;  // loop thread, as everything below
  std::set<OpenStream*> streams;
  bool have_last = false;
  DeviceHealthList last;  // the list the open streams were last sent
  uint64_t sent = 0;
  uint64_t resends = 0;
  std::unique_ptr<boost::asio::steady_timer> resend_timer;
  bool resend_armed = false;

  // While any stream is open, the whole list goes out again every `resend`.
  static void ArmResend(const std::shared_ptr<Shared>& self) {
    if (self->resend_armed || !self->alive || self->streams.empty()) return;
    if (!self->resend_timer) self->resend_timer = std::make_unique<boost::asio::steady_timer>(self->loop->Io());
    self->resend_armed = true;
    self->resend_timer->expires_at(SnapToWakeGrid(std::chrono::steady_clock::now() + self->resend, self->resend));
    self->resend_timer->async_wait([weak = std::weak_ptr<Shared>(self)](const boost::system::error_code& ec) {
      auto shared = weak.lock();
      if (!shared) return;
      shared->resend_armed = false;
      if (ec || !shared->alive || shared->streams.empty()) return;
      shared->last = shared->current();
      shared->have_last = true;
      ++shared->resends;
      const auto streams = shared->streams;  // a send may end a stream
      for (auto* stream : streams) stream->Send(shared->last);
      ArmResend(shared);
    });
  }
};

namespace {

// One kubelet NodeWatchResources stream of version A, loop thread only. Each operation in flight
// (the write, the finish, the call's end) holds the stream through its tag; the stream goes with
// the last.
template <typename A>
class HealthStream final : public OpenStream, public std::enable_shared_from_this<HealthStream<A>> {
 public:
  HealthStream(GrpcQueue& queue, std::shared_ptr<HealthService::Shared> shared)
      : queue_(queue), shared_(std::move(shared)) {}

  // Requests the next call on `server_cq`; re-armed as each one arrives.
  static void Serve(GrpcQueue& queue, grpc::ServerCompletionQueue* server_cq, typename A::AsyncService& service,
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

  void Send(const DeviceHealthList& list) override {
    if (finished_ || closing_ || done_) return;
    if (writing_) {
      pending_ = ToWire<A>(list, shared_->timeout_s);  // only the newest complete list matters
      has_pending_ = true;
      return;
    }
    Write(ToWire<A>(list, shared_->timeout_s));
  }

  // The DRA server is stopping: an open stream would hold Server::Shutdown until its deadline.
  // The kubelet reads a clean end and dials again once we are back.
  void Close() override {
    closing_ = true;
    has_pending_ = false;
    if (!writing_) FinishOnce(grpc::Status::OK);
  }

 private:
  void Write(typename A::Response message) {
    current_ = std::move(message);
    writing_ = true;
    auto self = this->shared_from_this();
    void* tag = GrpcQueue::Tag([self](bool ok) { self->OnWriteDone(ok); });
    if (!queue_.Begin([&] { writer_.Write(current_, tag); })) {
      GrpcQueue::Discard(tag);
      writing_ = false;
      finished_ = true;  // the queue is shut down: nothing more goes out
    } else {
      ++shared_->sent;
    }
  }

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
    Send(list);
    HealthService::Shared::ArmResend(shared_);
  }

  // At most one write or finish in flight: Finish waits for the write to complete.
  void FinishOnce(const grpc::Status& status) {
    if (finished_ || done_) return;
    finished_ = true;
    auto self = this->shared_from_this();
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
      Write(std::move(pending_));
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
  typename A::Request request_;
  grpc::ServerAsyncWriter<typename A::Response> writer_{&context_};
  typename A::Response current_;
  typename A::Response pending_;
  bool has_pending_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool closing_ = false;
  bool done_ = false;
};

}  // namespace

int64_t HealthCheckTimeoutSeconds(std::chrono::milliseconds resend) {
  const int64_t ms = 3 * resend.count();
  return std::max<int64_t>(1, (ms + 999) / 1000);
}

std::string KubeletHealthMessage(std::string_view message) {
  constexpr std::size_t kMax = 1024;
  constexpr std::size_t kKept = kMax - 3;
  if (message.size() <= kMax) return std::string(message);
  std::size_t cut = kKept;
  // Back off to the first byte of a character: a continuation byte is 10xxxxxx.
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return std::string(message.substr(0, cut)) + "...";
}

HealthService::HealthService(Loop& loop, std::function<DeviceHealthList()> current, std::chrono::milliseconds resend)
    : shared_(std::make_shared<Shared>()), services_(std::make_unique<AsyncServices>()) {
  shared_->loop = &loop;
  shared_->current = std::move(current);
  shared_->resend = resend;
  shared_->timeout_s = HealthCheckTimeoutSeconds(resend);
}

HealthService::~HealthService() { Detach(); }

std::vector<grpc::Service*> HealthService::Services() {
  return {&services_->v1, &services_->v1beta1, &services_->v1alpha1};
}

void HealthService::Serve(GrpcQueue& queue, grpc::ServerCompletionQueue* server_cq) {
  HealthStream<HealthV1>::Serve(queue, server_cq, services_->v1, shared_);
  HealthStream<HealthV1beta1>::Serve(queue, server_cq, services_->v1beta1, shared_);
  HealthStream<HealthV1alpha1>::Serve(queue, server_cq, services_->v1alpha1, shared_);
}

void HealthService::Update() {
  if (!shared_->alive) return;
  DeviceHealthList list = shared_->current();
  if (shared_->have_last && list == shared_->last) return;
  shared_->last = list;
  shared_->have_last = true;
  const auto streams = shared_->streams;  // a send may end a stream
  for (auto* stream : streams) stream->Send(list);
}

void HealthService::Close() {
  shared_->alive = false;
  shared_->resend_timer.reset();  // a wait in flight ends as cancelled
  // Close may end a stream (and take it out of the set): iterate over a copy.
  const auto streams = shared_->streams;
  for (auto* stream : streams) stream->Close();
}

void HealthService::Detach() {
  shared_->alive = false;
  shared_->resend_timer.reset();
  shared_->streams.clear();
}

std::size_t HealthService::OpenStreams() const { return shared_->streams.size(); }

uint64_t HealthService::MessagesSent() const { return shared_->sent; }

uint64_t HealthService::Resends() const { return shared_->resends; }

}  // namespace gns::dra
