// The DRA kubelet-plugin service (v1 and v1beta1) over one handler.
#include "modules/dra_compute_domain/dra_server.hpp"

#include "modules/dra_compute_domain/registration_server.hpp"

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
  using Service = typename Plugin::CallbackService;
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
  std::map<uint64_t, grpc::ServerUnaryReactor*> pending;

  // Registers the call; the returned id is what the handler's `done` redeems.
  uint64_t Track(grpc::ServerUnaryReactor* reactor) {
    const uint64_t id = next_id++;
    pending.emplace(id, reactor);
    return id;
  }
  // True once per call: the caller may finish it now. False if shutdown finished it already.
  bool Redeem(uint64_t id) { return pending.erase(id) == 1; }
};

// Runs the handler for one call on the loop and finishes the call with what it answers.
template <typename Out, typename Fill, typename Invoke>
void Dispatch(const std::shared_ptr<DraServer::Shared>& shared, grpc::ServerUnaryReactor* reactor,
              std::vector<ClaimRef> claims, Fill fill, Invoke invoke) {
  if (!shared->alive) {
    reactor->Finish(kStopping);
    return;
  }
  const uint64_t id = shared->Track(reactor);
  auto claims_ptr = std::make_shared<const std::vector<ClaimRef>>(claims);
  auto done = [shared, id, reactor, claims_ptr, fill](Out results) {
    GNS_ASSERT_ON_LOOP(*shared->loop);
    if (!shared->Redeem(id)) return;  // failed at shutdown already; the response is gone
    fill(*claims_ptr, results);
    reactor->Finish(grpc::Status::OK);
  };
  try {
    invoke(std::move(claims), std::move(done));
  } catch (const std::exception& e) {
    if (shared->Redeem(id)) reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, std::string("DRA plugin error: ") + e.what()));
  }
}

template <typename Api>
class DraServer::Service final : public Api::Service {
 public:
  Service(Loop& loop, std::shared_ptr<Shared> shared) : loop_(loop), shared_(std::move(shared)) {}

  grpc::ServerUnaryReactor* NodePrepareResources(grpc::CallbackServerContext* context,
                                                 const typename Api::PrepareRequest* request,
                                                 typename Api::PrepareResponse* response) override {
    auto* reactor = context->DefaultReactor();
    // Convert on the gRPC thread (the request is immutable); only plain structs reach the loop.
    loop_.Post([shared = shared_, reactor, response, claims = ClaimsOf(*request)]() mutable {
      Dispatch<PrepareResults>(
          shared, reactor, std::move(claims),
          [response](const std::vector<ClaimRef>& asked, const PrepareResults& results) {
            FillPrepare(asked, results, response);
          },
          [&shared](std::vector<ClaimRef> c, std::function<void(PrepareResults)> done) {
            shared->handler->Prepare(std::move(c), std::move(done));
          });
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* NodeUnprepareResources(grpc::CallbackServerContext* context,
                                                   const typename Api::UnprepareRequest* request,
                                                   typename Api::UnprepareResponse* response) override {
    auto* reactor = context->DefaultReactor();
    loop_.Post([shared = shared_, reactor, response, claims = ClaimsOf(*request)]() mutable {
      Dispatch<UnprepareResults>(
          shared, reactor, std::move(claims),
          [response](const std::vector<ClaimRef>& asked, const UnprepareResults& results) {
            FillUnprepare(asked, results, response);
          },
          [&shared](std::vector<ClaimRef> c, std::function<void(UnprepareResults)> done) {
            shared->handler->Unprepare(std::move(c), std::move(done));
          });
    });
    return reactor;
  }

 private:
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
};

struct DraServer::Services {
  Service<V1> v1;
  Service<V1beta1> v1beta1;
  Services(Loop& loop, const std::shared_ptr<Shared>& shared) : v1(loop, shared), v1beta1(loop, shared) {}
};

DraServer::DraServer(Loop& loop, DraHandler& handler) : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->loop = &loop;
  shared_->handler = &handler;
}

DraServer::~DraServer() {
  shared_->alive = false;
  for (auto& [id, reactor] : shared_->pending) reactor->Finish(kStopping);
  shared_->pending.clear();
}

void DraServer::Start(const std::string& socket_path) {
  services_ = std::make_shared<Services>(loop_, shared_);
  server_.Start(socket_path, {&services_->v1, &services_->v1beta1}, "the DRA plugin");
}

std::size_t DraServer::PendingCalls() const { return shared_->pending.size(); }

void DraServer::Shutdown(BlockingPool& pool, std::function<void()> done) {
  GNS_ASSERT_ON_LOOP(loop_);
  shared_->alive = false;
  // Calls the handler has not answered would hold Server::Wait forever: fail them now.
  for (auto& [id, reactor] : shared_->pending) reactor->Finish(kStopping);
  shared_->pending.clear();
  server_.Shutdown(pool, loop_, std::move(services_), std::move(done));
}

}  // namespace gns::dra
