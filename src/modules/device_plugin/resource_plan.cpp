// Resources and device IDs per MIG strategy and time-slicing settings.
#include "modules/device_plugin/resource_plan.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace gns::device_plugin {

namespace {

constexpr std::string_view kMigPrefix = "mig-";

PhysicalDevice WholeGpu(const gpu_inventory::GpuInfo& gpu, DeviceIdStrategy ids) {
  PhysicalDevice d;
  d.uuid = d.parent_uuid = gpu.uuid;
  d.id = ids == DeviceIdStrategy::kUuid ? gpu.uuid : std::to_string(gpu.index);
  d.gpu_index = gpu.index;
  d.minor = gpu.minor;
  d.numa_node = gpu.numa_node;
  return d;
}

PhysicalDevice MigDevice(const gpu_inventory::GpuInfo& gpu, const gpu_inventory::MigDeviceInfo& mig,
                         DeviceIdStrategy ids) {
  PhysicalDevice d;
  d.uuid = mig.uuid;
  d.parent_uuid = gpu.uuid;
  d.id = ids == DeviceIdStrategy::kUuid ? mig.uuid : std::to_string(gpu.index) + ":" + std::to_string(mig.index);
  d.gpu_index = gpu.index;
  d.minor = gpu.minor;
  d.numa_node = gpu.numa_node;
  d.mig = true;
  d.gpu_instance = mig.gpu_instance;
  d.compute_instance = mig.compute_instance;
  d.profile = mig.profile;
  return d;
}

std::string ResourceDomain(const std::string& gpu_resource) {
  const auto slash = gpu_resource.find('/');
  return slash == std::string::npos ? "nvidia.com" : gpu_resource.substr(0, slash);
}

}  // namespace

const SharedResource* SharingSettings::Find(const std::string& name) const {
  for (const auto& r : resources)
    if (r.name == name) return &r;
  return nullptr;
}

const PlannedDevice* ResourcePlan::Find(const std::string& id) const {
  for (const auto& d : devices)
    if (d.id == id) return &d;
  return nullptr;
}

const ResourcePlan* Plan::Find(const std::string& name) const {
  for (const auto& r : resources)
    if (r.name == name) return &r;
  return nullptr;
}

std::string SocketFor(const PlanSettings& settings, const std::string& resource) {
  if (resource == settings.gpu_resource) return settings.gpu_socket;
  const auto slash = resource.find('/');
  return "nvidia-" + resource.substr(slash == std::string::npos ? 0 : slash + 1) + ".sock";
}

Plan MakePlan(const std::vector<gpu_inventory::GpuInfo>& gpus, const PlanSettings& settings) {
  Plan plan;
  // Resource name (before time-slicing renames it) → its physical devices, in inventory order.
  std::map<std::string, std::vector<PhysicalDevice>> by_resource;
  by_resource[settings.gpu_resource];  // always registered, so no stale capacity lingers
  const std::string mig_prefix = ResourceDomain(settings.gpu_resource) + "/" + std::string(kMigPrefix);

  switch (settings.mig_strategy) {
    case MigStrategy::kNone:
      for (const auto& gpu : gpus) by_resource[settings.gpu_resource].push_back(WholeGpu(gpu, settings.id_strategy));
      break;
    case MigStrategy::kSingle: {
      std::set<std::string> profiles;
      std::vector<std::string> without_mig, without_devices;
      for (const auto& gpu : gpus) {
        if (!gpu.mig_enabled) without_mig.push_back(gpu.uuid);
        else if (gpu.mig_devices.empty()) without_devices.push_back(gpu.uuid);
        for (const auto& mig : gpu.mig_devices) profiles.insert(mig.profile);
      }
      auto join = [](const auto& items) {
        std::string s;
        for (const auto& x : items) s += (s.empty() ? "" : ", ") + x;
        return s;
      };
      if (!without_mig.empty() && without_mig.size() != gpus.size()) {
        plan.error = "migStrategy single needs MIG enabled on every GPU; disabled on " + join(without_mig);
      } else if (without_mig.size() == gpus.size()) {
        // No GPU has MIG: upstream then serves the whole GPUs under `single` too.
        for (const auto& gpu : gpus) by_resource[settings.gpu_resource].push_back(WholeGpu(gpu, settings.id_strategy));
      } else if (!without_devices.empty()) {
        plan.error = "migStrategy single: MIG is enabled but no MIG devices exist on " + join(without_devices);
      } else if (profiles.size() > 1) {
        plan.error = "migStrategy single needs one MIG profile on the node; found " + join(profiles);
      } else {
        for (const auto& gpu : gpus)
          for (const auto& mig : gpu.mig_devices)
            by_resource[settings.gpu_resource].push_back(MigDevice(gpu, mig, settings.id_strategy));
      }
      if (!plan.error.empty()) by_resource[settings.gpu_resource].clear();
      break;
    }
    case MigStrategy::kMixed:
      for (const auto& gpu : gpus) {
        if (!gpu.mig_enabled) {
          by_resource[settings.gpu_resource].push_back(WholeGpu(gpu, settings.id_strategy));
          continue;
        }
        for (const auto& mig : gpu.mig_devices)
          by_resource[mig_prefix + mig.profile].push_back(MigDevice(gpu, mig, settings.id_strategy));
      }
      break;
  }

  for (auto& [name, physical] : by_resource) {
    ResourcePlan resource;
    resource.name = name;
    const SharedResource* shared = settings.sharing.Find(name);
    if (shared != nullptr && shared->replicas > 1) {
      resource.replicas = shared->replicas;
      resource.mps = settings.sharing.strategy == SharingStrategy::kMps;
      resource.fail_requests_greater_than_one = settings.sharing.fail_requests_greater_than_one || resource.mps;
      if (!shared->rename.empty()) resource.name = shared->rename;
      else if (settings.sharing.rename_by_default) resource.name = name + ".shared";
      if (resource.mps) {
        // Upstream refuses MPS for MIG devices (migStrategy single with MIG on); so do we, for
        // the whole resource: a partial MPS resource would advertise less than configured.
        std::vector<std::string> mig;
        for (const auto& p : physical)
          if (p.mig) mig.push_back(p.uuid);
        if (!mig.empty()) {
          std::string list;
          for (const auto& m : mig) list += (list.empty() ? "" : ", ") + m;
          if (plan.error.empty()) plan.error = "sharing using MPS is not supported for MIG devices: " + list;
          physical.clear();
        }
      }
      for (const auto& p : physical)
        for (int n = 0; n < resource.replicas; ++n)
          resource.devices.push_back({p.id + std::string(kReplicaSeparator) + std::to_string(n), p});
    } else {
      for (const auto& p : physical) resource.devices.push_back({p.id, p});
    }
    resource.socket = SocketFor(settings, resource.name);
    plan.resources.push_back(std::move(resource));
  }
  std::sort(plan.resources.begin(), plan.resources.end(),
            [](const ResourcePlan& a, const ResourcePlan& b) { return a.name < b.name; });
  return plan;
}

std::vector<PhysicalDevice> PhysicalDevices(const Plan& plan) {
  std::vector<PhysicalDevice> out;
  std::set<std::string> seen;
  for (const auto& resource : plan.resources)
    for (const auto& d : resource.devices)
      if (seen.insert(d.physical.uuid).second) out.push_back(d.physical);
  return out;
}

}  // namespace gns::device_plugin
