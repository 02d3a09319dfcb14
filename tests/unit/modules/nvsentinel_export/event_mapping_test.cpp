// Our health facts as NVSentinel HealthEvents: every field of an XID event, the actions, stable
// ids, the book's round trip, and the diffs of the retained facts (each change once).
#include "modules/nvsentinel_export/event_mapping.hpp"

#include <gtest/gtest.h>

namespace gns::nvsentinel_export {
namespace {

ExportSettings Settings() { return ExportSettings{"node-1", datamodels::STORE_ONLY}; }

gpu_health::HealthEvent Xid79() {
  gpu_health::HealthEvent e;
  e.check_name = "SysLogsXIDError";
  e.is_fatal = true;
  e.is_healthy = false;
  e.message = "Xid 79: GPU has fallen off the bus";
  e.recommended_action = 24;
  e.recommended_action_name = "RESTART_BM";
  e.error_code = {"79"};
  e.entities_impacted = {{"PCI", "0000:3b:00"}, {"GPU_UUID", "GPU-1"}};
  e.node_name = "node-1";
  e.generated_seconds = 1700000000;
  e.generated_nanos = 5;
  e.source = "kernel";
  e.pods = {"ns/a", "ns/b"};
  return e;
}

TEST(EventMappingTest, XidEventCarriesEveryField) {
  const auto e = FromGpuHealthEvent(Xid79(), Settings());
  EXPECT_EQ(e.version(), 1u);
  EXPECT_EQ(e.agent(), "gpu-node-supervisor");
  EXPECT_EQ(e.componentclass(), "GPU");
  EXPECT_EQ(e.checkname(), "SysLogsXIDError");
  EXPECT_TRUE(e.isfatal());
  EXPECT_FALSE(e.ishealthy());
  EXPECT_EQ(e.message(), "Xid 79: GPU has fallen off the bus");
  EXPECT_EQ(e.recommendedaction(), datamodels::RESTART_BM);
  ASSERT_EQ(e.errorcode_size(), 1);
  EXPECT_EQ(e.errorcode(0), "79");
  ASSERT_EQ(e.entitiesimpacted_size(), 2);
  EXPECT_EQ(e.entitiesimpacted(0).entitytype(), "PCI");
  EXPECT_EQ(e.entitiesimpacted(0).entityvalue(), "0000:3b:00");
  EXPECT_EQ(e.entitiesimpacted(1).entitytype(), "GPU_UUID");
  EXPECT_EQ(e.entitiesimpacted(1).entityvalue(), "GPU-1");
  EXPECT_EQ(e.generatedtimestamp().seconds(), 1700000000);
  EXPECT_EQ(e.generatedtimestamp().nanos(), 5);
  EXPECT_EQ(e.nodename(), "node-1");
  EXPECT_EQ(e.processingstrategy(), datamodels::STORE_ONLY);
  EXPECT_EQ(e.metadata().at("source"), "kernel");
  EXPECT_EQ(e.metadata().at("pods"), "ns/a,ns/b");
  EXPECT_EQ(e.id().size(), 36u);
}

TEST(EventMappingTest, IdsAreStableAndDistinguishEvents) {
  const auto a = FromGpuHealthEvent(Xid79(), Settings());
  EXPECT_EQ(FromGpuHealthEvent(Xid79(), Settings()).id(), a.id());  // the same fact after a restart
  auto later = Xid79();
  later.generated_nanos = 6;
  EXPECT_NE(FromGpuHealthEvent(later, Settings()).id(), a.id());
  auto other_gpu = Xid79();
  other_gpu.entities_impacted[1].value = "GPU-2";
  EXPECT_NE(FromGpuHealthEvent(other_gpu, Settings()).id(), a.id());
  EXPECT_NE(StableId({"ab", "c"}), StableId({"a", "bc"}));
}

TEST(EventMappingTest, ActionsOfTheNewestRevision) {
  EXPECT_EQ(ActionFromName("COMPONENT_RESET"), datamodels::COMPONENT_RESET);
  EXPECT_EQ(ActionFromName("RUN_DCGMEUD"), datamodels::RUN_DCGMEUD);
  EXPECT_EQ(ActionFromName(""), datamodels::NONE);
  EXPECT_EQ(ActionFromName("SOMETHING_NEW"), datamodels::UNKNOWN);
  // RESTART_APP is not in the newest revision: NONE, with our name in metadata.
  auto xid = Xid79();
  xid.recommended_action_name = "RESTART_APP";
  const auto e = FromGpuHealthEvent(xid, Settings());
  EXPECT_EQ(e.recommendedaction(), datamodels::NONE);
  EXPECT_EQ(e.metadata().at("recommendedActionName"), "RESTART_APP");
  EXPECT_EQ(FromGpuHealthEvent(Xid79(), Settings()).metadata().count("recommendedActionName"), 0u);
}

gpu_health::GpuHealthChecks Checks(std::vector<gpu_health::GpuHealthChecks::Held> held) {
  gpu_health::GpuHealthChecks c;
  c.status = "running";
  c.passes = 3;
  c.conditions = std::move(held);
  return c;
}

TEST(EventMappingTest, ConditionsAppearAndClearOnceEach) {
  ExportBook book;
  const std::map<std::string, std::string> pci{{"GPU-1", "0000:3b:00"}};
  gpu_health::GpuHealthChecks::Held row{"GPU-1", "GpuMemoryRowRemapFailure", "GPU", "fatal", "RESTART_BM",
                                        "row remap failed", "ROW_REMAP", 1000};
  gpu_health::GpuHealthChecks::Held warn{"GPU-1", "GpuTemperature", "GPU", "warning", "NONE", "warm", "", 900};
  auto appear = DiffConditions(book, Checks({row, warn}), pci, Settings(), 5000);
  ASSERT_EQ(appear.size(), 1u);  // the warning is not exported
  EXPECT_EQ(appear[0].checkname(), "GpuMemoryRowRemapFailure");
  EXPECT_TRUE(appear[0].isfatal());
  EXPECT_FALSE(appear[0].ishealthy());
  EXPECT_EQ(appear[0].recommendedaction(), datamodels::RESTART_BM);
  EXPECT_EQ(appear[0].errorcode(0), "ROW_REMAP");
  ASSERT_EQ(appear[0].entitiesimpacted_size(), 2);
  EXPECT_EQ(appear[0].entitiesimpacted(1).entityvalue(), "0000:3b:00");
  EXPECT_EQ(appear[0].generatedtimestamp().seconds(), 1);
  // The same snapshot again: nothing.
  EXPECT_TRUE(DiffConditions(book, Checks({row, warn}), pci, Settings(), 6000).empty());
  // A snapshot of no pass yet says nothing either (not a clearing).
  auto idle = Checks({});
  idle.passes = 0;
  EXPECT_TRUE(DiffConditions(book, idle, pci, Settings(), 6000).empty());
  // Cleared.
  auto cleared = DiffConditions(book, Checks({}), pci, Settings(), 7000);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_TRUE(cleared[0].ishealthy());
  EXPECT_EQ(cleared[0].checkname(), "GpuMemoryRowRemapFailure");
  EXPECT_EQ(cleared[0].generatedtimestamp().seconds(), 7);
  EXPECT_TRUE(DiffConditions(book, Checks({}), pci, Settings(), 8000).empty());
  // The book survives a restart (JSON): the re-diff after a crash makes the same ids.
  ExportBook before;
  auto first = DiffConditions(before, Checks({row}), pci, Settings(), 5000);
  ExportBook restored = BookFromJson(BookToJson(ExportBook{}));
  auto again = DiffConditions(restored, Checks({row}), pci, Settings(), 9000);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].id(), first[0].id());
  EXPECT_EQ(BookFromJson(BookToJson(before)), before);
}

TEST(EventMappingTest, ImexChangesOnceEachAndAHealthyFirstSightIsSilent) {
  ExportBook book;
  imex_health::ImexHealth ok;
  ok.ready = true;
  ok.status = "True";
  ok.reason = "ImexHealthy";
  EXPECT_TRUE(DiffImex(book, ok, Settings(), 1000).empty());
  imex_health::ImexHealth down = ok;
  down.ready = false;
  down.status = "False";
  down.reason = "ServiceFailed";
  auto events = DiffImex(book, down, Settings(), 2000);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].ishealthy());
  EXPECT_EQ(events[0].componentclass(), "IMEX");
  EXPECT_TRUE(DiffImex(book, down, Settings(), 3000).empty());
  auto back = DiffImex(book, ok, Settings(), 4000);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(back[0].ishealthy());
  // The same failure a second time is a new event (a new id).
  auto again = DiffImex(book, down, Settings(), 5000);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0].id(), events[0].id());
  imex_health::ImexHealth unknown;
  unknown.status = "Unknown";
  EXPECT_TRUE(DiffImex(book, unknown, Settings(), 6000).empty());
}

TEST(EventMappingTest, ResetOutcomesOnceEachAndHistoryIsNotReplayed) {
  ExportBook book;
  gpu_reset::GpuResetState state;
  state.jobs = nlohmann::json::array({{{"id", "cli/1"}, {"phase", "Succeeded"}, {"gpus", {{{"uuid", "GPU-1"}}}}}});
  EXPECT_TRUE(DiffResets(book, state, {}, Settings(), 1000).empty());  // history at first sight
  state.jobs.push_back({{"id", "cli/2"}, {"phase", "InProgress"}, {"gpus", {{{"uuid", "GPU-2"}}}}});
  EXPECT_TRUE(DiffResets(book, state, {}, Settings(), 1000).empty());
  state.jobs[1]["phase"] = "Failed";
  state.jobs[1]["reason"] = "ValidationFailed";
  state.jobs[1]["completedUnixMs"] = 3000;
  auto failed = DiffResets(book, state, {{"GPU-2", "0000:86:00"}}, Settings(), 4000);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_FALSE(failed[0].ishealthy());
  EXPECT_TRUE(failed[0].isfatal());
  EXPECT_EQ(failed[0].recommendedaction(), datamodels::RESTART_BM);
  EXPECT_EQ(failed[0].checkname(), "GpuReset");
  EXPECT_EQ(failed[0].entitiesimpacted(0).entityvalue(), "GPU-2");
  EXPECT_EQ(failed[0].entitiesimpacted(1).entityvalue(), "0000:86:00");
  EXPECT_EQ(failed[0].generatedtimestamp().seconds(), 3);
  EXPECT_TRUE(DiffResets(book, state, {}, Settings(), 5000).empty());
}

TEST(EventMappingTest, VerdictsThatFlippedWhileAwayAreExportedOnce) {
  gpu_health::DeviceHealth sick;
  sick.uuid = "GPU-1";
  sick.healthy = false;
  sick.xid = 48;
  sick.recommended_action = "COMPONENT_RESET";
  sick.since_unix_ms = 2000;
  sick.pci = "0000:3b:00";
  gpu_health::DeviceHealth fine;
  fine.uuid = "GPU-2";
  ExportBook book;
  auto first = DiffVerdicts(book, {sick, fine}, Settings(), 9000);
  ASSERT_EQ(first.size(), 1u);  // a fresh book: what is unhealthy now
  EXPECT_EQ(first[0].recommendedaction(), datamodels::COMPONENT_RESET);
  EXPECT_EQ(first[0].errorcode(0), "48");
  EXPECT_EQ(first[0].metadata().at("source"), "verdict-at-start");
  EXPECT_TRUE(DiffVerdicts(book, {sick, fine}, Settings(), 9000).empty());
  gpu_health::DeviceHealth recovered = sick;
  recovered.healthy = true;
  recovered.since_unix_ms = 3000;
  auto back = DiffVerdicts(book, {recovered, fine}, Settings(), 9000);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(back[0].ishealthy());
}

// A verdict no XID made is exported under its own cause's check: the NVSwitch SXid's
// (SysLogsSXIDError, the SXid as error code) or the polled check's name; not as an XID 0.
TEST(EventMappingTest, AVerdictAtStartCarriesTheCheckOfItsCause) {
  gpu_health::DeviceHealth sxid;
  sxid.uuid = "GPU-1";
  sxid.healthy = false;
  sxid.sxid = 20034;
  sxid.recommended_action = "COMPONENT_RESET";
  sxid.since_unix_ms = 2000;
  gpu_health::DeviceHealth check;
  check.uuid = "GPU-2";
  check.healthy = false;
  check.check = "RowRemapPending";
  check.recommended_action = "COMPONENT_RESET";
  check.since_unix_ms = 2000;
  gpu_health::DeviceHealth xid = sxid;
  xid.uuid = "GPU-3";
  xid.sxid = 0;
  xid.xid = 79;
  ExportBook book;
  const auto events = DiffVerdicts(book, {sxid, check, xid}, Settings(), 9000);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].checkname(), "SysLogsSXIDError");
  ASSERT_EQ(events[0].errorcode_size(), 1);
  EXPECT_EQ(events[0].errorcode(0), "20034");
  EXPECT_EQ(events[1].checkname(), "RowRemapPending");
  EXPECT_EQ(events[1].errorcode_size(), 0);
  EXPECT_EQ(events[2].checkname(), "SysLogsXIDError");
  EXPECT_EQ(events[2].errorcode(0), "79");
  // Three causes, three ids; and the same verdict twice is the same id.
  EXPECT_NE(events[0].id(), events[2].id());
  ExportBook again;
  EXPECT_EQ(DiffVerdicts(again, {sxid}, Settings(), 9000)[0].id(), events[0].id());
}

}  // namespace
}  // namespace gns::nvsentinel_export
