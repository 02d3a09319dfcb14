// The device-plugin side of the fake kubelet (WIRE-FACTS §1.4): v1beta1.Registration on
// kubelet.sock, the kubelet's validation of RegisterRequest, the blocking dial +
// GetDevicePluginOptions + ListAndWatch reader per resource, and the calls made on pod admission.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <system_error>

#include <grpcpp/server_posix.h>

#include "kubelet_sim_impl.h"

namespace gns::sim {

namespace fs = std::filesystem;
using detail::DevicePluginConnection;

namespace {

// Go's %q for plain ASCII strings, so error texts read like the kubelet's.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Kubernetes IsDNS1123Subdomain.
bool IsDns1123Subdomain(std::string_view value) {
  static const std::regex kPattern("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return !value.empty() && value.size() <= 253 && std::regex_match(value.begin(), value.end(), kPattern);
}

// Kubernetes IsQualifiedName: [prefix/]name, name <= 63 characters.
bool IsQualifiedName(std::string_view value) {
  static const std::regex kName("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]");
  std::string_view name = value;
  const std::size_t slash = value.find('/');
  if (slash != std::string_view::npos) {
    if (value.find('/', slash + 1) != std::string_view::npos) return false;
    const std::string_view prefix = value.substr(0, slash);
    if (!IsDns1123Subdomain(prefix)) return false;
    name = value.substr(slash + 1);
  }
  return !name.empty() && name.size() <= 63 && std::regex_match(name.begin(), name.end(), kName);
}

std::vector<DeviceInfo> ToDevices(const v1beta1::ListAndWatchResponse& response) {
  std::vector<DeviceInfo> devices;
  devices.reserve(static_cast<std::size_t>(response.devices_size()));
  for (const v1beta1::Device& device : response.devices()) {
    DeviceInfo info{device.id(), device.health(), {}};
    for (const v1beta1::NUMANode& node : device.topology().nodes()) info.numa_nodes.push_back(node.id());
    devices.push_back(std::move(info));
  }
  return devices;
}

// "nvidia.com/gpu: 8 devices, 7 Healthy, 1 Unhealthy (GPU-…)": the unhealthy ones are named.
std::string Summary(const std::string& resource, const std::vector<DeviceInfo>& devices) {
  std::map<std::string, std::vector<std::string>> by_health;
  for (const DeviceInfo& device : devices) by_health[device.health].push_back(device.id);
  std::ostringstream out;
  out << resource << ": " << devices.size() << (devices.size() == 1 ? " device" : " devices");
  auto print = [&](const std::string& health, bool name_them) {
    auto it = by_health.find(health);
    if (it == by_health.end()) return;
    out << ", " << it->second.size() << ' ' << (health.empty() ? "\"\"" : health);
    if (name_them) {
      out << " (";
      for (std::size_t i = 0; i < it->second.size(); ++i) out << (i == 0 ? "" : ", ") << it->second[i];
      out << ')';
    }
    by_health.erase(it);
  };
  print("Healthy", false);
  print("Unhealthy", true);
  while (!by_health.empty()) print(by_health.begin()->first, true);
  return out.str();
}

std::string Describe(const DevicePluginOptions& options) {
  return std::string("pre_start_required=") + (options.pre_start_required ? "true" : "false") +
         " get_preferred_allocation_available=" + (options.get_preferred_allocation_available ? "true" : "false");
}

// filepath.Join(dir, endpoint): an absolute endpoint is still joined under dir.
fs::path JoinUnder(const fs::path& dir, const std::string& endpoint) {
  std::string_view rest = endpoint;
  while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
  return (dir / fs::path(rest)).lexically_normal();
}

}  // namespace

bool IsExtendedResourceName(std::string_view name) {
  // IsNativeResource: no '/' at all, or a kubernetes.io/ prefix; "requests." is reserved for quota.
  if (name.find('/') == std::string_view::npos) return false;
  if (name.find("kubernetes.io/") != std::string_view::npos) return false;
  if (name.starts_with("requests.")) return false;
  return IsQualifiedName("requests." + std::string(name));
}

// ---- registration server -------------------------------------------------------------------

void KubeletSim::Impl::StartRegistrationServer() {
  const fs::path socket = device_plugin_dir / detail::kKubeletSocketName;
  std::error_code ec;
  fs::remove(socket, ec);  // a stale socket: the kubelet removes it before listening too
  const bool delayed = options.registration_listen_delay.count() > 0;
  grpc::ServerBuilder builder;
  if (!delayed) builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&registration_service);
  // Register calls are rare; a small pool is plenty.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  registration_server = builder.BuildAndStart();
  if (!registration_server) throw std::runtime_error("cannot serve " + socket.string());
  if (delayed) StartDelayedListener(socket);
  std::ofstream(device_plugin_dir / detail::kDeprecationFileName).flush();
}

void KubeletSim::Impl::StartDelayedListener(const fs::path& socket) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = socket.string();
  if (path.size() >= sizeof(addr.sun_path)) throw std::runtime_error("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::system_error(err, std::generic_category(), "bind " + path);
  }
  registration_listen_fd = fd;
  {
    std::lock_guard lock(listen_mutex);
    listen_stop = false;
  }
  Log("kubelet: " + path + " bound; listening in " + std::to_string(options.registration_listen_delay.count()) + " ms");
  registration_accept_thread = std::thread([this, fd] {
    {
      std::unique_lock lock(listen_mutex);
      if (listen_cv.wait_for(lock, options.registration_listen_delay, [this] { return listen_stop; })) return;
    }
    if (::listen(fd, 64) != 0) return;
    for (;;) {
      // Non-blocking, as gRPC wants the descriptors it is handed.
      const int connection = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (connection < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down by StopRegistrationServer
      }
      grpc::AddInsecureChannelFromFd(registration_server.get(), connection);
    }
  });
}

void KubeletSim::Impl::StopRegistrationServer() {
  if (registration_accept_thread.joinable()) {
    {
      std::lock_guard lock(listen_mutex);
      listen_stop = true;
    }
    listen_cv.notify_all();
    ::shutdown(registration_listen_fd, SHUT_RDWR);  // wakes accept()
    registration_accept_thread.join();
  }
  if (registration_listen_fd >= 0) {
    ::close(registration_listen_fd);
    registration_listen_fd = -1;
    std::error_code ec;
    fs::remove(device_plugin_dir / detail::kKubeletSocketName, ec);  // gRPC removes its own; this one is ours
  }
  if (!registration_server) return;
  // In-flight Register calls may be dialling their plugin; give them a moment, then cancel.
  registration_server->Shutdown(detail::Deadline(std::chrono::milliseconds(1000)));
  registration_server->Wait();
  registration_server.reset();
}

grpc::Status KubeletSim::Impl::RegistrationService::Register(grpc::ServerContext* /*context*/,
                                                             const v1beta1::RegisterRequest* request,
                                                             v1beta1::Empty* /*response*/) {
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(impl_.mutex);
    if (!impl_.state.running) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is stopping");
    generation = impl_.generation;
  }
  // The kubelet returns plain Go errors, which gRPC sends as UNKNOWN (server.go Register).
  grpc::Status status;
  if (request->version() != detail::kDevicePluginVersion) {
    status = grpc::Status(grpc::StatusCode::UNKNOWN, "requested API version " + Quote(request->version()) +
                                                         " is not supported by kubelet. Supported version is [" +
                                                         Quote(detail::kDevicePluginVersion) + "]");
  } else if (!IsExtendedResourceName(request->resource_name())) {
    status = grpc::Status(grpc::StatusCode::UNKNOWN, "the ResourceName " + Quote(request->resource_name()) + " is invalid");
  } else {
    const fs::path socket = JoinUnder(impl_.device_plugin_dir, request->endpoint());
    status = impl_.ConnectDevicePlugin(request->resource_name(), socket.string(), "", generation);
  }
  if (!status.ok()) impl_.RecordRejection(*request, status);
  return status;
}

void KubeletSim::Impl::RecordRejection(const v1beta1::RegisterRequest& request, const grpc::Status& status) {
  {
    std::lock_guard lock(mutex);
    state.rejected.push_back(RejectedRegistration{std::chrono::steady_clock::now(), request.resource_name(),
                                                  request.version(), request.endpoint(), detail::ToRpcStatus(status)});
  }
  NotifyChanged();
  Log("device-plugin: rejected Register resource=" + request.resource_name() + " version=" + request.version() +
      " endpoint=" + request.endpoint() + ": " + status.error_message());
}

// ---- connections ----------------------------------------------------------------------------

grpc::Status KubeletSim::Impl::ConnectDevicePlugin(const std::string& resource, const std::string& socket_path,
                                                   const std::string& registration_socket,
                                                   std::uint64_t generation_at_start) {
  auto connection = std::make_shared<DevicePluginConnection>();
  connection->resource = resource;
  connection->socket_path = socket_path;
  connection->registration_socket = registration_socket;
  connection->channel = detail::DialUnix(socket_path);
  connection->stub = v1beta1::DevicePlugin::NewStub(connection->channel);

  // The kubelet dials with WithBlock and a 10 s timeout before answering Register: a plugin must
  // be serving its socket before it registers.
  if (!connection->channel->WaitForConnected(detail::Deadline(options.dial_timeout))) {
    return grpc::Status(grpc::StatusCode::UNKNOWN,
                        "failed to dial device plugin: context deadline exceeded (" + socket_path + ")");
  }
  v1beta1::DevicePluginOptions plugin_options;
  {
    grpc::ClientContext context;
    context.set_deadline(detail::Deadline(options.dial_timeout));
    v1beta1::Empty empty;
    grpc::Status status = connection->stub->GetDevicePluginOptions(&context, empty, &plugin_options);
    if (!status.ok()) {
      return grpc::Status(grpc::StatusCode::UNKNOWN, "failed to get device plugin options: " + status.error_message());
    }
  }

  const DevicePluginOptions options_view{plugin_options.pre_start_required(),
                                         plugin_options.get_preferred_allocation_available()};
  std::shared_ptr<DevicePluginConnection> replaced;
  int registrations = 0;
  {
    std::lock_guard lock(mutex);
    if (!state.running || generation != generation_at_start) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet restarted during registration");
    }
    connection->id = ++next_connection_id;
    std::shared_ptr<DevicePluginConnection>& slot = device_plugins[resource];
    replaced = std::move(slot);
    slot = connection;
    ResourceState& rs = state.resources[resource];
    rs.resource = resource;
    rs.endpoint = socket_path;
    rs.registration_socket = registration_socket;
    rs.connected = true;
    rs.connection = connection->id;
    rs.options = options_view;
    rs.registered_at = std::chrono::steady_clock::now();
    rs.disconnect_reason.clear();
    registrations = ++rs.registrations;
    if (!registration_socket.empty()) {
      // Through plugins_registry: the socket counts as registered from this step on.
      PluginSocketState& ps = state.plugin_sockets[registration_socket];
      ps.registered = true;
      ++ps.registrations;
    }
    connection->reader = std::thread([this, connection] { RunListAndWatch(connection); });
  }
  NotifyChanged();
  // The newest registration wins; the old connection is closed (its plugin sees the stream end).
  if (replaced) DropConnection(replaced);
  Log("device-plugin: registered " + resource + " endpoint=" + socket_path + " (" + Describe(options_view) +
      ", registration #" + std::to_string(registrations) + ")");
  return grpc::Status::OK;
}

void KubeletSim::Impl::RunListAndWatch(std::shared_ptr<DevicePluginConnection> connection) {
  v1beta1::Empty request;
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader =
      connection->stub->ListAndWatch(&connection->stream_context, request);
  v1beta1::ListAndWatchResponse response;
  while (reader->Read(&response)) {
    const SteadyTime received = std::chrono::steady_clock::now();
    std::vector<DeviceInfo> devices = ToDevices(response);
    std::string line;
    {
      std::lock_guard lock(mutex);
      auto it = device_plugins.find(connection->resource);
      if (it == device_plugins.end() || it->second != connection) continue;  // superseded
      ResourceState& rs = state.resources[connection->resource];
      ++rs.list_and_watch_messages;
      rs.updates.push_back(ListAndWatchUpdate{received, connection->id, devices});
      while (rs.updates.size() > options.max_updates) rs.updates.pop_front();
      line = Summary(connection->resource, devices);
      rs.devices = std::move(devices);
    }
    // Logged before waiters wake, so whoever waited on the update also finds its line.
    Log(line);
    NotifyChanged();
  }
  const grpc::Status status = reader->Finish();
  bool gone = false;
  {
    std::lock_guard lock(mutex);
    auto it = device_plugins.find(connection->resource);
    if (!connection->dropped && it != device_plugins.end() && it->second == connection) {
      // The kubelet keeps the devices (marked unhealthy) for endpointStopGracePeriod; we keep the
      // last list as the plugin sent it and flag the resource.
      ResourceState& rs = state.resources[connection->resource];
      rs.connected = false;
      ++rs.disconnects;
      rs.disconnect_reason = "ListAndWatch ended: " + detail::ToRpcStatus(status).ToString();
      rs.disconnected_at = std::chrono::steady_clock::now();
      gone = true;
    }
  }
  if (gone) {
    NotifyChanged();
    Log(connection->resource + ": ListAndWatch ended (" + detail::ToRpcStatus(status).ToString() +
        "): plugin disconnected");
  }
}

void KubeletSim::Impl::DropConnection(const std::shared_ptr<DevicePluginConnection>& connection) {
  connection->dropped = true;
  // Cancelling before the reader has started the call is fine: gRPC cancels it on start.
  connection->stream_context.TryCancel();
  if (connection->reader.joinable()) connection->reader.join();
}

std::shared_ptr<DevicePluginConnection> KubeletSim::Impl::ConnectionFor(const std::string& resource) const {
  std::lock_guard lock(mutex);
  auto it = device_plugins.find(resource);
  return it == device_plugins.end() ? nullptr : it->second;
}

// ---- calls on pod admission -----------------------------------------------------------------

namespace {

RpcStatus NotRegistered(const std::string& resource) {
  // The device manager's own wording for a resource without an endpoint.
  return RpcStatus{grpc::StatusCode::FAILED_PRECONDITION, "can't allocate unregistered device " + resource};
}

}  // namespace

RpcResult<v1beta1::AllocateResponse> KubeletSim::Allocate(const std::string& resource,
                                                          const std::vector<std::vector<std::string>>& container_requests) {
  RpcResult<v1beta1::AllocateResponse> result;
  auto connection = impl_->ConnectionFor(resource);
  if (!connection) {
    result.status = NotRegistered(resource);
    return result;
  }
  v1beta1::AllocateRequest request;
  for (const auto& ids : container_requests) {
    v1beta1::ContainerAllocateRequest* container = request.add_container_requests();
    for (const std::string& id : ids) container->add_devices_ids(id);
  }
  grpc::ClientContext context;
  context.set_deadline(detail::Deadline(impl_->options.device_plugin_call_timeout));
  result.status = detail::ToRpcStatus(connection->stub->Allocate(&context, request, &result.response));
  impl_->Log("device-plugin: Allocate " + resource + " (" + std::to_string(container_requests.size()) +
             " containers): " + result.status.ToString());
  return result;
}

RpcResult<v1beta1::PreferredAllocationResponse> KubeletSim::GetPreferredAllocation(
    const std::string& resource, const std::vector<std::string>& available, const std::vector<std::string>& must_include,
    int size) {
  RpcResult<v1beta1::PreferredAllocationResponse> result;
  auto connection = impl_->ConnectionFor(resource);
  if (!connection) {
    result.status = NotRegistered(resource);
    return result;
  }
  if (impl_->options.strict_options && !LastOptions(resource).value_or(DevicePluginOptions{}).get_preferred_allocation_available) {
    result.status = RpcStatus{grpc::StatusCode::FAILED_PRECONDITION,
                              "the plugin for " + resource +
                                  " did not set get_preferred_allocation_available; the kubelet would not call "
                                  "GetPreferredAllocation"};
    return result;
  }
  v1beta1::PreferredAllocationRequest request;
  v1beta1::ContainerPreferredAllocationRequest* container = request.add_container_requests();
  for (const std::string& id : available) container->add_available_deviceids(id);
  for (const std::string& id : must_include) container->add_must_include_deviceids(id);
  container->set_allocation_size(size);
  grpc::ClientContext context;
  context.set_deadline(detail::Deadline(impl_->options.device_plugin_call_timeout));
  result.status = detail::ToRpcStatus(connection->stub->GetPreferredAllocation(&context, request, &result.response));
  return result;
}

RpcResult<v1beta1::PreStartContainerResponse> KubeletSim::PreStartContainer(const std::string& resource,
                                                                            const std::vector<std::string>& device_ids) {
  RpcResult<v1beta1::PreStartContainerResponse> result;
  auto connection = impl_->ConnectionFor(resource);
  if (!connection) {
    result.status = NotRegistered(resource);
    return result;
  }
  if (impl_->options.strict_options && !LastOptions(resource).value_or(DevicePluginOptions{}).pre_start_required) {
    result.status = RpcStatus{grpc::StatusCode::FAILED_PRECONDITION,
                              "the plugin for " + resource +
                                  " did not set pre_start_required; the kubelet would not call PreStartContainer"};
    return result;
  }
  v1beta1::PreStartContainerRequest request;
  for (const std::string& id : device_ids) request.add_devices_ids(id);
  grpc::ClientContext context;
  // KubeletPreStartContainerRPCTimeoutInSecs.
  context.set_deadline(detail::Deadline(std::chrono::seconds(30)));
  result.status = detail::ToRpcStatus(connection->stub->PreStartContainer(&context, request, &result.response));
  return result;
}

}  // namespace gns::sim
