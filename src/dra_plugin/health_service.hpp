#pragma once
// The kubelet's DRA device-health service (KEP-4680): v1alpha1.DRAResourceHealth /
// NodeWatchResources on the DRA socket, for a driver that says its devices' health
// (DraDriver::ServesDeviceHealth). WIRE-FACTS §3.5: each message on a stream is the driver's
// complete device list; the kubelet opens the stream only when the plugin advertises the service
// in PluginInfo.supported_versions (registration_server.hpp, kHealthServiceV1alpha1).
//
// Threading as in device_plugin/plugin_server (ListAndWatch): the streams live on the loop; a
// stream keeps at most one write in flight and, behind it, only the newest list; each new
// stream gets the current list at once, every open stream gets a list that differs from the last
// one sent; Close (the DRA server's shutdown) ends every stream after its write in flight.

#include "loop/grpc_queue.hpp"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gns::dra {

enum class DeviceHealthStatus { kUnknown, kHealthy, kUnhealthy };

// One device of the driver's ResourceSlice and its health.
struct DeviceHealthEntry {
  std::string pool_name;
  std::string device_name;
  DeviceHealthStatus status = DeviceHealthStatus::kUnknown;
  int64_t last_updated_unix_s = 0;  // when `status` last changed
  bool operator==(const DeviceHealthEntry&) const = default;
};
using DeviceHealthList = std::vector<DeviceHealthEntry>;

class HealthService {
 public:
  // `current` (loop thread): the driver's whole list now.
  explicit HealthService(std::function<DeviceHealthList()> current);
  ~HealthService();
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // The gRPC service to register on the server (before it starts).
  grpc::Service* Service();
  // Once the server runs: accepts NodeWatchResources calls on its queue.
  void Serve(GrpcQueue& queue, grpc::ServerCompletionQueue* server_cq);
  // Loop thread: asks the driver for its list and sends it to every open stream if it differs
  // from the last list sent.
  void Update();
  // Loop thread: no new stream; every open one ends (OK) after its write in flight.
  void Close();
  // The owner goes without a shutdown (a failed start, a test): nothing more reaches the driver.
  void Detach();
  std::size_t OpenStreams() const;
  uint64_t MessagesSent() const;

  struct Shared;

 private:
  class AsyncService;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<AsyncService> service_;
};

}  // namespace gns::dra
