// The operator's ways to tell gpu-health that a GPU is fine again (after a manual reset or a
// repair): the local admin socket (`gpu-node-supervisor set-healthy`, mode 0600) and the Node
// annotation `gpu-node-supervisor.nvidia.com/set-healthy: "GPU-…[,GPU-…]|all"`, which is
// taken off once acted on so the same request can be made again. Both end in one call,
// `set_healthy(target, who)`, whose answer goes back to the caller; `status` answers the
// admin socket's status request.
#pragma once

#include "loop/bus.hpp"
#include "loop/gate.hpp"
#include "loop/rate_limited_log.hpp"
#include "loop/admin_socket.hpp"

#include <spdlog/logger.h>

#include <boost/asio/io_context.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace gns {
class Clock;
}  // namespace gns

namespace gns::kube {
class KubeClient;
class Informer;
class InformerRegistry;
struct ResourceEvent;
}  // namespace gns::kube

namespace gns::gpu_health {

class OperatorChannel {
 public:
  static constexpr std::string_view kSetHealthyAnnotation = "gpu-node-supervisor.nvidia.com/set-healthy";

  using SetHealthy = std::function<std::string(std::string_view target, std::string_view who)>;
  using Status = std::function<std::string()>;

  OperatorChannel(boost::asio::io_context& io, Bus& bus, const Clock& clock, spdlog::logger& log, std::string node_name,
                  std::string field_manager, SetHealthy set_healthy, Status status);
  ~OperatorChannel();

  // The admin socket at `path` (empty: none). Throws std::system_error when it cannot listen.
  void StartSocket(const std::string& path);
  // Watches this node's annotation through the kube services (either null: not watched).
  void WatchAnnotation(std::shared_ptr<kube::InformerRegistry> registry, std::shared_ptr<kube::KubeClient> client);
  void Stop();

  // One admin socket request line → its answer.
  std::string HandleLine(std::string_view line);
  const std::string& SocketPath() const;

 private:
  void OnNodeEvent(const kube::ResourceEvent& event);

  boost::asio::io_context& io_;
  Bus& bus_;
  spdlog::logger& log_;
  std::string node_name_;
  std::string field_manager_;
  SetHealthy set_healthy_;
  Status status_;
  RateLimitedLog warn_;
  std::unique_ptr<AdminSocket> socket_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::Informer> informer_;
  std::string informer_key_;
  std::string last_annotation_;
  Gate lifetime_;
  Subscription node_sub_;
};

}  // namespace gns::gpu_health
