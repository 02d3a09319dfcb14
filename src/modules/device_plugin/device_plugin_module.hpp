#pragma once
// The `device-plugin` module: the kubelet device plugin (v1beta1) for `nvidia.com/gpu`, the
// MIG resources of the mixed strategy and time-sliced or MPS-shared resources: one socket and registration
// per resource (resource_plan, resource_endpoint), each advertising its devices with live
// health; a kubelet restart (our sockets removed, kubelet.sock recreated) is noticed through
// inotify and every resource serves and registers again.
// Device health follows gpu-health's DeviceHealth verdicts and NVML availability from the GPU
// inventory; the plugin judges no XID itself (one judge per verdict).

#include "loop/backoff.hpp"
#include "loop/dir_watcher.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/device_plugin/allocation.hpp"
#include "modules/device_plugin/cdi_writer.hpp"
#include "modules/device_plugin/device_health.hpp"
#include "modules/device_plugin/mps.hpp"
#include "modules/device_plugin/resource_plan.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <map>
#include <set>
#include <memory>
#include <string>

// Kept out of this widely included header (gRPC and protobuf are heavy to compile).
namespace grpc {
class Status;
}
namespace v1beta1 {
class ListAndWatchResponse;
class AllocateRequest;
class AllocateResponse;
class PreferredAllocationRequest;
class PreferredAllocationResponse;
}  // namespace v1beta1

namespace gns::device_plugin {

class ResourceEndpoint;

class DevicePluginModule final : public Module {
 public:
  static constexpr std::string_view kName = "device-plugin";
  static constexpr std::string_view kSummary =
      "kubelet device plugin v1beta1 for nvidia.com/gpu, MIG devices, time-sliced and MPS replicas";

  struct Config {
    // `gpus:` (loop/gpu_split.hpp); the dra-gpu module's GPUs are left out at run time.
    GpuSelection gpus{true, {}};
    bool gpus_written = false;
    std::string resource_name = "nvidia.com/gpu";
    std::string socket_name = "nvidia-gpu.sock";
    AllocationSettings allocation;
    MigStrategy mig_strategy = MigStrategy::kNone;
    DeviceIdStrategy id_strategy = DeviceIdStrategy::kUuid;
    SharingSettings sharing;
    MpsSettings mps;  // with sharing.strategy kMps
    // Our CDI spec (kind = allocation.cdi_kind) in the site's CDI directory.
    bool cdi_spec = false;
    std::string driver_root = "/";
    bool cdi_remove_on_stop = false;
    std::string cdi_hook_path = CdiSettings{}.hook_path;  // "auto", an absolute path, or "" (no hooks)
    std::chrono::milliseconds register_timeout{5000};
    BackoffPolicy register_backoff{std::chrono::milliseconds(200), std::chrono::milliseconds(10000), 2.0, 0.5};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  DevicePluginModule(ModuleContext& context, const Config& config);
  ~DevicePluginModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  PlanSettings MakePlanSettings() const;
  // Recomputes the plan from the tracker; starts endpoints for new resources, stops those of
  // resources gone, and sends changed lists.
  void Replan();
  std::vector<gpu_inventory::GpuInfo> ServedGpus();
  void StartEndpoint(const std::string& resource, const std::string& socket);
  void OnDirectoryChange(DirWatcher::Change change, const std::string& name);
  void OnEndpointStateChanged();
  void PublishState();
  void SayWhatHealthMeans();
  // The first plan waits (bounded) for gpu-health's state when gpu-health is enabled.
  void WaitForHealthState();
  void HealthStateKnown();
  static constexpr std::chrono::milliseconds kHealthStateWait{10000};
  std::vector<std::string> ExistingControlDevices() const;
  // A device as advertised: its physical device's health and, for an MPS resource, whether the
  // control daemon answers. `reason` (optional) says why not.
  bool Usable(const ResourcePlan& resource, const PlannedDevice& device, std::string* reason = nullptr) const;
  // Probes the control daemon of every MPS resource of the plan; true when one changed.
  bool CheckMpsDaemons();
  void ArmMpsTimer();

  v1beta1::ListAndWatchResponse ListFor(const std::string& resource) const;
  grpc::Status Allocate(const std::string& resource, const v1beta1::AllocateRequest& request,
                        v1beta1::AllocateResponse* response);
  grpc::Status PreferredFor(const std::string& resource, const v1beta1::PreferredAllocationRequest& request,
                         v1beta1::PreferredAllocationResponse* response) const;

  ModuleContext& context_;
  Config config_;
  std::set<std::string> dra_warned_;  // GPUs named in both selections, warned about once
  std::string plugin_dir_;
  std::string kubelet_socket_;
  DeviceHealthTracker tracker_;
  Plan plan_;
  std::map<std::string, std::unique_ptr<ResourceEndpoint>> endpoints_;  // by resource name
  DirWatcher watcher_;
  CdiWriter cdi_;
  bool started_ = false;
  bool serving_started_ = false;
  bool inventory_seen_ = false;  // an available inventory arrived (the CDI spec waits for it)  // Start() finished: later serving failures are reported
  bool stopping_ = false;
  uint64_t allocations_ = 0;  // names each response's CDI annotation
  // MPS resources: why the control daemon does not answer ("" when it does), by resource name.
  // A resource registers only once its daemon answered; a daemon that stops answering makes
  // its replicas Unhealthy.
  std::map<std::string, std::string> mps_problem_;
  boost::asio::steady_timer mps_timer_;
  bool mps_timer_armed_ = false;
  // gpu-health is enabled and has not yet published its state (it restores this boot's
  // verdicts off the loop): nothing is advertised until it has, or kHealthStateWait passed.
  bool awaiting_health_ = false;
  boost::asio::steady_timer health_wait_timer_;
  Gate lifetime_;
  Subscription inventory_sub_;
  Subscription health_sub_;
  Subscription health_state_sub_;
};

}  // namespace gns::device_plugin
