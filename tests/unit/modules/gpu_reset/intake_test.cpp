// The request sources turned into jobs (intake.hpp): a GPUReset object for this node (selected
// GPUs, or refused with the field at fault), reset-gpu lines, and autoReset's pod-map check.
#include "modules/gpu_reset/intake.hpp"

#include <gtest/gtest.h>

namespace gns::gpu_reset {
namespace {

constexpr const char* kGpu0 = "GPU-00000000-0000-0000-0000-000000000000";
constexpr const char* kGpu1 = "GPU-11111111-1111-1111-1111-111111111111";
constexpr int64_t kNow = 1767225600000;

gpu_inventory::GpuInventory Inventory() {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  for (const auto& [uuid, bus] : {std::pair<std::string, std::string>{kGpu0, "00000000:3B:00.0"}, {kGpu1, "00000000:86:00.0"}}) {
    gpu_inventory::GpuInfo info;
    info.uuid = uuid;
    info.pci_bus_id = bus;
    info.pci = *ParsePciAddress(bus);
    inventory.gpus.push_back(info);
  }
  return inventory;
}

nlohmann::json Object(nlohmann::json selector, std::string node = "n1") {
  return {{"apiVersion", "janitor.dgxc.nvidia.com/v1alpha1"},
          {"kind", "GPUReset"},
          {"metadata", {{"name", "r1"}, {"uid", "u-1"}, {"generation", 2}}},
          {"spec", {{"nodeName", node}, {"selector", selector}}}};
}

TEST(GpuResetIntake, AnObjectNamingGpusByUuidAndPciBecomesOnePendingJob) {
  const auto inventory = Inventory();
  const auto intake = ReadGpuResetObject(Object({{"uuids", {kGpu1}}, {"pciBusIDs", {"0000:3b:00.0"}}}), "n1", &inventory, kNow);
  ASSERT_TRUE(intake.ours);
  EXPECT_EQ(intake.problem, "");
  EXPECT_EQ(intake.job.id, "GPUReset/r1/u-1");
  EXPECT_EQ(intake.job.source, "GPUReset");
  EXPECT_EQ(intake.job.generation, 2);
  EXPECT_EQ(intake.job.created_unix_ms, kNow);
  EXPECT_EQ(intake.job.phase, "Pending");
  ASSERT_EQ(intake.job.gpus.size(), 2u);  // sorted
  EXPECT_EQ(intake.job.gpus[0].uuid, kGpu0);
  EXPECT_EQ(intake.job.gpus[1].uuid, kGpu1);
  EXPECT_EQ(intake.uuids, (std::vector<std::string>{kGpu0, kGpu1}));
}

TEST(GpuResetIntake, AllSelectsEveryGpuOfTheNodeAndNamedGpusAreTakenOnce) {
  const auto inventory = Inventory();
  const auto all = ReadGpuResetObject(Object({{"all", true}}), "n1", &inventory, kNow);
  ASSERT_TRUE(all.ours);
  EXPECT_EQ(all.problem, "");
  EXPECT_EQ(all.uuids, (std::vector<std::string>{kGpu0, kGpu1}));
  // The same GPU by UUID and by bus ID: one reset.
  const auto twice = ReadGpuResetObject(Object({{"uuids", {kGpu0}}, {"pciBusIDs", {"0000:3b:00.0"}}}), "n1", &inventory, kNow);
  EXPECT_EQ(twice.uuids, (std::vector<std::string>{kGpu0}));
  EXPECT_EQ(twice.job.gpus.size(), 1u);
  // all: true with names is refused (reset_request.hpp).
  EXPECT_NE(ReadGpuResetObject(Object({{"all", true}, {"uuids", {kGpu0}}}), "n1", &inventory, kNow).problem, "");
}

TEST(GpuResetIntake, AnotherNodesOrAFinishedOrAMalformedObjectIsLeftAlone) {
  const auto inventory = Inventory();
  EXPECT_FALSE(ReadGpuResetObject(Object({{"all", true}}, "n2"), "n1", &inventory, kNow).ours);
  auto done = Object({{"all", true}});
  done["status"] = {{"conditions", {{{"type", "Complete"}, {"status", "False"}}}}};
  EXPECT_FALSE(ReadGpuResetObject(done, "n1", &inventory, kNow).ours);
  auto running = Object({{"all", true}});
  running["status"] = {{"conditions", {{{"type", "Complete"}, {"status", "Unknown"}}}}};
  EXPECT_TRUE(ReadGpuResetObject(running, "n1", &inventory, kNow).ours);
  auto no_spec = Object({{"all", true}});
  no_spec.erase("spec");
  EXPECT_FALSE(ReadGpuResetObject(no_spec, "n1", &inventory, kNow).ours);
  auto no_meta = Object({{"all", true}});
  no_meta.erase("metadata");
  EXPECT_FALSE(ReadGpuResetObject(no_meta, "n1", &inventory, kNow).ours);
}

// NVSentinel's janitor executes GPUReset objects too: one whose status another controller
// writes is not ours, whatever it selects (never two executors of one reset).
TEST(GpuResetIntake, AnObjectWhoseStatusAnotherControllerWritesIsLeftToIt) {
  const auto inventory = Inventory();
  auto janitors = Object({{"all", true}});
  janitors["metadata"]["managedFields"] = {
      {{"manager", "kubectl-create"}, {"operation", "Update"}},
      {{"manager", "janitor"}, {"operation", "Update"}, {"subresource", "status"}}};
  auto intake = ReadGpuResetObject(janitors, "n1", &inventory, kNow);
  EXPECT_FALSE(intake.ours);
  EXPECT_EQ(intake.id, "GPUReset/r1/u-1");
  EXPECT_NE(intake.other_executor.find("field manager \"janitor\""), std::string::npos) << intake.other_executor;

  auto conditions = Object({{"all", true}});
  conditions["status"] = {{"phase", "InProgress"},
                          {"conditions", {{{"type", "Ready"}, {"status", "True"}}, {{"type", "ServicesTornDown"}, {"status", "True"}}}}};
  intake = ReadGpuResetObject(conditions, "n1", &inventory, kNow);
  EXPECT_FALSE(intake.ours);
  EXPECT_NE(intake.other_executor.find("condition Ready"), std::string::npos) << intake.other_executor;

  // Our own status writes (field manager gpu-reset, condition Complete) keep it ours.
  auto mine = Object({{"all", true}});
  mine["metadata"]["managedFields"] = {{{"manager", "gpu-reset"}, {"operation", "Update"}, {"subresource", "status"}}};
  mine["status"] = {{"phase", "InProgress"}, {"conditions", {{{"type", "Complete"}, {"status", "Unknown"}}}}};
  intake = ReadGpuResetObject(mine, "n1", &inventory, kNow);
  EXPECT_TRUE(intake.ours);
  EXPECT_EQ(intake.other_executor, "");
  EXPECT_EQ(OtherStatusWriter(mine, "gpu-reset"), "");
  EXPECT_NE(OtherStatusWriter(mine, "another-name"), "");

  // Another node's object is not looked at at all.
  EXPECT_EQ(ReadGpuResetObject(janitors, "n2", &inventory, kNow).other_executor, "");
}

TEST(GpuResetIntake, AGpuNotOnTheNodeRefusesTheWholeObjectNamingTheField) {
  const auto inventory = Inventory();
  const auto intake =
      ReadGpuResetObject(Object({{"uuids", {kGpu0, "GPU-99999999-9999-9999-9999-999999999999"}}}), "n1", &inventory, kNow);
  ASSERT_TRUE(intake.ours);
  EXPECT_EQ(intake.problem, "spec.selector.uuids[1]: GPU GPU-99999999-9999-9999-9999-999999999999 is not on node n1");
  EXPECT_EQ(intake.job.phase, "Failed");
  EXPECT_EQ(intake.job.reason, "InvalidRequest");
  EXPECT_EQ(intake.job.message, intake.problem);
  EXPECT_EQ(intake.job.completed_unix_ms, kNow);
  ASSERT_EQ(intake.job.gpus.size(), 1u);
  EXPECT_EQ(intake.job.gpus[0].uuid, kGpu0);
  EXPECT_EQ(intake.job.gpus[0].outcome, "refused");
  EXPECT_EQ(intake.job.gpus[0].step, Step::kDone);
  EXPECT_TRUE(intake.job.Finished());
}

TEST(GpuResetIntake, ABusIdThatIsNoGpuAndAnEmptySelectorAreRefused) {
  const auto inventory = Inventory();
  auto pci = ReadGpuResetObject(Object({{"pciBusIDs", {"0000:01:00.0"}}}), "n1", &inventory, kNow);
  EXPECT_EQ(pci.problem, "spec.selector.pciBusIDs[0]: 0000:01:00.0 is no GPU of node n1");
  EXPECT_EQ(pci.job.gpus.at(0).uuid, "unknown");
  auto empty = ReadGpuResetObject(Object(nlohmann::json::object()), "n1", &inventory, kNow);
  EXPECT_NE(empty.problem.find("spec.selector"), std::string::npos) << empty.problem;
  EXPECT_EQ(empty.job.reason, "InvalidRequest");
}

TEST(GpuResetIntake, AllBeforeTheInventoryIsKnownIsRefused) {
  const auto intake = ReadGpuResetObject(Object({{"all", true}}), "n1", nullptr, kNow);
  EXPECT_EQ(intake.problem, "no GPU is known on node n1 yet");
}

TEST(GpuResetIntake, ResetGpuLines) {
  const auto inventory = Inventory();
  EXPECT_EQ(ReadResetGpuLine(std::string("reset-gpu ") + kGpu1, &inventory).error, "");
  EXPECT_EQ(ReadResetGpuLine(std::string("reset-gpu ") + kGpu1, &inventory).uuid, kGpu1);
  EXPECT_EQ(ReadResetGpuLine("reboot", &inventory).error, "error: unknown request (expected: reset-gpu GPU-…)");
  EXPECT_EQ(ReadResetGpuLine("reset-gpu 3", &inventory).error, "error: \"3\" is not a GPU UUID (GPU-…)");
  EXPECT_EQ(ReadResetGpuLine("reset-gpu GPU-99999999-9999-9999-9999-999999999999", &inventory).error,
            "error: GPU GPU-99999999-9999-9999-9999-999999999999 is not on this node (gpu-inventory does not list it)");
  EXPECT_NE(ReadResetGpuLine(std::string("reset-gpu ") + kGpu1, nullptr).error, "");
}

TEST(GpuResetIntake, AutoResetOnlyForAGpuNoPodHoldsOnAFreshMap) {
  EXPECT_EQ(CheckAutoReset(kGpu0, nullptr), AutoReset::kReset);
  pod_resources::GpuPodMap map;
  map.listed = map.fresh = true;
  map.gpus[kGpu1] = {{"ml", "trainer-0", "uid", "main", "nvidia.com/gpu"}};
  EXPECT_EQ(CheckAutoReset(kGpu0, &map), AutoReset::kReset);
  EXPECT_EQ(CheckAutoReset(kGpu1, &map), AutoReset::kHeldByPods);
  map.fresh = false;
  EXPECT_EQ(CheckAutoReset(kGpu0, &map), AutoReset::kPodMapNotFresh);
  EXPECT_EQ(AutoResetJobId(kGpu0, 42), std::string("auto/") + kGpu0 + "/42");
}

// A reset of a MIG-partitioned GPU resets every MIG device on it: a pod on one of them holds the
// GPU (pod-resources lists it under the MIG UUID and, via, under its GPU).
TEST(GpuResetIntake, AutoResetOfAMigPartitionedGpuWithAPodOnAMigDeviceIsHeld) {
  pod_resources::GpuPodMap map;
  map.listed = map.fresh = true;
  const pod_resources::PodContainerRef notebook{"ml", "notebook", "uid", "nb", "nvidia.com/mig-1g.10gb"};
  map.gpus["MIG-0a"] = {notebook};
  auto through_mig = notebook;
  through_mig.device = "MIG-0a";
  map.via[kGpu0] = {through_mig};
  EXPECT_EQ(CheckAutoReset(kGpu0, &map), AutoReset::kHeldByPods);
  EXPECT_EQ(CheckAutoReset(kGpu1, &map), AutoReset::kReset);
  const auto view = PodHoldersOf(kGpu0, &map);
  ASSERT_EQ(view.holders.size(), 1u);
  EXPECT_EQ(view.holders[0].name, "notebook");
  EXPECT_EQ(view.holders[0].via, "MIG device MIG-0a");
}

// Held through a DRA claim: by a listed pod, or by a claim dra-gpu prepared whose pod the
// kubelet does not list yet, or by a claim whose GPU cannot be told (it may be any GPU).
TEST(GpuResetIntake, AutoResetOfAGpuHeldOnlyThroughADraClaimIsHeld) {
  pod_resources::GpuPodMap map;
  map.listed = map.fresh = true;
  map.via[kGpu0] = {{"ml", "trainer", "uid", "main", "gpu.nvidia.com", "ml/gpus", "node-1/gpu-3"}};
  EXPECT_EQ(CheckAutoReset(kGpu0, &map), AutoReset::kHeldByPods);
  auto view = PodHoldersOf(kGpu0, &map);
  ASSERT_EQ(view.holders.size(), 1u);
  EXPECT_EQ(view.holders[0].via, "claim ml/gpus (gpu.nvidia.com node-1/gpu-3)");
  EXPECT_TRUE(view.others.empty());

  map.via.clear();
  map.pending[kGpu1] = {{"", "ml/new", "gpu-5", "prepared by dra-gpu; the kubelet lists no pod with it yet"}};
  EXPECT_EQ(CheckAutoReset(kGpu0, &map), AutoReset::kReset);
  EXPECT_EQ(CheckAutoReset(kGpu1, &map), AutoReset::kHeldByPods);
  view = PodHoldersOf(kGpu1, &map);
  EXPECT_TRUE(view.holders.empty());  // no pod to evict
  EXPECT_EQ(view.others, (std::vector<std::string>{
                             "claim ml/new on gpu-5 (prepared by dra-gpu; the kubelet lists no pod with it yet)"}));

  map.unplaced = {{"ml/odd", "ml/odd", "node-1/gpu-x", "a gpu.nvidia.com device not named gpu-<minor>"}};
  EXPECT_EQ(CheckAutoReset(kGpu0, &map), AutoReset::kHeldByPods);
  EXPECT_EQ(PodHoldersOf(kGpu0, &map).others.size(), 1u);
}

}  // namespace
}  // namespace gns::gpu_reset
