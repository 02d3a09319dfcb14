#pragma once
// The CSI Identity and Node services on the plugin's unix socket (src/proto/csi/v1/csi.proto),
// translated to plain requests for the module: what the kubelet calls, and nothing of gRPC past
// this file. Threading as the DRA plugin's servers: Identity's answers are fixed at construction
// and served on the queue thread (GetPluginInfo, GetPluginCapabilities); Probe and the Node calls
// run on the loop, where the module answers them (after a pool job for the mount work).

#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "loop/unix_grpc_server.hpp"
#include "modules/gkm_csi/volume_ops.hpp"
#include "modules/gkm_csi/volume_request.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace gns::gkm_csi {

class CsiService {
 public:
  struct Info {
    std::string driver_name;  // GetPluginInfo.name
    std::string version;      // GetPluginInfo.vendor_version
    std::string node_id;      // NodeGetInfo.node_id: the node's name
  };
  using Reply = std::function<void(std::optional<CsiError>)>;
  // Loop thread. Each must call its reply exactly once (it may be later, from the loop).
  struct Backend {
    std::function<bool()> ready;
    std::function<void(PublishRequest, Reply)> publish;
    std::function<void(std::string volume_id, std::string target_path, Reply)> unpublish;
    using StatsReply = std::function<void(std::optional<CsiError>, VolumeStats)>;
    std::function<void(std::string volume_id, std::string volume_path, StatsReply)> stats;
  };

  CsiService(Loop& loop, Info info, Backend backend);
  ~CsiService();
  CsiService(const CsiService&) = delete;
  CsiService& operator=(const CsiService&) = delete;

  // Serves on `socket_path` (0600; the directory created 0750 when missing). Throws.
  void Start(const std::string& socket_path);
  // Stops answering (calls still arriving get UNAVAILABLE), removes the socket, shuts down off
  // the loop; `done` runs on the loop.
  void Shutdown(BlockingPool& pool, std::function<void()> done);

  struct Shared;

 private:
  class Services;
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Services> services_;
  UnixGrpcServer server_;
};

}  // namespace gns::gkm_csi
