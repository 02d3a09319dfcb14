#pragma once
// The kubelet's DRA device-health service (KEP-4680): DRAResourceHealth / NodeWatchResources on
// the DRA socket, in v1, v1beta1 and v1alpha1 (the same stream; v1beta1 and v1 add a timeout
// and a message per device), for a driver that says its devices' health
// (DraDriver::ServesDeviceHealth). WIRE-FACTS §3.5: each message on a stream is the driver's
// complete device list; the kubelet opens the stream only when the plugin advertises the service
// in PluginInfo.supported_versions (registration_server.hpp, kHealthService*).
//
// The kubelet forgets a report: a device it has not heard of for its timeout (30 s unless the
// report says otherwise, v1beta1 and v1 only) reads Unknown in the pod's status. So besides each
// change, every open stream gets the whole list again every `resend` (on the loop's wake grid,
// healthy or not, changed or not), and v1beta1/v1 reports carry a timeout of three resends.
//
// Threading as in device_plugin/plugin_server (ListAndWatch): the streams live on the loop; a
// stream keeps at most one write in flight and, behind it, only the newest list; each new
// stream gets the current list at once, every open stream gets a list that differs from the last
// one sent; Close (the DRA server's shutdown) ends every stream after its write in flight.

#include "loop/grpc_queue.hpp"
#include "loop/loop.hpp"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

enum class DeviceHealthStatus { kUnknown, kHealthy, kUnhealthy };

// One device of the driver's ResourceSlice and its health.
struct DeviceHealthEntry {
  std::string pool_name;
  std::string device_name;
  DeviceHealthStatus status = DeviceHealthStatus::kUnknown;
  int64_t last_updated_unix_s = 0;  // when `status` last changed
  std::string message;              // why (v1beta1 and v1 carry it; cut to the kubelet's 1024)
  bool operator==(const DeviceHealthEntry&) const = default;
};
using DeviceHealthList = std::vector<DeviceHealthEntry>;

// The one source of the default resend period: under the 30 s the kubelet keeps a v1alpha1
// report, with the wake grid's half-grid of play (15–25 s between sends).
inline constexpr std::chrono::milliseconds kDefaultHealthResend{20000};
// The most a site may set: a resend snapped to the grid may come half a grid late, and a
// v1alpha1 kubelet reads a device Unknown 30 s after its last report.
inline constexpr std::chrono::milliseconds kMaxHealthResend{20000};

// The timeout a v1beta1/v1 report asks the kubelet for: three resends, whole seconds, at least 1.
int64_t HealthCheckTimeoutSeconds(std::chrono::milliseconds resend);
// `message` as the kubelet keeps it: at most 1024 bytes, a longer one cut to 1021 at a UTF-8
// character boundary with "..." after.
std::string KubeletHealthMessage(std::string_view message);

class HealthService {
 public:
  // `current` (loop thread): the driver's whole list now.
  HealthService(Loop& loop, std::function<DeviceHealthList()> current,
                std::chrono::milliseconds resend = kDefaultHealthResend);
  ~HealthService();
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // The gRPC services to register on the server (before it starts): v1, v1beta1, v1alpha1.
  std::vector<grpc::Service*> Services();
  // Once the server runs: accepts NodeWatchResources calls on its queue, in every version.
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
  uint64_t Resends() const;  // whole-list resends (each to every open stream)

  struct Shared;

 private:
  struct AsyncServices;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<AsyncServices> services_;
};

}  // namespace gns::dra
