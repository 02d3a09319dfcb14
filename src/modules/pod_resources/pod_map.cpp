// The pod-resources core: List answer -> checked view -> GPU map, annotations, writes.
#include "modules/pod_resources/pod_map.hpp"

#include "modules/dra_gpu/messages.hpp"

#include <algorithm>
#include <tuple>

namespace gns::pod_resources {

using nlohmann::json;

namespace {

std::string Quoted(std::string_view text) { return json(std::string(text)).dump(); }

}  // namespace

std::string_view PhysicalDeviceId(std::string_view id) {
  const auto cut = id.rfind(kReplicaSeparator);
  if (cut == std::string_view::npos || cut == 0) return id;
  const std::string_view n = id.substr(cut + kReplicaSeparator.size());
  if (n.empty() || !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; })) return id;
  return id.substr(0, cut);
}

bool IsOurResource(const std::set<std::string>& resources, std::string_view name) {
  if (resources.contains(std::string(name))) return true;
  return std::any_of(resources.begin(), resources.end(), [&](const std::string& r) {
    return r.ends_with('*') && name.starts_with(std::string_view(r).substr(0, r.size() - 1));
  });
}

ListView ReadList(const v1::ListPodResourcesResponse& response, const std::set<std::string>& resources,
                  const KnownDevice& known) {
  ListView view;
  std::map<std::string, PodView> pods;
  int index = 0;
  for (const v1::PodResources& pod : response.pod_resources()) {
    ++index;
    if (pod.name().empty() || pod.namespace_().empty()) {
      view.problems.push_back("List entry #" + std::to_string(index) + " has an empty " +
                              (pod.name().empty() ? "name" : "namespace") + " (namespace " +
                              Quoted(pod.namespace_()) + ", name " + Quoted(pod.name()) + "): skipped");
      continue;
    }
    const std::string key = pod.namespace_() + "/" + pod.name();
    auto [it, inserted] = pods.try_emplace(key);
    PodView& out = it->second;
    if (inserted) {
      out.namespace_name = pod.namespace_();
      out.name = pod.name();
    } else {
      view.problems.push_back("pod " + key + " appears twice in the List answer: its entries are merged");
    }
    for (const v1::ContainerResources& container : pod.containers()) {
      const std::string where = "pod " + key + " container " + Quoted(container.name());
      if (container.name().empty()) {
        view.problems.push_back("pod " + key + " has a container without a name: its devices are skipped");
        continue;
      }
      for (const v1::ContainerDevices& devices : container.devices()) {
        if (!IsOurResource(resources, devices.resource_name())) continue;
        for (const std::string& listed : devices.device_ids()) {
          if (listed.empty()) {
            view.problems.push_back(where + ": an empty " + devices.resource_name() + " device ID: skipped");
            continue;
          }
          // A time-slicing replica stands for its GPU (or MIG device): two pods sharing a GPU
          // both hold that GPU, and the annotation names the GPU, not the replica.
          const std::string id(PhysicalDeviceId(listed));
          if (known && !known(id)) {
            view.problems.push_back(where + ": " + devices.resource_name() + " device " + Quoted(listed) +
                                    " is not a GPU of this node (nor a MIG device or a time-slicing replica of one): left out of "
                                    "the map and the annotation");
            continue;
          }
          const bool duplicate = std::any_of(out.devices.begin(), out.devices.end(), [&](const HeldDevice& d) {
            return d.container == container.name() && d.resource == devices.resource_name() && d.id == id;
          });
          if (!duplicate) out.devices.push_back(HeldDevice{container.name(), devices.resource_name(), id});
        }
      }
      for (const v1::DynamicResource& dynamic : container.dynamic_resources()) {
        if (dynamic.claim_name().empty()) {
          view.problems.push_back(where + ": a dynamic resource without a claim name: skipped");
          continue;
        }
        // One entry per driver: a claim may hold devices of several drivers (a GPU and a
        // compute-domain channel), and each device must keep its own driver's name.
        std::vector<PodClaimRef> by_driver;
        for (const v1::ClaimResource& resource : dynamic.claim_resources()) {
          auto it = std::find_if(by_driver.begin(), by_driver.end(),
                                 [&](const PodClaimRef& c) { return c.driver == resource.driver_name(); });
          if (it == by_driver.end()) {
            it = by_driver.insert(by_driver.end(), PodClaimRef{pod.namespace_(), pod.name(), container.name(),
                                                               dynamic.claim_namespace() + "/" + dynamic.claim_name(),
                                                               resource.driver_name(), {}});
          }
          it->devices.push_back(resource.pool_name() + "/" + resource.device_name());
        }
        if (by_driver.empty()) {  // a claim with no devices (yet): still the pod's claim
          by_driver.push_back(PodClaimRef{pod.namespace_(), pod.name(), container.name(),
                                          dynamic.claim_namespace() + "/" + dynamic.claim_name(), {}, {}});
        }
        for (auto& claim : by_driver) out.claims.push_back(std::move(claim));
      }
    }
  }
  view.pods.reserve(pods.size());
  for (auto& [key, pod] : pods) {
    std::sort(pod.devices.begin(), pod.devices.end(), [](const HeldDevice& a, const HeldDevice& b) {
      return std::tie(a.container, a.resource, a.id) < std::tie(b.container, b.resource, b.id);
    });
    view.pods.push_back(std::move(pod));
  }
  return view;
}

std::size_t CountAllocatable(const v1::AllocatableResourcesResponse& response, const std::set<std::string>& resources) {
  std::set<std::string> ids;
  for (const v1::ContainerDevices& devices : response.devices()) {
    if (!IsOurResource(resources, devices.resource_name())) continue;
    for (const std::string& id : devices.device_ids()) ids.insert(devices.resource_name() + "\n" + id);
  }
  return ids.size();
}

std::string AnnotationValue(const std::map<std::string, std::set<std::string>>& by_resource) {
  json devices = json::object();
  for (const auto& [resource, ids] : by_resource) devices[resource] = json(std::vector<std::string>(ids.begin(), ids.end()));
  return json{{"devices", std::move(devices)}}.dump();
}

bool SameAnnotation(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const json pa = json::parse(a, nullptr, false);
  const json pb = json::parse(b, nullptr, false);
  return !pa.is_discarded() && !pb.is_discarded() && pa == pb;
}

std::map<std::string, std::string> DesiredAnnotations(const ListView& view) {
  std::map<std::string, std::string> desired;
  for (const PodView& pod : view.pods) {
    if (pod.devices.empty()) continue;
    std::map<std::string, std::set<std::string>> by_resource;
    for (const HeldDevice& device : pod.devices) by_resource[device.resource].insert(device.id);
    desired.emplace(pod.Key(), AnnotationValue(by_resource));
  }
  return desired;
}

std::map<std::string, std::vector<PodContainerRef>> BuildGpuMap(const ListView& view, const UidLookup& uid) {
  std::map<std::string, std::vector<PodContainerRef>> gpus;
  for (const PodView& pod : view.pods) {
    const std::string pod_uid = uid ? uid(pod.namespace_name, pod.name) : std::string();
    for (const HeldDevice& device : pod.devices) {
      gpus[device.id].push_back(PodContainerRef{pod.namespace_name, pod.name, pod_uid, device.container, device.resource});
    }
  }
  // view.pods is sorted by key and devices by container, so each list is already in order.
  return gpus;
}

std::vector<PodClaimRef> AllClaims(const ListView& view) {
  std::vector<PodClaimRef> claims;
  for (const PodView& pod : view.pods) claims.insert(claims.end(), pod.claims.begin(), pod.claims.end());
  return claims;
}

void GpuTopology::Add(const gpu_inventory::GpuInfo& gpu) {
  known = true;
  uuid_by_minor.emplace(gpu.minor, gpu.uuid);
  for (const auto& mig : gpu.mig_devices) {
    parent_of_mig.emplace(mig.uuid, gpu.uuid);
    // emplace keeps the first: dra-gpu offers a GPU instance's first compute instance.
    if (mig.placement_known) {
      mig_by_place.emplace(
          dra_gpu::DeviceNameParts{gpu.minor, true, mig.gi_profile_id, mig.placement_start, mig.placement_size}, mig.uuid);
    }
  }
}

IndirectHolders BuildIndirectHolders(const std::map<std::string, std::vector<PodContainerRef>>& gpus,
                                     const std::vector<PodClaimRef>& claims,
                                     const std::vector<PreparedGpuClaim>& prepared, const GpuTopology& topology,
                                     const UidLookup& uid) {
  IndirectHolders out;
  // Which GPU a DRA device name is on; "" and `why` when that cannot be told.
  const auto gpu_of = [&](std::string_view name, std::string& why) -> std::string {
    const auto parts = dra_gpu::ParseDeviceName(name);
    const std::optional<uint32_t> minor = parts ? std::optional<uint32_t>(parts->minor) : std::nullopt;
    if (!minor) {
      why = "a gpu.nvidia.com device not named gpu-<minor> or gpu-<minor>-mig-<profile>-<start>-<size>: its GPU cannot be told";
    } else if (!topology.known) {
      why = "no GPU inventory yet: the GPU of minor " + std::to_string(*minor) + " cannot be told";
    } else if (const auto it = topology.uuid_by_minor.find(*minor); it != topology.uuid_by_minor.end()) {
      return it->second;
    } else {
      why = "no GPU of this node has minor " + std::to_string(*minor);
    }
    return {};
  };

  // The MIG devices a device name on `gpu` holds besides the GPU: none for a whole GPU's name;
  // the MIG device at its place; or, when the inventory has none there, every MIG device of
  // that GPU (`exact` false: it may be any of them).
  const auto migs_of = [&](std::string_view name, const std::string& gpu, bool& exact) {
    std::vector<std::string> out_migs;
    exact = true;
    const auto parts = dra_gpu::ParseDeviceName(name);
    if (!parts || !parts->mig) return out_migs;
    if (const auto it = topology.mig_by_place.find(*parts); it != topology.mig_by_place.end()) {
      out_migs.push_back(it->second);
      return out_migs;
    }
    exact = false;
    for (const auto& [mig, parent] : topology.parent_of_mig) {
      if (parent == gpu) out_migs.push_back(mig);
    }
    return out_migs;
  };
  const auto no_such_place = [](std::string_view name, const std::string& gpu) {
    return "a gpu.nvidia.com MIG device " + std::string(name) + " at a place where GPU " + gpu +
           " has no MIG device in the inventory: it may be any of that GPU's";
  };

  // MIG devices: a reset of their GPU resets them.
  for (const auto& [id, refs] : gpus) {
    if (const auto parent = topology.parent_of_mig.find(id); parent != topology.parent_of_mig.end()) {
      for (PodContainerRef ref : refs) {
        ref.device = id;
        out.via[parent->second].push_back(std::move(ref));
      }
    } else if (!topology.known && id.starts_with("MIG-")) {
      for (const auto& ref : refs) {
        out.unplaced.push_back(OtherHolder{ref.namespace_name + "/" + ref.name, "", id,
                                           "a MIG device whose GPU is not known yet (no GPU inventory)"});
      }
    }
  }

  // Listed claims of gpu.nvidia.com: the pod holds the GPU each device is on.
  std::set<std::string> listed;
  for (const PodClaimRef& claim : claims) {
    if (claim.driver != kGpuDraDriver) continue;
    listed.insert(claim.claim);
    const std::string pod_uid = uid ? uid(claim.namespace_name, claim.name) : std::string();
    for (const std::string& device : claim.devices) {
      const auto slash = device.find('/');
      const std::string_view name = slash == std::string::npos ? std::string_view(device) : std::string_view(device).substr(slash + 1);
      std::string why;
      const std::string gpu = gpu_of(name, why);
      if (gpu.empty()) {
        out.unplaced.push_back(OtherHolder{claim.namespace_name + "/" + claim.name, claim.claim, device, why});
        continue;
      }
      PodContainerRef ref{claim.namespace_name, claim.name, pod_uid, claim.container, claim.driver, claim.claim, device};
      bool exact = true;
      for (const std::string& mig : migs_of(name, gpu, exact)) {
        if (exact) {
          out.via[mig].push_back(ref);
        } else {
          out.pending[mig].push_back(OtherHolder{claim.namespace_name + "/" + claim.name, claim.claim, device,
                                                 no_such_place(name, gpu)});
        }
      }
      out.via[gpu].push_back(std::move(ref));
    }
  }

  // Prepared claims no listed pod shows yet.
  for (const PreparedGpuClaim& claim : prepared) {
    if (listed.contains(claim.claim)) continue;
    for (const std::string& device : claim.devices) {
      std::string why;
      const std::string gpu = gpu_of(device, why);
      if (gpu.empty()) {
        out.unplaced.push_back(OtherHolder{"", claim.claim, device, "prepared by dra-gpu; " + why});
        continue;
      }
      const OtherHolder holder{"", claim.claim, device, "prepared by dra-gpu; the kubelet lists no pod with it yet"};
      bool exact = true;
      for (const std::string& mig : migs_of(device, gpu, exact)) {
        out.pending[mig].push_back(exact ? holder : OtherHolder{"", claim.claim, device, "prepared by dra-gpu; " + no_such_place(device, gpu)});
      }
      out.pending[gpu].push_back(holder);
    }
  }

  for (auto& [gpu, refs] : out.via) {
    const auto key = [](const PodContainerRef& r) {
      return std::tie(r.namespace_name, r.name, r.container, r.resource, r.claim, r.device, r.uid);
    };
    std::sort(refs.begin(), refs.end(), [&](const PodContainerRef& a, const PodContainerRef& b) { return key(a) < key(b); });
    refs.erase(std::unique(refs.begin(), refs.end()), refs.end());
  }
  return out;
}

std::vector<AnnotationWrite> PlanAnnotationWrites(const std::map<std::string, std::string>& desired,
                                                  const std::map<std::string, PodAnnotationState>& pods) {
  std::vector<AnnotationWrite> writes;
  for (const auto& [key, pod] : pods) {
    const auto want = desired.find(key);
    if (want != desired.end()) {
      if (pod.current && SameAnnotation(*pod.current, want->second)) continue;
      writes.push_back(AnnotationWrite{pod.namespace_name, pod.name, pod.uid, want->second});
    } else if (pod.current) {
      writes.push_back(AnnotationWrite{pod.namespace_name, pod.name, pod.uid, std::nullopt});
    }
  }
  return writes;
}

json AnnotationPatch(const AnnotationWrite& write) {
  json metadata{{"annotations", {{std::string(kDevicesAnnotation), write.value ? json(*write.value) : json(nullptr)}}}};
  if (!write.uid.empty()) metadata["uid"] = write.uid;
  return json{{"metadata", std::move(metadata)}};
}

}  // namespace gns::pod_resources
