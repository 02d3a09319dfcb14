// KubeletSim lifecycle (start, stop, restart), the device-plugins/ directory rules, state
// accessors and waits. The device-plugin side is in device_plugins.cpp, the plugin watcher and
// DRA in plugin_watcher.cpp.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "kubelet_sim_impl.h"

namespace gns::sim {

namespace fs = std::filesystem;

namespace detail {

std::shared_ptr<grpc::Channel> DialUnix(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Quick reconnects after a plugin restarts. Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC's core
  // takes it as the minimum connect timeout too, and at 50 ms a loaded machine's handshake (an
  // ASan build on 2 busy cores) failed calls with "timed out before receiving SETTINGS frame".
  // Without it a connection attempt gets gRPC's default 20 s, as the kubelet's does.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // The kubelet dials device plugins with authority "localhost" (client.go); some servers check it.
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  return grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
}

RpcStatus ToRpcStatus(const grpc::Status& status) {
  return RpcStatus{status.error_code(), status.error_message()};
}

bool IsSocket(const fs::path& path) {
  std::error_code ec;
  return fs::is_socket(fs::status(path, ec));
}

std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

}  // namespace detail

std::string_view StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN_CODE";
  }
}

std::string RpcStatus::ToString() const {
  std::string out(StatusCodeName(code));
  if (!message.empty()) out += ": " + message;
  return out;
}

std::string_view ToString(PluginWatcherEvent::Kind kind) {
  switch (kind) {
    case PluginWatcherEvent::Kind::kRegistered: return "registered";
    case PluginWatcherEvent::Kind::kRejected: return "rejected";
    case PluginWatcherEvent::Kind::kGetInfoFailed: return "getinfo-failed";
    case PluginWatcherEvent::Kind::kDeregistered: return "deregistered";
    case PluginWatcherEvent::Kind::kProbeFailed: return "probe-failed";
  }
  return "unknown";
}

std::string_view ServiceName(DraVersion version) {
  return version == DraVersion::kV1 ? kDraV1Service : kDraV1beta1Service;
}

std::size_t ResourceState::CountHealth(std::string_view health) const {
  return static_cast<std::size_t>(
      std::count_if(devices.begin(), devices.end(), [&](const DeviceInfo& d) { return d.health == health; }));
}

const DeviceInfo* ResourceState::FindDevice(std::string_view id) const {
  for (const DeviceInfo& device : devices) {
    if (device.id == id) return &device;
  }
  return nullptr;
}

const ResourceState* KubeletState::FindResource(std::string_view resource) const {
  auto it = resources.find(std::string(resource));
  return it == resources.end() ? nullptr : &it->second;
}

const DraDriverState* KubeletState::FindDraDriver(std::string_view driver) const {
  auto it = dra_drivers.find(std::string(driver));
  return it == dra_drivers.end() ? nullptr : &it->second;
}

const DraDeviceHealth* DraDriverState::FindHealth(std::string_view device) const {
  for (const auto& entry : health) {
    if (entry.device_name == device) return &entry;
  }
  return nullptr;
}

// ---- Impl lifecycle -------------------------------------------------------------------------

KubeletSim::Impl::Impl(KubeletSimOptions opts)
    : options(std::move(opts)),
      kubelet_dir(options.kubelet_dir),
      device_plugin_dir(kubelet_dir / "device-plugins"),
      registry_dir(kubelet_dir / "plugins_registry"),
      pod_resources_dir(kubelet_dir / "pod-resources"),
      pod_resources_wanted(options.serve_pod_resources) {}

void KubeletSim::Impl::StartLocked() {
  {
    std::lock_guard lock(mutex);
    if (state.running) return;
  }
  // device-plugins/ is 0750 (server.go Start); plugins_registry/ 0755 (plugin_watcher.go).
  fs::create_directories(device_plugin_dir);
  fs::permissions(device_plugin_dir, fs::perms(0750), fs::perm_options::replace);
  fs::create_directories(registry_dir);
  fs::permissions(registry_dir, fs::perms(0755), fs::perm_options::replace);
  CleanupDevicePluginDirectory();
  {
    std::lock_guard lock(mutex);
    state.running = true;
  }
  try {
    StartRegistrationServer();
    if (pod_resources_wanted) StartPodResourcesServer();
    StartPluginWatcher();
  } catch (...) {
    StopLocked();
    throw;
  }
  NotifyChanged();
}

void KubeletSim::Impl::StopLocked() {
  {
    std::lock_guard lock(mutex);
    if (!state.running && !registration_server && !watcher_thread.joinable() && !worker_thread.joinable()) return;
    state.running = false;
    ++generation;
  }
  StopRegistrationServer();
  StopPodResourcesServer();
  StopPluginWatcher();
  std::vector<std::shared_ptr<detail::DevicePluginConnection>> connections;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
  std::map<std::string, std::shared_ptr<detail::DraHealthConnection>> health_streams;
  {
    std::lock_guard lock(mutex);
    connections = TakeConnectionsLocked("kubelet stopped");
    channels.swap(dra_channels);
    health_streams.swap(dra_health);
  }
  for (const auto& connection : connections) DropConnection(connection);
  for (const auto& [endpoint, health] : health_streams) DropDraHealth(health);
  channels.clear();
  NotifyChanged();
}

std::vector<std::shared_ptr<detail::DevicePluginConnection>> KubeletSim::Impl::TakeConnectionsLocked(
    const std::string& reason) {
  std::vector<std::shared_ptr<detail::DevicePluginConnection>> taken;
  for (auto& [resource, connection] : device_plugins) {
    ResourceState& rs = state.resources[resource];
    if (rs.connected) {
      rs.connected = false;
      rs.disconnect_reason = reason;
      rs.disconnected_at = std::chrono::steady_clock::now();
    }
    taken.push_back(std::move(connection));
  }
  device_plugins.clear();
  // A kubelet that stops forgets every plugin-watcher registration; a restarted one walks
  // plugins_registry again and registers each socket afresh.
  for (auto& [driver, dra] : state.dra_drivers) dra.endpoints.clear();
  state.csi_drivers.clear();
  for (auto& [socket, plugin] : state.plugin_sockets) plugin.registered = false;
  return taken;
}

void KubeletSim::Impl::CleanupDevicePluginDirectory() {
  // CleanupPluginDirectory: every non-directory entry but the checkpoint goes, so every plugin
  // socket disappears and plugins must re-register.
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(device_plugin_dir, ec)) {
    if (entry.path().filename() == detail::kCheckpointName) continue;
    std::error_code type_ec;
    if (entry.is_directory(type_ec) && !entry.is_symlink(type_ec)) continue;
    std::error_code remove_ec;
    fs::remove(entry.path(), remove_ec);
    if (remove_ec) Log("kubelet: cannot remove " + entry.path().string() + ": " + remove_ec.message());
  }
  if (ec) throw std::runtime_error("cannot list " + device_plugin_dir.string() + ": " + ec.message());
}

void KubeletSim::Impl::Log(const std::string& line) {
  if (!options.log) return;
  std::lock_guard lock(log_mutex);
  options.log(line);
}

// ---- KubeletSim -----------------------------------------------------------------------------

KubeletSim::KubeletSim(KubeletSimOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  if (impl_->kubelet_dir.empty()) throw std::invalid_argument("KubeletSim: kubelet_dir is empty");
  // Unix socket paths are limited to 107 bytes; fail here rather than with a bind error.
  const std::size_t longest = (impl_->device_plugin_dir / detail::kKubeletSocketName).string().size();
  if (longest >= 108) throw std::invalid_argument("KubeletSim: kubelet_dir too long for unix sockets");
}

KubeletSim::~KubeletSim() { Stop(); }

void KubeletSim::Start() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  impl_->StartLocked();
  impl_->Log("kubelet: serving " + KubeletSocket().string() + ", watching " + PluginsRegistryDir().string());
}

void KubeletSim::Stop() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  impl_->StopLocked();
}

void KubeletSim::Restart() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  impl_->StopLocked();
  impl_->StartLocked();
  {
    std::lock_guard state_lock(impl_->mutex);
    ++impl_->state.restarts;
  }
  impl_->NotifyChanged();
  impl_->Log("kubelet: restarted (device-plugins/ cleaned, kubelet.sock recreated, plugins_registry re-walked)");
}

fs::path KubeletSim::KubeletDir() const { return impl_->kubelet_dir; }
fs::path KubeletSim::DevicePluginDir() const { return impl_->device_plugin_dir; }
fs::path KubeletSim::KubeletSocket() const { return impl_->device_plugin_dir / detail::kKubeletSocketName; }
fs::path KubeletSim::PluginsRegistryDir() const { return impl_->registry_dir; }
fs::path KubeletSim::PodResourcesSocket() const { return impl_->pod_resources_dir / detail::kKubeletSocketName; }

KubeletState KubeletSim::State() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->state;
}

std::optional<ResourceState> KubeletSim::Resource(const std::string& resource) const {
  std::lock_guard lock(impl_->mutex);
  const ResourceState* rs = impl_->state.FindResource(resource);
  if (rs == nullptr) return std::nullopt;
  return *rs;
}

std::vector<DeviceInfo> KubeletSim::Devices(const std::string& resource) const {
  std::lock_guard lock(impl_->mutex);
  const ResourceState* rs = impl_->state.FindResource(resource);
  return rs == nullptr ? std::vector<DeviceInfo>{} : rs->devices;
}

int KubeletSim::Registrations(const std::string& resource) const {
  std::lock_guard lock(impl_->mutex);
  const ResourceState* rs = impl_->state.FindResource(resource);
  return rs == nullptr ? 0 : rs->registrations;
}

std::uint64_t KubeletSim::ListAndWatchMessages(const std::string& resource) const {
  std::lock_guard lock(impl_->mutex);
  const ResourceState* rs = impl_->state.FindResource(resource);
  return rs == nullptr ? 0 : rs->list_and_watch_messages;
}

std::optional<DevicePluginOptions> KubeletSim::LastOptions(const std::string& resource) const {
  std::lock_guard lock(impl_->mutex);
  const ResourceState* rs = impl_->state.FindResource(resource);
  if (rs == nullptr || rs->registrations == 0) return std::nullopt;
  return rs->options;
}

bool KubeletSim::Connected(const std::string& resource) const {
  std::lock_guard lock(impl_->mutex);
  const ResourceState* rs = impl_->state.FindResource(resource);
  return rs != nullptr && rs->connected;
}

std::optional<DraDriverState> KubeletSim::DraDriver(const std::string& driver) const {
  std::lock_guard lock(impl_->mutex);
  const DraDriverState* dra = impl_->state.FindDraDriver(driver);
  if (dra == nullptr) return std::nullopt;
  return *dra;
}

bool KubeletSim::WaitFor(const std::function<bool(const KubeletState&)>& predicate,
                         std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->changed.wait_for(lock, timeout, [&] { return predicate(impl_->state); });
}

bool KubeletSim::WaitForDevices(const std::string& resource,
                                const std::function<bool(const std::vector<DeviceInfo>&)>& predicate,
                                std::chrono::milliseconds timeout) const {
  return WaitFor(
      [&](const KubeletState& state) {
        const ResourceState* rs = state.FindResource(resource);
        return rs != nullptr && predicate(rs->devices);
      },
      timeout);
}

bool KubeletSim::WaitForDeviceHealth(const std::string& resource, const std::string& id, const std::string& health,
                                     std::chrono::milliseconds timeout) const {
  return WaitFor(
      [&](const KubeletState& state) {
        const ResourceState* rs = state.FindResource(resource);
        const DeviceInfo* device = rs == nullptr ? nullptr : rs->FindDevice(id);
        return device != nullptr && device->health == health;
      },
      timeout);
}

bool KubeletSim::WaitForRegistrations(const std::string& resource, int count, std::chrono::milliseconds timeout) const {
  return WaitFor(
      [&](const KubeletState& state) {
        const ResourceState* rs = state.FindResource(resource);
        return rs != nullptr && rs->registrations >= count;
      },
      timeout);
}

bool KubeletSim::WaitForDraDriver(const std::string& driver, std::chrono::milliseconds timeout) const {
  return WaitFor(
      [&](const KubeletState& state) {
        const DraDriverState* dra = state.FindDraDriver(driver);
        return dra != nullptr && dra->registered();
      },
      timeout);
}

SteadyTime DraDeviceHealth::ExpiresAt(std::chrono::milliseconds default_timeout) const {
  const auto timeout = health_check_timeout_seconds > 0
                           ? std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::seconds(health_check_timeout_seconds))
                           : default_timeout;
  return received + timeout;
}

std::string DraDeviceHealth::SeenAt(SteadyTime now, std::chrono::milliseconds default_timeout) const {
  return now > ExpiresAt(default_timeout) ? std::string("UNKNOWN") : health;
}

std::string KubeletSim::DraDeviceHealthNow(const std::string& driver, const std::string& device) const {
  std::lock_guard lock(impl_->mutex);
  const DraDriverState* dra = impl_->state.FindDraDriver(driver);
  const DraDeviceHealth* entry = dra == nullptr ? nullptr : dra->FindHealth(device);
  return entry == nullptr ? std::string() : entry->SeenAt(std::chrono::steady_clock::now(), impl_->options.dra_health_timeout);
}

bool KubeletSim::WaitForDraDeviceHealth(const std::string& driver, const std::string& device,
                                        const std::string& health, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto default_timeout = impl_->options.dra_health_timeout;
  std::unique_lock lock(impl_->mutex);
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const DraDriverState* dra = impl_->state.FindDraDriver(driver);
    const DraDeviceHealth* entry = dra == nullptr ? nullptr : dra->FindHealth(device);
    if (entry != nullptr && entry->SeenAt(now, default_timeout) == health) return true;
    if (now >= deadline) return false;
    // Wake at the next change, or when this report runs out (it then reads UNKNOWN).
    auto wake = deadline;
    if (entry != nullptr) {
      const auto expires = entry->ExpiresAt(default_timeout) + std::chrono::milliseconds(1);
      if (expires > now && expires < wake) wake = expires;
    }
    impl_->changed.wait_until(lock, wake);
  }
}

}  // namespace gns::sim
