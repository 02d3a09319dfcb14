// Allocate outputs per strategy and the preferred-allocation choices on a two-NUMA topology
// with NVLink pairs.
#include "modules/device_plugin/allocation.hpp"
#include "modules/device_plugin/device_health.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace gns::device_plugin {
namespace {

DeviceLookup Lookup(std::map<std::string, DeviceFacts> facts) {
  return [facts = std::move(facts)](const std::string& id) -> std::optional<DeviceFacts> {
    const auto it = facts.find(id);
    if (it == facts.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Allocate, EnvVarStrategyListsUuids) {
  ContainerAllocation out;
  const auto error = AllocateContainer({}, Lookup({{"GPU-a", {true, 0}}, {"GPU-b", {true, 1}}}), {"GPU-a", "GPU-b"}, out);
  EXPECT_EQ(error, "");
  EXPECT_EQ(out.envs.at("NVIDIA_VISIBLE_DEVICES"), "GPU-a,GPU-b");
  EXPECT_TRUE(out.cdi_devices.empty());
  EXPECT_TRUE(out.devices.empty());
}

TEST(Allocate, CdiStrategyNamesCdiDevicesAndDeviceSpecsWhenAsked) {
  AllocationSettings settings;
  settings.strategies = {.envvar = false, .cdi_cri = true};
  settings.pass_device_specs = true;
  settings.control_devices = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
  ContainerAllocation out;
  EXPECT_EQ(AllocateContainer(settings, Lookup({{"GPU-a", {true, 3}}}), {"GPU-a"}, out), "");
  EXPECT_TRUE(out.envs.empty());
  EXPECT_EQ(out.cdi_devices, std::vector<std::string>{"nvidia.com/gpu=GPU-a"});
  EXPECT_EQ(out.devices, (std::vector<DeviceSpecOut>{{"/dev/nvidia3", "/dev/nvidia3", "rw"},
                                                     {"/dev/nvidiactl", "/dev/nvidiactl", "rw"},
                                                     {"/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"}}));
}

TEST(Allocate, UnknownAndUnhealthyIdsAreNamed) {
  ContainerAllocation out;
  const auto error =
      AllocateContainer({}, Lookup({{"GPU-a", {true, 0}}, {"GPU-sick", {false, 1}}}), {"GPU-a", "GPU-x", "GPU-sick"}, out);
  EXPECT_EQ(error, "unknown device IDs: GPU-x; unhealthy device IDs: GPU-sick");
  EXPECT_EQ(AllocateContainer({}, Lookup({}), {}, out), "no device IDs in the container request");
}

// Eight GPUs: 0-3 on NUMA 0, 4-7 on NUMA 1; NVLink pairs (0,1) (2,3) (4,5) (6,7); PCI buses
// in order.
std::vector<TopologyDevice> EightGpus() {
  std::vector<TopologyDevice> t;
  for (int i = 0; i < 8; ++i) {
    TopologyDevice d;
    d.id = "GPU-" + std::to_string(i);
    d.numa_node = i < 4 ? 0 : 1;
    d.pci.bus = static_cast<uint32_t>(0x10 * (i + 1));
    d.nvlink_peers.insert("GPU-" + std::to_string(i ^ 1));
    t.push_back(d);
  }
  return t;
}

std::vector<std::string> All() {
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) ids.push_back("GPU-" + std::to_string(i));
  return ids;
}

TEST(PreferredAllocation, PairPrefersAnNvlinkPairOnOneNumaNode) {
  const auto p = PreferredAllocation(EightGpus(), All(), {}, 2);
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.ids, (std::vector<std::string>{"GPU-0", "GPU-1"}));
}

TEST(PreferredAllocation, MustIncludeComesFirstThenItsNvlinkPeer) {
  const auto p = PreferredAllocation(EightGpus(), All(), {"GPU-6"}, 2);
  EXPECT_EQ(p.ids, (std::vector<std::string>{"GPU-6", "GPU-7"}));
}

TEST(PreferredAllocation, FourStayOnOneNumaNode) {
  const auto p = PreferredAllocation(EightGpus(), All(), {"GPU-5"}, 4);
  EXPECT_EQ(p.ids, (std::vector<std::string>{"GPU-4", "GPU-5", "GPU-6", "GPU-7"}));
}

TEST(PreferredAllocation, WhenThePeerIsTakenPicksTheSameNumaNode) {
  // GPU-1 is in use: GPU-0's best partner is on NUMA 0, nearest on the PCI bus.
  const auto p = PreferredAllocation(EightGpus(), {"GPU-0", "GPU-2", "GPU-3", "GPU-4", "GPU-5"}, {"GPU-0"}, 2);
  EXPECT_EQ(p.ids, (std::vector<std::string>{"GPU-0", "GPU-2"}));
}

TEST(PreferredAllocation, ThreeFromFragmentedPoolKeepsAPairAndTheNumaNode) {
  const auto p = PreferredAllocation(EightGpus(), {"GPU-1", "GPU-3", "GPU-4", "GPU-6", "GPU-7"}, {}, 3);
  EXPECT_EQ(p.ids, (std::vector<std::string>{"GPU-4", "GPU-6", "GPU-7"}));
}

TEST(PreferredAllocation, IsDeterministicAcrossInputOrder) {
  auto shuffled = All();
  std::reverse(shuffled.begin(), shuffled.end());
  EXPECT_EQ(PreferredAllocation(EightGpus(), shuffled, {}, 4).ids, PreferredAllocation(EightGpus(), All(), {}, 4).ids);
}

TEST(PreferredAllocation, ImpossibleRequestsAreErrors) {
  EXPECT_EQ(PreferredAllocation(EightGpus(), {"GPU-0"}, {}, 2).error, "cannot pick 2 devices from 1 available");
  EXPECT_EQ(PreferredAllocation(EightGpus(), All(), {"GPU-9"}, 1).error,
            "must-include device GPU-9 is not among the available devices");
  EXPECT_EQ(PreferredAllocation(EightGpus(), All(), {"GPU-0", "GPU-1"}, 1).error,
            "allocation size 1 is smaller than the 2 must-include devices");
}

// Two GPUs time-sliced into 4 replicas each: IDs GPU-<g>::<n>, grouped by their GPU.
std::vector<std::string> FourReplicasOfTwoGpus() {
  std::vector<std::string> ids;
  for (int g = 0; g < 2; ++g)
    for (int n = 0; n < 4; ++n) ids.push_back("GPU-" + std::to_string(g) + "::" + std::to_string(n));
  return ids;
}

std::string GpuOf(const std::string& id) { return id.substr(0, id.find("::")); }

std::vector<std::string> Without(std::vector<std::string> ids, const std::vector<std::string>& taken) {
  for (const auto& id : taken) ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
  return ids;
}

TEST(PreferredSpread, AReplicaGoesToTheGpuWithFewestReplicasInUse) {
  // Two of GPU 0's replicas run containers (the kubelet leaves them out of the available ones);
  // GPU 1 is idle.
  const auto advertised = FourReplicasOfTwoGpus();
  const auto available = Without(advertised, {"GPU-0::0", "GPU-0::1"});
  const auto p = PreferredSpread(advertised, available, {}, 1, GpuOf);
  EXPECT_EQ(p.ids, (std::vector<std::string>{"GPU-1::0"}));
}

TEST(PreferredSpread, ConsecutiveRequestsAlternateBetweenIdleGpus) {
  const auto advertised = FourReplicasOfTwoGpus();
  std::vector<std::string> in_use;
  std::vector<std::string> gpus;
  for (int request = 0; request < 4; ++request) {
    const auto p = PreferredSpread(advertised, Without(advertised, in_use), {}, 1, GpuOf);
    ASSERT_EQ(p.ids.size(), 1u) << p.error;
    in_use.push_back(p.ids.front());
    gpus.push_back(GpuOf(p.ids.front()));
  }
  EXPECT_EQ(gpus, (std::vector<std::string>{"GPU-0", "GPU-1", "GPU-0", "GPU-1"}));
}

TEST(PreferredSpread, ARequestForSeveralSpreadsThemAndCountsMustIncludeAsTaken) {
  const auto advertised = FourReplicasOfTwoGpus();
  // GPU 1 has one replica in use; the request must include GPU-0::3: GPU 0 and 1 are then
  // equally loaded, and the one this request took fewer from (GPU 1) comes next.
  const auto available = Without(advertised, {"GPU-1::0"});
  EXPECT_EQ(PreferredSpread(advertised, available, {"GPU-0::3"}, 2, GpuOf).ids,
            (std::vector<std::string>{"GPU-0::3", "GPU-1::1"}));
  // Three from idle GPUs: two on one, one on the other.
  EXPECT_EQ(PreferredSpread(advertised, advertised, {}, 3, GpuOf).ids,
            (std::vector<std::string>{"GPU-0::0", "GPU-0::1", "GPU-1::0"}));
  EXPECT_EQ(PreferredSpread(advertised, {"GPU-0::0"}, {}, 2, GpuOf).error, "cannot pick 2 devices from 1 available");
}

gpu_inventory::GpuInventory Inventory(bool available) {
  gpu_inventory::GpuInventory inv;
  inv.available = available;
  inv.error = available ? "" : "NVML: GPU is lost";
  for (int i = 0; i < 2; ++i) {
    gpu_inventory::GpuInfo g;
    g.uuid = "GPU-" + std::to_string(i);
    g.numa_node = i;
    inv.gpus.push_back(g);
  }
  return inv;
}

TEST(DeviceHealthTracker, HealthVerdictMarksUnhealthyAndAHealthyVerdictClearsIt) {
  DeviceHealthTracker t;
  EXPECT_TRUE(t.OnInventory(Inventory(true)));
  EXPECT_TRUE(t.Devices()[0].healthy);
  gpu_health::DeviceHealth sick;
  sick.uuid = "GPU-0";
  sick.healthy = false;
  sick.reason = "XID 79: GPU has fallen off the bus";
  EXPECT_TRUE(t.OnDeviceHealth(sick));
  EXPECT_FALSE(t.Devices()[0].healthy);
  EXPECT_EQ(t.Devices()[0].reason, "XID 79: GPU has fallen off the bus");
  EXPECT_TRUE(t.Devices()[1].healthy);
  gpu_health::DeviceHealth back;
  back.uuid = "GPU-0";
  back.healthy = true;
  back.reason = "GPU reset occurred";
  EXPECT_TRUE(t.OnDeviceHealth(back));
  EXPECT_TRUE(t.Devices()[0].healthy);
  EXPECT_EQ(t.Devices()[0].reason, "");
}

TEST(DeviceHealthTracker, NvmlDownAdvertisesEveryKnownDeviceUnhealthyAndRecoveryKeepsVerdicts) {
  DeviceHealthTracker t;
  t.OnInventory(Inventory(true));
  gpu_health::DeviceHealth sick;
  sick.uuid = "GPU-1";
  sick.healthy = false;
  sick.reason = "XID 48";
  t.OnDeviceHealth(sick);
  EXPECT_TRUE(t.OnInventory(Inventory(false)));
  ASSERT_EQ(t.Devices().size(), 2u);
  for (const auto& d : t.Devices()) {
    EXPECT_FALSE(d.healthy);
    EXPECT_EQ(d.reason, "NVML: GPU is lost");
  }
  EXPECT_TRUE(t.OnInventory(Inventory(true)));  // NVML re-initialised (e.g. after a reset)
  EXPECT_TRUE(t.Devices()[0].healthy);
  // NVML coming back is not a health verdict: only gpu-health clears what it decided.
  EXPECT_FALSE(t.Devices()[1].healthy);
  EXPECT_EQ(t.Devices()[1].reason, "XID 48");
}

TEST(DeviceHealthTracker, AReleasedGpuIsUnhealthyAloneAndHealthyAgainWhenTakenBack) {
  DeviceHealthTracker t;
  auto inventory = Inventory(true);
  t.OnInventory(inventory);
  inventory.gpus[1].released = true;
  inventory.gpus[1].release_reason = "GPU reset";
  EXPECT_TRUE(t.OnInventory(inventory));
  EXPECT_TRUE(t.Devices()[0].healthy);
  EXPECT_FALSE(t.Devices()[1].healthy);
  EXPECT_EQ(t.Devices()[1].reason, "NVML handles released: GPU reset");
  inventory.gpus[1].released = false;
  EXPECT_TRUE(t.OnInventory(inventory));
  EXPECT_TRUE(t.Devices()[1].healthy);
}

TEST(DeviceHealthTracker, HealthModuleVerdictWins) {
  DeviceHealthTracker t;
  t.OnInventory(Inventory(true));
  gpu_health::DeviceHealth sick;
  sick.uuid = "GPU-1";
  sick.healthy = false;
  sick.reason = "XID 48: double-bit ECC";
  EXPECT_TRUE(t.OnDeviceHealth(sick));
  EXPECT_FALSE(t.Devices()[1].healthy);
  EXPECT_EQ(t.Devices()[1].reason, "XID 48: double-bit ECC");
  EXPECT_FALSE(t.OnDeviceHealth(sick));  // no change, no new list
}

}  // namespace
}  // namespace gns::device_plugin
