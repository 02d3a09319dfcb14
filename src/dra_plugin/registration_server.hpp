#pragma once
// The kubelet plugin-watcher side of the DRA driver: pluginregistration.Registration on
// <kubeletDir>/plugins_registry/compute-domain.nvidia.com-reg.sock (WIRE-FACTS §2, §3.4). The
// kubelet finds the socket, calls GetInfo (and keeps calling it as a liveness probe on newer
// kubelets, so it answers for the server's whole life), then NotifyRegistrationStatus. Start the
// DRA server first: the kubelet dials PluginInfo.endpoint as soon as it has registered us.
//
// Threading as in device_plugin/plugin_server: GetInfo answers from immutable data on the server's
// completion-queue thread (loop/grpc_queue.hpp); NotifyRegistrationStatus is posted to the loop,
// which reports it and finishes the RPC.

#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "loop/unix_grpc_server.hpp"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

// DRA services we serve, in preference order (the kubelet takes the first it supports).
inline const std::vector<std::string>& DefaultSupportedVersions() {
  static const std::vector<std::string> kVersions{"v1.DRAPlugin", "v1beta1.DRAPlugin"};
  return kVersions;
}

// KEP-4680's device-health service, advertised beside the DRA services by a driver that serves
// it (the string is the full gRPC service name, WIRE-FACTS §3.1). A kubelet opens the health
// stream only for a plugin that lists a version it knows: 1.34/1.35 know v1alpha1; later ones
// v1beta1 and v1 (v1alpha1 deprecated in 1.37). We serve and list all three, newest first.
inline constexpr std::string_view kHealthServiceV1 = "v1.DRAResourceHealth";
inline constexpr std::string_view kHealthServiceV1beta1 = "v1beta1.DRAResourceHealth";
inline constexpr std::string_view kHealthServiceV1alpha1 = "v1alpha1.DRAResourceHealth";

class RegistrationServer {
 public:
  struct Info {
    std::string driver_name;   // PluginInfo.name (= ResourceSlice.spec.driver)
    std::string endpoint;      // absolute path of the DRA socket
    std::vector<std::string> supported_versions = DefaultSupportedVersions();
    std::string type = "DRAPlugin";  // PluginInfo.type: also "CSIPlugin" (gkm-csi); last, so Info{name, endpoint} stays
  };
  // Loop thread: what the kubelet told us about the registration.
  using StatusSink = std::function<void(bool registered, const std::string& error)>;

  RegistrationServer(Loop& loop, Info info, StatusSink on_status);
  ~RegistrationServer();
  RegistrationServer(const RegistrationServer&) = delete;
  RegistrationServer& operator=(const RegistrationServer&) = delete;

  // Serves on `socket_path` (parents created 0750 if missing, a stale socket replaced, the socket
  // chmod 0600). Throws std::runtime_error on failure.
  void Start(const std::string& socket_path);
  // Stops answering, removes our socket (the kubelet deregisters on its removal), shuts the server
  // down off the loop; `done` runs on the loop.
  void Shutdown(BlockingPool& pool, std::function<void()> done);

  struct Shared;

 private:
  class Service;
  Loop& loop_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Service> service_;
  UnixGrpcServer server_;
};


}  // namespace gns::dra
