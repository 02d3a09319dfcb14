// The DRA kubelet-plugin service (v1 and v1beta1) over one handler.
#include "dra_plugin/dra_server.hpp"

#include "dra_plugin/registration_server.hpp"

#include "loop/grpc_unary.hpp"

#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace gns::dra {

namespace {

namespace v1 = k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = k8s::io::kubelet::pkg::apis::dra::v1beta1;

// The generated types of one API version; the two packages have identical messages.
template <typename Plugin, typename PrepareReq, typename PrepareResp, typename UnprepareReq, typename UnprepareResp>
struct ApiTypes {
  using Service = typename Plugin::AsyncService;
  using PrepareRequest = PrepareReq;
  using PrepareResponse = PrepareResp;
  using UnprepareRequest = UnprepareReq;
  using UnprepareResponse = UnprepareResp;
};

using V1 = ApiTypes<v1::DRAPlugin, v1::NodePrepareResourcesRequest, v1::NodePrepareResourcesResponse,
                    v1::NodeUnprepareResourcesRequest, v1::NodeUnprepareResourcesResponse>;
using V1beta1 = ApiTypes<v1beta1::DRAPlugin, v1beta1::NodePrepareResourcesRequest, v1beta1::NodePrepareResourcesResponse,
                         v1beta1::NodeUnprepareResourcesRequest, v1beta1::NodeUnprepareResourcesResponse>;

template <typename Request>
std::vector<ClaimRef> ClaimsOf(const Request& request) {
  std::vector<ClaimRef> claims;
  claims.reserve(static_cast<std::size_t>(request.claims_size()));
  for (const auto& claim : request.claims()) claims.push_back(ClaimRef{claim.namespace_(), claim.uid(), claim.name()});
  return claims;
}

template <typename Response>
void FillPrepare(const std::vector<ClaimRef>& claims, const PrepareResults& results, Response* response) {
  auto& out = *response->mutable_claims();
  for (const auto& claim : claims) {
    auto& entry = out[claim.uid];
    const auto it = results.find(claim.uid);
    if (it == results.end()) {
      entry.set_error("no result for claim " + claim.namespace_name + "/" + claim.name + " (internal error)");
      continue;
    }
    if (!it->second.error.empty()) {
      entry.set_error(it->second.error);
      continue;
    }
    for (const auto& device : it->second.devices) {
      auto* d = entry.add_devices();
      for (const auto& name : device.request_names) d->add_request_names(name);
      d->set_pool_name(device.pool_name);
      d->set_device_name(device.device_name);
      for (const auto& id : device.cdi_device_ids) d->add_cdi_device_ids(id);
    }
  }
}

template <typename Response>
void FillUnprepare(const std::vector<ClaimRef>& claims, const UnprepareResults& results, Response* response) {
  auto& out = *response->mutable_claims();
  for (const auto& claim : claims) {
    auto& entry = out[claim.uid];  // every claim needs an entry, even an empty one
    const auto it = results.find(claim.uid);
    if (it == results.end()) {
      entry.set_error("no result for claim " + claim.namespace_name + "/" + claim.name + " (internal error)");
    } else if (!it->second.error.empty()) {
      entry.set_error(it->second.error);
    }
  }
}

const grpc::Status kStopping(grpc::StatusCode::UNAVAILABLE, "DRA plugin is stopping");

}  // namespace

struct DraServer::Shared {
  Loop* loop = nullptr;
  DraHandler* handler = nullptr;
  bool alive = true;  // loop thread, as everything below
  uint64_t next_id = 0;
  // Calls handed to the handler, by id: how to fail each one at shutdown.
  std::map<uint64_t, std::function<void(const grpc::Status&)>> pending;

  // Registers the call; the returned id is what the handler's `done` redeems.
  uint64_t Track(std::function<void(const grpc::Status&)> fail) {
    const uint64_t id = next_id++;
    pending.emplace(id, std::move(fail));
    return id;
  }
  // True once per call: the caller may finish it now. False if shutdown finished it already.
  bool Redeem(uint64_t id) { return pending.erase(id) == 1; }
  void FailPending() {
    auto calls = std::move(pending);
    pending.clear();
    for (auto& [id, fail] : calls) fail(kStopping);
  }
};

namespace {

// Runs the handler for one call on the loop and finishes the call with what it answers.
template <typename Out, typename Call, typename Fill, typename Invoke>
void Dispatch(const std::shared_ptr<DraServer::Shared>& shared, const std::shared_ptr<Call>& call, Fill fill,
              Invoke invoke) {
  if (!shared->alive) {
    call->Finish(kStopping);
    return;
  }
  const uint64_t id = shared->Track([call](const grpc::Status& status) { call->Finish(status); });
  auto claims = ClaimsOf(call->request);
  auto claims_ptr = std::make_shared<const std::vector<ClaimRef>>(claims);
  auto done = [shared, id, call, claims_ptr, fill](Out results) {
    GNS_ASSERT_ON_LOOP(*shared->loop);
    if (!shared->Redeem(id)) return;  // failed at shutdown already; the response is gone
    fill(*claims_ptr, results, &call->response);
    call->Finish(grpc::Status::OK);
  };
  try {
    invoke(std::move(claims), std::move(done));
  } catch (const std::exception& e) {
    if (shared->Redeem(id)) call->Finish(grpc::Status(grpc::StatusCode::INTERNAL, std::string("DRA plugin error: ") + e.what()));
  }
}

// Serves one API version's two methods on the server's queue, on the loop.
template <typename Api>
void ServeVersion(GrpcQueue& queue, grpc::ServerCompletionQueue* cq, typename Api::Service& service,
                  const std::shared_ptr<DraServer::Shared>& shared) {
  using PrepareReq = typename Api::PrepareRequest;
  using PrepareResp = typename Api::PrepareResponse;
  using UnprepareReq = typename Api::UnprepareRequest;
  using UnprepareResp = typename Api::UnprepareResponse;
  ServeUnary<PrepareReq, PrepareResp>(
      queue,
      [&service, cq](grpc::ServerContext* context, PrepareReq* request,
                     grpc::ServerAsyncResponseWriter<PrepareResp>* responder, void* tag) {
        service.RequestNodePrepareResources(context, request, responder, cq, cq, tag);
      },
      [shared](const std::shared_ptr<UnaryCall<PrepareReq, PrepareResp>>& call) {
        Dispatch<PrepareResults>(
            shared, call,
            [](const std::vector<ClaimRef>& asked, const PrepareResults& results, PrepareResp* response) {
              FillPrepare(asked, results, response);
            },
            [&shared](std::vector<ClaimRef> c, std::function<void(PrepareResults)> done) {
              shared->handler->Prepare(std::move(c), std::move(done));
            });
      });
  ServeUnary<UnprepareReq, UnprepareResp>(
      queue,
      [&service, cq](grpc::ServerContext* context, UnprepareReq* request,
                     grpc::ServerAsyncResponseWriter<UnprepareResp>* responder, void* tag) {
        service.RequestNodeUnprepareResources(context, request, responder, cq, cq, tag);
      },
      [shared](const std::shared_ptr<UnaryCall<UnprepareReq, UnprepareResp>>& call) {
        Dispatch<UnprepareResults>(
            shared, call,
            [](const std::vector<ClaimRef>& asked, const UnprepareResults& results, UnprepareResp* response) {
              FillUnprepare(asked, results, response);
            },
            [&shared](std::vector<ClaimRef> c, std::function<void(UnprepareResults)> done) {
              shared->handler->Unprepare(std::move(c), std::move(done));
            });
      });
}

}  // namespace

struct DraServer::Services {
  typename V1::Service v1;
  typename V1beta1::Service v1beta1;
  std::shared_ptr<HealthService> health;  // kept until the server is down, as the others
};

DraServer::DraServer(Loop& loop, DraHandler& handler, std::shared_ptr<HealthService> health)
    : loop_(loop), shared_(std::make_shared<Shared>()), health_(std::move(health)) {
  shared_->loop = &loop;
  shared_->handler = &handler;
}

DraServer::~DraServer() {
  shared_->alive = false;
  if (health_) health_->Detach();
  shared_->pending.clear();  // the server's teardown cancels them
}

void DraServer::Start(const std::string& socket_path) {
  services_ = std::make_shared<Services>();
  services_->health = health_;
  std::vector<grpc::Service*> services{&services_->v1, &services_->v1beta1};
  if (health_) {
    for (auto* service : health_->Services()) services.push_back(service);
  }
  server_.Start(loop_, socket_path, services, "the DRA plugin");
  ServeVersion<V1>(server_.Queue(), server_.ServerCq(), services_->v1, shared_);
  ServeVersion<V1beta1>(server_.Queue(), server_.ServerCq(), services_->v1beta1, shared_);
  if (health_) health_->Serve(server_.Queue(), server_.ServerCq());
}

std::size_t DraServer::PendingCalls() const { return shared_->pending.size(); }

void DraServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  GNS_ASSERT_ON_LOOP(loop_);
  shared_->alive = false;
  // Calls the handler has not answered would hold Server::Shutdown until its deadline: fail them now.
  shared_->FailPending();
  // Open health streams would hold it too: they end now (after a write in flight).
  if (health_) health_->Close();
  server_.Shutdown(pool, loop_, std::move(services_), std::move(done));
}

}  // namespace gns::dra
