#pragma once
// The `device-plugin` module: the kubelet device plugin (v1beta1) for `nvidia.com/gpu`.
// Serves on <kubeletDir>/device-plugins/<socketName>, registers with kubelet.sock once it
// exists, advertises every GPU with its live health, and notices a kubelet restart (our
// socket removed, kubelet.sock recreated) through inotify to serve and register again.
// Device health follows gpu-health's DeviceHealth verdicts and NVML availability from the GPU
// inventory; the plugin judges no XID itself (one judge per verdict).

#include "loop/backoff.hpp"
#include "loop/dir_watcher.hpp"
#include "loop/module.hpp"
#include "modules/device_plugin/allocation.hpp"
#include "modules/device_plugin/device_health.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace gns::device_plugin {

class PluginServer;

class DevicePluginModule final : public Module {
 public:
  static constexpr std::string_view kName = "device-plugin";
  static constexpr std::string_view kSummary = "kubelet device plugin v1beta1 for nvidia.com/gpu";

  struct Config {
    std::string resource_name = "nvidia.com/gpu";
    std::string socket_name = "nvidia-gpu.sock";
    AllocationSettings allocation;
    std::chrono::milliseconds register_timeout{5000};
    BackoffPolicy register_backoff{std::chrono::milliseconds(200), std::chrono::milliseconds(10000), 2.0, 0.5};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  DevicePluginModule(ModuleContext& context, const Config& config);
  ~DevicePluginModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  void StartServing();
  void RestartServing(const std::string& why);
  void Register();
  void OnDirectoryChange(DirWatcher::Change change, const std::string& name);
  void OnDevicesChanged();
  void PublishState();
  void SayWhatHealthMeans();
  std::vector<std::string> ExistingControlDevices() const;

  ModuleContext& context_;
  Config config_;
  std::string plugin_dir_;
  std::string socket_path_;
  std::string kubelet_socket_;
  DeviceHealthTracker tracker_;
  std::unique_ptr<PluginServer> server_;
  DirWatcher watcher_;
  Backoff register_backoff_;
  boost::asio::steady_timer register_timer_;
  bool serving_ = false;
  bool restarting_ = false;
  bool registering_ = false;
  bool registered_ = false;
  bool stopping_ = false;
  int registrations_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  MetricsRegistry::Series* registrations_total_;
  MetricsRegistry::Series* allocations_ok_;
  MetricsRegistry::Series* allocations_rejected_;
  MetricsRegistry::Series* healthy_devices_;
  MetricsRegistry::Series* unhealthy_devices_;
  Subscription inventory_sub_;
  Subscription health_sub_;
};

}  // namespace gns::device_plugin
