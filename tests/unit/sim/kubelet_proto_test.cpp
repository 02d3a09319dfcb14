// Checks our kubelet .proto files (src/proto) against the wire facts in WIRE-FACTS.md: full
// gRPC method paths (which come from the `package` lines), streaming flags, field numbers and
// types, and a few hand-encoded byte strings. Linking every generated file into one binary also
// proves the packages have no C++ name collisions.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"

namespace gns::proto {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;
using google::protobuf::ServiceDescriptor;
using ::testing::ElementsAre;

// "/<package>.<Service>/<Method>" for every method, as gRPC puts it on the wire.
std::vector<std::string> MethodPaths(const std::string& service_full_name) {
  const ServiceDescriptor* service = DescriptorPool::generated_pool()->FindServiceByName(service_full_name);
  EXPECT_NE(service, nullptr) << service_full_name;
  std::vector<std::string> paths;
  if (service == nullptr) return paths;
  for (int i = 0; i < service->method_count(); ++i) {
    paths.push_back("/" + service->full_name() + "/" + service->method(i)->name());
  }
  return paths;
}

std::string Bytes(const google::protobuf::MessageLite& message) {
  std::string out;
  EXPECT_TRUE(message.SerializeToString(&out));
  return out;
}

TEST(KubeletProtoTest, DevicePluginMethodPaths) {
  EXPECT_STREQ(v1beta1::Registration::service_full_name(), "v1beta1.Registration");
  EXPECT_STREQ(v1beta1::DevicePlugin::service_full_name(), "v1beta1.DevicePlugin");
  EXPECT_THAT(MethodPaths("v1beta1.Registration"), ElementsAre("/v1beta1.Registration/Register"));
  EXPECT_THAT(MethodPaths("v1beta1.DevicePlugin"),
              ElementsAre("/v1beta1.DevicePlugin/GetDevicePluginOptions", "/v1beta1.DevicePlugin/ListAndWatch",
                          "/v1beta1.DevicePlugin/GetPreferredAllocation", "/v1beta1.DevicePlugin/Allocate",
                          "/v1beta1.DevicePlugin/PreStartContainer"));
  const ServiceDescriptor* plugin = DescriptorPool::generated_pool()->FindServiceByName("v1beta1.DevicePlugin");
  ASSERT_NE(plugin, nullptr);
  for (int i = 0; i < plugin->method_count(); ++i) {
    const auto* method = plugin->method(i);
    EXPECT_FALSE(method->client_streaming()) << method->name();
    EXPECT_EQ(method->server_streaming(), method->name() == "ListAndWatch") << method->name();
  }
  EXPECT_EQ(plugin->FindMethodByName("ListAndWatch")->output_type()->full_name(), "v1beta1.ListAndWatchResponse");
  EXPECT_EQ(plugin->FindMethodByName("Allocate")->input_type()->full_name(), "v1beta1.AllocateRequest");
}

TEST(KubeletProtoTest, PluginRegistrationDraAndPodResourcesMethodPaths) {
  EXPECT_STREQ(pluginregistration::Registration::service_full_name(), "pluginregistration.Registration");
  EXPECT_THAT(MethodPaths("pluginregistration.Registration"),
              ElementsAre("/pluginregistration.Registration/GetInfo",
                          "/pluginregistration.Registration/NotifyRegistrationStatus"));
  EXPECT_STREQ(k8s::io::kubelet::pkg::apis::dra::v1::DRAPlugin::service_full_name(),
               "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin");
  EXPECT_THAT(MethodPaths("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"),
              ElementsAre("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                          "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"));
  EXPECT_STREQ(k8s::io::kubelet::pkg::apis::dra::v1beta1::DRAPlugin::service_full_name(),
               "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin");
  EXPECT_THAT(MethodPaths("k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"),
              ElementsAre("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
                          "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"));
  EXPECT_STREQ(v1::PodResourcesLister::service_full_name(), "v1.PodResourcesLister");
  EXPECT_THAT(MethodPaths("v1.PodResourcesLister"),
              ElementsAre("/v1.PodResourcesLister/List", "/v1.PodResourcesLister/GetAllocatableResources",
                          "/v1.PodResourcesLister/Get"));
}

struct FieldFact {
  const char* message;
  const char* field;
  int number;
  FieldDescriptor::Type type;
  bool repeated;
};

// Field numbers and types from WIRE-FACTS.md §1.2, §2, §3.2 and §5.
TEST(KubeletProtoTest, FieldNumbersAndTypesMatchUpstream) {
  using F = FieldDescriptor;
  const FieldFact facts[] = {
      {"v1beta1.DevicePluginOptions", "pre_start_required", 1, F::TYPE_BOOL, false},
      {"v1beta1.DevicePluginOptions", "get_preferred_allocation_available", 2, F::TYPE_BOOL, false},
      {"v1beta1.RegisterRequest", "version", 1, F::TYPE_STRING, false},
      {"v1beta1.RegisterRequest", "endpoint", 2, F::TYPE_STRING, false},
      {"v1beta1.RegisterRequest", "resource_name", 3, F::TYPE_STRING, false},
      {"v1beta1.RegisterRequest", "options", 4, F::TYPE_MESSAGE, false},
      {"v1beta1.ListAndWatchResponse", "devices", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.TopologyInfo", "nodes", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.NUMANode", "ID", 1, F::TYPE_INT64, false},
      {"v1beta1.Device", "ID", 1, F::TYPE_STRING, false},
      {"v1beta1.Device", "health", 2, F::TYPE_STRING, false},
      {"v1beta1.Device", "topology", 3, F::TYPE_MESSAGE, false},
      {"v1beta1.PreStartContainerRequest", "devices_ids", 1, F::TYPE_STRING, true},
      {"v1beta1.PreferredAllocationRequest", "container_requests", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerPreferredAllocationRequest", "available_deviceIDs", 1, F::TYPE_STRING, true},
      {"v1beta1.ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, F::TYPE_STRING, true},
      {"v1beta1.ContainerPreferredAllocationRequest", "allocation_size", 3, F::TYPE_INT32, false},
      {"v1beta1.PreferredAllocationResponse", "container_responses", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerPreferredAllocationResponse", "deviceIDs", 1, F::TYPE_STRING, true},
      {"v1beta1.AllocateRequest", "container_requests", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerAllocateRequest", "devices_ids", 1, F::TYPE_STRING, true},
      {"v1beta1.AllocateResponse", "container_responses", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerAllocateResponse", "envs", 1, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerAllocateResponse", "mounts", 2, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerAllocateResponse", "devices", 3, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerAllocateResponse", "annotations", 4, F::TYPE_MESSAGE, true},
      {"v1beta1.ContainerAllocateResponse", "cdi_devices", 5, F::TYPE_MESSAGE, true},
      {"v1beta1.CDIDevice", "name", 1, F::TYPE_STRING, false},
      {"v1beta1.Mount", "container_path", 1, F::TYPE_STRING, false},
      {"v1beta1.Mount", "host_path", 2, F::TYPE_STRING, false},
      {"v1beta1.Mount", "read_only", 3, F::TYPE_BOOL, false},
      {"v1beta1.DeviceSpec", "container_path", 1, F::TYPE_STRING, false},
      {"v1beta1.DeviceSpec", "host_path", 2, F::TYPE_STRING, false},
      {"v1beta1.DeviceSpec", "permissions", 3, F::TYPE_STRING, false},
      {"pluginregistration.PluginInfo", "type", 1, F::TYPE_STRING, false},
      {"pluginregistration.PluginInfo", "name", 2, F::TYPE_STRING, false},
      {"pluginregistration.PluginInfo", "endpoint", 3, F::TYPE_STRING, false},
      {"pluginregistration.PluginInfo", "supported_versions", 4, F::TYPE_STRING, true},
      {"pluginregistration.RegistrationStatus", "plugin_registered", 1, F::TYPE_BOOL, false},
      {"pluginregistration.RegistrationStatus", "error", 2, F::TYPE_STRING, false},
      {"v1.AllocatableResourcesResponse", "devices", 1, F::TYPE_MESSAGE, true},
      {"v1.AllocatableResourcesResponse", "cpu_ids", 2, F::TYPE_INT64, true},
      {"v1.AllocatableResourcesResponse", "memory", 3, F::TYPE_MESSAGE, true},
      {"v1.ListPodResourcesResponse", "pod_resources", 1, F::TYPE_MESSAGE, true},
      {"v1.PodResources", "name", 1, F::TYPE_STRING, false},
      {"v1.PodResources", "namespace", 2, F::TYPE_STRING, false},
      {"v1.PodResources", "containers", 3, F::TYPE_MESSAGE, true},
      {"v1.ContainerResources", "name", 1, F::TYPE_STRING, false},
      {"v1.ContainerResources", "devices", 2, F::TYPE_MESSAGE, true},
      {"v1.ContainerResources", "cpu_ids", 3, F::TYPE_INT64, true},
      {"v1.ContainerResources", "memory", 4, F::TYPE_MESSAGE, true},
      {"v1.ContainerResources", "dynamic_resources", 5, F::TYPE_MESSAGE, true},
      {"v1.ContainerMemory", "memory_type", 1, F::TYPE_STRING, false},
      {"v1.ContainerMemory", "size", 2, F::TYPE_UINT64, false},
      {"v1.ContainerMemory", "topology", 3, F::TYPE_MESSAGE, false},
      {"v1.ContainerDevices", "resource_name", 1, F::TYPE_STRING, false},
      {"v1.ContainerDevices", "device_ids", 2, F::TYPE_STRING, true},
      {"v1.ContainerDevices", "topology", 3, F::TYPE_MESSAGE, false},
      {"v1.NUMANode", "ID", 1, F::TYPE_INT64, false},
      {"v1.DynamicResource", "claim_name", 2, F::TYPE_STRING, false},
      {"v1.DynamicResource", "claim_namespace", 3, F::TYPE_STRING, false},
      {"v1.DynamicResource", "claim_resources", 4, F::TYPE_MESSAGE, true},
      {"v1.ClaimResource", "cdi_devices", 1, F::TYPE_MESSAGE, true},
      {"v1.ClaimResource", "driver_name", 2, F::TYPE_STRING, false},
      {"v1.ClaimResource", "pool_name", 3, F::TYPE_STRING, false},
      {"v1.ClaimResource", "device_name", 4, F::TYPE_STRING, false},
      {"v1.CDIDevice", "name", 1, F::TYPE_STRING, false},
      {"v1.GetPodResourcesRequest", "pod_name", 1, F::TYPE_STRING, false},
      {"v1.GetPodResourcesRequest", "pod_namespace", 2, F::TYPE_STRING, false},
      {"v1.GetPodResourcesResponse", "pod_resources", 1, F::TYPE_MESSAGE, false},
  };
  for (const FieldFact& fact : facts) {
    SCOPED_TRACE(std::string(fact.message) + "." + fact.field);
    const auto* message = DescriptorPool::generated_pool()->FindMessageTypeByName(fact.message);
    ASSERT_NE(message, nullptr);
    const FieldDescriptor* field = message->FindFieldByName(fact.field);
    ASSERT_NE(field, nullptr);
    EXPECT_EQ(field->number(), fact.number);
    EXPECT_EQ(field->type(), fact.type);
    EXPECT_EQ(field->is_repeated(), fact.repeated);
  }
  // The removed DynamicResource.class_name number must stay unused.
  EXPECT_EQ(DescriptorPool::generated_pool()->FindMessageTypeByName("v1.DynamicResource")->FindFieldByNumber(1), nullptr);

  // DRA v1 and v1beta1 carry identical messages.
  for (const char* prefix : {"k8s.io.kubelet.pkg.apis.dra.v1.", "k8s.io.kubelet.pkg.apis.dra.v1beta1."}) {
    const std::string package = prefix;
    const FieldFact dra[] = {
        {"NodePrepareResourcesRequest", "claims", 1, F::TYPE_MESSAGE, true},
        {"NodePrepareResourcesResponse", "claims", 1, F::TYPE_MESSAGE, true},
        {"NodePrepareResourceResponse", "devices", 1, F::TYPE_MESSAGE, true},
        {"NodePrepareResourceResponse", "error", 2, F::TYPE_STRING, false},
        {"Device", "request_names", 1, F::TYPE_STRING, true},
        {"Device", "pool_name", 2, F::TYPE_STRING, false},
        {"Device", "device_name", 3, F::TYPE_STRING, false},
        {"Device", "cdi_device_ids", 4, F::TYPE_STRING, true},
        {"NodeUnprepareResourcesRequest", "claims", 1, F::TYPE_MESSAGE, true},
        {"NodeUnprepareResourcesResponse", "claims", 1, F::TYPE_MESSAGE, true},
        {"NodeUnprepareResourceResponse", "error", 1, F::TYPE_STRING, false},
        {"Claim", "namespace", 1, F::TYPE_STRING, false},
        {"Claim", "uid", 2, F::TYPE_STRING, false},
        {"Claim", "name", 3, F::TYPE_STRING, false},
    };
    for (const FieldFact& fact : dra) {
      SCOPED_TRACE(package + fact.message + "." + fact.field);
      const auto* message = DescriptorPool::generated_pool()->FindMessageTypeByName(package + fact.message);
      ASSERT_NE(message, nullptr);
      const FieldDescriptor* field = message->FindFieldByName(fact.field);
      ASSERT_NE(field, nullptr);
      EXPECT_EQ(field->number(), fact.number);
      EXPECT_EQ(field->type(), fact.type);
      EXPECT_EQ(field->is_repeated(), fact.repeated);
    }
    const auto* response = DescriptorPool::generated_pool()->FindMessageTypeByName(package + "NodePrepareResourcesResponse");
    ASSERT_NE(response, nullptr);
    EXPECT_TRUE(response->FindFieldByName("claims")->is_map());
  }
}

TEST(KubeletProtoTest, HandEncodedWireBytes) {
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint("gns.sock");
  request.set_resource_name("nvidia.com/gpu");
  EXPECT_EQ(Bytes(request), std::string("\x0a\x07v1beta1\x12\x08gns.sock\x1a\x0envidia.com/gpu"));

  v1beta1::ListAndWatchResponse list;
  auto* device = list.add_devices();
  device->set_id("GPU-0");
  device->set_health("Healthy");
  device->mutable_topology()->add_nodes()->set_id(1);
  // devices{ ID "GPU-0", health "Healthy", topology{ nodes{ ID 1 } } }
  EXPECT_EQ(Bytes(list), std::string("\x0a\x16\x0a\x05GPU-0\x12\x07Healthy\x1a\x04\x0a\x02\x08\x01"));

  v1beta1::ContainerAllocateResponse allocate;
  allocate.add_cdi_devices()->set_name("nvidia.com/gpu=0");
  EXPECT_EQ(Bytes(allocate), std::string("\x2a\x12\x0a\x10nvidia.com/gpu=0"));

  // A map entry is {key = 1, value = 2}; the response is keyed by claim UID.
  k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse prepared;
  (*prepared.mutable_claims())["uid1"].set_error("x");
  EXPECT_EQ(Bytes(prepared), std::string("\x0a\x0b\x0a\x04uid1\x12\x03\x12\x01x"));

  k8s::io::kubelet::pkg::apis::dra::v1beta1::Claim claim;
  claim.set_namespace_("default");
  claim.set_uid("u");
  claim.set_name("c");
  EXPECT_EQ(Bytes(claim), std::string("\x0a\x07" "default\x12\x01u\x1a\x01" "c"));

  pluginregistration::PluginInfo info;
  info.set_type("DRAPlugin");
  info.add_supported_versions("v1.DRAPlugin");
  info.add_supported_versions("v1beta1.DRAPlugin");
  pluginregistration::PluginInfo parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(info)));
  EXPECT_EQ(parsed.supported_versions_size(), 2);
  EXPECT_EQ(parsed.supported_versions(0), "v1.DRAPlugin");

  v1::GetPodResourcesResponse pod;
  pod.mutable_pod_resources()->set_namespace_("kube-system");
  EXPECT_EQ(Bytes(pod), std::string("\x0a\x0d\x12\x0bkube-system"));
}

}  // namespace
}  // namespace gns::proto
