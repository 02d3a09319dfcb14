#pragma once
// The DRA kubelet-plugin service on <kubeletDir>/plugins/<driver>/dra.sock:
// NodePrepareResources / NodeUnprepareResources in both k8s.io.kubelet.pkg.apis.dra.v1 and
// …v1beta1 (WIRE-FACTS §3: byte-for-byte the same messages; 1.32/1.33 kubelets speak only
// v1beta1), and, for a driver that says its devices' health, DRAResourceHealth in v1, v1beta1
// and v1alpha1. Both versions convert to plain structs and call one DraHandler, so the module has one
// code path.
//
// Threading as in device_plugin/plugin_server: the server's completion-queue thread
// (loop/grpc_queue.hpp) posts each arriving call to the loop; the handler runs on the loop and may
// answer later (it fetches from the API), calling `done` on the loop; the loop finishes the RPC. A shared `alive` gate: once Shutdown starts, new
// calls get UNAVAILABLE and calls still waiting on the handler are finished with UNAVAILABLE (a
// late `done` is then dropped), so Server::Wait never waits on the module.

#include "dra_plugin/health_service.hpp"
#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "loop/unix_grpc_server.hpp"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gns::dra {

// One claim as the kubelet names it.
struct ClaimRef {
  std::string namespace_name;
  std::string uid;
  std::string name;
  bool operator==(const ClaimRef&) const = default;
};

struct PreparedDevice {
  std::vector<std::string> request_names;  // empty: all requests of the claim
  std::string pool_name;
  std::string device_name;
  std::vector<std::string> cdi_device_ids;  // fully qualified
  bool operator==(const PreparedDevice&) const = default;
};

struct PrepareResult {
  std::vector<PreparedDevice> devices;
  std::string error;  // non-empty: the claim failed (devices ignored)
};

struct UnprepareResult {
  std::string error;
};

using PrepareResults = std::map<std::string, PrepareResult>;      // by claim UID
using UnprepareResults = std::map<std::string, UnprepareResult>;  // by claim UID

// Implemented by the module. Loop thread. Call `done` exactly once, on the loop (now or later).
// A claim missing from the results is answered with an error for it (the kubelet needs every
// claim in the response and would retry a missing one anyway).
class DraHandler {
 public:
  virtual ~DraHandler() = default;
  virtual void Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) = 0;
  virtual void Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) = 0;
};

class DraServer {
 public:
  // `handler` must outlive the server's Shutdown completion. With `health`, the socket also
  // serves DRAResourceHealth v1, v1beta1 and v1alpha1 (health_service.hpp); without, it does not.
  DraServer(Loop& loop, DraHandler& handler, std::shared_ptr<HealthService> health = nullptr);
  ~DraServer();
  DraServer(const DraServer&) = delete;
  DraServer& operator=(const DraServer&) = delete;

  // Serves both versions on `socket_path` (parents created 0750 if missing, a stale socket
  // replaced, the socket chmod 0600). Throws std::runtime_error on failure.
  void Start(const std::string& socket_path);
  // Loop thread: closes the gate, fails the calls still pending, removes the socket and shuts the
  // server down on the pool; `done` runs on the loop.
  void Shutdown(BlockingPool& pool, std::function<void()> done);
  // Calls handed to the handler and not answered yet. Loop thread.
  std::size_t PendingCalls() const;
  // The health service, when served (nullptr otherwise).
  HealthService* Health() const { return health_.get(); }

  struct Shared;

 private:
  struct Services;
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Services> services_;
  std::shared_ptr<HealthService> health_;
  UnixGrpcServer server_;
};

}  // namespace gns::dra
