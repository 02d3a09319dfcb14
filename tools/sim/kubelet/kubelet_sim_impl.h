// Internals of KubeletSim shared by its translation units (kubelet_sim.cpp: lifecycle and state,
// device_plugins.cpp: the device-plugin side, plugin_watcher.cpp: plugins_registry and DRA).
// Not part of the library's interface.
#pragma once

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"
#include "kubelet_sim.h"

namespace gns::sim {

namespace detail {

// Names in device-plugins/ (WIRE-FACTS §1.3, and the kubelet's device manager).
inline constexpr std::string_view kKubeletSocketName = "kubelet.sock";
inline constexpr std::string_view kCheckpointName = "kubelet_internal_checkpoint";
// The kubelet's device manager drops this empty file into device-plugins/ when it hands its
// plugin-watcher handler out (handler.go GetPluginHandler); plugins see one more entry there.
inline constexpr std::string_view kDeprecationFileName = "DEPRECATION";
inline constexpr std::string_view kDevicePluginVersion = "v1beta1";
inline constexpr std::string_view kPluginTypeDra = "DRAPlugin";
inline constexpr std::string_view kPluginTypeDevicePlugin = "DevicePlugin";

// An insecure channel to a unix socket path, with its own subchannel pool so that dropping the
// channel really closes the connection (a plugin must see its stream end), and a short reconnect
// backoff so a socket that starts listening a moment after it appears is found quickly.
std::shared_ptr<grpc::Channel> DialUnix(const std::string& path);
RpcStatus ToRpcStatus(const grpc::Status& status);
bool IsSocket(const std::filesystem::path& path);
std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds timeout);

// One device plugin's connection: the channel, and the ListAndWatch stream read on its thread.
struct DevicePluginConnection {
  std::string resource;
  std::string socket_path;
  std::string registration_socket;  // set when registered through plugins_registry
  std::uint64_t id = 0;  // ResourceState::connection
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  grpc::ClientContext stream_context;
  std::thread reader;
  // Set before the kubelet side cancels the stream itself (re-registration, restart, stop), so
  // the reader does not report that as the plugin going away.
  std::atomic<bool> dropped{false};
};

// One DRA plugin's KEP-4680 health stream, read on its own thread (dra_health.cpp).
struct DraHealthConnection {
  std::string driver;
  std::string endpoint;
  std::string service;  // the version dialled: kDraHealthServiceV1, …
  std::shared_ptr<grpc::Channel> channel;
  grpc::ClientContext context;
  std::thread reader;
  std::atomic<bool> dropped{false};  // the kubelet side ends it (deregistration, stop)
};

struct WorkItem {
  enum class Kind { kRegister, kDeregister };
  Kind kind = Kind::kRegister;
  std::string socket;
  SteadyTime due{};
  int attempt = 0;
  // From a directory walk rather than a create event: leave the socket alone if it is already
  // registered (a create event means a new plugin instance, which re-registers).
  bool if_new = false;
};

}  // namespace detail

struct KubeletSim::Impl {
  explicit Impl(KubeletSimOptions opts);

  class RegistrationService final : public v1beta1::Registration::Service {
   public:
    explicit RegistrationService(Impl& impl) : impl_(impl) {}
    grpc::Status Register(grpc::ServerContext* context, const v1beta1::RegisterRequest* request,
                          v1beta1::Empty* response) override;

   private:
    Impl& impl_;
  };

  // PodResourcesLister v1 over what `state.pods` and `state.resources` hold (pod_resources.cpp).
  class PodResourcesService final : public v1::PodResourcesLister::Service {
   public:
    explicit PodResourcesService(Impl& impl) : impl_(impl) {}
    grpc::Status List(grpc::ServerContext* context, const v1::ListPodResourcesRequest* request,
                      v1::ListPodResourcesResponse* response) override;
    grpc::Status GetAllocatableResources(grpc::ServerContext* context, const v1::AllocatableResourcesRequest* request,
                                         v1::AllocatableResourcesResponse* response) override;
    grpc::Status Get(grpc::ServerContext* context, const v1::GetPodResourcesRequest* request,
                     v1::GetPodResourcesResponse* response) override;

   private:
    Impl& impl_;
  };

  // ---- lifecycle (lifecycle_mutex held)
  void StartPodResourcesServer();
  void StopPodResourcesServer();
  void StartLocked();
  void StopLocked();
  void CleanupDevicePluginDirectory();
  void StartRegistrationServer();
  void StopRegistrationServer();
  void StartDelayedListener(const std::filesystem::path& socket);
  void StartPluginWatcher();
  void StopPluginWatcher();
  // Takes every plugin connection out of the state (mutex held); the caller drops them unlocked.
  std::vector<std::shared_ptr<detail::DevicePluginConnection>> TakeConnectionsLocked(const std::string& reason);

  // ---- device plugins
  // Dial, GetDevicePluginOptions, then keep ListAndWatch open. `generation` is the one the
  // caller started under: a restart in between discards the new connection.
  grpc::Status ConnectDevicePlugin(const std::string& resource, const std::string& socket_path,
                                   const std::string& registration_socket, std::uint64_t generation);
  void RunListAndWatch(std::shared_ptr<detail::DevicePluginConnection> connection);
  static void DropConnection(const std::shared_ptr<detail::DevicePluginConnection>& connection);
  std::shared_ptr<detail::DevicePluginConnection> ConnectionFor(const std::string& resource) const;
  void RecordRejection(const v1beta1::RegisterRequest& request, const grpc::Status& status);

  // ---- plugin watcher (watcher thread / worker thread)
  void WatchLoop(int inotify_fd, int wake_fd, std::map<int, std::filesystem::path>& watches);
  void AddWatchTree(int inotify_fd, const std::filesystem::path& dir, std::map<int, std::filesystem::path>& watches);
  void Enqueue(detail::WorkItem item);
  void WorkerLoop();
  void RegisterPluginSocket(const detail::WorkItem& item);
  void DeregisterPluginSocket(const std::string& socket, const std::string& why);
  void AddWatcherEventLocked(PluginWatcherEvent event);
  void RetryLater(const detail::WorkItem& item);
  // GetInfo on every registered plugin socket (the kubelet's plugin monitor).
  std::map<std::string, RpcStatus> ProbeSockets();

  // ---- DRA health (dra_health.cpp)
  // Opens the endpoint's NodeWatchResources stream (mutex held); returns the stream it replaces.
  std::shared_ptr<detail::DraHealthConnection> StartDraHealthLocked(const std::string& driver,
                                                                    const std::string& endpoint,
                                                                    const std::string& service,
                                                                    std::shared_ptr<grpc::Channel> channel);
  void RunDraHealth(std::shared_ptr<detail::DraHealthConnection> connection);
  template <typename Api>
  grpc::Status ReadDraHealth(const std::shared_ptr<detail::DraHealthConnection>& connection);
  // Mutex not held: cancels the stream and joins its reader.
  static void DropDraHealth(const std::shared_ptr<detail::DraHealthConnection>& connection);

  // ---- DRA
  // Unprepared claims leave every pod's dynamic resources.
  void DropPreparedClaims(const std::vector<std::string>& claim_uids);
  std::shared_ptr<grpc::Channel> DraChannel(const std::string& driver, std::string& endpoint, std::string& service,
                                            RpcStatus& error) const;

  void Log(const std::string& line);
  void NotifyChanged() { changed.notify_all(); }

  KubeletSimOptions options;
  std::filesystem::path kubelet_dir;
  std::filesystem::path device_plugin_dir;
  std::filesystem::path registry_dir;
  std::filesystem::path pod_resources_dir;

  std::mutex lifecycle_mutex;  // Start / Stop / Restart, one at a time

  mutable std::mutex mutex;  // everything below
  mutable std::condition_variable changed;
  KubeletState state;
  std::uint64_t generation = 0;  // bumped by every restart and stop
  std::uint64_t next_connection_id = 0;
  std::map<std::string, std::shared_ptr<detail::DevicePluginConnection>> device_plugins;
  std::map<std::string, std::shared_ptr<grpc::Channel>> dra_channels;  // by DRA endpoint path
  std::map<std::string, std::shared_ptr<detail::DraHealthConnection>> dra_health;  // by DRA endpoint path

  // Registration worker queue (guarded by mutex; work_cv wakes the worker).
  std::vector<detail::WorkItem> queue;
  std::condition_variable work_cv;
  bool worker_stop = false;
  grpc::ClientContext* worker_call = nullptr;  // the worker's call in flight, cancelled by Stop

  RegistrationService registration_service{*this};
  PodResourcesService pod_resources_service{*this};
  std::unique_ptr<grpc::Server> pod_resources_server;
  bool pod_resources_wanted = true;  // lifecycle_mutex: serve it while running
  std::unique_ptr<grpc::Server> registration_server;
  // With registration_listen_delay: kubelet.sock is our own socket, bound at start, listened on
  // after the delay; the accept thread hands each connection to registration_server.
  int registration_listen_fd = -1;
  std::thread registration_accept_thread;
  std::mutex listen_mutex;
  std::condition_variable listen_cv;
  bool listen_stop = false;  // listen_mutex
  int inotify_fd = -1;
  int wake_fd = -1;
  std::thread watcher_thread;
  std::thread worker_thread;

  std::mutex log_mutex;
};

}  // namespace gns::sim
