// The device-plugin module.
#include "modules/device_plugin/device_plugin_module.hpp"

#include "loop/supervisor_messages.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/device_plugin/plugin_server.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace gns::device_plugin {

namespace {

// The module whose DeviceHealth verdicts the plugin follows (its kName; only messages.hpp
// crosses a module wall, so the name is spelled here).
constexpr std::string_view kHealthModule = "gpu-health";

bool IsExtendedResourceName(const std::string& name) {
  const auto slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == name.size()) return false;
  if (name.find('/', slash + 1) != std::string::npos) return false;
  const std::string domain = name.substr(0, slash);
  // The kubelet rejects names in the kubernetes.io namespaces.
  return domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io") && domain.find('.') != std::string::npos;
}

v1beta1::ListAndWatchResponse ToListAndWatch(const std::vector<AdvertisedDevice>& devices) {
  v1beta1::ListAndWatchResponse list;
  for (const auto& d : devices) {
    auto* device = list.add_devices();
    device->set_id(d.id);
    device->set_health(d.healthy ? "Healthy" : "Unhealthy");
    if (d.numa_node >= 0) device->mutable_topology()->add_nodes()->set_id(d.numa_node);
  }
  return list;
}

std::vector<std::string> AllocatedIds(const v1beta1::AllocateRequest& request) {
  std::vector<std::string> ids;
  for (const auto& container : request.container_requests()) {
    ids.insert(ids.end(), container.devices_ids().begin(), container.devices_ids().end());
  }
  return ids;
}

}  // namespace

DevicePluginModule::Config DevicePluginModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  using std::chrono::milliseconds;
  Config config;
  config.resource_name = section.String("resourceName", config.resource_name);
  if (!IsExtendedResourceName(config.resource_name)) {
    section.Fail("resourceName", "must be an extended resource name such as nvidia.com/gpu, got \"" +
                                     config.resource_name + "\"");
  }
  config.socket_name = section.String("socketName", config.socket_name);
  if (config.socket_name.empty() || config.socket_name.find('/') != std::string::npos ||
      config.socket_name == "kubelet.sock") {
    section.Fail("socketName", "must be a plain file name other than kubelet.sock, got \"" + config.socket_name + "\"");
  }
  config.allocation.strategy = section.Enum("deviceListStrategy", {"envvar", "cdi-cri"}, "envvar") == "cdi-cri"
                                   ? DeviceListStrategy::kCdiCri
                                   : DeviceListStrategy::kEnvVar;
  config.allocation.pass_device_specs = section.Bool("passDeviceSpecs", false);
  config.allocation.cdi_kind = section.String("cdiKind", "nvidia.com/gpu");
  if (config.allocation.cdi_kind.find('/') == std::string::npos) {
    section.Fail("cdiKind", "must be vendor/class, e.g. nvidia.com/gpu");
  }
  config.register_timeout = section.Duration("registerTimeout", milliseconds(100), milliseconds(60000), milliseconds(5000));
  auto backoff = section.Section("registerBackoff");
  config.register_backoff.initial = backoff.Duration("initial", milliseconds(1), milliseconds(60000), milliseconds(200));
  config.register_backoff.max =
      backoff.Duration("max", config.register_backoff.initial, milliseconds(600000), milliseconds(10000));
  backoff.Finish();
  return config;
}

DevicePluginModule::DevicePluginModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      plugin_dir_(context.Site().paths.kubelet_dir + "/device-plugins"),
      socket_path_(plugin_dir_ + "/" + config.socket_name),
      kubelet_socket_(plugin_dir_ + "/kubelet.sock"),
      watcher_(context.GetLoop().Io(), plugin_dir_,
               [this](DirWatcher::Change change, const std::string& name) { OnDirectoryChange(change, name); }),
      register_backoff_(config.register_backoff),
      register_timer_(context.GetLoop().Io()) {
  const MetricLabels resource{{"resource", config_.resource_name}};
  auto& m = context_.Metrics();
  registrations_total_ = &m.Counter("gpu_node_supervisor_device_plugin_registrations_total",
                                    "Successful registrations with the kubelet", resource);
  allocations_ok_ = &m.Counter("gpu_node_supervisor_device_plugin_allocations_total", "Allocate requests",
                               {{"resource", config_.resource_name}, {"result", "ok"}});
  allocations_rejected_ = &m.Counter("gpu_node_supervisor_device_plugin_allocations_total", "Allocate requests",
                                     {{"resource", config_.resource_name}, {"result", "rejected"}});
  healthy_devices_ = &m.Gauge("gpu_node_supervisor_device_plugin_devices", "Devices advertised to the kubelet",
                              {{"resource", config_.resource_name}, {"health", "Healthy"}});
  unhealthy_devices_ = &m.Gauge("gpu_node_supervisor_device_plugin_devices", "Devices advertised to the kubelet",
                                {{"resource", config_.resource_name}, {"health", "Unhealthy"}});
}

DevicePluginModule::~DevicePluginModule() { *alive_ = false; }

void DevicePluginModule::Start() {
  std::error_code ec;
  std::filesystem::create_directories(plugin_dir_, ec);
  if (ec) throw std::runtime_error("cannot create " + plugin_dir_ + ": " + ec.message());
  watcher_.Start();

  auto& bus = context_.GetBus();
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory& inv) {
    if (tracker_.OnInventory(inv)) OnDevicesChanged();
  });
  health_sub_ = bus.Subscribe<gpu_health::DeviceHealth>([this](const gpu_health::DeviceHealth& health) {
    if (tracker_.OnDeviceHealth(health)) OnDevicesChanged();
  });
  SayWhatHealthMeans();

  StartServing();
}

void DevicePluginModule::SayWhatHealthMeans() {
  // The supervisor's retained snapshot lists every enabled module (it is published before any
  // module starts). Without it (a test wiring the module alone) there is nothing to say.
  const auto* states = context_.GetBus().Latest<ModuleStates>();
  if (states == nullptr) return;
  const bool health_enabled = std::any_of(states->modules.begin(), states->modules.end(),
                                          [](const ModuleStatus& m) { return m.name == kHealthModule; });
  if (health_enabled) return;
  context_.Log().warn(
      "{} is not enabled: devices are advertised Unhealthy only while NVML cannot reach them (inventory "
      "unavailable or a GPU released); no XID, from NVML or the kernel log, changes a device's health",
      kHealthModule);
}

void DevicePluginModule::StartServing() {
  PluginServer::Handlers handlers;
  handlers.options.set_pre_start_required(false);
  handlers.options.set_get_preferred_allocation_available(true);
  handlers.current_list = [this] { return ToListAndWatch(tracker_.Devices()); };
  handlers.allocate = [this](const v1beta1::AllocateRequest& request, v1beta1::AllocateResponse* response) {
    AllocationSettings settings = config_.allocation;
    if (settings.pass_device_specs) settings.control_devices = ExistingControlDevices();
    const DeviceLookup lookup = [this](const std::string& id) -> std::optional<DeviceFacts> {
      const auto* gpu = tracker_.Find(id);
      if (gpu == nullptr) return std::nullopt;
      bool healthy = false;
      for (const auto& d : tracker_.Devices())
        if (d.id == id) healthy = d.healthy;
      return DeviceFacts{healthy, gpu->minor};
    };
    for (const auto& container : request.container_requests()) {
      ContainerAllocation allocation;
      const std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
      const auto error = AllocateContainer(settings, lookup, ids, allocation);
      if (!error.empty()) {
        allocations_rejected_->Inc();
        context_.Log().warn("Allocate rejected: {}", error);
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error);
      }
      auto* out = response->add_container_responses();
      for (const auto& [k, v] : allocation.envs) (*out->mutable_envs())[k] = v;
      for (const auto& name : allocation.cdi_devices) out->add_cdi_devices()->set_name(name);
      for (const auto& spec : allocation.devices) {
        auto* d = out->add_devices();
        d->set_container_path(spec.container_path);
        d->set_host_path(spec.host_path);
        d->set_permissions(spec.permissions);
      }
    }
    allocations_ok_->Inc();
    context_.GetBus().Publish(DevicesAllocated{config_.resource_name, AllocatedIds(request)});
    return grpc::Status::OK;
  };
  handlers.preferred = [this](const v1beta1::PreferredAllocationRequest& request,
                              v1beta1::PreferredAllocationResponse* response) {
    std::vector<TopologyDevice> topology;
    for (const auto& gpu : tracker_.Gpus()) {
      topology.push_back({gpu.uuid, gpu.numa_node, gpu.pci, {gpu.nvlink_peers.begin(), gpu.nvlink_peers.end()}});
    }
    for (const auto& container : request.container_requests()) {
      const std::vector<std::string> available(container.available_deviceids().begin(),
                                               container.available_deviceids().end());
      const std::vector<std::string> must(container.must_include_deviceids().begin(),
                                          container.must_include_deviceids().end());
      const auto preferred = PreferredAllocation(topology, available, must, container.allocation_size());
      if (!preferred.error.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, preferred.error);
      auto* out = response->add_container_responses();
      for (const auto& id : preferred.ids) out->add_deviceids(id);
    }
    return grpc::Status::OK;
  };

  server_ = std::make_unique<PluginServer>(context_.GetLoop(), std::move(handlers));
  server_->Start(socket_path_);
  serving_ = true;
  context_.Log().info("serving {} on {}", config_.resource_name, socket_path_);
  if (::access(kubelet_socket_.c_str(), F_OK) == 0) {
    Register();
  } else {
    context_.Log().info("waiting for {} before registering", kubelet_socket_);
    context_.SetHealth(ModuleHealth::kUnhealthy, "kubelet.sock not present; not registered");
  }
  PublishState();
}

void DevicePluginModule::RestartServing(const std::string& why) {
  if (restarting_ || stopping_) return;
  context_.Log().warn("{}: serving again", why);
  restarting_ = true;
  serving_ = false;
  registered_ = false;
  register_timer_.cancel();
  context_.SetHealth(ModuleHealth::kUnhealthy, why);
  PublishState();
  auto old = std::move(server_);
  auto* raw = old.get();
  raw->Shutdown(context_.Pool(), [this, alive = alive_, old = std::shared_ptr<PluginServer>(std::move(old))] {
    if (!*alive || stopping_) return;
    restarting_ = false;
    try {
      StartServing();
    } catch (const std::exception& e) {
      context_.ReportFailure(std::string("cannot serve again: ") + e.what());
    }
  });
}

void DevicePluginModule::Register() {
  if (registering_ || !serving_ || stopping_) return;
  registering_ = true;
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(config_.socket_name);
  request.set_resource_name(config_.resource_name);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  RegisterWithKubelet(context_.GetLoop(), kubelet_socket_, request, config_.register_timeout,
                      [this, alive = alive_](const grpc::Status& status) {
                        if (!*alive) return;
                        registering_ = false;
                        if (stopping_ || !serving_) return;
                        if (status.ok()) {
                          registered_ = true;
                          ++registrations_;
                          registrations_total_->Inc();
                          register_backoff_.Reset();
                          context_.SetHealth(ModuleHealth::kOk);
                          context_.Log().info("registered {} with the kubelet", config_.resource_name);
                          PublishState();
                          return;
                        }
                        const auto delay = register_backoff_.Next();
                        context_.Log().warn("registration failed ({}: {}); retrying in {} ms",
                                            static_cast<int>(status.error_code()), status.error_message(),
                                            delay.count());
                        context_.SetHealth(ModuleHealth::kUnhealthy, "registration failed: " + status.error_message());
                        register_timer_.expires_after(delay);
                        register_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
                          if (ec || !*alive) return;
                          if (::access(kubelet_socket_.c_str(), F_OK) == 0) Register();
                        });
                      });
}

void DevicePluginModule::OnDirectoryChange(DirWatcher::Change change, const std::string& name) {
  switch (change) {
    case DirWatcher::Change::kDeleted:
      // The kubelet's start-up clean-up removes every socket there, ours included.
      if (name == config_.socket_name && serving_) RestartServing("our socket " + socket_path_ + " was removed");
      if (name == "kubelet.sock") {
        registered_ = false;
        context_.SetHealth(ModuleHealth::kUnhealthy, "kubelet.sock removed; waiting for the kubelet");
        PublishState();
      }
      break;
    case DirWatcher::Change::kCreated:
      if (name == "kubelet.sock") {
        context_.Log().info("kubelet.sock appeared: registering");
        register_backoff_.Reset();
        register_timer_.cancel();
        Register();  // no-op while restarting: StartServing registers when done
      }
      break;
    case DirWatcher::Change::kOverflow:
      if (::access(socket_path_.c_str(), F_OK) != 0) RestartServing("inotify overflow and our socket is gone");
      else if (::access(kubelet_socket_.c_str(), F_OK) == 0) Register();
      break;
    case DirWatcher::Change::kDirectoryGone:
      context_.ReportFailure(plugin_dir_ + " was removed");
      break;
  }
}

void DevicePluginModule::OnDevicesChanged() {
  if (server_ && serving_) server_->Broadcast(ToListAndWatch(tracker_.Devices()));
  PublishState();
}

void DevicePluginModule::PublishState() {
  DevicePluginState state;
  state.resource_name = config_.resource_name;
  state.socket = socket_path_;
  state.serving = serving_;
  state.registered = registered_;
  state.registrations = registrations_;
  state.open_streams = server_ ? server_->OpenStreams() : 0;
  int healthy = 0, unhealthy = 0;
  for (const auto& d : tracker_.Devices()) {
    state.devices.push_back({d.id, d.healthy, d.numa_node, d.reason});
    (d.healthy ? healthy : unhealthy)++;
  }
  healthy_devices_->Set(healthy);
  unhealthy_devices_->Set(unhealthy);
  context_.GetBus().Publish(std::move(state));
}

std::vector<std::string> DevicePluginModule::ExistingControlDevices() const {
  std::vector<std::string> out;
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
    const std::string on_host = context_.Site().paths.host_root + node;
    if (::access(on_host.c_str(), F_OK) == 0) out.emplace_back(node);
  }
  return out;
}

void DevicePluginModule::Stop(std::function<void()> done) {
  stopping_ = true;
  watcher_.Stop();
  register_timer_.cancel();
  inventory_sub_.Reset();
  health_sub_.Reset();
  if (!server_) {
    done();
    return;
  }
  server_->Shutdown(context_.Pool(), [this, alive = alive_, done = std::move(done)] {
    if (*alive) server_.reset();  // the socket is already gone: the kubelet cannot dial a dead one
    done();
  });
}

}  // namespace gns::device_plugin
