// CSI Identity and Node over gRPC: see csi_service.hpp.
#include "modules/gkm_csi/csi_service.hpp"

#include "csi/v1/csi.grpc.pb.h"

#include "loop/grpc_unary.hpp"

namespace gns::gkm_csi {

struct CsiService::Shared {
  Info info;
  Backend backend;
  bool alive = true;  // loop thread
};

class CsiService::Services {
 public:
  csi::v1::Identity::AsyncService identity;
  csi::v1::Node::AsyncService node;
};

namespace {

grpc::Status ToStatus(const std::optional<CsiError>& error) {
  if (!error) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(error->code), error->message);
}

const grpc::Status kStopping(grpc::StatusCode::UNAVAILABLE, "csi.gkm.io node plugin is stopping");

}  // namespace

CsiService::CsiService(Loop& loop, Info info, Backend backend) : loop_(loop), shared_(std::make_shared<Shared>()) {
  shared_->info = std::move(info);
  shared_->backend = std::move(backend);
}

CsiService::~CsiService() { shared_->alive = false; }

void CsiService::Start(const std::string& socket_path) {
  services_ = std::make_shared<Services>();
  server_.Start(loop_, socket_path, {&services_->identity, &services_->node}, "CSI node plugin");
  auto& identity = services_->identity;
  auto& node = services_->node;
  grpc::ServerCompletionQueue* cq = server_.ServerCq();
  GrpcQueue& queue = server_.Queue();
  auto shared = shared_;
  using namespace csi::v1;

  // Identity: fixed answers, on the queue thread.
  ServeUnary<GetPluginInfoRequest, GetPluginInfoResponse>(
      queue,
      [&identity, cq](auto* context, auto* request, auto* responder, void* tag) {
        identity.RequestGetPluginInfo(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        call->response.set_name(shared->info.driver_name);
        call->response.set_vendor_version(shared->info.version);
        call->Finish(grpc::Status::OK);
      },
      GrpcQueue::On::kQueueThread);
  // No controller service, no topology: a node-only plugin answers an empty list.
  ServeUnary<GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse>(
      queue,
      [&identity, cq](auto* context, auto* request, auto* responder, void* tag) {
        identity.RequestGetPluginCapabilities(context, request, responder, cq, cq, tag);
      },
      [](const auto& call) { call->Finish(grpc::Status::OK); }, GrpcQueue::On::kQueueThread);
  ServeUnary<ProbeRequest, ProbeResponse>(
      queue,
      [&identity, cq](auto* context, auto* request, auto* responder, void* tag) {
        identity.RequestProbe(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        if (!shared->alive) return call->Finish(kStopping);
        call->response.mutable_ready()->set_value(shared->backend.ready());
        call->Finish(grpc::Status::OK);
      });

  // Node.
  ServeUnary<NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse>(
      queue,
      [&node, cq](auto* context, auto* request, auto* responder, void* tag) {
        node.RequestNodeGetCapabilities(context, request, responder, cq, cq, tag);
      },
      // Volume stats (what the kubelet's volume metrics show); no staging (a bind mount needs
      // none), no expansion, no volume condition.
      [](const auto& call) {
        call->response.add_capabilities()->mutable_rpc()->set_type(NodeServiceCapability::RPC::GET_VOLUME_STATS);
        call->Finish(grpc::Status::OK);
      },
      GrpcQueue::On::kQueueThread);
  ServeUnary<NodeGetInfoRequest, NodeGetInfoResponse>(
      queue,
      [&node, cq](auto* context, auto* request, auto* responder, void* tag) {
        node.RequestNodeGetInfo(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        call->response.set_node_id(shared->info.node_id);
        call->response.set_max_volumes_per_node(0);  // no limit of ours
        call->Finish(grpc::Status::OK);
      },
      GrpcQueue::On::kQueueThread);
  ServeUnary<NodePublishVolumeRequest, NodePublishVolumeResponse>(
      queue,
      [&node, cq](auto* context, auto* request, auto* responder, void* tag) {
        node.RequestNodePublishVolume(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        if (!shared->alive) return call->Finish(kStopping);
        const auto& q = call->request;
        PublishRequest r;
        r.volume_id = q.volume_id();
        r.target_path = q.target_path();
        r.has_capability = q.has_volume_capability();
        r.block = q.has_volume_capability() && q.volume_capability().has_block();
        r.readonly_flag = q.readonly();
        r.volume_context.insert(q.volume_context().begin(), q.volume_context().end());
        shared->backend.publish(std::move(r), [call](std::optional<CsiError> error) { call->Finish(ToStatus(error)); });
      });
  ServeUnary<NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse>(
      queue,
      [&node, cq](auto* context, auto* request, auto* responder, void* tag) {
        node.RequestNodeGetVolumeStats(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        if (!shared->alive) return call->Finish(kStopping);
        shared->backend.stats(call->request.volume_id(), call->request.volume_path(),
                              [call](std::optional<CsiError> error, VolumeStats stats) {
                                if (!error) {
                                  auto* bytes = call->response.add_usage();
                                  bytes->set_unit(VolumeUsage::BYTES);
                                  bytes->set_used(stats.used_bytes);
                                  bytes->set_total(stats.total_bytes);
                                  bytes->set_available(stats.available_bytes);
                                  auto* inodes = call->response.add_usage();
                                  inodes->set_unit(VolumeUsage::INODES);
                                  inodes->set_used(stats.used_inodes);
                                  inodes->set_total(stats.total_inodes);
                                  inodes->set_available(stats.free_inodes);
                                }
                                call->Finish(ToStatus(error));
                              });
      });
  ServeUnary<NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse>(
      queue,
      [&node, cq](auto* context, auto* request, auto* responder, void* tag) {
        node.RequestNodeUnpublishVolume(context, request, responder, cq, cq, tag);
      },
      [shared](const auto& call) {
        if (!shared->alive) return call->Finish(kStopping);
        shared->backend.unpublish(call->request.volume_id(), call->request.target_path(),
                                  [call](std::optional<CsiError> error) { call->Finish(ToStatus(error)); });
      });
}

void CsiService::Shutdown(BlockingPool& pool, std::function<void()> done) {
  shared_->alive = false;
  server_.Shutdown(pool, loop_, std::move(services_), std::move(done));
}

}  // namespace gns::gkm_csi
