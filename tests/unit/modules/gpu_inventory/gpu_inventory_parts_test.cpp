// The pure parts of gpu-inventory: PCI address forms, the clique rules of WIRE-FACTS §8.5,
// the /debug/state JSON, the module's config section, and when the NVML event waiter has to
// register again.
#include "loop/config.hpp"
#include "modules/gpu_inventory/clique.hpp"
#include "modules/gpu_inventory/event_waiter.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gns::gpu_inventory {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

TEST(PciAddress, ParsesKernelNvmlAndLspciForms) {
  const PciAddress expected{0, 0x3b, 0, 0};
  EXPECT_EQ(PciAddress::Parse("0000:3b:00.0"), expected);
  EXPECT_EQ(PciAddress::Parse("00000000:3B:00.0"), expected);
  EXPECT_EQ(PciAddress::Parse("3b:00"), expected);
  EXPECT_EQ(PciAddress::Parse("3B:00.0"), expected);
  EXPECT_EQ(PciAddress::Parse("0000:3b:00"), expected);  // the Xid line's "PCI:0000:3b:00"
  EXPECT_EQ(PciAddress::Parse("0001:DB:1f.7"), (PciAddress{1, 0xdb, 0x1f, 7}));
  EXPECT_EQ(PciAddress::Parse("10000:01:02.3"), (PciAddress{0x10000, 1, 2, 3}));
}

TEST(PciAddress, RejectsGarbage) {
  for (const char* text : {"", "garbage", "3b", ":", "3b:", ":00.0", "0000:3b:00.8", "0000:3b:20.0",
                           "0000:13b:00.0", "123456789:3b:00.0", "0:0:0:0.0", "3b:00.", "0x3b:00.0",
                           "3b:00.0 ", " 3b:00.0", "-1:00.0", "zz:00.0", "3b:00.0.0"}) {
    EXPECT_FALSE(PciAddress::Parse(text)) << '"' << text << '"';
  }
}

TEST(PciAddress, PrintsTheSysfsFormAndRoundTrips) {
  EXPECT_EQ((PciAddress{0, 0x3b, 0, 0}).ToString(), "0000:3b:00.0");
  EXPECT_EQ((PciAddress{0x10000, 0xdb, 0x1f, 7}).ToString(), "10000:db:1f.7");
  const auto parsed = PciAddress::Parse("00000000:AB:00.0");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(PciAddress::Parse(parsed->ToString()), parsed);
}

TEST(Clique, FormatsClusterUuidCanonically) {
  const unsigned char bytes[16] = {0xc9, 0xa0, 0xf3, 0xd2, 0x41, 0xb7, 0x4e, 0x6a,
                                   0x9d, 0x58, 0x2f, 0x1e, 0x7b, 0x3c, 0x8a, 0x64};
  EXPECT_EQ(FormatClusterUuid(bytes, sizeof(bytes)), "c9a0f3d2-41b7-4e6a-9d58-2f1e7b3c8a64");
}

GpuInfo Gpu(const std::string& uuid, std::optional<FabricInfo> fabric) {
  GpuInfo gpu;
  gpu.uuid = uuid;
  gpu.fabric = std::move(fabric);
  return gpu;
}

FabricInfo Attached(const std::string& cluster, uint32_t clique) { return FabricInfo{cluster, clique, 3, 0}; }

TEST(Clique, AgreeingGpusGiveClusterDotClique) {
  const auto clique = ComputeClique({Gpu("GPU-a", Attached("c1", 7)), Gpu("GPU-b", Attached("c1", 7))});
  EXPECT_EQ(clique.clique_id, "c1.7");
  EXPECT_EQ(clique.reason, "");
}

TEST(Clique, OnlyFabricAttachedGpusCount) {
  // In progress, failed registration, or no fabric: ignored, as the DRA driver does.
  const auto clique = ComputeClique({Gpu("GPU-a", Attached("c1", 7)), Gpu("GPU-b", FabricInfo{"c2", 9, 2, 0}),
                                     Gpu("GPU-c", FabricInfo{"c3", 1, 3, 15}), Gpu("GPU-d", std::nullopt)});
  EXPECT_EQ(clique.clique_id, "c1.7");
}

TEST(Clique, DisagreementIsEmptyAndNamesTheGpus) {
  const auto clique = ComputeClique(
      {Gpu("GPU-a", Attached("c1", 7)), Gpu("GPU-b", Attached("c1", 8)), Gpu("GPU-c", Attached("c2", 7))});
  EXPECT_EQ(clique.clique_id, "");
  EXPECT_THAT(clique.reason, HasSubstr("disagree"));
  EXPECT_THAT(clique.reason, HasSubstr("c1.7 (GPU-a)"));
  EXPECT_THAT(clique.reason, HasSubstr("c1.8 (GPU-b)"));
  EXPECT_THAT(clique.reason, HasSubstr("c2.7 (GPU-c)"));
}

TEST(Clique, NoFabricAttachedGpuSaysWhy) {
  const auto clique = ComputeClique({Gpu("GPU-a", std::nullopt), Gpu("GPU-b", FabricInfo{"c1", 1, 2, 0})});
  EXPECT_EQ(clique.clique_id, "");
  EXPECT_THAT(clique.reason, HasSubstr("no fabric-attached GPU"));
  EXPECT_THAT(clique.reason, HasSubstr("no fabric support: 1 of 2"));
  EXPECT_THAT(clique.reason, HasSubstr("fabric in progress: 1 of 2"));
  EXPECT_THAT(ComputeClique({}).reason, HasSubstr("no GPUs"));
}

TEST(Clique, AllZeroClusterUuidMeansNoCliqueWithTheReason) {
  // HGX nodes with NVSwitches but no multi-node NVLink: registration completes, the UUID is zero.
  const std::string zero = "00000000-0000-0000-0000-000000000000";
  const auto clique = ComputeClique({Gpu("GPU-a", Attached(zero, 0)), Gpu("GPU-b", Attached(zero, 0))});
  EXPECT_EQ(clique.clique_id, "");
  EXPECT_THAT(clique.reason, HasSubstr("no multi-node NVLink"));
  EXPECT_THAT(clique.reason, HasSubstr("all-zero cluster UUID on every GPU (2 of 2)"));
  // Mixed with other non-attached GPUs, the zero ones are named among the reasons.
  const auto mixed = ComputeClique({Gpu("GPU-a", Attached(zero, 0)), Gpu("GPU-b", std::nullopt)});
  EXPECT_EQ(mixed.clique_id, "");
  EXPECT_THAT(mixed.reason, HasSubstr("all-zero cluster UUID: 1 of 2"));
  EXPECT_THAT(mixed.reason, HasSubstr("no fabric support: 1 of 2"));
  // Beside a real cluster UUID the zero GPU does not make a disagreement: it is in no clique.
  EXPECT_EQ(ComputeClique({Gpu("GPU-a", Attached("c1", 7)), Gpu("GPU-b", Attached(zero, 0))}).clique_id, "c1.7");
}

TEST(Clique, UnreadableFabricInfoMakesTheCliqueUnknown) {
  const auto clique = ComputeClique({Gpu("GPU-a", Attached("c1", 7))}, {"GPU-b (nvmlDeviceGetGpuFabricInfoV: x)"});
  EXPECT_EQ(clique.clique_id, "");
  EXPECT_THAT(clique.reason, HasSubstr("fabric info unreadable: GPU-b"));
}

// What the waiter registered by (its `registered` lines) against a later read: a MIG mode
// (current or pending) or a waited-for event type that changed means registering again; what
// the waiter does not wait for, what one side does not know and a GPU one side lacks do not.
TEST(EventWaiterBasis, AChangedMigModeOrWaitedEventTypeMeansRegisteringAgain) {
  constexpr uint64_t kWithoutMig = 0x1f;  // SBE, DBE, PState, XID, clock
  const GpuEventBasis whole{kWithoutMig, 0u, 0u};
  const std::map<std::string, GpuEventBasis> registered{{"GPU-a", whole}, {"GPU-b", whole}, {"GPU-c", GpuEventBasis{}}};
  EXPECT_TRUE(GpusWithNewEventBasis(registered, registered).empty());

  auto read = registered;
  read["GPU-a"].mig_current = 1;
  read["GPU-a"].mig_pending = 1;
  read["GPU-b"].mig_pending = 1;  // enabling, pending a reset
  EXPECT_EQ(GpusWithNewEventBasis(registered, read), (std::vector<std::string>{"GPU-a", "GPU-b"}));

  read = registered;
  read["GPU-b"].supported_events = kWithoutMig | nvml::kEventMigConfigChange;
  EXPECT_EQ(GpusWithNewEventBasis(registered, read), std::vector<std::string>{"GPU-b"});
  read["GPU-b"].supported_events = kWithoutMig & ~nvml::kEventTypePState;  // not waited for
  EXPECT_TRUE(GpusWithNewEventBasis(registered, read).empty());

  // Unknown on one side (a call failed, no MIG), or a GPU only one side has: no restart on
  // every read for a call that keeps failing.
  read = registered;
  read["GPU-a"] = GpuEventBasis{};
  read["GPU-c"] = GpuEventBasis{kWithoutMig | nvml::kEventMigConfigChange, 1u, 1u};
  read["GPU-new"] = GpuEventBasis{kWithoutMig, 1u, 1u};
  EXPECT_TRUE(GpusWithNewEventBasis(registered, read).empty());
}

TEST(Messages, JsonForDebugState) {
  GpuInventory inventory;
  inventory.available = true;
  inventory.driver_version = "550.90.07";
  GpuInfo gpu = Gpu("GPU-a", Attached("c1", 7));
  gpu.pci = PciAddress{0, 0x18, 0, 0};
  gpu.pci_bus_id = "00000000:18:00.0";
  inventory.gpus.push_back(gpu);
  const nlohmann::json j = inventory;
  EXPECT_EQ(j.at("available"), true);
  EXPECT_FALSE(j.contains("error"));
  EXPECT_EQ(j.at("gpus").at(0).at("pci"), "0000:18:00.0");
  EXPECT_EQ(j.at("gpus").at(0).at("fabric").at("attached"), true);
  const nlohmann::json c = NodeClique{"", "why"};
  EXPECT_EQ(c.at("reason"), "why");
  EXPECT_EQ(inventory.FindByPci(*PciAddress::Parse("18:00")), &inventory.gpus[0]);
  EXPECT_EQ(inventory.FindByUuid("GPU-a"), &inventory.gpus[0]);
  EXPECT_EQ(inventory.FindByUuid("GPU-z"), nullptr);
}

GpuInventoryModule::Config Parse(const std::string& yaml) {
  const ConfigValue root = ParseYaml(yaml, "site.yaml");
  ConfigMap section(root, "modules.gpu-inventory");
  SiteConfig site;
  auto config = GpuInventoryModule::ParseConfig(section, site);
  section.Finish();
  return config;
}

TEST(GpuInventoryConfig, DefaultsAndEveryKey) {
  const auto defaults = Parse("{}");
  EXPECT_EQ(defaults.nvml_library, "libnvidia-ml.so.1");
  EXPECT_EQ(defaults.event_wait_timeout, milliseconds(60000));
  EXPECT_EQ(defaults.event_waiter_program, "/proc/self/exe");
  EXPECT_EQ(defaults.retry_backoff.initial, milliseconds(1000));
  EXPECT_EQ(defaults.retry_backoff.max, milliseconds(60000));
  EXPECT_EQ(defaults.refresh_interval, milliseconds(60000));
  EXPECT_EQ(defaults.health_read_timeout, milliseconds(10000));

  const auto all = Parse(
      "nvmlLibrary: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
      "eventWaitTimeout: 20m\n"
      "eventWaiterProgram: /usr/bin/gpu-node-supervisor\n"
      "retryBackoff: {initial: 500ms, max: 30s}\n"
      "refreshInterval: 5m\n"
      "healthReadTimeout: 2500ms\n");
  EXPECT_EQ(all.nvml_library, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  EXPECT_EQ(all.event_wait_timeout, milliseconds(1200000));
  EXPECT_EQ(all.event_waiter_program, "/usr/bin/gpu-node-supervisor");
  EXPECT_EQ(all.retry_backoff.initial, milliseconds(500));
  EXPECT_EQ(all.retry_backoff.max, milliseconds(30000));
  EXPECT_EQ(all.refresh_interval, milliseconds(300000));
  EXPECT_EQ(all.health_read_timeout, milliseconds(2500));
}

TEST(GpuInventoryConfig, BadValuesNameThePlace) {
  auto error_of = [](const std::string& yaml) -> std::string {
    try {
      Parse(yaml);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(error_of("eventWaitTimeout: 0s\n"), HasSubstr("modules.gpu-inventory.eventWaitTimeout"));
  EXPECT_THAT(error_of("eventWaitTimeout: 2h\n"), HasSubstr("eventWaitTimeout"));
  EXPECT_THAT(error_of("nvmlLibrary: \"\"\n"), HasSubstr("nvmlLibrary"));
  EXPECT_THAT(error_of("eventWaiterProgram: \"\"\n"), HasSubstr("eventWaiterProgram"));
  // Gone with the waiter thread whose waits they paced.
  EXPECT_THAT(error_of("shortEventWait: 10ms\n"), HasSubstr("shortEventWait"));
  EXPECT_THAT(error_of("retryBackoff: {initial: 10s, max: 1s}\n"), HasSubstr("max"));
  EXPECT_THAT(error_of("retryBackoff: {initial: 1s, bogus: 1}\n"), HasSubstr("bogus"));
  // XID filtering is gpu-health's business: every XID is published here.
  EXPECT_THAT(error_of("ignoredXids: [13]\n"), HasSubstr("ignoredXids"));
  EXPECT_THAT(error_of("healthReadTimeout: 10ms\n"), HasSubstr("healthReadTimeout"));
  EXPECT_THAT(error_of("healthReadTimeout: 1h\n"), HasSubstr("healthReadTimeout"));
  EXPECT_EQ(error_of("eventWaitTimeout: 1s\n"), "no error");
}

}  // namespace
}  // namespace gns::gpu_inventory
