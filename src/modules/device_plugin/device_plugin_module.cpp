// The device-plugin module.
#include "modules/device_plugin/device_plugin_module.hpp"
#include "loop/gpu_split_config.hpp"

#include "loop/supervisor_messages.hpp"
#include "loop/atomic_file.hpp"
#include "loop/config_checks.hpp"
#include "modules/device_plugin/cdi_spec.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/device_plugin/plugin_server.hpp"
#include "modules/device_plugin/resource_endpoint.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/pod_resources/messages.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

namespace gns::device_plugin {

namespace {

// The module whose DeviceHealth verdicts the plugin follows (its kName; only messages.hpp
// crosses a module wall, so the name is spelled here).
constexpr std::string_view kHealthModule = "gpu-health";

std::vector<std::string> AllocatedIds(const v1beta1::AllocateRequest& request) {
  std::vector<std::string> ids;
  for (const auto& container : request.container_requests()) {
    ids.insert(ids.end(), container.devices_ids().begin(), container.devices_ids().end());
  }
  return ids;
}

// deviceListStrategy: one name or a list of them (upstream allows several at once).
DeviceListStrategies ParseDeviceListStrategies(ConfigMap& section) {
  constexpr std::string_view kKey = "deviceListStrategy";
  const ConfigValue* raw = section.Raw(kKey);
  if (raw == nullptr) return {};
  std::vector<const ConfigValue*> items;
  if (raw->kind == ConfigValue::Kind::kScalar) items.push_back(raw);
  else if (raw->kind == ConfigValue::Kind::kSequence)
    for (const auto& item : raw->items) items.push_back(&item);
  else section.Fail(kKey, "expected a strategy name or a list of them");
  if (items.empty()) section.Fail(kKey, "needs at least one of envvar, volume-mounts, cdi-annotations, cdi-cri");
  DeviceListStrategies out;
  out.envvar = false;
  std::set<std::string> seen;
  for (const auto* item : items) {
    if (item->kind != ConfigValue::Kind::kScalar) section.Fail(kKey, "expected strategy names");
    const std::string name = ExpandEnv(item->scalar, item->where, section.Path() + "." + std::string(kKey));
    if (!seen.insert(name).second) section.Fail(kKey, "\"" + name + "\" is listed twice");
    if (name == "envvar") out.envvar = true;
    else if (name == "volume-mounts") out.volume_mounts = true;
    else if (name == "cdi-annotations") out.cdi_annotations = true;
    else if (name == "cdi-cri") out.cdi_cri = true;
    else section.Fail(kKey, "unknown strategy \"" + name + "\" (envvar, volume-mounts, cdi-annotations, cdi-cri)");
  }
  return out;
}

// The most clients an MPS server serves per GPU (NVIDIA's MPS docs: 48 from compute capability
// 7.0, 16 before). The inventory does not know the compute capability, so the higher bound.
constexpr int64_t kMpsMaxReplicas = 48;

// sharing.timeSlicing or sharing.mps, as upstream's config file spells them.
void ParseSharedResources(ConfigMap& shared, const std::string& gpu_resource, bool mps, SharingSettings& sharing) {
  const std::string mig_prefix = gpu_resource.substr(0, gpu_resource.find('/')) + "/mig-";
  const ConfigValue* resources = shared.Raw("resources");
  if (resources == nullptr) {
    if (mps) shared.Fail("resources", "MPS needs at least one resource, e.g. {name: " + gpu_resource + ", replicas: 4}");
    return;
  }
  if (resources->kind != ConfigValue::Kind::kSequence) shared.Fail("resources", "expected a list of {name, replicas}");
  if (mps && resources->items.empty()) shared.Fail("resources", "MPS needs at least one resource");
  std::set<std::string> names;
  for (std::size_t i = 0; i < resources->items.size(); ++i) {
    ConfigMap item(resources->items[i], shared.Path() + ".resources[" + std::to_string(i) + "]");
    SharedResource r;
    r.name = item.String("name");
    if (mps && r.name != gpu_resource) {
      item.Fail("name", "MPS shares whole GPUs only: must be " + gpu_resource + ", got \"" + r.name + "\"");
    }
    if (r.name != gpu_resource && !r.name.starts_with(mig_prefix)) {
      item.Fail("name", "must be " + gpu_resource + " or a MIG resource " + mig_prefix + "<profile>, got \"" +
                            r.name + "\"");
    }
    if (!names.insert(r.name).second) item.Fail("name", "\"" + r.name + "\" is listed twice");
    r.replicas = static_cast<int>(item.Int("replicas", 1, 1024, mps ? std::nullopt : std::optional<int64_t>(1)));
    if (mps && r.replicas < 2) item.Fail("replicas", "MPS needs at least 2 replicas, got " + std::to_string(r.replicas));
    if (mps && r.replicas > kMpsMaxReplicas) {
      item.Fail("replicas", "an MPS server serves at most " + std::to_string(kMpsMaxReplicas) +
                                " clients per GPU (16 before compute capability 7.0), got " + std::to_string(r.replicas));
    }
    r.rename = item.String("rename", "");
    if (!r.rename.empty()) {
      if (const auto problem = ExtendedResourceNameProblem(r.rename); !problem.empty()) item.Fail("rename", problem);
    }
    item.Finish();
    sharing.resources.push_back(std::move(r));
  }
}

SharingSettings ParseSharing(ConfigMap& section, const std::string& gpu_resource, MigStrategy mig) {
  SharingSettings sharing;
  auto sharing_section = section.Section("sharing");
  const bool has_mps = sharing_section.Has("mps");
  auto ts = sharing_section.Section("timeSlicing");
  if (has_mps) {
    // Upstream silently prefers MPS when both are set; we refuse the ambiguity.
    if (!ts.Keys().empty()) {
      sharing_section.Fail("timeSlicing", "cannot be set together with sharing.mps: one sharing strategy per node");
    }
    auto mps = sharing_section.Section("mps");
    if (mig == MigStrategy::kMixed) {
      sharing_section.Fail("mps", "MPS is not supported with migStrategy mixed (MIG devices cannot be shared with MPS)");
    }
    sharing.strategy = SharingStrategy::kMps;
    sharing.rename_by_default = mps.Bool("renameByDefault", false);
    if (!mps.Bool("failRequestsGreaterThanOne", true)) {
      mps.Fail("failRequestsGreaterThanOne", "must be true with MPS: a container gets one replica (its share of one GPU)");
    }
    sharing.fail_requests_greater_than_one = true;
    ParseSharedResources(mps, gpu_resource, true, sharing);
    mps.Finish();
  } else {
    sharing.rename_by_default = ts.Bool("renameByDefault", false);
    sharing.fail_requests_greater_than_one = ts.Bool("failRequestsGreaterThanOne", false);
    ParseSharedResources(ts, gpu_resource, false, sharing);
  }
  ts.Finish();
  sharing_section.Finish();
  return sharing;
}

}  // namespace

DevicePluginModule::Config DevicePluginModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  using std::chrono::milliseconds;
  Config config;
  // Which GPUs this plugin serves (loop/gpu_split.hpp): absent, every GPU the dra-gpu module
  // does not serve; `all` or a list, exactly those (an overlap with dra-gpu's is refused).
  config.gpus_written = section.Has("gpus");
  config.gpus = ParseGpuSelection(section, "gpus", GpuSelection{true, {}});
  RecordGpuSelection(section, "gpus", site, /*dra=*/false, config.gpus, config.gpus_written);
  config.resource_name = section.String("resourceName", config.resource_name);
  if (const auto problem = ExtendedResourceNameProblem(config.resource_name); !problem.empty()) {
    section.Fail("resourceName", problem);
  }
  config.socket_name = section.String("socketName", config.socket_name);
  if (config.socket_name.empty() || config.socket_name.find('/') != std::string::npos ||
      config.socket_name == "kubelet.sock" || config.socket_name == "." || config.socket_name == "..") {
    section.Fail("socketName", "must be a plain file name other than kubelet.sock, got \"" + config.socket_name + "\"");
  }
  // The sockets are bound in <kubeletDir>/device-plugins/: each path must fit a sockaddr_un.
  const std::string plugin_dir = site.paths.kubelet_dir + "/device-plugins/";
  if (const auto problem = SocketPathProblem(plugin_dir + config.socket_name); !problem.empty()) {
    section.Fail("socketName", problem);
  }
  config.allocation.strategies = ParseDeviceListStrategies(section);
  config.allocation.pass_device_specs = section.Bool("passDeviceSpecs", false);
  config.allocation.cdi_kind = section.String("cdiKind", "nvidia.com/gpu");
  if (config.allocation.cdi_kind.find('/') == std::string::npos) {
    section.Fail("cdiKind", "must be vendor/class, e.g. nvidia.com/gpu");
  }
  const auto mig = section.Enum("migStrategy", {"none", "single", "mixed"}, "none");
  config.mig_strategy = mig == "single" ? MigStrategy::kSingle : mig == "mixed" ? MigStrategy::kMixed : MigStrategy::kNone;
  config.id_strategy = section.Enum("deviceIDStrategy", {"uuid", "index"}, "uuid") == "index" ? DeviceIdStrategy::kIndex
                                                                                              : DeviceIdStrategy::kUuid;
  config.sharing = ParseSharing(section, config.resource_name, config.mig_strategy);
  PlanSettings sockets;
  sockets.gpu_resource = config.resource_name;
  sockets.gpu_socket = config.socket_name;
  for (const auto& shared : config.sharing.resources) {
    if (shared.rename.empty()) continue;
    if (const auto problem = SocketPathProblem(plugin_dir + SocketFor(sockets, shared.rename)); !problem.empty()) {
      section.Fail("sharing", "the socket of " + shared.rename + ": " + problem);
    }
  }
  config.mps.root = section.String("mpsRoot", config.mps.root);
  if (config.mps.root.empty() || config.mps.root.front() != '/') section.Fail("mpsRoot", "must be an absolute path");
  config.mps.check_interval =
      section.Duration("mpsCheckInterval", milliseconds(10), milliseconds(60000), config.mps.check_interval);
  auto cdi = section.Section("cdi");
  config.cdi_spec = cdi.Bool("enabled", false);
  config.driver_root = cdi.String("driverRoot", "/");
  if (config.driver_root.empty() || config.driver_root.front() != '/') cdi.Fail("driverRoot", "must be an absolute path");
  config.cdi_remove_on_stop = cdi.Bool("removeOnStop", false);
  config.cdi_hook_path = cdi.String("hookPath", config.cdi_hook_path);
  if (!config.cdi_hook_path.empty() && config.cdi_hook_path != "auto" && config.cdi_hook_path.front() != '/') {
    cdi.Fail("hookPath", "must be \"auto\", an absolute path (on the host), or \"\" for no hooks");
  }
  cdi.Finish();
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
      kubelet_socket_(plugin_dir_ + "/kubelet.sock"),
      watcher_(context.GetLoop().Io(), plugin_dir_,
               [this](DirWatcher::Change change, const std::string& name) { OnDirectoryChange(change, name); }),
      cdi_(context,
           CdiWriter::Settings{config.cdi_spec, context.Site().paths.cdi_dir,
                               CdiSettings{config.allocation.cdi_kind, config.driver_root, config.cdi_hook_path},
                               config.cdi_remove_on_stop},
           [this] { PublishState(); }),
      mps_timer_(context.GetLoop().Io()),
      health_wait_timer_(context.GetLoop().Io()) {}

DevicePluginModule::~DevicePluginModule() { lifetime_.Close(); }

PlanSettings DevicePluginModule::MakePlanSettings() const {
  PlanSettings settings;
  settings.gpu_resource = config_.resource_name;
  settings.gpu_socket = config_.socket_name;
  settings.mig_strategy = config_.mig_strategy;
  settings.id_strategy = config_.id_strategy;
  settings.sharing = config_.sharing;
  return settings;
}

void DevicePluginModule::Start() {
  std::string mkdir_error;
  // The kubelet's directory when it exists (its mode kept); else 0750 whatever the umask.
  if (!EnsureDirectory(plugin_dir_, 0750, mkdir_error)) {
    throw std::runtime_error("cannot create " + plugin_dir_ + ": " + mkdir_error);
  }
  watcher_.Start();
  started_ = true;

  auto& bus = context_.GetBus();
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory& inv) {
    const bool first = !inventory_seen_ && inv.available;
    inventory_seen_ = inventory_seen_ || inv.available;
    if (tracker_.OnInventory(inv) || first) Replan();
  });
  health_sub_ = bus.Subscribe<gpu_health::DeviceHealth>([this](const gpu_health::DeviceHealth& health) {
    if (tracker_.OnDeviceHealth(health)) Replan();
  });
  SayWhatHealthMeans();
  WaitForHealthState();
  Replan();
  serving_started_ = true;
}

void DevicePluginModule::WaitForHealthState() {
  // gpu-health restores this boot's verdicts on the pool (issue #24 item 6), after this module
  // may have started: the first advertisement waits for its state, so a GPU it restores
  // Unhealthy is never offered as Healthy first. Bounded: a gpu-health that cannot start must
  // not keep every GPU from the kubelet.
  const auto* states = context_.GetBus().Latest<ModuleStates>();
  const bool health_enabled = states != nullptr && std::any_of(states->modules.begin(), states->modules.end(),
                                                               [](const ModuleStatus& m) { return m.name == kHealthModule; });
  if (!health_enabled || context_.GetBus().Latest<gpu_health::GpuHealthState>() != nullptr) return;
  awaiting_health_ = true;
  health_state_sub_ = context_.GetBus().Subscribe<gpu_health::GpuHealthState>(
      [this](const gpu_health::GpuHealthState&) { HealthStateKnown(); });
  health_wait_timer_.expires_after(kHealthStateWait);
  health_wait_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec || !awaiting_health_) return;
    context_.Log().warn("{} has not published its state after {} s: advertising without it", kHealthModule,
                        std::chrono::duration_cast<std::chrono::seconds>(kHealthStateWait).count());
    HealthStateKnown();
  }));
}

void DevicePluginModule::HealthStateKnown() {
  if (!awaiting_health_) return;
  awaiting_health_ = false;
  health_wait_timer_.cancel();
  Replan();
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

// The inventory's GPUs this plugin serves: its `gpus:` selection, less every GPU the dra-gpu
// module serves (a GPU goes to Kubernetes one way, never both; DRA wins a GPU that both name,
// which only a UUID in one list and the same GPU's index in the other can reach).
std::vector<gpu_inventory::GpuInfo> DevicePluginModule::ServedGpus() {
  const auto& split = context_.Site().gpu_split;
  std::vector<gpu_inventory::GpuInfo> out;
  for (const auto& gpu : tracker_.Gpus()) {
    if (!config_.gpus.Matches(gpu.uuid, gpu.index)) continue;
    if (split && split->dra_set && split->dra.Matches(gpu.uuid, gpu.index)) {
      if (config_.gpus_written && !config_.gpus.all && dra_warned_.insert(gpu.uuid).second) {
        context_.Log().warn("GPU {} (index {}) is selected here and by {}: left to DRA", gpu.uuid, gpu.index,
                            split->dra_where);
      }
      continue;
    }
    out.push_back(gpu);
  }
  return out;
}

void DevicePluginModule::Replan() {
  if (!started_ || stopping_ || awaiting_health_) return;
  Plan next = MakePlan(ServedGpus(), MakePlanSettings());
  if (next.error != plan_.error && !next.error.empty()) context_.Log().error("{}", next.error);
  plan_ = std::move(next);

  // Resources gone: their sockets go (the kubelet then drops their capacity).
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    const ResourcePlan* planned = plan_.Find(it->first);
    if (planned != nullptr && planned->socket == it->second->SocketName()) {
      ++it;
      continue;
    }
    context_.Log().info("{} is no longer advertised: stopping its endpoint", it->first);
    auto gone = std::shared_ptr<ResourceEndpoint>(std::move(it->second));
    it = endpoints_.erase(it);
    gone->Stop([gone] {});  // keeps itself alive until its server is down
  }
  CheckMpsDaemons();
  for (const auto& resource : plan_.resources) {
    if (endpoints_.count(resource.name) != 0) continue;
    if (resource.mps) {
      const auto it = mps_problem_.find(resource.name);
      if (it == mps_problem_.end() || !it->second.empty()) continue;  // registers once its daemon answers
    }
    try {
      StartEndpoint(resource.name, resource.socket);
    } catch (const std::exception& e) {
      // At start this fails Start (the supervisor retries); later, from a bus message, the
      // supervisor restarts the module.
      if (!serving_started_) throw;
      context_.ReportFailure("cannot serve " + resource.name + ": " + e.what());
      return;
    }
  }
  for (auto& [name, endpoint] : endpoints_) endpoint->Refresh();
  // No spec before the first inventory: an empty one would only be replaced a moment later.
  if (inventory_seen_) cdi_.Update(PhysicalDevices(plan_));
  ArmMpsTimer();
  OnEndpointStateChanged();
}

bool DevicePluginModule::CheckMpsDaemons() {
  bool changed = false;
  std::map<std::string, std::string> next;
  for (const auto& resource : plan_.resources) {
    if (!resource.mps) continue;
    const std::string control =
        context_.Site().paths.host_root + MpsControlPath(MpsPipeDir(config_.mps.root, resource.name));
    std::string problem = ProbeMpsControl(control);
    const auto it = mps_problem_.find(resource.name);
    if (it == mps_problem_.end() || it->second != problem) {
      changed = true;
      if (problem.empty()) context_.Log().info("the MPS control daemon of {} answers on {}", resource.name, control);
      else if (it == mps_problem_.end()) context_.Log().warn("waiting for the MPS control daemon of {}: {}", resource.name, problem);
      else context_.Log().warn("the MPS control daemon of {} does not answer: {}", resource.name, problem);
    }
    next[resource.name] = std::move(problem);
  }
  changed = changed || next.size() != mps_problem_.size();
  mps_problem_ = std::move(next);
  return changed;
}

void DevicePluginModule::ArmMpsTimer() {
  if (mps_timer_armed_ || stopping_ || mps_problem_.empty()) return;
  mps_timer_armed_ = true;
  mps_timer_.expires_after(config_.mps.check_interval);
  mps_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    mps_timer_armed_ = false;
    if (ec || stopping_) return;  // cancelled at stop
    if (CheckMpsDaemons()) Replan();  // starts a waiting endpoint, or changes the replicas' health
    ArmMpsTimer();
  }));
}

bool DevicePluginModule::Usable(const ResourcePlan& resource, const PlannedDevice& device, std::string* reason) const {
  const AdvertisedDevice* health = tracker_.HealthOf(device.physical.uuid);
  if (health == nullptr || !health->healthy) {
    if (reason != nullptr) *reason = health != nullptr ? health->reason : "unknown device";
    return false;
  }
  if (resource.mps) {
    const auto it = mps_problem_.find(resource.name);
    const std::string problem = it == mps_problem_.end() ? "not probed yet" : it->second;
    if (!problem.empty()) {
      if (reason != nullptr) *reason = "MPS control daemon does not answer: " + problem;
      return false;
    }
  }
  return true;
}

void DevicePluginModule::StartEndpoint(const std::string& resource, const std::string& socket) {
  ResourceEndpoint::Settings settings;
  settings.resource = resource;
  settings.plugin_dir = plugin_dir_;
  settings.socket_name = socket;
  settings.register_timeout = config_.register_timeout;
  settings.register_backoff = config_.register_backoff;
  ResourceEndpoint::Hooks hooks;
  hooks.current_list = [this, resource] { return ListFor(resource); };
  hooks.allocate = [this, resource](const v1beta1::AllocateRequest& request, v1beta1::AllocateResponse* response) {
    return Allocate(resource, request, response);
  };
  hooks.preferred = [this, resource](const v1beta1::PreferredAllocationRequest& request,
                                     v1beta1::PreferredAllocationResponse* response) {
    return PreferredFor(resource, request, response);
  };
  hooks.state_changed = [this] { OnEndpointStateChanged(); };
  auto endpoint = std::make_unique<ResourceEndpoint>(context_, std::move(settings), std::move(hooks));
  auto* raw = endpoint.get();
  endpoints_[resource] = std::move(endpoint);
  raw->Start();
}

v1beta1::ListAndWatchResponse DevicePluginModule::ListFor(const std::string& resource) const {
  v1beta1::ListAndWatchResponse list;
  const ResourcePlan* plan = plan_.Find(resource);
  if (plan == nullptr) return list;
  for (const auto& d : plan->devices) {
    auto* device = list.add_devices();
    device->set_id(d.id);
    device->set_health(Usable(*plan, d) ? "Healthy" : "Unhealthy");
    if (d.physical.numa_node >= 0) device->mutable_topology()->add_nodes()->set_id(d.physical.numa_node);
  }
  return list;
}

grpc::Status DevicePluginModule::Allocate(const std::string& resource, const v1beta1::AllocateRequest& request,
                                          v1beta1::AllocateResponse* response) {
  auto& metrics = context_.Metrics();
  auto rejected = [&](const std::string& error) {
    metrics.Counter("gpu_node_supervisor_device_plugin_allocations_total", "Allocate requests",
                    {{"resource", resource}, {"result", "rejected"}}).Inc();
    context_.Log().warn("Allocate for {} rejected: {}", resource, error);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error);
  };
  const ResourcePlan* plan = plan_.Find(resource);
  if (plan == nullptr) return rejected(resource + " is no longer advertised");
  AllocationSettings settings = config_.allocation;
  if (settings.pass_device_specs) settings.control_devices = ExistingControlDevices();
  RequestRules rules;
  rules.resource = resource;
  rules.fail_requests_greater_than_one = plan->fail_requests_greater_than_one;
  rules.healthy_devices = 0;
  for (const auto& d : plan->devices)
    if (Usable(*plan, d)) ++rules.healthy_devices;
  // passDeviceSpecs with MIG devices: their capability nodes, from the driver's mig-minors
  // (read and parsed once per request, and only when a MIG device is asked for: MIG can be
  // reconfigured).
  std::optional<std::pair<CdiHostFacts, std::string>> minors;  // parsed, error
  auto read_minors = [&]() -> const std::pair<CdiHostFacts, std::string>& {
    if (!minors) {
      const std::string path = MigMinorsPath(context_.Site().paths.host_root);
      std::string text, error;
      CdiHostFacts parsed;
      if (ReadWholeFile(path, text, error)) {
        ParseMigMinors(text, parsed);
      } else {
        error = "cannot read " + path + ": " + error;
      }
      minors.emplace(std::move(parsed), std::move(error));
    }
    return *minors;
  };
  const DeviceLookup lookup = [&, plan](const std::string& id) -> std::optional<DeviceFacts> {
    const PlannedDevice* d = plan->Find(id);
    if (d == nullptr) return std::nullopt;
    DeviceFacts facts{Usable(*plan, *d), d->physical.minor, d->physical.id, plan->replicas > 1};
    if (settings.pass_device_specs && d->physical.mig) {
      const auto& [parsed, error] = read_minors();
      if (error.empty()) {
        facts.cap_nodes = MigCapNodes(d->physical, parsed, facts.cap_error);
      } else {
        facts.cap_error = error;
      }
    }
    return facts;
  };
  for (const auto& container : request.container_requests()) {
    ContainerAllocation allocation;
    rules.annotation_key = "gpu-node-supervisor_" + std::to_string(++allocations_);
    const std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
    const auto error = AllocateContainer(settings, lookup, ids, allocation, rules);
    if (!error.empty()) return rejected(error);
    if (plan->mps) {
      // One replica per container (failRequestsGreaterThanOne is forced): its GPU's memory.
      const PlannedDevice* d = plan->Find(ids.front());
      const auto* gpu = d != nullptr ? tracker_.Find(d->physical.parent_uuid) : nullptr;
      AddMpsEdits(config_.mps, resource, plan->replicas, gpu != nullptr ? gpu->memory_total_bytes : 0, allocation);
    }
    auto* out = response->add_container_responses();
    for (const auto& [k, v] : allocation.envs) (*out->mutable_envs())[k] = v;
    for (const auto& [k, v] : allocation.annotations) (*out->mutable_annotations())[k] = v;
    for (const auto& name : allocation.cdi_devices) out->add_cdi_devices()->set_name(name);
    for (const auto& mount : allocation.mounts) {
      auto* m = out->add_mounts();
      m->set_container_path(mount.container_path);
      m->set_host_path(mount.host_path);
      m->set_read_only(mount.read_only);
    }
    for (const auto& spec : allocation.devices) {
      auto* d = out->add_devices();
      d->set_container_path(spec.container_path);
      d->set_host_path(spec.host_path);
      d->set_permissions(spec.permissions);
    }
  }
  metrics.Counter("gpu_node_supervisor_device_plugin_allocations_total", "Allocate requests",
                  {{"resource", resource}, {"result", "ok"}}).Inc();
  context_.GetBus().Publish(pod_resources::DevicesAllocated{resource, AllocatedIds(request)});
  return grpc::Status::OK;
}

grpc::Status DevicePluginModule::PreferredFor(const std::string& resource,
                                           const v1beta1::PreferredAllocationRequest& request,
                                           v1beta1::PreferredAllocationResponse* response) const {
  const ResourcePlan* plan = plan_.Find(resource);
  if (plan == nullptr) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, resource + " is no longer advertised");
  // Whole GPUs, not shared: NVLink/NUMA locality from the inventory. MIG devices and replicas:
  // the least loaded device first, counting what running containers hold (PreferredSpread).
  const bool whole_gpus = plan->replicas == 1 &&
                          std::none_of(plan->devices.begin(), plan->devices.end(),
                                       [](const PlannedDevice& d) { return d.physical.mig; });
  std::vector<TopologyDevice> topology;
  if (whole_gpus) {
    std::map<std::string, std::string> id_of;  // GPU UUID → advertised ID
    for (const auto& d : plan->devices) id_of[d.physical.uuid] = d.id;
    for (const auto& d : plan->devices) {
      const auto* gpu = tracker_.Find(d.physical.uuid);
      TopologyDevice t{d.id, d.physical.numa_node, gpu != nullptr ? gpu->pci : gpu_inventory::PciAddress{}, {}};
      if (gpu != nullptr)
        for (const auto& peer : gpu->nvlink_peers)
          if (const auto it = id_of.find(peer); it != id_of.end()) t.nvlink_peers.insert(it->second);
      topology.push_back(std::move(t));
    }
  }
  // Replicas share their physical device (a GPU, or a MIG device): spread over those. MIG
  // devices that are not shared: over their GPUs.
  std::vector<std::string> advertised;
  for (const auto& d : plan->devices) advertised.push_back(d.id);
  const bool shared = plan->replicas > 1;
  const auto group_of = [plan, shared](const std::string& id) -> std::string {
    const PlannedDevice* d = plan->Find(id);
    if (d == nullptr) return {};
    return shared ? d->physical.uuid : d->physical.parent_uuid;
  };
  for (const auto& container : request.container_requests()) {
    const std::vector<std::string> available(container.available_deviceids().begin(),
                                             container.available_deviceids().end());
    const std::vector<std::string> must(container.must_include_deviceids().begin(),
                                        container.must_include_deviceids().end());
    Preferred preferred;
    if (whole_gpus) {
      preferred = PreferredAllocation(topology, available, must, container.allocation_size());
    } else {
      preferred = PreferredSpread(advertised, available, must, container.allocation_size(), group_of);
    }
    if (!preferred.error.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, preferred.error);
    auto* out = response->add_container_responses();
    for (const auto& id : preferred.ids) out->add_deviceids(id);
  }
  return grpc::Status::OK;
}

void DevicePluginModule::OnDirectoryChange(DirWatcher::Change change, const std::string& name) {
  switch (change) {
    case DirWatcher::Change::kDeleted:
      for (auto& [resource, endpoint] : endpoints_) {
        if (name == endpoint->SocketName()) endpoint->OnOurSocketDeleted();
        if (name == "kubelet.sock") endpoint->OnKubeletSocketDeleted();
      }
      break;
    case DirWatcher::Change::kCreated:
      if (name == "kubelet.sock") {
        context_.Log().info("kubelet.sock appeared: registering");
        for (auto& [resource, endpoint] : endpoints_) endpoint->OnKubeletSocketCreated();
      }
      break;
    case DirWatcher::Change::kOverflow:
      for (auto& [resource, endpoint] : endpoints_) endpoint->OnOverflow();
      break;
    case DirWatcher::Change::kDirectoryGone:
      context_.ReportFailure(plugin_dir_ + " was removed");
      break;
  }
}

void DevicePluginModule::OnEndpointStateChanged() {
  if (stopping_) return;
  std::string problem = plan_.error;
  for (const auto& [resource, endpoint] : endpoints_) {
    if (problem.empty() && !endpoint->Problem().empty()) problem = resource + ": " + endpoint->Problem();
  }
  for (const auto& [resource, mps_problem] : mps_problem_) {
    if (problem.empty() && !mps_problem.empty()) {
      problem = resource + ": " + (endpoints_.count(resource) != 0 ? "the MPS control daemon does not answer: "
                                                                     : "not registered until the MPS control daemon answers: ") +
                mps_problem;
    }
  }
  if (problem.empty()) context_.SetHealth(ModuleHealth::kOk);
  else context_.SetHealth(ModuleHealth::kUnhealthy, problem);
  PublishState();
}

void DevicePluginModule::PublishState() {
  DevicePluginState state;
  state.resource_name = config_.resource_name;
  state.inventory_read = inventory_seen_;
  state.serving = !endpoints_.empty();
  state.registered = !endpoints_.empty();
  state.error = plan_.error;
  state.mig_strategy = config_.mig_strategy == MigStrategy::kSingle  ? "single"
                       : config_.mig_strategy == MigStrategy::kMixed ? "mixed"
                                                                     : "none";
  if (const auto* shared = config_.sharing.Find(config_.resource_name); shared != nullptr && shared->replicas > 1) {
    state.gpu_replicas = shared->replicas;
    state.gpu_shared_renamed = !shared->rename.empty() || config_.sharing.rename_by_default;
  }
  for (const auto& r : plan_.resources)
    if (r.replicas > 1) state.sharing_strategy = r.mps ? "mps" : "time-slicing";
  if (cdi_.Enabled()) {
    state.cdi_spec = cdi_.GetStatus().path;
    state.cdi_writes = cdi_.GetStatus().writes;
    state.cdi_error = cdi_.GetStatus().last_error;
  }
  if (const auto it = endpoints_.find(config_.resource_name); it != endpoints_.end()) {
    state.socket = it->second->SocketPath();
  }
  // A resource waiting for its MPS control daemon has no endpoint yet: not everything serves.
  if (endpoints_.size() != plan_.resources.size()) state.serving = state.registered = false;
  for (const auto& [resource, endpoint] : endpoints_) {
    state.serving = state.serving && endpoint->Serving();
    state.registered = state.registered && endpoint->Registered();
    state.registrations += endpoint->Registrations();
    state.open_streams += endpoint->OpenStreams();
  }
  std::set<std::string> physical_seen;
  for (const auto& resource : plan_.resources) {
    DevicePluginState::Resource r;
    r.name = resource.name;
    r.socket = resource.socket;
    r.replicas = resource.replicas;
    if (resource.replicas > 1) r.sharing = resource.mps ? "mps" : "time-slicing";
    if (resource.mps) {
      r.mps_pipe_dir = MpsPipeDir(config_.mps.root, resource.name);
      const auto it = mps_problem_.find(resource.name);
      r.mps_daemon = it == mps_problem_.end() ? "not probed yet" : it->second.empty() ? "answers" : it->second;
    }
    if (const auto it = endpoints_.find(resource.name); it != endpoints_.end()) {
      r.serving = it->second->Serving();
      r.registered = it->second->Registered();
      r.registrations = it->second->Registrations();
    }
    int healthy = 0, unhealthy = 0;
    for (const auto& d : resource.devices) {
      (Usable(resource, d) ? healthy : unhealthy)++;
      r.device_ids.push_back(d.id);
      if (!physical_seen.insert(d.physical.uuid).second) continue;
      // The physical device's own health (an MPS daemon's state is the resource's, above).
      const AdvertisedDevice* health = tracker_.HealthOf(d.physical.uuid);
      const bool ok = health != nullptr && health->healthy;
      state.devices.push_back({d.physical.uuid, ok, d.physical.numa_node, health != nullptr ? health->reason : "unknown device"});
    }
    r.healthy = healthy;
    auto& m = context_.Metrics();
    m.Gauge("gpu_node_supervisor_device_plugin_devices", "Devices advertised to the kubelet",
            {{"resource", resource.name}, {"health", "Healthy"}}).Set(healthy);
    m.Gauge("gpu_node_supervisor_device_plugin_devices", "Devices advertised to the kubelet",
            {{"resource", resource.name}, {"health", "Unhealthy"}}).Set(unhealthy);
    state.resources.push_back(std::move(r));
  }
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
  mps_timer_.cancel();
  health_wait_timer_.cancel();
  watcher_.Stop();
  inventory_sub_.Reset();
  health_sub_.Reset();
  health_state_sub_.Reset();
  // Every endpoint shuts down off the loop, and the CDI spec goes when configured; `done` once
  // the last of them is done.
  auto remaining = std::make_shared<std::size_t>(endpoints_.size() + 1);
  auto shared_done = std::make_shared<std::function<void()>>(std::move(done));
  auto one_done = [remaining, shared_done] {
    if (--*remaining == 0) (*shared_done)();
  };
  for (auto& [resource, endpoint] : endpoints_) endpoint->Stop(one_done);
  cdi_.Stop(one_done);
}

}  // namespace gns::device_plugin
