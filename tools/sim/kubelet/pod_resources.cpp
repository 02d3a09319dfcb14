// The kubelet's PodResourcesLister v1 (WIRE-FACTS §5) over what this simulator allocated: device
// IDs from Allocate calls made for a pod, dynamic resources from NodePrepareResources calls made
// for a pod, allocatable devices from the plugins' latest ListAndWatch lists. Served on
// <kubelet>/pod-resources/kubelet.sock (directory 0750, as the kubelet makes it).
#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>
#include <system_error>

#include "kubelet_sim_impl.h"

namespace gns::sim {

namespace fs = std::filesystem;

namespace {

std::string PodKey(const std::string& ns, const std::string& name) { return ns + "/" + name; }

void FillPod(const PodResourcesEntry& pod, v1::PodResources* out) {
  out->set_name(pod.name);
  out->set_namespace_(pod.namespace_);
  for (const auto& [container_name, container] : pod.containers) {
    v1::ContainerResources* c = out->add_containers();
    c->set_name(container_name);
    for (const auto& [resource, ids] : container.devices) {
      v1::ContainerDevices* d = c->add_devices();
      d->set_resource_name(resource);
      for (const std::string& id : ids) d->add_device_ids(id);
    }
    for (const PodDynamicResource& dynamic : container.dynamic_resources) {
      v1::DynamicResource* r = c->add_dynamic_resources();
      r->set_claim_name(dynamic.claim_name);
      r->set_claim_namespace(dynamic.claim_namespace);
      for (const PodClaimDevice& device : dynamic.devices) {
        v1::ClaimResource* cr = r->add_claim_resources();
        cr->set_driver_name(dynamic.driver);
        cr->set_pool_name(device.pool_name);
        cr->set_device_name(device.device_name);
        for (const std::string& cdi : device.cdi_device_ids) cr->add_cdi_devices()->set_name(cdi);
      }
    }
  }
}

}  // namespace

// ---- the server --------------------------------------------------------------------------------

void KubeletSim::Impl::StartPodResourcesServer() {
  if (pod_resources_server) return;
  fs::create_directories(pod_resources_dir);
  fs::permissions(pod_resources_dir, fs::perms(0750), fs::perm_options::replace);
  const fs::path socket = pod_resources_dir / detail::kKubeletSocketName;
  std::error_code ec;
  fs::remove(socket, ec);  // a stale socket from an earlier run
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&pod_resources_service);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  pod_resources_server = builder.BuildAndStart();
  if (!pod_resources_server) throw std::runtime_error("cannot serve " + socket.string());
  {
    std::lock_guard lock(mutex);
    state.pod_resources_serving = true;
  }
  NotifyChanged();
  Log("pod-resources: serving " + socket.string());
}

void KubeletSim::Impl::StopPodResourcesServer() {
  if (!pod_resources_server) return;
  pod_resources_server->Shutdown(detail::Deadline(std::chrono::milliseconds(500)));
  pod_resources_server->Wait();
  pod_resources_server.reset();
  std::error_code ec;
  fs::remove(pod_resources_dir / detail::kKubeletSocketName, ec);  // gone, as from a kubelet that stopped
  {
    std::lock_guard lock(mutex);
    state.pod_resources_serving = false;
  }
  NotifyChanged();
  Log("pod-resources: stopped serving");
}

grpc::Status KubeletSim::Impl::PodResourcesService::List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                                                         v1::ListPodResourcesResponse* response) {
  {
    std::lock_guard lock(impl_.mutex);
    for (const auto& [key, pod] : impl_.state.pods) FillPod(pod, response->add_pod_resources());
    ++impl_.state.pod_resources_lists;
  }
  impl_.NotifyChanged();
  return grpc::Status::OK;
}

grpc::Status KubeletSim::Impl::PodResourcesService::GetAllocatableResources(grpc::ServerContext*,
                                                                            const v1::AllocatableResourcesRequest*,
                                                                            v1::AllocatableResourcesResponse* response) {
  {
    std::lock_guard lock(impl_.mutex);
    // The device manager reports every healthy device of every registered resource, one entry
    // per device with its NUMA nodes.
    for (const auto& [resource, rs] : impl_.state.resources) {
      for (const DeviceInfo& device : rs.devices) {
        if (device.health != "Healthy") continue;
        v1::ContainerDevices* d = response->add_devices();
        d->set_resource_name(resource);
        d->add_device_ids(device.id);
        for (const std::int64_t numa : device.numa_nodes) d->mutable_topology()->add_nodes()->set_id(numa);
      }
    }
    ++impl_.state.pod_resources_allocatable_calls;
  }
  impl_.NotifyChanged();
  return grpc::Status::OK;
}

grpc::Status KubeletSim::Impl::PodResourcesService::Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* request,
                                                        v1::GetPodResourcesResponse* response) {
  std::lock_guard lock(impl_.mutex);
  const auto it = impl_.state.pods.find(PodKey(request->pod_namespace(), request->pod_name()));
  if (it == impl_.state.pods.end()) {
    // The kubelet's wording (server_v1.go Get).
    return grpc::Status(grpc::StatusCode::UNKNOWN,
                        "pod " + request->pod_name() + " not found in namespace " + request->pod_namespace());
  }
  FillPod(it->second, response->mutable_pod_resources());
  return grpc::Status::OK;
}

// ---- calls made for a pod ----------------------------------------------------------------------

RpcResult<v1beta1::AllocateResponse> KubeletSim::Allocate(const std::string& resource,
                                                          const std::vector<std::vector<std::string>>& container_requests,
                                                          const PodBinding& pod) {
  if (pod.containers.size() != container_requests.size()) {
    RpcResult<v1beta1::AllocateResponse> refused;
    refused.status = RpcStatus{grpc::StatusCode::INVALID_ARGUMENT,
                               "need one container name per container request (" +
                                   std::to_string(container_requests.size()) + " requests, " +
                                   std::to_string(pod.containers.size()) + " names)"};
    return refused;
  }
  auto result = Allocate(resource, container_requests);
  if (!result.ok()) return result;
  // The kubelet records the allocation (podDevices) once the plugin has answered.
  {
    std::lock_guard lock(impl_->mutex);
    PodResourcesEntry& entry = impl_->state.pods[PodKey(pod.namespace_, pod.name)];
    entry.namespace_ = pod.namespace_;
    entry.name = pod.name;
    for (std::size_t i = 0; i < container_requests.size(); ++i) {
      auto& ids = entry.containers[pod.containers[i]].devices[resource];
      for (const std::string& id : container_requests[i]) {
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
      }
    }
  }
  impl_->NotifyChanged();
  impl_->Log("pod-resources: " + pod.namespace_ + "/" + pod.name + " holds " + resource + " devices");
  return result;
}

DraPrepareResult KubeletSim::NodePrepareResources(const std::string& driver, const std::vector<DraClaim>& claims,
                                                  const PodBinding& pod) {
  DraPrepareResult result = NodePrepareResources(driver, claims);
  if (!result.ok()) return result;
  const std::string container = pod.containers.empty() ? std::string("main") : pod.containers.front();
  {
    std::lock_guard lock(impl_->mutex);
    PodResourcesEntry& entry = impl_->state.pods[PodKey(pod.namespace_, pod.name)];
    entry.namespace_ = pod.namespace_;
    entry.name = pod.name;
    auto& dynamic = entry.containers[container].dynamic_resources;
    for (const DraClaim& claim : claims) {
      const auto prepared = result.claims.find(claim.uid);
      if (prepared == result.claims.end() || !prepared->second.error.empty()) continue;
      std::erase_if(dynamic, [&](const PodDynamicResource& d) { return d.claim_uid == claim.uid; });
      PodDynamicResource resource{claim.name, claim.namespace_, claim.uid, driver, {}};
      for (const DraPreparedDevice& device : prepared->second.devices) {
        resource.devices.push_back(PodClaimDevice{device.pool_name, device.device_name, device.cdi_device_ids});
      }
      dynamic.push_back(std::move(resource));
    }
  }
  impl_->NotifyChanged();
  return result;
}

void KubeletSim::Impl::DropPreparedClaims(const std::vector<std::string>& claim_uids) {
  {
    std::lock_guard lock(mutex);
    for (auto& [key, pod] : state.pods) {
      for (auto& [name, container] : pod.containers) {
        std::erase_if(container.dynamic_resources, [&](const PodDynamicResource& d) {
          return std::find(claim_uids.begin(), claim_uids.end(), d.claim_uid) != claim_uids.end();
        });
      }
    }
  }
  NotifyChanged();
}

// ---- pod resources state ------------------------------------------------------------------------

bool KubeletSim::ForgetPod(const std::string& namespace_, const std::string& name) {
  bool erased = false;
  {
    std::lock_guard lock(impl_->mutex);
    erased = impl_->state.pods.erase(PodKey(namespace_, name)) > 0;
  }
  impl_->NotifyChanged();
  if (erased) impl_->Log("pod-resources: forgot " + namespace_ + "/" + name);
  return erased;
}

void KubeletSim::InjectPodDevices(const std::string& namespace_, const std::string& name, const std::string& container,
                                  const std::string& resource, const std::vector<std::string>& ids) {
  {
    std::lock_guard lock(impl_->mutex);
    PodResourcesEntry& entry = impl_->state.pods[PodKey(namespace_, name)];
    entry.namespace_ = namespace_;
    entry.name = name;
    auto& held = entry.containers[container].devices[resource];
    held.insert(held.end(), ids.begin(), ids.end());
  }
  impl_->NotifyChanged();
}

std::map<std::string, PodResourcesEntry> KubeletSim::Pods() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->state.pods;
}

void KubeletSim::StartPodResources() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  impl_->pod_resources_wanted = true;
  bool running = false;
  {
    std::lock_guard state_lock(impl_->mutex);
    running = impl_->state.running;
  }
  if (running) impl_->StartPodResourcesServer();
}

void KubeletSim::StopPodResources() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  impl_->pod_resources_wanted = false;
  impl_->StopPodResourcesServer();
}

}  // namespace gns::sim
