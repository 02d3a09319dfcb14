#pragma once
// One registered extended resource: its gRPC server on its own socket in the kubelet's
// device-plugins directory, and its registration with kubelet.sock (retried with backoff, done
// again when the kubelet restarts or removes our socket). The module runs one per resource of
// the plan (nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared, …); what each
// serves comes from the module through the hooks.

#include "loop/backoff.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/device_plugin/plugin_server.hpp"

#include <boost/asio/steady_timer.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace gns::device_plugin {

class ResourceEndpoint {
 public:
  struct Settings {
    std::string resource;
    std::string plugin_dir;   // <kubeletDir>/device-plugins
    std::string socket_name;  // our file there
    std::chrono::milliseconds register_timeout{5000};
    BackoffPolicy register_backoff{std::chrono::milliseconds(200), std::chrono::milliseconds(10000), 2.0, 0.5};
  };
  struct Hooks {
    std::function<v1beta1::ListAndWatchResponse()> current_list;
    std::function<grpc::Status(const v1beta1::AllocateRequest&, v1beta1::AllocateResponse*)> allocate;
    std::function<grpc::Status(const v1beta1::PreferredAllocationRequest&, v1beta1::PreferredAllocationResponse*)>
        preferred;
    std::function<void()> state_changed;  // serving/registration changed (loop thread)
  };

  ResourceEndpoint(ModuleContext& context, Settings settings, Hooks hooks);
  ~ResourceEndpoint();
  ResourceEndpoint(const ResourceEndpoint&) = delete;
  ResourceEndpoint& operator=(const ResourceEndpoint&) = delete;

  // Serves, and registers when kubelet.sock exists. Throws std::runtime_error when it cannot serve.
  void Start();
  // Shuts the server down (its socket goes); `done` runs on the loop.
  void Stop(std::function<void()> done);

  // Directory events, forwarded by the module.
  void OnKubeletSocketCreated();
  void OnKubeletSocketDeleted();
  void OnOurSocketDeleted();
  void OnOverflow();

  // Sends the current list to every open ListAndWatch stream when it differs from the last sent.
  void Refresh();

  const std::string& Resource() const { return settings_.resource; }
  const std::string& SocketName() const { return settings_.socket_name; }
  const std::string& SocketPath() const { return socket_path_; }
  bool Serving() const { return serving_; }
  bool Registered() const { return registered_; }
  int Registrations() const { return registrations_; }
  std::size_t OpenStreams() const { return server_ ? server_->OpenStreams() : 0; }
  // Why the endpoint is not registered (empty when it is).
  const std::string& Problem() const { return problem_; }

 private:
  void StartServing();
  void RestartServing(const std::string& why);
  // Whether the file at socket_path_ is the socket our server listens on (the same inode as
  // when it started serving). A delete event is ours only when it is not: the stale socket of
  // a killed run, removed as we start, and our own removal before serving again, are not.
  bool OurSocketPresent() const;
  // Registers when the kubelet listens on kubelet.sock (a connect() succeeds); else waits.
  void Register();
  // kubelet.sock is not accepting connections (`err` from connect()): registers again shortly.
  void WaitForListener(int err);
  void SetProblem(std::string problem);

  ModuleContext& context_;
  Settings settings_;
  Hooks hooks_;
  std::string socket_path_;
  std::string kubelet_socket_;
  std::unique_ptr<PluginServer> server_;
  Backoff register_backoff_;
  Backoff listen_backoff_;  // while kubelet.sock exists but nobody listens: 1 ms doubling
  uint64_t kubelet_generation_ = 0;  // kubelet.sock creations seen
  boost::asio::steady_timer register_timer_;
  std::string last_sent_;  // serialized list last broadcast
  dev_t socket_dev_ = 0;   // our socket's identity once serving (st_dev, st_ino)
  ino_t socket_ino_ = 0;
  std::string problem_ = "not started";
  bool serving_ = false;
  bool restarting_ = false;
  bool registering_ = false;
  bool registered_ = false;
  bool stopping_ = false;
  int registrations_ = 0;
  Gate lifetime_;
  MetricsRegistry::Series* registrations_total_;
};

}  // namespace gns::device_plugin
