// The kubelet's side of KEP-4680 (WIRE-FACTS §3.5): once a DRA plugin that advertises
// v1alpha1.DRAResourceHealth is registered, one NodeWatchResources stream per registration, read
// on its own thread; each message replaces the driver's recorded device list (every message is
// the complete list), and how the stream ended is kept.
#include "dra_health/v1alpha1/api.grpc.pb.h"
#include "kubelet_sim_impl.h"

namespace gns::sim {

std::shared_ptr<detail::DraHealthConnection> KubeletSim::Impl::StartDraHealthLocked(
    const std::string& driver, const std::string& endpoint, std::shared_ptr<grpc::Channel> channel) {
  auto connection = std::make_shared<detail::DraHealthConnection>();
  connection->driver = driver;
  connection->endpoint = endpoint;
  connection->channel = std::move(channel);
  std::shared_ptr<detail::DraHealthConnection> replaced;
  if (auto it = dra_health.find(endpoint); it != dra_health.end()) replaced = std::move(it->second);
  dra_health[endpoint] = connection;
  DraDriverState& dra = state.dra_drivers[driver];
  ++dra.health_streams;
  dra.health_stream_open = true;
  connection->reader = std::thread([this, connection] { RunDraHealth(connection); });
  return replaced;
}

void KubeletSim::Impl::RunDraHealth(std::shared_ptr<detail::DraHealthConnection> connection) {
  auto stub = ::v1alpha1::DRAResourceHealth::NewStub(connection->channel);
  ::v1alpha1::NodeWatchResourcesRequest request;
  std::unique_ptr<grpc::ClientReader<::v1alpha1::NodeWatchResourcesResponse>> reader =
      stub->NodeWatchResources(&connection->context, request);
  ::v1alpha1::NodeWatchResourcesResponse response;
  while (reader->Read(&response)) {
    std::vector<DraDeviceHealth> devices;
    std::string line = connection->driver + ": health";
    for (const auto& device : response.devices()) {
      devices.push_back(DraDeviceHealth{device.device().pool_name(), device.device().device_name(),
                                        ::v1alpha1::HealthStatus_Name(device.health()), device.last_updated_time()});
      line += " " + devices.back().device_name + "=" + devices.back().health;
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
  const grpc::Status status = reader->Finish();
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
  Log(connection->driver + ": NodeWatchResources ended (" + detail::ToRpcStatus(status).ToString() + ")");
}

void KubeletSim::Impl::DropDraHealth(const std::shared_ptr<detail::DraHealthConnection>& connection) {
  connection->dropped = true;
  connection->context.TryCancel();
  if (connection->reader.joinable()) connection->reader.join();
}

}  // namespace gns::sim
