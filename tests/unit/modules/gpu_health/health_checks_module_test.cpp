// gpu-health with the polled checks, against a fake GpuHealthSampler in the module context's
// services (gpu-inventory's, until the NVML half lands): a reading with a pending row remap →
// gpu-health.device Unhealthy with COMPONENT_RESET and a HealthEvent of that check; kept until
// a validated reset or set-healthy, and across a restart; a non-fatal condition back Healthy
// after the hysteresis; a pass that comes back ok=false changes nothing; no sampler → no
// checks, said in /debug/state; the metrics of the checks.
#include "loop/config.hpp"
#include "modules/gpu_health/checks_config.hpp"
#include "modules/gpu_health/gpu_health_module.hpp"
#include "modules/gpu_inventory/api/health_sample.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/private_bus.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gns::gpu_health::checks_module_test {
namespace {

namespace fs = std::filesystem;
namespace inv = gpu_inventory;
using std::chrono::milliseconds;

constexpr const char* kUuid = "GPU-455d8f70-2051-db6c-0430-ffc457bff834";
constexpr const char* kOther = "GPU-00000000-0000-0000-0000-000000000002";
const std::string kBoot(32, 'a');

// Answers each pass on the loop (never inside Sample) with the readings the test set.
class FakeSampler final : public inv::GpuHealthSampler {
 public:
  explicit FakeSampler(Loop& loop) : loop_(loop) {}
  void Sample(uint32_t groups, std::function<void(inv::HealthSample)> done) override {
    ++passes;
    last_groups = groups;
    inv::HealthSample sample = next;
    sample.groups = groups;
    sample.taken_unix_ms = (taken_ms += 100);
    loop_.Post([done = std::move(done), sample = std::move(sample)]() mutable { done(std::move(sample)); });
  }
  inv::HealthSample next;
  int passes = 0;
  uint32_t last_groups = 0;
  int64_t taken_ms = 1'700'000'000'000;

 private:
  Loop& loop_;
};

inv::GpuHealthReading Reading(const std::string& uuid, uint32_t index, const std::string& pci) {
  inv::GpuHealthReading gpu;
  gpu.uuid = uuid;
  gpu.index = index;
  gpu.pci_bus_id = pci;
  gpu.remapped_rows = inv::RemappedRows{};
  gpu.persistence_mode = true;
  return gpu;
}

class GpuHealthChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnsghc-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    h_.site.paths.state_dir = dir_ + "/state";
    h_.site.node_name = "node1";
    fs::create_directories(h_.site.paths.state_dir);
    // Boot ID from the host: the verdicts of this boot survive a restart.
    h_.site.paths.host_root = dir_ + "/host";
    fs::create_directories(dir_ + "/host/proc/sys/kernel/random");
    std::ofstream(dir_ + "/host/proc/sys/kernel/random/boot_id") << kBoot << "\n";
    config_.catalog = XidCatalog::Builtin();
    config_.admin_socket = false;
    config_.watch_annotation = false;
    config_.checks.clear_after = 2;
    for (auto& interval : config_.checks.intervals) interval = milliseconds(100);
    // The host services need a system bus: only the tests that start a private one follow them.
    config_.checks.host_services.persistenced = false;
    config_.checks.host_services.fabric_manager = false;
    sampler_ = std::make_shared<FakeSampler>(h_.loop);
    sampler_->next.ok = true;
    sampler_->next.gpus = {Reading(kUuid, 0, "00000000:03:00.0"), Reading(kOther, 1, "00000000:3B:00.0")};
    health_sub_ = h_.bus.Subscribe<DeviceHealth>([this](const DeviceHealth& d) { health_.push_back(d); });
    event_sub_ = h_.bus.Subscribe<HealthEvent>([this](const HealthEvent& e) { events_.push_back(e); });
  }

  void TearDown() override {
    module_.Stop();
    health_sub_.Reset();
    event_sub_.Reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void Start(bool with_sampler = true) {
    if (with_sampler) h_.services.Provide<inv::GpuHealthSampler>(sampler_);
    module_.Start(config_);
    ASSERT_TRUE(h_.RunUntil([&] { return !module_->Loading(); }));
    h_.bus.Publish(Inventory());
    h_.Drain();
  }

  // gpu-inventory's message for the GPUs the sampler reads.
  inv::GpuInventory Inventory() const {
    inv::GpuInventory inventory;
    inventory.available = true;
    for (const auto& r : sampler_->next.gpus) {
      inv::GpuInfo info;
      info.uuid = r.uuid;
      info.index = r.index;
      info.pci_bus_id = r.pci_bus_id;
      info.pci = *inv::PciAddress::Parse(r.pci_bus_id);
      inventory.gpus.push_back(info);
    }
    return inventory;
  }

  const DeviceHealth* Health(const std::string& uuid) {
    const auto& all = h_.bus.LatestByKey<DeviceHealth>();
    const auto it = all.find(uuid);
    return it == all.end() ? nullptr : &it->second;
  }
  bool IsUnhealthy(const std::string& uuid) {
    const auto* h = Health(uuid);
    return h != nullptr && !h->healthy;
  }
  bool IsHealthy(const std::string& uuid) {
    const auto* h = Health(uuid);
    return h != nullptr && h->healthy;
  }
  // Lets `n` more passes happen.
  void Passes(int n) {
    const int until = sampler_->passes + n;
    ASSERT_TRUE(h_.RunUntil([&] { return sampler_->passes >= until; }));
    h_.RunUntil([] { return false; }, milliseconds(20));  // their answers are judged
  }
  const HealthEvent* EventOf(std::string_view check, bool healthy) {
    for (const auto& e : events_) {
      if (e.check_name == check && e.is_healthy == healthy) return &e;
    }
    return nullptr;
  }
  double Metric(const std::string& series) {
    const auto rendered = h_.metrics.Render();
    const auto at = rendered.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(rendered.substr(at + series.size() + 2));
  }
  void PendingRemap(bool pending) { sampler_->next.gpus[0].remapped_rows->pending = pending; }

  test::LoopHarness h_;
  test::ModuleUnderTest<GpuHealthModule> module_{h_};
  GpuHealthModule::Config config_;
  std::shared_ptr<FakeSampler> sampler_;
  std::string dir_;
  std::vector<DeviceHealth> health_;
  std::vector<HealthEvent> events_;
  Subscription health_sub_;
  Subscription event_sub_;
};

TEST_F(GpuHealthChecksTest, APendingRemapMakesTheGpuUnhealthyWithComponentResetAndAHealthEvent) {
  Start();
  Passes(1);
  EXPECT_EQ(Health(kUuid), nullptr) << "a healthy GPU's verdict is not published by the checks";
  PendingRemap(true);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  const DeviceHealth* h = Health(kUuid);
  EXPECT_EQ(h->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(h->reason.rfind("RowRemapPending: GPU 0 (" + std::string(kUuid), 0), 0u) << h->reason;
  EXPECT_EQ(h->xid, 0u);
  EXPECT_EQ(h->pci, "00000000:03:00.0");
  EXPECT_EQ(Health(kOther), nullptr) << "the other GPU is untouched";
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("RowRemapPending", false) != nullptr; }));
  const HealthEvent* e = EventOf("RowRemapPending", false);
  EXPECT_TRUE(e->is_fatal);
  EXPECT_EQ(e->recommended_action_name, "COMPONENT_RESET");
  EXPECT_EQ(e->recommended_action, 2);
  EXPECT_EQ(e->error_code, std::vector<std::string>{"DCGM_FR_PENDING_ROW_REMAP"});
  EXPECT_NE(std::find(e->entities_impacted.begin(), e->entities_impacted.end(), ImpactedEntity{"GPU_UUID", kUuid}),
            e->entities_impacted.end());
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_check_condition{gpu=\"" + std::string(kUuid) +
                   "\",check=\"RowRemapPending\",severity=\"fatal\"}"),
            1)
      << h_.metrics.Render();
  // Held while it holds: one event, one verdict.
  const std::size_t verdicts = health_.size();
  Passes(3);
  EXPECT_EQ(health_.size(), verdicts);
  EXPECT_EQ(std::count_if(events_.begin(), events_.end(), [](const auto& ev) { return ev.check_name == "RowRemapPending"; }), 1);
}

TEST_F(GpuHealthChecksTest, AFatalConditionStaysUntilAValidatedResetThenTheGpuIsHealthy) {
  Start();
  PendingRemap(true);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  PendingRemap(false);  // the reading clears, as it does after the reset
  Passes(4);
  EXPECT_TRUE(IsUnhealthy(kUuid)) << "fatal: kept until a reset, a new boot or set-healthy";
  journald::UnitLine ack;
  ack.message = "GPU reset occurred: " + std::string(kUuid);
  ack.boot_id = kBoot;
  ack.identifier = "gpu-reset";
  ack.acknowledgement = true;
  h_.bus.Publish(ack);
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kUuid); }));
  EXPECT_EQ(Health(kUuid)->reason, "GPU reset occurred");
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("RowRemapPending", true) != nullptr; }));
  EXPECT_EQ(EventOf("RowRemapPending", true)->message, "RowRemapPending cleared: GPU reset occurred");
  Passes(3);
  EXPECT_TRUE(IsHealthy(kUuid));
}

TEST_F(GpuHealthChecksTest, SetHealthyClearsAFatalConditionAndAFaultStillThereComesBack) {
  Start();
  PendingRemap(true);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  EXPECT_EQ(module_->SetHealthy(kUuid, "test"), "ok: 1 device(s) set healthy");
  h_.Drain();
  EXPECT_TRUE(IsHealthy(kUuid));
  // The remap is still pending: the next memory pass finds it again.
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  PendingRemap(false);
  EXPECT_EQ(module_->SetHealthy("all", "test"), "ok: 1 device(s) set healthy");
  h_.Drain();
  Passes(3);
  EXPECT_TRUE(IsHealthy(kUuid));
}

TEST_F(GpuHealthChecksTest, ANonFatalConditionClearsAfterTheHysteresis) {
  auto& gpu = sampler_->next.gpus[1];
  gpu.nvlinks.resize(2);
  gpu.nvlinks[0].link = 0;
  gpu.nvlinks[0].active = true;
  gpu.nvlinks[1].link = 1;
  gpu.nvlinks[1].active = false;
  Start();
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kOther); }));
  EXPECT_EQ(Health(kOther)->recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(Health(kOther)->reason.rfind("NvLinkDown: ", 0), 0u) << Health(kOther)->reason;
  gpu.nvlinks[1].active = true;
  // One clean pass is not enough (clearAfterPasses: 2) ...
  const int clean_from = sampler_->passes;
  ASSERT_TRUE(h_.RunUntil([&] { return IsHealthy(kOther); }));
  EXPECT_GE(sampler_->passes - clean_from, 2);
  EXPECT_EQ(Health(kOther)->reason, "NvLinkDown cleared after 2 clean pass(es)");
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("NvLinkDown", true) != nullptr; }));
  EXPECT_FALSE(EventOf("NvLinkDown", true)->is_fatal);
}

TEST_F(GpuHealthChecksTest, AWarningLeavesTheGpuHealthyButIsReported) {
  sampler_->next.gpus[0].persistence_mode = false;
  Start();
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("PersistenceModeOff", false) != nullptr; }));
  EXPECT_EQ(Health(kUuid), nullptr) << "no verdict: the GPU stays Healthy";
  EXPECT_FALSE(EventOf("PersistenceModeOff", false)->is_fatal);
  EXPECT_EQ(EventOf("PersistenceModeOff", false)->recommended_action_name, "NONE");
  const auto* state = h_.bus.Latest<GpuHealthChecks>();
  ASSERT_NE(state, nullptr);
  ASSERT_EQ(state->conditions.size(), 1u);
  EXPECT_EQ(state->conditions[0].check, "PersistenceModeOff");
  EXPECT_EQ(state->conditions[0].severity, "warning");
}

TEST_F(GpuHealthChecksTest, APassThatFailedJudgesNothing) {
  Start();
  PendingRemap(true);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid) && EventOf("RowRemapPending", false) != nullptr; }));
  Passes(1);
  sampler_->next.gpus[1].nvlinks.resize(1);  // would be NvLinkDown, were it judged
  sampler_->next.gpus[1].nvlinks[0].active = false;
  sampler_->next.gpus[0].remapped_rows->pending = false;
  sampler_->next.ok = false;
  sampler_->next.error = "the pass ran past its deadline (nvmlDeviceGetRemappedRows hung)";
  const std::size_t verdicts = health_.size();
  const std::size_t events = events_.size();
  Passes(4);
  EXPECT_EQ(health_.size(), verdicts);
  EXPECT_EQ(events_.size(), events);
  EXPECT_TRUE(IsUnhealthy(kUuid));
  EXPECT_EQ(Health(kOther), nullptr);
  const auto* state = h_.bus.Latest<GpuHealthChecks>();
  ASSERT_NE(state, nullptr);
  EXPECT_FALSE(state->last_ok);
  EXPECT_EQ(state->last_error, "the pass ran past its deadline (nvmlDeviceGetRemappedRows hung)");
  EXPECT_GE(Metric("gpu_node_supervisor_gpu_health_check_passes_failed_total"), 4);
}

TEST_F(GpuHealthChecksTest, WithoutASamplerNoPolledChecksAndDebugStateSaysSo) {
  Start(/*with_sampler=*/false);
  const auto* state = h_.bus.Latest<GpuHealthChecks>();
  ASSERT_NE(state, nullptr);
  EXPECT_NE(state->status.find("no GpuHealthSampler"), std::string::npos) << state->status;
  EXPECT_EQ(sampler_->passes, 0);
  // gpu-inventory comes: its next inventory starts the checks.
  h_.services.Provide<inv::GpuHealthSampler>(sampler_);
  h_.bus.Publish(inv::GpuInventory{});
  ASSERT_TRUE(h_.RunUntil([&] { return sampler_->passes > 0; }));
  EXPECT_EQ(h_.bus.Latest<GpuHealthChecks>()->status, "running");
}

// gpu-inventory provides its sampler before NVML is open; a pass then could only fail ("not
// open yet") and warn at every start. The first pass waits for its first inventory.
TEST_F(GpuHealthChecksTest, TheFirstPassWaitsForGpuInventorysFirstInventory) {
  h_.services.Provide<inv::GpuHealthSampler>(sampler_);
  module_.Start(config_);
  ASSERT_TRUE(h_.RunUntil([&] { return !module_->Loading(); }));
  const auto until = std::chrono::steady_clock::now() + milliseconds(300);  // three check intervals
  h_.RunUntil([&] { return std::chrono::steady_clock::now() >= until; });
  EXPECT_EQ(sampler_->passes, 0);
  const auto* state = h_.bus.Latest<GpuHealthChecks>();
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->status, "waiting for gpu-inventory's first inventory");
  EXPECT_LE(Metric("gpu_node_supervisor_gpu_health_check_passes_failed_total"), 0);  // -1: not yet registered
  inv::GpuInventory inventory;
  inventory.available = true;
  h_.bus.Publish(inventory);
  ASSERT_TRUE(h_.RunUntil([&] { return sampler_->passes > 0; }));
  EXPECT_EQ(h_.bus.Latest<GpuHealthChecks>()->status, "running");
}

TEST_F(GpuHealthChecksTest, AFatalConditionSurvivesARestartInTheSameBoot) {
  Start();
  PendingRemap(true);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  module_.Stop();
  std::ifstream file(h_.site.paths.state_dir + "/gpu-health/devices.json");
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_NE(text.str().find("\"checkConditions\""), std::string::npos) << text.str();
  // The next instance starts with nothing pending in the readings: the condition was fatal.
  PendingRemap(false);
  h_.services.Withdraw<inv::GpuHealthSampler>();
  health_.clear();
  module_.Start(config_);
  ASSERT_TRUE(h_.RunUntil([&] { return !module_->Loading(); }));
  ASSERT_TRUE(h_.RunUntil([&] { return !health_.empty(); }));
  EXPECT_FALSE(health_.back().healthy);
  EXPECT_EQ(health_.back().recommended_action, "COMPONENT_RESET");
  EXPECT_EQ(health_.back().reason.rfind("RowRemapPending: ", 0), 0u) << health_.back().reason;
}

TEST_F(GpuHealthChecksTest, AnXidAndAConditionRankTogether) {
  Start();
  sampler_->next.gpus[0].pcie.width = 8;
  sampler_->next.gpus[0].pcie.max_width = 16;
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }));
  EXPECT_EQ(Health(kUuid)->recommended_action, "RESTART_BM");
  // XID 48 (COMPONENT_RESET) ranks below the degraded link (RESTART_BM): the reason stays.
  journald::KernelLine line;
  line.message = "NVRM: Xid (PCI:0000:03:00): 48, pid=1, name=x, An uncorrectable double bit error";
  line.boot_id = kBoot;
  line.realtime_usec = 1'700'000'000'000'000;
  h_.bus.Publish(line);
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("SysLogsXIDError", false) != nullptr; }));
  EXPECT_EQ(Health(kUuid)->recommended_action, "RESTART_BM");
  EXPECT_EQ(Health(kUuid)->reason.rfind("PcieLinkDegraded: ", 0), 0u) << Health(kUuid)->reason;
  // The link comes back: the XID's verdict remains.
  sampler_->next.gpus[0].pcie.width = 16;
  ASSERT_TRUE(h_.RunUntil([&] { return Health(kUuid)->xid == 48; }));
  EXPECT_FALSE(Health(kUuid)->healthy);
  EXPECT_EQ(Health(kUuid)->recommended_action, "COMPONENT_RESET");
}

// Issue 26's SXid → GPU, through the module: gpu-inventory's NVLink wiring (two GPUs behind one
// NVSwitch, ports 10-13 → GPU 0, 14-17 → GPU 1) and a fatal SXid on port 15 → GPU 1 Unhealthy at
// gpu-health.device with the reason, GPU 0 untouched; a fatal SXid on an unwired port → a
// HealthEvent for the switch only. With a site SXid catalog through the config key: a Fatal line
// downgraded to counted-only.
TEST_F(GpuHealthChecksTest, AFatalSxidOnAGpusSwitchPortTurnsThatGpuUnhealthyAndNoOther) {
  const std::string site = dir_ + "/sxid-site.yaml";
  std::ofstream(site) << "version: 1\nsxids:\n  - {sxid: 12028, description: harmless here, fatal: false}\n";
  const ConfigValue value = ParseYaml("sxidCatalog: " + site + "\nadminSocket: false\n", "site.yaml");
  ConfigMap section(value, "modules.gpu-health");
  const GpuHealthModule::Config parsed = GpuHealthModule::ParseConfig(section, h_.site);
  config_.sxid_catalog = parsed.sxid_catalog;
  config_.sxid_catalog_source = parsed.sxid_catalog_source;
  Start();
  inv::GpuInventory inventory = Inventory();
  const auto nvswitch = *inv::PciAddress::Parse("0000:c3:00.0");
  for (auto& gpu : inventory.gpus) {
    for (uint32_t link = 0; link < 4; ++link) gpu.nvswitch_links.push_back({link, nvswitch, 10 + 4 * gpu.index + link});
  }
  h_.bus.Publish(inventory);
  h_.Drain();
  auto kernel = [&](const std::string& message) {
    journald::KernelLine line;
    line.message = message;
    line.boot_id = kBoot;
    line.realtime_usec = 1'700'000'000'000'000;
    h_.bus.Publish(line);
  };
  kernel("[ 4102.118236] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12028, Fatal, Link 11 egress non-posted PRIV error");
  kernel("[ 4102.118240] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 15 LTSSM Fault Up");
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kOther); }));
  EXPECT_EQ(Health(kOther)->recommended_action, "COMPONENT_RESET");
  EXPECT_NE(Health(kOther)->reason.find("SXid 20034 (LTSSM_FAULT_UP) on NVSwitch 0 at 0000:c3:00.0 port 15, wired to "
                                        "GPU 1 link 1"),
            std::string::npos)
      << Health(kOther)->reason;
  EXPECT_EQ(Health(kOther)->sxid, 20034u) << "the verdict names its cause";
  EXPECT_EQ(Health(kOther)->xid, 0u);
  EXPECT_FALSE(IsUnhealthy(kUuid)) << "port 11 is GPU 0's, but the site catalog made 12028 harmless";
  kernel("[ 4102.120001] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 40 sourcetrack timeout error");
  ASSERT_TRUE(h_.RunUntil([&] {
    return std::count_if(events_.begin(), events_.end(),
                         [](const HealthEvent& e) { return e.check_name == "SysLogsSXIDError"; }) == 2;
  }));
  const auto unmapped = std::find_if(events_.begin(), events_.end(), [](const HealthEvent& e) {
    return e.check_name == "SysLogsSXIDError" && e.error_code == std::vector<std::string>{"24007"};
  });
  ASSERT_NE(unmapped, events_.end());
  EXPECT_EQ(unmapped->recommended_action_name, "CONTACT_SUPPORT");
  for (const auto& entity : unmapped->entities_impacted) EXPECT_NE(entity.type, "GPU_UUID");
  EXPECT_FALSE(IsUnhealthy(kUuid));
  EXPECT_TRUE(IsUnhealthy(kOther));
}

// A GPU on the PCI bus that NVML does not list is named by its address; a GPU out for a reset
// (in the inventory, not in the pass) is neither counted nor named as missing.
TEST_F(GpuHealthChecksTest, AGpuMissingFromNvmlIsNamedByItsPciAddress) {
  sampler_->next.pci_gpu_count = 3;
  sampler_->next.pci_gpu_addresses = {"0000:03:00.0", "0000:3b:00.0", "0000:86:00.0"};
  Start();
  sampler_->next.gpus.pop_back();  // kOther (00000000:3B:00.0) is out for its reset
  Passes(2);
  const HealthEvent* missing = EventOf("GpuMissingFromNvml", false);
  ASSERT_NE(missing, nullptr);
  EXPECT_TRUE(missing->entities_impacted.empty()) << "a condition of the node, not of a GPU";
  EXPECT_NE(missing->message.find("not in NVML: 0000:86:00.0)"), std::string::npos) << missing->message;
  EXPECT_EQ(missing->message.find("3b:00.0"), std::string::npos) << "out for a reset, not missing: " << missing->message;
  EXPECT_FALSE(IsUnhealthy(kUuid));
}

// NVML's DBE event (gpu-inventory's NvmlHealthEvent): the memory group is read and judged at
// once. The poll interval is an hour, so only the event can explain the second pass.
TEST_F(GpuHealthChecksTest, ADoubleBitEccEventJudgesTheMemoryChecksWithoutWaitingForThePoll) {
  for (auto& interval : config_.checks.intervals) interval = std::chrono::hours(1);
  sampler_->next.gpus[0].ecc.uncorrected_volatile = 0;
  Start();
  // The first pass (every group, never run): the DBE counter's baseline.
  ASSERT_TRUE(h_.RunUntil([&] { return sampler_->passes >= 1; }));
  ASSERT_EQ(sampler_->passes, 1);
  h_.RunUntil([] { return false; }, milliseconds(200));
  EXPECT_EQ(sampler_->passes, 1) << "nothing due for an hour";

  sampler_->next.gpus[0].ecc.uncorrected_volatile = 1;
  inv::NvmlHealthEvent event;
  event.uuid = kUuid;
  event.kind = inv::NvmlHealthEvent::Kind::kDoubleBitEcc;
  h_.bus.Publish(event);
  ASSERT_TRUE(h_.RunUntil([&] { return IsUnhealthy(kUuid); }, milliseconds(5000)));
  EXPECT_EQ(sampler_->passes, 2);
  EXPECT_EQ(sampler_->last_groups, inv::kHealthMemory) << "the event's group only";
  // HealthEvents leave once the checkpoint that covers them is on disk.
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("EccUncorrectableVolatile", false) != nullptr; }));
  const HealthEvent* dbe = EventOf("EccUncorrectableVolatile", false);
  EXPECT_TRUE(dbe->is_fatal);
  EXPECT_EQ(dbe->recommended_action_name, "COMPONENT_RESET");
  EXPECT_EQ(Metric("gpu_node_supervisor_gpu_health_check_event_passes_total"), 1);

  // A clock event reads the thermal group; a storm of events within a second is one pass.
  event.kind = inv::NvmlHealthEvent::Kind::kClock;
  for (int i = 0; i < 5; ++i) h_.bus.Publish(event);
  ASSERT_TRUE(h_.RunUntil([&] { return sampler_->passes == 3; }, milliseconds(5000)));
  EXPECT_EQ(sampler_->last_groups, inv::kHealthThermal);
  h_.RunUntil([] { return false; }, milliseconds(1500));
  EXPECT_EQ(sampler_->passes, 3) << "five events at once: one pass";
}

// A group switched off stays off: its events read nothing.
TEST_F(GpuHealthChecksTest, AnEventOfAGroupSwitchedOffReadsNothing) {
  for (auto& interval : config_.checks.intervals) interval = std::chrono::hours(1);
  config_.checks.intervals[0] = milliseconds(0);  // memory off
  Start();
  ASSERT_TRUE(h_.RunUntil([&] { return sampler_->passes >= 1; }));
  inv::NvmlHealthEvent event;
  event.uuid = kUuid;
  event.kind = inv::NvmlHealthEvent::Kind::kDoubleBitEcc;
  h_.bus.Publish(event);
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_EQ(sampler_->passes, 1);
}

// The host services over the real D-Bus wire (dbus-daemon + the fake systemd): the fabric
// manager failing is a node condition with a HealthEvent and no GPU verdict; started again, it
// clears after the hysteresis. A unit the node does not have (persistenced here) says nothing.
TEST_F(GpuHealthChecksTest, TheFabricManagerFailingIsANodeConditionThatClearsWhenItRunsAgain) {
  if (!test::PrivateBus::Available()) GTEST_SKIP() << "dbus-daemon or gns-fake-systemd missing";
  test::PrivateBus bus(dir_);
  bus.StartBus();
  bus.StartSystemd({"nvidia-fabricmanager.service"});
  config_.checks.host_services.fabric_manager = true;
  config_.checks.host_services.persistenced = true;  // not on this bus: LoadState not-found
  config_.checks.host_services.bus_address = bus.Address();
  Start();
  Passes(3);
  EXPECT_EQ(EventOf("FabricManagerNotRunning", false), nullptr);

  ASSERT_EQ(bus.Crash("nvidia-fabricmanager.service", 1, false), "");
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("FabricManagerNotRunning", false) != nullptr; }));
  const HealthEvent* failed = EventOf("FabricManagerNotRunning", false);
  EXPECT_FALSE(failed->is_fatal);
  EXPECT_EQ(failed->recommended_action_name, "RESTART_BM");
  EXPECT_TRUE(failed->entities_impacted.empty()) << "a condition of the node, not of a GPU";
  EXPECT_NE(failed->message.find("nvidia-fabricmanager.service is failed"), std::string::npos) << failed->message;
  const auto* state = h_.bus.Latest<GpuHealthChecks>();
  ASSERT_NE(state, nullptr);
  bool held = false;
  for (const auto& c : state->conditions) held = held || (c.gpu == "node" && c.check == "FabricManagerNotRunning");
  EXPECT_TRUE(held);
  EXPECT_FALSE(IsUnhealthy(kUuid)) << "no GPU's verdict changes for a node condition";
  EXPECT_FALSE(IsUnhealthy(kOther));
  EXPECT_EQ(EventOf("PersistencedNotRunning", false), nullptr);

  ASSERT_EQ(bus.ManagerCall("StartUnit", "nvidia-fabricmanager.service"), "");
  ASSERT_TRUE(h_.RunUntil([&] { return EventOf("FabricManagerNotRunning", true) != nullptr; }));
  EXPECT_NE(EventOf("FabricManagerNotRunning", true)->message.find("cleared after"), std::string::npos);
  EXPECT_EQ(EventOf("PersistencedNotRunning", false), nullptr);
}

}  // namespace
}  // namespace gns::gpu_health::checks_module_test

namespace gns::gpu_health::checks_config_test {
namespace {

// The `checks:` section: defaults, each key read, and errors that name the key.
std::string ErrorOf(const std::string& yaml) {
  const ConfigValue value = ParseYaml(yaml, "site.yaml");
  ConfigMap section(value, "modules.gpu-health");
  try {
    ParseChecksConfig(section);
  } catch (const gns::ConfigError& e) {  // the loop's, not the XID catalog's
    return e.what();
  }
  return "";
}

TEST(ChecksConfigTest, DefaultsAreTheAnchorsIntervals) {
  const ConfigValue value = ParseYaml("{}", "site.yaml");
  ConfigMap section(value, "modules.gpu-health");
  const ChecksConfig config = ParseChecksConfig(section);
  EXPECT_TRUE(config.enabled);
  EXPECT_EQ(config.clear_after, 3u);
  EXPECT_EQ(config.intervals[0], std::chrono::seconds(60));  // memory
  EXPECT_EQ(config.intervals[2], std::chrono::seconds(30));  // fabric
  EXPECT_EQ(config.intervals[4], std::chrono::seconds(30));  // thermal
  EXPECT_DOUBLE_EQ(config.thermal.clock_event_rate.per_minute, 0.6);
  EXPECT_EQ(config.thermal.clock_event_rate.window, std::chrono::minutes(10));
}

TEST(ChecksConfigTest, EachKeyIsRead) {
  const ConfigValue value = ParseYaml(R"(
checks:
  clearAfterPasses: 5
  memory: {interval: 2m, rowRemapPending: {enabled: false}, retiredPagesLimit: {pages: 10}}
  nvlink: {enabled: false}
  thermal: {clockEventRate: {perMinute: 1.5, window: 20m}, thermalMargin: {marginC: 8},
            powerViolation: {percent: 25, window: 30m}}
  presence: {gpuMissingFromNvml: {enabled: false}}
  host: {fabricManagerService: {enabled: false}, persistencedService: {unit: persistenced-site.service},
         busAddress: "unix:path=/run/site-bus"}
)",
                                      "site.yaml");
  ConfigMap section(value, "modules.gpu-health");
  const ChecksConfig config = ParseChecksConfig(section);
  EXPECT_EQ(config.clear_after, 5u);
  EXPECT_EQ(config.intervals[0], std::chrono::minutes(2));
  EXPECT_FALSE(config.memory.row_remap_pending);
  EXPECT_TRUE(config.memory.row_remap_failed);
  EXPECT_EQ(config.memory.retired_pages_max, 10u);
  EXPECT_EQ(config.intervals[1], std::chrono::milliseconds(0)) << "a group switched off";
  EXPECT_DOUBLE_EQ(config.thermal.clock_event_rate.per_minute, 1.5);
  EXPECT_EQ(config.thermal.margin_c, 8u);
  EXPECT_DOUBLE_EQ(config.thermal.power_violation_percent, 25.0);
  EXPECT_EQ(config.thermal.power_violation_window, std::chrono::minutes(30));
  EXPECT_TRUE(config.thermal.power_violation);
  EXPECT_FALSE(config.presence.missing_from_nvml);
  EXPECT_FALSE(config.host_services.fabric_manager);
  EXPECT_TRUE(config.host_services.persistenced);
  EXPECT_EQ(config.host_services.persistenced_unit, "persistenced-site.service");
  EXPECT_EQ(config.host_services.bus_address, "unix:path=/run/site-bus");
}

TEST(ChecksConfigTest, TheHostGroupSwitchedOffFollowsNoService) {
  const ConfigValue value = ParseYaml("checks: {host: {enabled: false}}", "site.yaml");
  ConfigMap section(value, "modules.gpu-health");
  const ChecksConfig config = ParseChecksConfig(section);
  EXPECT_FALSE(config.host_services.persistenced);
  EXPECT_FALSE(config.host_services.fabric_manager);
}

TEST(ChecksConfigTest, ErrorsNameTheKey) {
  EXPECT_NE(ErrorOf("checks: {memory: {interval: 10ms}}").find("checks.memory.interval"), std::string::npos)
      << ErrorOf("checks: {memory: {interval: 10ms}}");
  EXPECT_NE(ErrorOf("checks: {memory: {rowRemapPendin: {enabled: true}}}").find("rowRemapPendin"), std::string::npos);
  EXPECT_NE(ErrorOf("checks: {thermal: {clockEventRate: {perMinute: -1}}}").find("checks.thermal.clockEventRate.perMinute"),
            std::string::npos)
      << ErrorOf("checks: {thermal: {clockEventRate: {perMinute: -1}}}");
  EXPECT_NE(ErrorOf("checks: {clearAfterPasses: 0}").find("checks.clearAfterPasses"), std::string::npos);
  EXPECT_NE(ErrorOf("checks: {host: {fabricManagerService: {unit: \"\"}}}").find("checks.host.fabricManagerService.unit"),
            std::string::npos)
      << ErrorOf("checks: {host: {fabricManagerService: {unit: \"\"}}}");
  EXPECT_NE(ErrorOf("checks: {pcie: {pcieLinkDegraded: {enabled: maybe}}}").find("checks.pcie.pcieLinkDegraded.enabled"),
            std::string::npos);
}

}  // namespace
}  // namespace gns::gpu_health::checks_config_test
