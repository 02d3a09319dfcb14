// The plugin-watcher and DRA side of the fake kubelet (WIRE-FACTS §2, §3): inotify on
// plugins_registry/, the register sequence GetInfo -> validate -> register ->
// NotifyRegistrationStatus (retried from the start on failure), deregistration when the socket
// goes, the GetInfo monitor, and NodePrepareResources / NodeUnprepareResources over v1 or v1beta1.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "kubelet_sim_impl.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace gns::sim {

namespace fs = std::filesystem;
using detail::WorkItem;

namespace {

constexpr std::uint32_t kWatchMask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF;

PluginInfoView ToView(const pluginregistration::PluginInfo& info) {
  PluginInfoView view{info.type(), info.name(), info.endpoint(), {}};
  view.supported_versions.assign(info.supported_versions().begin(), info.supported_versions().end());
  return view;
}

// Go's %q of a []string: ["a" "b"].
std::string QuoteList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "\"" : " \"") + items[i] + "\"";
  return out + "]";
}

std::string JoinComma(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

// utilversion.ParseGeneric, as far as CSI versions need it: an optional "v", then at least
// major.minor, dot-separated numbers; anything after the numbers ("-rc1") is ignored.
std::optional<std::vector<int>> ParseGenericVersion(std::string_view text) {
  if (!text.empty() && text.front() == 'v') text.remove_prefix(1);
  std::vector<int> parts;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t end = i;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == i || end - i > 9) break;
    parts.push_back(std::stoi(std::string(text.substr(i, end - i))));
    if (end >= text.size() || text[end] != '.') break;
    i = end + 1;
  }
  if (parts.size() < 2) return std::nullopt;
  return parts;
}

// csi_plugin.go highestSupportedVersion: the highest offered version with major <= 1 (2.x need
// not be compatible), which must be a 1.x (0.x is no longer supported). "" and the error text
// otherwise.
std::string HighestCsiVersion(const std::vector<std::string>& versions, std::string& error) {
  std::optional<std::vector<int>> best;
  std::string best_text;
  for (const std::string& offered : versions) {
    auto parsed = ParseGenericVersion(offered);
    if (!parsed) {
      error = "illegal version string \"" + offered + "\"";
      continue;
    }
    if ((*parsed)[0] > 1) continue;
    if (!best || *best < *parsed) {
      best = parsed;
      best_text = offered;
    }
  }
  if (!best) {
    error = "could not find a highest supported version from versions (" + QuoteList(versions) +
            ") reported by this driver: " + error;
    return "";
  }
  if ((*best)[0] != 1) {
    error = "highest supported version reported by driver is " + best_text + ", must be v1.x";
    return "";
  }
  error.clear();
  return best_text;
}

}  // namespace

// ---- watcher thread -------------------------------------------------------------------------

void KubeletSim::Impl::StartPluginWatcher() {
  inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (inotify_fd < 0 || wake_fd < 0) {
    const std::string why = std::strerror(errno);
    StopPluginWatcher();
    throw std::runtime_error("plugin watcher: " + why);
  }
  {
    std::lock_guard lock(mutex);
    worker_stop = false;
    queue.clear();
  }
  worker_thread = std::thread([this] { WorkerLoop(); });
  // The watch is set before the directory is walked, so a socket created meanwhile is seen by
  // one or the other (or both: a pending walk item is replaced by the create event's).
  std::map<int, fs::path> watches;
  AddWatchTree(inotify_fd, registry_dir, watches);
  watcher_thread = std::thread(
      [this, fd = inotify_fd, wake = wake_fd, watches = std::move(watches)]() mutable { WatchLoop(fd, wake, watches); });
}

void KubeletSim::Impl::StopPluginWatcher() {
  if (wake_fd >= 0) {
    const std::uint64_t one = 1;
    // An eventfd write of 1 cannot block or fail short here; the watcher only needs POLLIN.
    [[maybe_unused]] ssize_t written = ::write(wake_fd, &one, sizeof(one));
  }
  if (watcher_thread.joinable()) watcher_thread.join();
  {
    std::lock_guard lock(mutex);
    worker_stop = true;
    if (worker_call != nullptr) worker_call->TryCancel();
  }
  work_cv.notify_all();
  if (worker_thread.joinable()) worker_thread.join();
  if (inotify_fd >= 0) ::close(inotify_fd);
  if (wake_fd >= 0) ::close(wake_fd);
  inotify_fd = wake_fd = -1;
}

void KubeletSim::Impl::AddWatchTree(int fd, const fs::path& dir, std::map<int, fs::path>& watches) {
  const int wd = inotify_add_watch(fd, dir.c_str(), kWatchMask);
  if (wd < 0) {
    Log("plugin-watcher: cannot watch " + dir.string() + ": " + std::strerror(errno));
    return;
  }
  watches[wd] = dir;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with('.')) continue;  // the kubelet ignores hidden names
    std::error_code type_ec;
    const fs::file_status status = entry.symlink_status(type_ec);
    if (fs::is_directory(status)) {
      AddWatchTree(fd, entry.path(), watches);
    } else if (fs::is_socket(status)) {
      Enqueue(WorkItem{WorkItem::Kind::kRegister, entry.path().string(), std::chrono::steady_clock::now(), 0, true});
    }
  }
}

void KubeletSim::Impl::WatchLoop(int fd, int wake, std::map<int, fs::path>& watches) {
  alignas(inotify_event) char buffer[16 * 1024];
  for (;;) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log(std::string("plugin-watcher: poll: ") + std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      return;
    }
    for (ssize_t offset = 0; offset < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
      offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      if (event->mask & IN_Q_OVERFLOW) {
        // Events were lost: walk again (registered sockets are left alone by the worker).
        Log("plugin-watcher: inotify queue overflow, re-walking " + registry_dir.string());
        AddWatchTree(fd, registry_dir, watches);
        continue;
      }
      if (event->mask & IN_IGNORED) {
        watches.erase(event->wd);
        continue;
      }
      auto it = watches.find(event->wd);
      if (it == watches.end() || event->len == 0) continue;
      const std::string name = event->name;
      if (name.starts_with('.')) continue;
      const fs::path path = it->second / name;
      if (event->mask & (IN_CREATE | IN_MOVED_TO)) {
        if (event->mask & IN_ISDIR) {
          AddWatchTree(fd, path, watches);
        } else if (detail::IsSocket(path)) {
          Enqueue(WorkItem{WorkItem::Kind::kRegister, path.string(), std::chrono::steady_clock::now(), 0, false});
        }
      } else if (event->mask & (IN_DELETE | IN_MOVED_FROM)) {
        if (!(event->mask & IN_ISDIR)) {
          Enqueue(WorkItem{WorkItem::Kind::kDeregister, path.string(), std::chrono::steady_clock::now(), 0, false});
        }
      }
    }
  }
}

// ---- registration worker --------------------------------------------------------------------

void KubeletSim::Impl::Enqueue(WorkItem item) {
  {
    std::lock_guard lock(mutex);
    // A newer event for a socket replaces a pending (re)registration of it.
    std::erase_if(queue, [&](const WorkItem& queued) {
      return queued.socket == item.socket && queued.kind == WorkItem::Kind::kRegister;
    });
    queue.push_back(std::move(item));
  }
  work_cv.notify_all();
}

void KubeletSim::Impl::RetryLater(const WorkItem& item) {
  if (options.registration_retry_initial.count() <= 0) return;
  auto delay = options.registration_retry_initial;
  for (int i = 0; i < item.attempt && delay < options.registration_retry_max; ++i) delay *= 2;
  delay = std::min(delay, options.registration_retry_max);
  std::lock_guard lock(mutex);
  if (worker_stop) return;
  // Only if nothing newer about this socket is pending.
  if (std::any_of(queue.begin(), queue.end(), [&](const WorkItem& queued) { return queued.socket == item.socket; })) {
    return;
  }
  queue.push_back(WorkItem{WorkItem::Kind::kRegister, item.socket, std::chrono::steady_clock::now() + delay,
                           item.attempt + 1, item.if_new});
  work_cv.notify_all();
}

void KubeletSim::Impl::WorkerLoop() {
  using Clock = std::chrono::steady_clock;
  const bool probing = options.probe_interval.count() > 0;
  Clock::time_point next_probe = probing ? Clock::now() + options.probe_interval : Clock::time_point::max();
  std::unique_lock lock(mutex);
  while (!worker_stop) {
    // The earliest due item; ties keep arrival order.
    auto next = std::min_element(queue.begin(), queue.end(),
                                 [](const WorkItem& a, const WorkItem& b) { return a.due < b.due; });
    const Clock::time_point item_due = next == queue.end() ? Clock::time_point::max() : next->due;
    const Clock::time_point wake = std::min(item_due, next_probe);
    const Clock::time_point now = Clock::now();
    if (wake == Clock::time_point::max()) {
      work_cv.wait(lock);
      continue;
    }
    if (now < wake) {
      work_cv.wait_until(lock, wake);
      continue;
    }
    if (next_probe <= now) {
      lock.unlock();
      ProbeSockets();
      lock.lock();
      next_probe = Clock::now() + options.probe_interval;
      continue;
    }
    WorkItem item = std::move(*next);
    queue.erase(next);
    lock.unlock();
    if (item.kind == WorkItem::Kind::kRegister) {
      RegisterPluginSocket(item);
    } else {
      DeregisterPluginSocket(item.socket, "socket removed");
    }
    lock.lock();
  }
}

void KubeletSim::Impl::AddWatcherEventLocked(PluginWatcherEvent event) {
  state.watcher_events.push_back(std::move(event));
  while (state.watcher_events.size() > options.max_watcher_events) state.watcher_events.pop_front();
}

void KubeletSim::Impl::RegisterPluginSocket(const WorkItem& item) {
  const std::string& socket = item.socket;
  if (!detail::IsSocket(socket)) return;  // gone again before we got to it
  std::uint64_t generation_at_start = 0;
  bool already_registered = false;
  {
    std::lock_guard lock(mutex);
    if (!state.running || worker_stop) return;
    generation_at_start = generation;
    auto it = state.plugin_sockets.find(socket);
    already_registered = it != state.plugin_sockets.end() && it->second.registered;
  }
  if (already_registered && item.if_new) return;
  // A socket recreated at the same path is a new plugin instance: deregister the old one first.
  if (already_registered) DeregisterPluginSocket(socket, "socket recreated");

  auto channel = detail::DialUnix(socket);
  auto stub = pluginregistration::Registration::NewStub(channel);
  pluginregistration::PluginInfo info;
  grpc::Status getinfo_status;
  {
    grpc::ClientContext context;
    // The kubelet's blocking dial (10 s), then GetInfo with 1 s: a socket that is bound but not
    // yet listening is waited for.
    context.set_wait_for_ready(true);
    context.set_deadline(detail::Deadline(options.dial_timeout + options.getinfo_timeout));
    {
      std::lock_guard lock(mutex);
      if (worker_stop) return;
      worker_call = &context;
    }
    getinfo_status = stub->GetInfo(&context, pluginregistration::InfoRequest{}, &info);
    std::lock_guard lock(mutex);
    worker_call = nullptr;
  }

  if (!getinfo_status.ok()) {
    const std::string error = "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket " + socket +
                              ", err: " + detail::ToRpcStatus(getinfo_status).ToString();
    {
      std::lock_guard lock(mutex);
      if (worker_stop) return;
      PluginSocketState& ps = state.plugin_sockets[socket];
      ps.socket = socket;
      ++ps.attempts;
      ++ps.getinfo_failures;
      ps.last_getinfo = detail::ToRpcStatus(getinfo_status);
      AddWatcherEventLocked(PluginWatcherEvent{PluginWatcherEvent::Kind::kGetInfoFailed, std::chrono::steady_clock::now(),
                                               socket, {}, "", error, {}});
    }
    NotifyChanged();
    Log("plugin-watcher: " + error);
    RetryLater(item);
    return;
  }

  const PluginInfoView view = ToView(info);
  {
    std::lock_guard lock(mutex);
    PluginSocketState& ps = state.plugin_sockets[socket];
    ps.socket = socket;
    ps.info = view;
    ++ps.attempts;
    ++ps.getinfo_ok;
    ps.last_getinfo = RpcStatus{};
    ps.consecutive_probe_failures = 0;
  }
  const std::string endpoint = view.endpoint.empty() ? socket : view.endpoint;  // as the kubelet defaults it
  std::shared_ptr<detail::DraHealthConnection> replaced_health;  // dropped once the lock is released
  std::string error;
  std::string service;
  if (view.type == detail::kPluginTypeDra) {
    // DRAPluginManager.validateSupportedServices: the plugin's list in the plugin's order, the
    // first entry this kubelet speaks wins.
    if (view.supported_versions.empty()) {
      error = "empty list of supported gRPC services (aka supported versions)";
    } else {
      for (const std::string& offered : view.supported_versions) {
        if (std::find(options.dra_services.begin(), options.dra_services.end(), offered) != options.dra_services.end()) {
          service = offered;
          break;
        }
      }
      if (service.empty()) {
        error = "none of services supported by the plugin (" + QuoteList(view.supported_versions) +
                ") are supported by the kubelet (" + QuoteList(options.dra_services) + ")";
      }
    }
    if (!error.empty()) {
      error = "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver "
              "plugin " + view.name + " at endpoint " + endpoint + ": " + error;
    } else if (options.check_dra_endpoint && !detail::IsSocket(endpoint)) {
      // KubeletSimOptions::check_dra_endpoint (not a kubelet rule).
      error = "RegisterPlugin error -- plugin registration failed with err: DRA endpoint " + endpoint +
              " is not a socket (kubelet simulator check)";
    } else {
      std::lock_guard lock(mutex);
      if (!state.running || generation != generation_at_start) return;
      DraDriverState& dra = state.dra_drivers[view.name];
      dra.driver = view.name;
      if (std::any_of(dra.endpoints.begin(), dra.endpoints.end(),
                      [&](const DraEndpointState& e) { return e.endpoint == endpoint; })) {
        error = "RegisterPlugin error -- plugin registration failed with err: endpoint " + endpoint +
                " already registered for DRA driver plugin " + view.name;
      } else {
        auto dra_channel = detail::DialUnix(endpoint);
        dra_channel->GetState(true);  // connect now, as the kubelet does (conn.Connect())
        dra_channels[endpoint] = dra_channel;
        dra.endpoints.push_back(
            DraEndpointState{endpoint, socket, service, view.supported_versions, std::chrono::steady_clock::now()});
        ++dra.registrations;
        // A kubelet dials the health service only for a plugin that advertises a version it knows.
        if (options.watch_dra_health) {
          for (const std::string& service : options.dra_health_services) {
            if (std::find(view.supported_versions.begin(), view.supported_versions.end(), service) !=
                view.supported_versions.end()) {
              replaced_health = StartDraHealthLocked(view.name, endpoint, service, std::move(dra_channel));
              break;
            }
          }
        }
        // In the same step, so a waiter that sees the driver also sees its socket registered.
        PluginSocketState& ps = state.plugin_sockets[socket];
        ps.registered = true;
        ++ps.registrations;
      }
    }
    if (replaced_health) DropDraHealth(replaced_health);
  } else if (view.type == detail::kPluginTypeDevicePlugin) {
    // The device manager's plugin-watcher handler (handler.go ValidatePlugin / RegisterPlugin).
    const auto& versions = view.supported_versions;
    if (std::find(versions.begin(), versions.end(), detail::kDevicePluginVersion) == versions.end()) {
      error = "RegisterPlugin error -- plugin validation failed with err: manager version, v1beta1, is not among plugin "
              "supported versions " + QuoteList(versions);
    } else if (!IsExtendedResourceName(view.name)) {
      error = "RegisterPlugin error -- plugin validation failed with err: invalid name of device plugin socket: the "
              "ResourceName \"" + view.name + "\" is invalid";
    } else {
      grpc::Status status = ConnectDevicePlugin(view.name, endpoint, socket, generation_at_start);
      if (!status.ok()) {
        error = "RegisterPlugin error -- plugin registration failed with err: " + status.error_message();
      }
    }
  } else if (view.type == kPluginTypeCsi) {
    // The CSI handler (pkg/volume/csi/csi_plugin.go): ValidatePlugin (a 1.x version, not below a
    // driver of that name registered already), RegisterPlugin (kept, then NodeGetInfo; a failure
    // there unregisters it again).
    std::string why;
    const std::string highest =
        view.supported_versions.empty() ? std::string() : HighestCsiVersion(view.supported_versions, why);
    if (view.supported_versions.empty()) {
      why = "ValidatePlugin for CSI driver \"" + view.name + "\" failed. Plugin returned an empty list for supported versions";
    } else if (highest.empty()) {
      why = "ValidatePlugin for CSI driver \"" + view.name + "\" failed. None of the versions specified " +
            QuoteList(view.supported_versions) + " are supported. err=" + why;
    } else {
      std::lock_guard lock(mutex);
      auto existing = state.csi_drivers.find(view.name);
      if (existing != state.csi_drivers.end() && existing->second.registration_socket != socket &&
          !(*ParseGenericVersion(existing->second.highest_version) < *ParseGenericVersion(highest))) {
        why = "ValidatePlugin for CSI driver \"" + view.name +
              "\" failed. Another driver with the same name is already registered with a higher supported version: \"" +
              existing->second.highest_version + "\"";
      }
    }
    if (!why.empty()) {
      error = "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver " + view.name +
              " at endpoint " + endpoint + ": " + why;
    } else {
      std::string node_id;
      const std::string failed = options.csi_node_info ? options.csi_node_info(view.name, endpoint, node_id) : "";
      if (!failed.empty()) {
        error = "RegisterPlugin error -- plugin registration failed with err: error updating CSI node info for driver " +
                view.name + ": " + failed;
      } else {
        std::lock_guard lock(mutex);
        if (!state.running || generation != generation_at_start) return;
        CsiDriverState& csi = state.csi_drivers[view.name];
        const int registrations = csi.registrations;
        csi = CsiDriverState{view.name, endpoint, socket, view.supported_versions, highest, node_id, registrations + 1};
        PluginSocketState& ps = state.plugin_sockets[socket];
        ps.registered = true;
        ++ps.registrations;
      }
    }
  } else {
    error = "RegisterPlugin error -- no handler registered for plugin type: " + view.type + " at socket " + socket;
  }

  // NotifyRegistrationStatus, after the handler registered the plugin (or refused it).
  pluginregistration::RegistrationStatus registration_status;
  registration_status.set_plugin_registered(error.empty());
  registration_status.set_error(error);
  pluginregistration::RegistrationStatusResponse notify_response;
  grpc::Status notify_status;
  {
    grpc::ClientContext context;
    context.set_deadline(detail::Deadline(options.notify_timeout));
    notify_status = stub->NotifyRegistrationStatus(&context, registration_status, &notify_response);
  }

  {
    std::lock_guard lock(mutex);
    PluginSocketState& ps = state.plugin_sockets[socket];
    ps.last_notified_registered = error.empty();
    ps.last_notified_error = error;
    ps.last_notify = detail::ToRpcStatus(notify_status);
    AddWatcherEventLocked(PluginWatcherEvent{
        error.empty() ? PluginWatcherEvent::Kind::kRegistered : PluginWatcherEvent::Kind::kRejected,
        std::chrono::steady_clock::now(), socket, view, service, error, detail::ToRpcStatus(notify_status)});
  }
  NotifyChanged();
  if (error.empty()) {
    Log("plugin-watcher: registered " + view.type + " " + view.name + " endpoint=" + endpoint +
        (service.empty() ? "" : " service=" + service) + " (offered " + JoinComma(view.supported_versions) +
        "; notify: " + detail::ToRpcStatus(notify_status).ToString() + ")");
  } else {
    Log("plugin-watcher: " + error + " (socket " + socket + ")");
    RetryLater(item);
  }
}

void KubeletSim::Impl::DeregisterPluginSocket(const std::string& socket, const std::string& why) {
  std::shared_ptr<detail::DevicePluginConnection> connection;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::shared_ptr<detail::DraHealthConnection>> health_streams;
  std::string line;
  {
    std::lock_guard lock(mutex);
    auto it = state.plugin_sockets.find(socket);
    if (it == state.plugin_sockets.end() || !it->second.registered) return;
    PluginSocketState& ps = it->second;
    ps.registered = false;
    if (ps.info.type == detail::kPluginTypeDra) {
      for (auto& [driver, dra] : state.dra_drivers) {
        std::erase_if(dra.endpoints, [&](const DraEndpointState& e) {
          if (e.registration_socket != socket) return false;
          auto channel = dra_channels.find(e.endpoint);
          if (channel != dra_channels.end()) {
            channels.push_back(std::move(channel->second));
            dra_channels.erase(channel);
          }
          if (auto health = dra_health.find(e.endpoint); health != dra_health.end()) {
            health_streams.push_back(std::move(health->second));
            dra_health.erase(health);
          }
          return true;
        });
      }
    } else if (ps.info.type == kPluginTypeCsi) {
      auto csi = state.csi_drivers.find(ps.info.name);
      if (csi != state.csi_drivers.end() && csi->second.registration_socket == socket) state.csi_drivers.erase(csi);
    } else if (ps.info.type == detail::kPluginTypeDevicePlugin) {
      auto dp = device_plugins.find(ps.info.name);
      if (dp != device_plugins.end() && dp->second->registration_socket == socket) {
        connection = std::move(dp->second);
        device_plugins.erase(dp);
        ResourceState& rs = state.resources[ps.info.name];
        rs.connected = false;
        rs.disconnect_reason = "deregistered: " + why;
        rs.disconnected_at = std::chrono::steady_clock::now();
      }
    }
    AddWatcherEventLocked(PluginWatcherEvent{PluginWatcherEvent::Kind::kDeregistered, std::chrono::steady_clock::now(),
                                             socket, ps.info, "", why, {}});
    line = "plugin-watcher: deregistered " + ps.info.type + " " + ps.info.name + " (" + why + ", socket " + socket + ")";
  }
  NotifyChanged();
  if (connection) DropConnection(connection);
  for (const auto& health : health_streams) DropDraHealth(health);
  channels.clear();
  Log(line);
}

std::map<std::string, RpcStatus> KubeletSim::ProbePluginSockets() { return impl_->ProbeSockets(); }

std::map<std::string, RpcStatus> KubeletSim::Impl::ProbeSockets() {
  std::vector<std::string> sockets;
  {
    std::lock_guard lock(mutex);
    if (!state.running) return {};
    for (const auto& [socket, ps] : state.plugin_sockets) {
      if (ps.registered) sockets.push_back(socket);
    }
  }
  std::map<std::string, RpcStatus> results;
  for (const std::string& socket : sockets) {
    auto stub = pluginregistration::Registration::NewStub(detail::DialUnix(socket));
    pluginregistration::PluginInfo info;
    grpc::ClientContext context;
    // No wait_for_ready: a socket nobody listens on fails at once, as a dead plugin should.
    context.set_deadline(detail::Deadline(options.probe_timeout));
    const RpcStatus status = detail::ToRpcStatus(stub->GetInfo(&context, pluginregistration::InfoRequest{}, &info));
    results[socket] = status;
    bool deregister = false;
    {
      std::lock_guard lock(mutex);
      PluginSocketState& ps = state.plugin_sockets[socket];
      ps.last_getinfo = status;
      if (status.ok()) {
        ++ps.getinfo_ok;
        ps.consecutive_probe_failures = 0;
      } else {
        ++ps.getinfo_failures;
        // The kubelet's plugin monitor deregisters after two consecutive failures.
        deregister = ++ps.consecutive_probe_failures >= 2;
        AddWatcherEventLocked(PluginWatcherEvent{PluginWatcherEvent::Kind::kProbeFailed,
                                                      std::chrono::steady_clock::now(), socket, ps.info, "",
                                                      status.ToString(), {}});
      }
    }
    NotifyChanged();
    if (!status.ok()) Log("plugin-watcher: GetInfo probe of " + socket + " failed: " + status.ToString());
    if (deregister) DeregisterPluginSocket(socket, "GetInfo failed twice");
  }
  return results;
}

// ---- DRA calls ------------------------------------------------------------------------------

namespace {

namespace dra1 = k8s::io::kubelet::pkg::apis::dra::v1;
namespace dra1beta1 = k8s::io::kubelet::pkg::apis::dra::v1beta1;

template <typename Service, typename PrepareRequest, typename PrepareResponse, typename UnprepareRequest,
          typename UnprepareResponse>
struct DraApi {
  template <typename Request>
  static Request MakeRequest(const std::vector<DraClaim>& claims) {
    Request request;
    for (const DraClaim& claim : claims) {
      auto* out = request.add_claims();
      out->set_namespace_(claim.namespace_);
      out->set_uid(claim.uid);
      out->set_name(claim.name);
    }
    return request;
  }

  static void Prepare(const std::shared_ptr<grpc::Channel>& channel, const std::vector<DraClaim>& claims,
                      std::chrono::milliseconds timeout, DraPrepareResult& result) {
    auto stub = Service::NewStub(channel);
    PrepareResponse response;
    grpc::ClientContext context;
    context.set_deadline(detail::Deadline(timeout));
    result.status = detail::ToRpcStatus(
        stub->NodePrepareResources(&context, MakeRequest<PrepareRequest>(claims), &response));
    if (!result.status.ok()) return;
    for (const auto& [uid, claim] : response.claims()) {
      DraPrepareClaimResult& out = result.claims[uid];
      out.error = claim.error();
      for (const auto& device : claim.devices()) {
        DraPreparedDevice d;
        d.request_names.assign(device.request_names().begin(), device.request_names().end());
        d.pool_name = device.pool_name();
        d.device_name = device.device_name();
        d.cdi_device_ids.assign(device.cdi_device_ids().begin(), device.cdi_device_ids().end());
        out.devices.push_back(std::move(d));
      }
    }
  }

  static void Unprepare(const std::shared_ptr<grpc::Channel>& channel, const std::vector<DraClaim>& claims,
                        std::chrono::milliseconds timeout, DraUnprepareResult& result) {
    auto stub = Service::NewStub(channel);
    UnprepareResponse response;
    grpc::ClientContext context;
    context.set_deadline(detail::Deadline(timeout));
    result.status = detail::ToRpcStatus(
        stub->NodeUnprepareResources(&context, MakeRequest<UnprepareRequest>(claims), &response));
    if (!result.status.ok()) return;
    for (const auto& [uid, claim] : response.claims()) result.claims[uid] = claim.error();
  }
};

using DraV1 = DraApi<dra1::DRAPlugin, dra1::NodePrepareResourcesRequest, dra1::NodePrepareResourcesResponse,
                     dra1::NodeUnprepareResourcesRequest, dra1::NodeUnprepareResourcesResponse>;
using DraV1beta1 = DraApi<dra1beta1::DRAPlugin, dra1beta1::NodePrepareResourcesRequest,
                          dra1beta1::NodePrepareResourcesResponse, dra1beta1::NodeUnprepareResourcesRequest,
                          dra1beta1::NodeUnprepareResourcesResponse>;

template <typename Result, typename Claims>
void FindMissing(Result& result, const std::vector<DraClaim>& requested, const Claims& answered) {
  if (!result.status.ok()) return;
  for (const DraClaim& claim : requested) {
    if (!answered.contains(claim.uid)) result.missing_claims.push_back(claim.uid);
  }
}

}  // namespace

std::shared_ptr<grpc::Channel> KubeletSim::Impl::DraChannel(const std::string& driver, std::string& endpoint,
                                                            std::string& service, RpcStatus& error) const {
  std::lock_guard lock(mutex);
  const DraDriverState* dra = state.FindDraDriver(driver);
  if (dra == nullptr || dra->endpoints.empty()) {
    error = RpcStatus{grpc::StatusCode::FAILED_PRECONDITION, "DRA driver " + driver + " is not registered"};
    return nullptr;
  }
  // The most recent connected endpoint, else the most recent one (DRAPluginManager.get).
  const DraEndpointState* chosen = &dra->endpoints.back();
  for (auto it = dra->endpoints.rbegin(); it != dra->endpoints.rend(); ++it) {
    auto channel = dra_channels.find(it->endpoint);
    if (channel != dra_channels.end() && channel->second->GetState(false) == GRPC_CHANNEL_READY) {
      chosen = &*it;
      break;
    }
  }
  endpoint = chosen->endpoint;
  service = chosen->service;
  auto channel = dra_channels.find(chosen->endpoint);
  if (channel == dra_channels.end()) {
    error = RpcStatus{grpc::StatusCode::INTERNAL, "no channel for " + chosen->endpoint};
    return nullptr;
  }
  return channel->second;
}

DraPrepareResult KubeletSim::NodePrepareResources(const std::string& driver, const std::vector<DraClaim>& claims) {
  DraPrepareResult result;
  auto channel = impl_->DraChannel(driver, result.endpoint, result.service, result.status);
  if (!channel) return result;
  return NodePrepareResources(driver, claims, result.service == kDraV1Service ? DraVersion::kV1 : DraVersion::kV1beta1);
}

DraPrepareResult KubeletSim::NodePrepareResources(const std::string& driver, const std::vector<DraClaim>& claims,
                                                  DraVersion version) {
  DraPrepareResult result;
  std::string negotiated;
  auto channel = impl_->DraChannel(driver, result.endpoint, negotiated, result.status);
  if (!channel) return result;
  result.service = std::string(ServiceName(version));
  if (version == DraVersion::kV1) {
    DraV1::Prepare(channel, claims, impl_->options.dra_call_timeout, result);
  } else {
    DraV1beta1::Prepare(channel, claims, impl_->options.dra_call_timeout, result);
  }
  FindMissing(result, claims, result.claims);
  impl_->Log("dra: NodePrepareResources " + driver + " via " + result.service + " (" + std::to_string(claims.size()) +
             " claims): " + result.status.ToString());
  return result;
}

DraUnprepareResult KubeletSim::NodeUnprepareResources(const std::string& driver, const std::vector<DraClaim>& claims) {
  DraUnprepareResult result;
  auto channel = impl_->DraChannel(driver, result.endpoint, result.service, result.status);
  if (!channel) return result;
  return NodeUnprepareResources(driver, claims,
                                result.service == kDraV1Service ? DraVersion::kV1 : DraVersion::kV1beta1);
}

DraUnprepareResult KubeletSim::NodeUnprepareResources(const std::string& driver, const std::vector<DraClaim>& claims,
                                                      DraVersion version) {
  DraUnprepareResult result;
  std::string negotiated;
  auto channel = impl_->DraChannel(driver, result.endpoint, negotiated, result.status);
  if (!channel) return result;
  result.service = std::string(ServiceName(version));
  if (version == DraVersion::kV1) {
    DraV1::Unprepare(channel, claims, impl_->options.dra_call_timeout, result);
  } else {
    DraV1beta1::Unprepare(channel, claims, impl_->options.dra_call_timeout, result);
  }
  FindMissing(result, claims, result.claims);
  std::vector<std::string> unprepared;
  for (const auto& [uid, error] : result.claims) {
    if (error.empty()) unprepared.push_back(uid);
  }
  if (result.ok() && !unprepared.empty()) impl_->DropPreparedClaims(unprepared);
  impl_->Log("dra: NodeUnprepareResources " + driver + " via " + result.service + " (" +
             std::to_string(claims.size()) + " claims): " + result.status.ToString());
  return result;
}

}  // namespace gns::sim
