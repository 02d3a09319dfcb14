// The kubelet's side of KEP-4680 (WIRE-FACTS §3.5): once a DRA plugin that advertises a
// DRAResourceHealth version this kubelet knows is registered, one NodeWatchResources stream per
// registration in the first such version (KubeletSimOptions::dra_health_services), read on its
// own thread; each message replaces the driver's recorded device list (every message is the
// complete list), stamped with when it arrived, and how the stream ended is kept. As the
// kubelet (pkg/kubelet/cm/dra/healthinfo.go), a report older than its timeout reads UNKNOWN
// (DraDeviceHealth::SeenAt).
#include "dra_health/v1/api.grpc.pb.h"
#include "dra_health/v1alpha1/api.grpc.pb.h"
#include "dra_health/v1beta1/api.grpc.pb.h"
#include "kubelet_sim_impl.h"

namespace gns::sim {

namespace {

// The generated types of one version; v1beta1 and v1 reports carry a timeout and a message.
template <typename ServiceT, typename RequestT, typename ResponseT, const std::string& (*NameOfT)(int), bool kDetailsV>
struct HealthApi {
  using Service = ServiceT;
  using Request = RequestT;
  using Response = ResponseT;
  static constexpr bool kDetails = kDetailsV;
  static std::string Name(int health) { return NameOfT(health); }
};

const std::string& HealthV1Name(int h) { return ::v1::HealthStatus_Name(static_cast<::v1::HealthStatus>(h)); }
const std::string& HealthV1beta1Name(int h) { return ::v1beta1::HealthStatus_Name(static_cast<::v1beta1::HealthStatus>(h)); }
const std::string& HealthV1alpha1Name(int h) {
  return ::v1alpha1::HealthStatus_Name(static_cast<::v1alpha1::HealthStatus>(h));
}

using HealthV1 = HealthApi<::v1::DRAResourceHealth, ::v1::NodeWatchResourcesRequest, ::v1::NodeWatchResourcesResponse,
                     &HealthV1Name, true>;
using HealthV1beta1 = HealthApi<::v1beta1::DRAResourceHealth, ::v1beta1::NodeWatchResourcesRequest,
                          ::v1beta1::NodeWatchResourcesResponse, &HealthV1beta1Name, true>;
using HealthV1alpha1 = HealthApi<::v1alpha1::DRAResourceHealth, ::v1alpha1::NodeWatchResourcesRequest,
                           ::v1alpha1::NodeWatchResourcesResponse, &HealthV1alpha1Name, false>;

}  // namespace

std::shared_ptr<detail::DraHealthConnection> KubeletSim::Impl::StartDraHealthLocked(
    const std::string& driver, const std::string& endpoint, const std::string& service,
    std::shared_ptr<grpc::Channel> channel) {
  auto connection = std::make_shared<detail::DraHealthConnection>();
  connection->driver = driver;
  connection->endpoint = endpoint;
  connection->service = service;
  connection->channel = std::move(channel);
  std::shared_ptr<detail::DraHealthConnection> replaced;
  if (auto it = dra_health.find(endpoint); it != dra_health.end()) replaced = std::move(it->second);
  dra_health[endpoint] = connection;
  DraDriverState& dra = state.dra_drivers[driver];
  ++dra.health_streams;
  dra.health_stream_open = true;
  dra.health_service = service;
  dra.health_default_timeout = options.dra_health_timeout;
  connection->reader = std::thread([this, connection] { RunDraHealth(connection); });
  return replaced;
}

template <typename Api>
grpc::Status KubeletSim::Impl::ReadDraHealth(const std::shared_ptr<detail::DraHealthConnection>& connection) {
  auto stub = Api::Service::NewStub(connection->channel);
  typename Api::Request request;
  auto reader = stub->NodeWatchResources(&connection->context, request);
  typename Api::Response response;
  while (reader->Read(&response)) {
    const auto received = std::chrono::steady_clock::now();
    std::vector<DraDeviceHealth> devices;
    std::string line = connection->driver + ": health";
    for (const auto& device : response.devices()) {
      DraDeviceHealth entry;
      entry.pool_name = device.device().pool_name();
      entry.device_name = device.device().device_name();
      entry.health = Api::Name(device.health());
      entry.last_updated_time = device.last_updated_time();
      entry.received = received;
      if constexpr (Api::kDetails) {
        entry.health_check_timeout_seconds = device.health_check_timeout_seconds();
        entry.message = device.message();
      }
      line += " " + entry.device_name + "=" + entry.health;
      devices.push_back(std::move(entry));
    }
    {
      std::lock_guard lock(mutex);
      auto it = dra_health.find(connection->endpoint);
      if (it == dra_health.end() || it->second != connection) continue;  // superseded
      DraDriverState& dra = state.dra_drivers[connection->driver];
      ++dra.health_messages;
      dra.health = std::move(devices);
    }
    Log(line);
    NotifyChanged();
  }
  return reader->Finish();
}

void KubeletSim::Impl::RunDraHealth(std::shared_ptr<detail::DraHealthConnection> connection) {
  const grpc::Status status = connection->service == kDraHealthServiceV1       ? ReadDraHealth<HealthV1>(connection)
                              : connection->service == kDraHealthServiceV1beta1 ? ReadDraHealth<HealthV1beta1>(connection)
                                                                                : ReadDraHealth<HealthV1alpha1>(connection);
  {
    std::lock_guard lock(mutex);
    auto it = dra_health.find(connection->endpoint);
    if (it == dra_health.end() || it->second == connection) {  // not superseded by a newer stream
      DraDriverState& dra = state.dra_drivers[connection->driver];
      dra.health_stream_open = false;
      dra.health_stream_end = connection->dropped ? "dropped by the kubelet" : detail::ToRpcStatus(status).ToString();
    }
  }
  NotifyChanged();
  Log(connection->driver + ": NodeWatchResources (" + connection->service + ") ended (" +
      detail::ToRpcStatus(status).ToString() + ")");
}

void KubeletSim::Impl::DropDraHealth(const std::shared_ptr<detail::DraHealthConnection>& connection) {
  connection->dropped = true;
  connection->context.TryCancel();
  if (connection->reader.joinable()) connection->reader.join();
}

}  // namespace gns::sim
