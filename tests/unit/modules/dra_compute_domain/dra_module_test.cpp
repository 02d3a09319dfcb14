// The dra-compute-domain module end to end: the kubelet simulator's plugin watcher and DRA calls
// through real gRPC on unix sockets, the API simulator serving the Node, the ComputeDomain, the
// ResourceClaims, the ResourceSlice and Events, and the files on disk (checkpoint, CDI specs).
// Covers seed 000 §14.1 kubelet-side items and the §13 rows the driver owns, idempotency, the
// crash-between-PrepareStarted-and-PrepareCompleted reconcile, a corrupt checkpoint, and §11.
#include "support/api_sim.hpp"
#include "channel_claim.h"
#include "kubelet_sim.h"
#include "loop/config.hpp"
#include "modules/dra_compute_domain/cdi_spec.hpp"
#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_log.hpp"
#include "modules/dra_compute_domain/domain_record.hpp"
#include "modules/dra_compute_domain/dra_module.hpp"
#include "modules/imex_health/messages.hpp"
#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/dra_compute_domain/messages.hpp"
#include "modules/dra_compute_domain/prepare.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/temp_dir.hpp"
#include "support/held_pool.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <unistd.h>
#include <sstream>

namespace gns::dra {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::seconds;

constexpr const char* kModuleNode = "gb200-node-07";
constexpr const char* kModuleNs = "team-a";
constexpr const char* kModuleClique = "7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.32766";
constexpr uint32_t kMajor = 509;
const std::string kDriver(kDriverName);
const std::string kClaims = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims";
const std::string kModuleDomains = "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomains";
const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";

void WriteFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string ProcDevices(bool with_imex) {
  std::string text = "Character devices:\n  1 mem\n195 nvidia\n";
  if (with_imex) text += std::to_string(kMajor) + " nvidia-caps-imex-channels\n";
  text += "510 nvidia-caps\n\nBlock devices:\n  8 sd\n";
  return text;
}

json ModuleChannelParams(const std::string& domain_uid, json allocation_mode = "Single") {
  json params{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "ComputeDomainChannelConfig"},
              {"domainID", domain_uid}};
  if (!allocation_mode.is_null()) params["allocationMode"] = std::move(allocation_mode);
  return params;
}

// A channel claim as the controller's claim template produces it, allocated on kModuleNode.
json ChannelClaim(const std::string& name, const json& parameters) {
  return sim::AllocatedChannelClaim(kModuleNs, name, kModuleNode, parameters, kDriver);
}

class DraModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_.site.node_name = kModuleNode;
    h_.site.paths.kubelet_dir = dir_ / "k";
    h_.site.paths.cdi_dir = dir_ / "cdi";
    h_.site.paths.state_dir = dir_ / "s";
    h_.site.paths.host_root = dir_ / "h";
    h_.site.gates.Set(gates::kHostManagedIMEX, true);
    h_.site.gates.Resolve();
    paths_ = MakeDriverPaths(h_.site.paths);
    WriteFile(paths_.proc_devices, ProcDevices(true));

    sim::ApiServerOptions api_options;
    api_options.bookmark_interval = std::chrono::milliseconds(200);
    api_ = std::make_unique<gns::test::ApiSim>(dir_ / "api", api_options);
    kube::ClientConfig config = api_->ClientConfig();
    config.request_timeout = std::chrono::milliseconds(5000);
    const auto log = gns::test::QuietLogger("dra-test");
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, log}, config);
    informers_ = std::make_shared<kube::InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics, log);
    events_ = std::make_shared<kube::EventRecorder>(client_, h_.clock, h_.metrics, log,
                                                    kube::EventRecorderConfig{});
    h_.services.Provide<kube::KubeClient>(client_);
    h_.services.Provide<kube::InformerRegistry>(informers_);
    h_.services.Provide<kube::EventRecorder>(events_);

    // Our CRD: status.nodes is a list-map keyed by name (driver-managed nodes apply their own entry).
    api_->SeedFile(std::string(std::getenv("GNS_SOURCE_DIR")) + "/deploy/crd-computedomains.yaml");
    api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kModuleNode}}}});
    node_uid_ = Get("/api/v1/nodes/" + std::string(kModuleNode))["metadata"]["uid"].get<std::string>();
    api_->Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                    {"kind", "ComputeDomain"},
                    {"metadata", {{"name", "train-a"}, {"namespace", kModuleNs}}},
                    {"spec", {{"numNodes", 0}, {"channel", {{"allocationMode", "Single"}}}}},
                    {"_resource", kModuleDomains}});
    domain_uid_ = Get(kModuleDomains + "/train-a")["metadata"]["uid"].get<std::string>();
    h_.bus.Publish(gpu_inventory::NodeClique{kModuleClique, "", true});

    sim::KubeletSimOptions sim_options;
    sim_options.kubelet_dir = h_.site.paths.kubelet_dir;
    sim_options.registration_retry_initial = std::chrono::milliseconds(50);
    sim_ = std::make_unique<sim::KubeletSim>(sim_options);
  }

  void TearDown() override {
    StopModule();
    sim_.reset();
    informers_->StopAll();
    client_->Shutdown();
    h_.Drain();
    api_->Stop();
  }

  json Get(const std::string& path) {
    const auto response = api_->Call("GET", path);
    EXPECT_EQ(response.status, 200) << path << ": " << response.body;
    return response.Json();
  }

  // Seeds a claim and returns its UID (the simulator assigns it).
  std::string SeedClaim(const json& claim) {
    api_->Seed(claim);
    return Get(kClaims + "/" + claim["metadata"]["name"].get<std::string>())["metadata"]["uid"].get<std::string>();
  }

  sim::DraClaim SeedChannelClaim(const std::string& name, json allocation_mode = "Single") {
    const auto uid = SeedClaim(ChannelClaim(name, ModuleChannelParams(domain_uid_, std::move(allocation_mode))));
    return sim::DraClaim{kModuleNs, uid, name};
  }

  void StartModule(DraComputeDomainModule::Config config = {}) {
    module_.Start(config);
    // The claim state is read on the pool: started once it is back.
    EXPECT_TRUE(h_.RunUntil([&] { return !module_->Loading(); })) << "the claim state never loaded";
    h_.Drain();
  }

  // Starts the kubelet simulator and the module and waits for the plugin watcher's registration.
  void StartAndRegister() {
    sim_->Start();
    StartModule();
    ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
    ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered; }));
  }

  void StopModule() {
    module_.Stop();
  }

  // The kubelet simulator has seen `n` registrations of the driver (over its restarts).
  bool WaitForRegistrations(int n) {
    return h_.OffLoop([&] {
      return sim_->WaitFor([n](const sim::KubeletState& s) {
        const auto* d = s.FindDraDriver(kDriverName);
        return d != nullptr && d->registrations >= n;
      }, seconds(20));
    });
  }

  const DraComputeDomainState* State() { return h_.bus.Latest<DraComputeDomainState>(); }

  // Driver-managed IMEX (HostManagedIMEX off) with tools/sim/imex's fake daemon on a loopback
  // address of its own; the node registers in status.nodes (ComputeDomainCliques off: the gate
  // is covered by the integration test).
  DraComputeDomainModule::Config DriverManaged() {
    h_.site.gates.Set(gates::kHostManagedIMEX, false);
    h_.site.gates.Set(gates::kComputeDomainCliques, false);
    DraComputeDomainModule::Config config;
    const std::string sim_dir = std::string(std::getenv("GNS_SOURCE_DIR")) + "/tools/sim/imex/";
    config.driver_managed.daemon.daemon_path = sim_dir + "nvidia-imex";
    config.driver_managed.daemon.ctl_path = sim_dir + "nvidia-imex-ctl";
    config.driver_managed.daemon.probe_interval = std::chrono::milliseconds(50);
    config.driver_managed.node_address = "127.0.77." + std::to_string(1 + ::getpid() % 200);
    config.driver_managed.server_port = static_cast<uint16_t>(40000 + ::getpid() % 10000);
    config.driver_managed.cmd_port = static_cast<uint16_t>(config.driver_managed.server_port + 1);
    config.driver_managed.ready_wait = std::chrono::milliseconds(200);
    return config;
  }

  // The Node's computeDomain label ("" when absent).
  std::string DomainLabel() {
    return Get("/api/v1/nodes/" + std::string(kModuleNode))
        .value(json::json_pointer("/metadata/labels/resource.nvidia.com~1computeDomain"), std::string());
  }
  // This node's entry in the domain's status.nodes ({} when absent).
  json DomainEntry() {
    const auto nodes = Get(kModuleDomains + "/train-a").value(json::json_pointer("/status/nodes"), json::array());
    return nodes.size() == 1 ? nodes[0] : json::object();
  }
  // The controller's verdict, written by hand (no controller runs here).
  void MarkDomainReady() {
    auto domain = Get(kModuleDomains + "/train-a");
    domain["status"]["status"] = "Ready";
    ASSERT_EQ(api_->Call("PUT", kModuleDomains + "/train-a/status", domain.dump()).status, 200);
  }

  sim::DraPrepareResult Prepare(const std::vector<sim::DraClaim>& claims) {
    return h_.OffLoop([&] { return sim_->NodePrepareResources(kDriver, claims); });
  }
  sim::DraPrepareResult Prepare(const std::vector<sim::DraClaim>& claims, sim::DraVersion version) {
    return h_.OffLoop([&] { return sim_->NodePrepareResources(kDriver, claims, version); });
  }
  sim::DraUnprepareResult Unprepare(const std::vector<sim::DraClaim>& claims) {
    return h_.OffLoop([&] { return sim_->NodeUnprepareResources(kDriver, claims); });
  }

  // The per-claim error of a one-claim prepare ("" on success).
  std::string PrepareError(const sim::DraClaim& claim) {
    const auto result = Prepare({claim});
    EXPECT_TRUE(result.ok()) << result.status.ToString();
    const auto it = result.claims.find(claim.uid);
    if (it == result.claims.end()) return "<no entry>";
    return it->second.error;
  }

  // What a restart would recover: the checkpoint with the claim log replayed over it.
  Checkpoint Claims() const { return LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file).state; }

  std::string SpecPath(const std::string& uid) const { return JoinPath(paths_.cdi_dir, CdiSpecFileName(uid)); }

  double Metric(const char* name, MetricLabels labels) {
    return h_.metrics.Counter(name, "", std::move(labels)).Value();
  }
  double Prepares(const char* result) {
    return Metric("gpu_node_supervisor_dra_prepares_total", {{"driver", kDriver}, {"result", result}});
  }

  gns::test::TempDir tmp_;
  fs::path dir_{tmp_.Path()};
  gns::test::LoopHarness h_;
  DriverPaths paths_;
  std::unique_ptr<gns::test::ApiSim> api_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::shared_ptr<kube::EventRecorder> events_;
  std::unique_ptr<sim::KubeletSim> sim_;
  gns::test::ModuleUnderTest<DraComputeDomainModule> module_{h_};
  std::string node_uid_;
  std::string domain_uid_;
};

// ------------------------------------------------------------------------------ registration

TEST_F(DraModuleTest, RegistersThroughThePluginWatcherWithV1First) {
  StartAndRegister();
  const auto driver = sim_->DraDriver(kDriver);
  ASSERT_TRUE(driver && driver->Latest());
  EXPECT_EQ(driver->Latest()->service, "v1.DRAPlugin");
  EXPECT_EQ(driver->Latest()->endpoint, paths_.dra_socket);
  EXPECT_EQ(driver->Latest()->supported_versions, (std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin"}));
  EXPECT_EQ(driver->health_streams, 0) << "no device health: the KEP-4680 service is neither advertised nor dialled";
  EXPECT_TRUE(State()->host_managed);
  EXPECT_EQ(State()->channel_major, kMajor);

  StopModule();
  EXPECT_FALSE(fs::exists(paths_.dra_socket));
  EXPECT_FALSE(fs::exists(paths_.registration_socket));
}

TEST_F(DraModuleTest, AV1beta1OnlyKubeletRegistersAndPrepares) {
  sim::KubeletSimOptions options;
  options.kubelet_dir = h_.site.paths.kubelet_dir;
  options.dra_services = {std::string(sim::kDraV1beta1Service)};
  sim_ = std::make_unique<sim::KubeletSim>(options);
  StartAndRegister();
  EXPECT_EQ(sim_->DraDriver(kDriver)->Latest()->service, "v1beta1.DRAPlugin");
  const auto claim = SeedChannelClaim("old-kubelet");
  const auto result = Prepare({claim});
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  EXPECT_EQ(result.service, "v1beta1.DRAPlugin");
  ASSERT_EQ(result.claims.at(claim.uid).error, "");
  EXPECT_EQ(result.claims.at(claim.uid).devices.at(0).cdi_device_ids,
            std::vector<std::string>{CdiQualifiedDeviceId(claim.uid)});
  const auto unprepared = Unprepare({claim});
  ASSERT_TRUE(unprepared.ok());
  EXPECT_EQ(unprepared.claims.at(claim.uid), "");
}

// ------------------------------------------------------------------------------ ResourceSlice

TEST_F(DraModuleTest, PublishesChannelZeroWithCliqueAndRecreatesTheSliceAfterDeletion) {
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return State()->slice_publishes >= 1 && State()->slice_generation >= 1; }));
  const std::string path = kSlices + "/" + ResourceSliceName(kModuleNode);
  const json slice = Get(path);
  EXPECT_EQ(slice["spec"]["driver"], kDriver);
  EXPECT_EQ(slice["spec"]["nodeName"], kModuleNode);
  EXPECT_EQ(slice["spec"]["pool"]["name"], kModuleNode);
  ASSERT_EQ(slice["spec"]["devices"].size(), 1u) << slice.dump();  // no daemon device under the gate
  const json& device = slice["spec"]["devices"][0];
  EXPECT_EQ(device["name"], "channel-0");
  EXPECT_EQ(device["attributes"]["type"]["string"], "channel");
  EXPECT_EQ(device["attributes"]["id"]["int"], 0);
  EXPECT_EQ(device["attributes"]["cliqueID"]["string"], kModuleClique);
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], node_uid_);
  const int64_t generation = slice["spec"]["pool"]["generation"];

  // The kubelet wipes the node's slices when it starts: the informer sees the deletion.
  ASSERT_EQ(api_->Call("DELETE", path).status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return State()->slice_publishes >= 2; }));
  const json again = Get(path);
  EXPECT_GT(again["spec"]["pool"]["generation"].get<int64_t>(), generation);
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_slice_publishes_total", {{"driver", kDriver}, {"result", "created"}}), 2);
  EXPECT_EQ(again["spec"]["devices"][0]["attributes"]["cliqueID"]["string"], kModuleClique);

  // A clique change is republished with a higher generation.
  const auto publishes = State()->slice_publishes;
  h_.bus.Publish(gpu_inventory::NodeClique{"7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.1", "", true});
  ASSERT_TRUE(h_.RunUntil([&] { return State()->slice_publishes > publishes; }));
  const json changed = Get(path);
  EXPECT_EQ(changed["spec"]["devices"][0]["attributes"]["cliqueID"]["string"],
            "7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.1");
  EXPECT_GT(changed["spec"]["pool"]["generation"].get<int64_t>(), again["spec"]["pool"]["generation"].get<int64_t>());
}

// ------------------------------------------------------------------------------ prepare / unprepare

TEST_F(DraModuleTest, PrepareWritesTheCdiSpecAndCheckpointAndReturnsTheCdiId) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("train-a-pod-0-imex");
  const auto result = Prepare({claim});
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  EXPECT_EQ(result.service, "v1.DRAPlugin");
  const auto& answer = result.claims.at(claim.uid);
  ASSERT_EQ(answer.error, "");
  ASSERT_EQ(answer.devices.size(), 1u);
  EXPECT_EQ(answer.devices[0].pool_name, kModuleNode);
  EXPECT_EQ(answer.devices[0].device_name, "channel-0");
  EXPECT_EQ(answer.devices[0].request_names, std::vector<std::string>{"channel"});
  EXPECT_EQ(answer.devices[0].cdi_device_ids, std::vector<std::string>{CdiQualifiedDeviceId(claim.uid)});

  const json spec = json::parse(ReadFile(SpecPath(claim.uid)));
  EXPECT_EQ(spec["kind"], "k8s.compute-domain.nvidia.com/claim");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia-caps-imex-channels/channel0");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["major"], kMajor);

  // The durable record: one claim-log append over the checkpoint the start wrote.
  const auto loaded = LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file);
  ASSERT_EQ(loaded.checkpoint.status, CheckpointStatus::kLoaded);
  ASSERT_EQ(loaded.log.records.size(), 1u);
  const auto* entry = loaded.state.Find(claim.uid);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->state, ClaimState::kPrepareCompleted);
  EXPECT_EQ(DomainUidOf(*entry), domain_uid_);
  EXPECT_EQ(entry->namespace_name, kModuleNs);

  // §14.1: no node labels under the gate.
  EXPECT_FALSE(Get("/api/v1/nodes/" + std::string(kModuleNode))["metadata"].contains("labels"));
  EXPECT_EQ(Prepares("ok"), 1);
  ASSERT_TRUE(h_.RunUntil([&] { return State()->prepared_claims.size() == 1; }));
  EXPECT_EQ(State()->prepared_claims[0].state, "PrepareCompleted");
  // As /debug/state shows it.
  const json state = *State();
  EXPECT_EQ(state["preparedClaims"][claim.uid]["state"], "PrepareCompleted");
  EXPECT_EQ(state["preparedClaims"][claim.uid]["claim"], "team-a/train-a-pod-0-imex");
  EXPECT_EQ(state["registered"], true);
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_dra_checkpoint_entries", "", {{"driver", kDriver}}).Value(), 1);
}

// §14.1 "channel prepare skips AssertComputeDomainReady": under the gate a ComputeDomain that
// exists is enough, NotReady and without nodes as it is before its first workload runs.
TEST_F(DraModuleTest, AComputeDomainThatIsNotReadyStillPrepares) {
  StartAndRegister();
  json domain = Get(kModuleDomains + "/train-a");
  domain["status"] = {{"status", "NotReady"}, {"nodes", json::array()}};
  ASSERT_EQ(api_->Call("PUT", kModuleDomains + "/train-a/status", domain.dump()).status, 200);
  ASSERT_EQ(Get(kModuleDomains + "/train-a")["status"]["status"], "NotReady");
  const auto claim = SeedChannelClaim("not-ready-domain");
  EXPECT_EQ(PrepareError(claim), "");
  EXPECT_TRUE(fs::exists(SpecPath(claim.uid)));
}

TEST_F(DraModuleTest, PrepareIsIdempotentAndAnswersFromTheCheckpoint) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("idem");
  const auto first = Prepare({claim});
  ASSERT_EQ(first.claims.at(claim.uid).error, "");
  // Even with the claim gone from the API, a repeated Prepare answers the same from the
  // checkpoint (the kubelet lost our answer) without a request. The ResourceSlice's own GETs
  // (Node, slice) are done first: they are not the prepare's.
  ASSERT_TRUE(h_.RunUntil([&] { return State()->slice_publishes >= 1; }));
  h_.Drain();
  ASSERT_EQ(api_->Call("DELETE", kClaims + "/idem").status, 200);
  api_->ResetRequestCounts();
  const auto second = Prepare({claim}, sim::DraVersion::kV1beta1);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second.claims.at(claim.uid).error, "");
  EXPECT_EQ(second.claims.at(claim.uid).devices.at(0).cdi_device_ids,
            first.claims.at(claim.uid).devices.at(0).cdi_device_ids);
  EXPECT_EQ(api_->RequestCount("get"), 0u);
  EXPECT_EQ(Prepares("already_prepared"), 1);
}

TEST_F(DraModuleTest, TheClaimAndItsNamespacesDomainsAreFetchedAtOnce) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("at-once");
  ASSERT_TRUE(h_.RunUntil([&] { return State()->slice_publishes >= 1; }));  // its requests are not ours
  h_.Drain();
  // The simulator counts a request when it arrives and its answer after the delay: both counted
  // with no answer yet can only be seen when the GET and the LIST are in flight together (sent one
  // after the other, the LIST would arrive after the GET's answer).
  api_->ResetRequestCounts();
  api_->SetResponseDelay(std::chrono::milliseconds(5000));
  auto prepare = std::async(std::launch::async, [&] { return sim_->NodePrepareResources(kDriver, {claim}); });
  const bool both_in_flight = h_.RunUntil([&] {
    return api_->RequestCount("get") >= 1 && api_->RequestCount("list") >= 1 && api_->ResponseCounts().empty();
  });
  api_->SetResponseDelay(std::chrono::milliseconds(0));
  EXPECT_TRUE(both_in_flight) << "requests " << ::testing::PrintToString(api_->RequestCounts()) << ", answers "
                              << ::testing::PrintToString(api_->ResponseCounts());
  ASSERT_TRUE(h_.RunUntil([&] { return prepare.wait_for(seconds(0)) == std::future_status::ready; }, seconds(30)));
  const auto result = prepare.get();
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  EXPECT_EQ(result.claims.at(claim.uid).error, "");
  EXPECT_EQ(Prepares("ok"), 1);
}

TEST_F(DraModuleTest, UnprepareRemovesSpecAndEntryAndIsIdempotent) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("unprep");
  ASSERT_EQ(PrepareError(claim), "");
  ASSERT_TRUE(fs::exists(SpecPath(claim.uid)));
  // §14.1: under the gate unprepare removes no node label either. The domain label is set here
  // (as a driver-managed prepare, or an operator, would have set it) so removing it would show.
  const json label_patch = {{"metadata", {{"labels", {{"resource.nvidia.com/computeDomain", domain_uid_}}}}}};
  ASSERT_EQ(api_->Call("PATCH", "/api/v1/nodes/" + std::string(kModuleNode), label_patch.dump(),
                       "application/merge-patch+json")
                .status,
            200);
  ASSERT_EQ(DomainLabel(), domain_uid_);

  auto result = Unprepare({claim});
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  EXPECT_EQ(result.claims.at(claim.uid), "");
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  EXPECT_EQ(Claims().Find(claim.uid), nullptr);

  result = Unprepare({claim});  // again: nothing left, still success
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.claims.at(claim.uid), "");
  const sim::DraClaim never{kModuleNs, "0b0b0b0b-0000-4000-8000-00000000abcd", "never-prepared"};
  result = Unprepare({never});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.claims.at(never.uid), "");

  // Channel 0 is free again: another claim prepares.
  EXPECT_EQ(PrepareError(SeedChannelClaim("next", nullptr)), "");  // allocationMode absent is Single
  EXPECT_EQ(DomainLabel(), domain_uid_) << "unprepare under the gate touches no node label";
}

// ------------------------------------------------------------------------------ §13 / §14.1

TEST_F(DraModuleTest, AllocationModeAllAndUnknownModesArePermanentErrors) {
  StartAndRegister();
  const auto all = SeedChannelClaim("mode-all", "All");
  const auto error_all = PrepareError(all);
  EXPECT_NE(error_all.find("allocationMode: \"All\" is not supported under HostManagedIMEX"), std::string::npos)
      << error_all;
  const auto foo = SeedChannelClaim("mode-foo", "foo");
  const auto error_foo = PrepareError(foo);
  EXPECT_NE(error_foo.find("allocationMode: \"foo\" is not supported"), std::string::npos) << error_foo;
  EXPECT_EQ(Prepares("permanent_error"), 2);
  EXPECT_TRUE(ListCdiSpecClaimUids(paths_.cdi_dir).claim_uids.empty());
  EXPECT_EQ(Claims().claims.size(), 0u);
}

TEST_F(DraModuleTest, EmptyCliqueIsAPermanentErrorNamingTheMissingClique) {
  StartAndRegister();
  h_.bus.Publish(gpu_inventory::NodeClique{"", "GPU 0 fabric state is not completed", true});
  ASSERT_TRUE(h_.RunUntil([&] { return State()->clique_id.empty(); }));
  const auto claim = SeedChannelClaim("no-clique");
  const auto error = PrepareError(claim);
  EXPECT_NE(error.find(kNoCliqueMessage), std::string::npos) << error;
  EXPECT_NE(error.find("ResourceClaim team-a/no-clique"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  EXPECT_EQ(Prepares("permanent_error"), 1);
}

TEST_F(DraModuleTest, BeforeTheCliqueIsKnownAPrepareWaitsForItThenSucceeds) {
  // Right after start gpu-inventory has not read NVML's fabric info yet.
  h_.bus.Publish(gpu_inventory::NodeClique{"", "NVML unavailable: opening", false});
  StartAndRegister();
  EXPECT_FALSE(State()->clique_known);
  const auto claim = SeedChannelClaim("early");
  auto prepare = std::async(std::launch::async, [&] { return sim_->NodePrepareResources(kDriver, {claim}); });
  ASSERT_TRUE(h_.RunUntil([&] { return State()->waiting_for_clique == 1; }));
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  h_.bus.Publish(gpu_inventory::NodeClique{kModuleClique, "", true});
  ASSERT_TRUE(h_.RunUntil([&] { return prepare.wait_for(seconds(0)) == std::future_status::ready; }));
  const auto result = prepare.get();
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  EXPECT_EQ(result.claims.at(claim.uid).error, "");
  EXPECT_TRUE(fs::exists(SpecPath(claim.uid)));
  h_.Drain();
  EXPECT_EQ(State()->waiting_for_clique, 0u);
  EXPECT_TRUE(State()->clique_known);
  EXPECT_EQ(Prepares("permanent_error"), 0);
}

TEST_F(DraModuleTest, ACliqueStillUnknownAtTheDeadlineIsARetryableErrorThatSaysSo) {
  h_.bus.Publish(gpu_inventory::NodeClique{"", "NVML unavailable: libnvidia-ml.so.1: not found", false});
  sim_->Start();
  DraComputeDomainModule::Config config;
  config.prepare_timeout = std::chrono::milliseconds(300);  // the bound of the wait
  StartModule(config);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  const auto claim = SeedChannelClaim("too-early");
  const auto error = PrepareError(claim);
  EXPECT_NE(error.find(kCliqueUnknownMessage), std::string::npos) << error;
  EXPECT_NE(error.find("libnvidia-ml.so.1: not found"), std::string::npos) << error;
  EXPECT_EQ(error.find(kNoCliqueMessage), std::string::npos) << error;
  EXPECT_EQ(Prepares("retryable_error"), 1);
  EXPECT_EQ(Prepares("permanent_error"), 0);
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  // Once the fabric is read, the kubelet's retry prepares it.
  h_.bus.Publish(gpu_inventory::NodeClique{kModuleClique, "", true});
  h_.Drain();
  EXPECT_EQ(PrepareError(claim), "");
}

TEST_F(DraModuleTest, DaemonConfigIsAPermanentError) {
  StartAndRegister();
  json daemon{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "ComputeDomainDaemonConfig"},
              {"domainID", domain_uid_}};
  json claim = ChannelClaim("daemon-claim", daemon);
  claim["status"]["allocation"]["devices"]["results"][0]["device"] = "daemon-0";
  const auto uid = SeedClaim(claim);
  const auto error = PrepareError({kModuleNs, uid, "daemon-claim"});
  EXPECT_NE(error.find(kDaemonDisabledMessage), std::string::npos) << error;
}

TEST_F(DraModuleTest, ASecondChannelClaimOnTheNodeConflicts) {
  StartAndRegister();
  const auto first = SeedChannelClaim("first");
  const auto second = SeedChannelClaim("second");
  ASSERT_EQ(PrepareError(first), "");
  const auto error = PrepareError(second);
  EXPECT_NE(error.find("channel-0 is already prepared for claim team-a/first"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(SpecPath(second.uid)));
  EXPECT_EQ(Prepares("retryable_error"), 1);
  // Both in one call: the first is answered from the checkpoint, the second conflicts.
  const auto both = Prepare({first, second});
  EXPECT_EQ(both.claims.at(first.uid).error, "");
  EXPECT_NE(both.claims.at(second.uid).error, "");
}

TEST_F(DraModuleTest, ConcurrentPreparesAreSerialisedSoOnlyOneClaimGetsTheChannel) {
  StartAndRegister();
  const auto a = SeedChannelClaim("race-a");
  const auto b = SeedChannelClaim("race-b");
  // Two kubelet calls at once (two pods admitted together): one at a time per node, so the
  // second sees the first's checkpoint entry and conflicts.
  const auto [ra, rb] = h_.OffLoop([&] {
    auto fa = std::async(std::launch::async, [&] { return sim_->NodePrepareResources(kDriver, {a}); });
    auto fb = std::async(std::launch::async, [&] { return sim_->NodePrepareResources(kDriver, {b}); });
    return std::make_pair(fa.get(), fb.get());
  });
  ASSERT_TRUE(ra.ok() && rb.ok());
  const std::string ea = ra.claims.at(a.uid).error;
  const std::string eb = rb.claims.at(b.uid).error;
  EXPECT_TRUE(ea.empty() != eb.empty()) << "a: " << ea << "\nb: " << eb;
  EXPECT_NE((ea.empty() ? eb : ea).find("already prepared for claim"), std::string::npos);
  EXPECT_EQ(Claims().claims.size(), 1u);
  EXPECT_EQ(ListCdiSpecClaimUids(paths_.cdi_dir).claim_uids.size(), 1u);
}

TEST_F(DraModuleTest, AMissingComputeDomainOrClaimIsAnError) {
  StartAndRegister();
  const auto orphan =
      SeedClaim(ChannelClaim("no-domain", ModuleChannelParams("d0d0d0d0-0000-4000-8000-0000000000ff")));
  const auto error = PrepareError({kModuleNs, orphan, "no-domain"});
  EXPECT_NE(error.find("ComputeDomain with UID d0d0d0d0-0000-4000-8000-0000000000ff not found"), std::string::npos)
      << error;

  const sim::DraClaim missing{kModuleNs, "0b0b0b0b-0000-4000-8000-00000000ffff", "not-there"};
  const auto missing_error = PrepareError(missing);
  EXPECT_NE(missing_error.find("ResourceClaim team-a/not-there: not found"), std::string::npos) << missing_error;

  // A claim recreated under the same name is not the one the kubelet asked for.
  const auto stale = SeedChannelClaim("recreated");
  const auto uid_error = PrepareError({kModuleNs, "0b0b0b0b-0000-4000-8000-00000000eeee", "recreated"});
  EXPECT_NE(uid_error.find("metadata.uid is \"" + stale.uid + "\""), std::string::npos) << uid_error;
  EXPECT_TRUE(ListCdiSpecClaimUids(paths_.cdi_dir).claim_uids.empty());
}

// Driver-managed IMEX (issue #16) on one node, with tools/sim/imex's fake daemon: the first
// prepare labels the Node, registers it in status.nodes and starts the domain's daemon, and
// answers "not Ready yet"; once the domain is Ready (the controller's verdict, written here by
// the test) the prepare succeeds; a restart of the module resumes the domain from its record;
// the last unprepare stops the daemon, deregisters the node and removes the label.
TEST_F(DraModuleTest, WithoutTheGateTheNodeJoinsItsDomainAndPreparesOnceItIsReady) {
  sim_->Start();
  const DraComputeDomainModule::Config config = DriverManaged();
  StartModule(config);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  EXPECT_FALSE(State()->host_managed);

  const auto claim = SeedChannelClaim("gate-off");
  // Retryable until the domain is Ready: first while this node registers, then "not Ready yet".
  std::string first;
  ASSERT_TRUE(h_.RunUntil([&] {
    first = PrepareError(claim);
    return first.find("ComputeDomain team-a/train-a is not Ready yet") != std::string::npos;
  })) << first;
  EXPECT_NE(first.find("the kubelet retries"), std::string::npos) << first;
  const auto label = [&] { return DomainLabel(); };
  const auto entry = [&] { return DomainEntry(); };
  EXPECT_EQ(label(), domain_uid_);
  ASSERT_TRUE(h_.RunUntil([&] { return entry().value("status", "") == "Ready"; })) << entry().dump();
  EXPECT_EQ(entry()["name"], kModuleNode);
  EXPECT_EQ(entry()["cliqueID"], kModuleClique);
  EXPECT_EQ(entry()["ipAddress"], config.driver_managed.node_address);
  EXPECT_EQ(entry()["index"], 0);
  // Applied (server-side apply on /status) under this node's own field manager, which owns it.
  const json applied = Get(kModuleDomains + "/train-a");
  bool owned = false;
  for (const auto& m : applied["metadata"]["managedFields"]) {
    const json items = m.value(json::json_pointer("/fieldsV1/f:status/f:nodes"), json::object());
    owned = owned || (m.value("manager", "") == "gpu-node-supervisor/" + std::string(kModuleNode) &&
                      m.value("subresource", "") == "status" &&
                      items.contains("k:{\"name\":\"" + std::string(kModuleNode) + "\"}"));
  }
  EXPECT_TRUE(owned) << applied["metadata"].dump();
  const std::string domain_dir = paths_.state_dir + "/domains/" + domain_uid_;
  EXPECT_EQ(ReadFile(domain_dir + "/nodes_config.cfg"), config.driver_managed.node_address + "\n");
  EXPECT_NE(ReadFile(domain_dir + "/config.cfg").find("SERVER_PORT=" + std::to_string(config.driver_managed.server_port)),
            std::string::npos);

  // The controller's verdict (written by hand here): the next prepare injects the channel.
  MarkDomainReady();
  std::string error = "not tried";
  ASSERT_TRUE(h_.RunUntil([&] { return (error = PrepareError(claim)).empty(); })) << error;
  EXPECT_TRUE(fs::exists(SpecPath(claim.uid)));

  // A restart resumes the domain from its record: the registration stays, the daemon runs again.
  StopModule();
  EXPECT_EQ(label(), domain_uid_);
  EXPECT_FALSE(entry().empty());
  StartModule(config);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  EXPECT_EQ(PrepareError(claim), "");  // from the checkpoint
  ASSERT_TRUE(h_.RunUntil([&] { return entry().value("status", "") == "Ready"; }));

  // The last claim goes: daemon stopped, node deregistered, label removed, files removed.
  const auto unprepared = Unprepare({claim});
  ASSERT_TRUE(unprepared.ok());
  EXPECT_EQ(unprepared.claims.at(claim.uid), "");
  ASSERT_TRUE(h_.RunUntil([&] { return entry().empty() && label().empty() && !fs::exists(domain_dir); }))
      << entry().dump() << " label " << label();
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
}

// Issue #23 item 1: an allocationMode "All" channel claim in driver-managed mode (a domain made
// with spec.channel.allocationMode All), alone and then beside a Single claim of the same
// domain: once the domain is Ready every channel 0..allChannels-1 is injected (one CDI device),
// and the All claim's unprepare leaves the daemon, label and registration to the Single claim.
// (Before: the module read the claim's domain UID with the host-managed allowlist, never looked
// the domain up, and answered "cannot look up ComputeDomain …: not looked up" forever.)
TEST_F(DraModuleTest, WithoutTheGateAnAllClaimGetsEveryChannelAndLeavesTheDomainToItsSingleClaim) {
  sim_->Start();
  DraComputeDomainModule::Config config = DriverManaged();
  config.all_channels = 4;
  StartModule(config);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));

  const auto all = SeedChannelClaim("mode-all", "All");
  std::string error;
  ASSERT_TRUE(h_.RunUntil([&] {
    error = PrepareError(all);
    return error.find("ComputeDomain team-a/train-a is not Ready yet") != std::string::npos;
  })) << error;
  EXPECT_EQ(DomainLabel(), domain_uid_);
  ASSERT_TRUE(h_.RunUntil([&] { return DomainEntry().value("status", "") == "Ready"; })) << DomainEntry().dump();
  MarkDomainReady();
  ASSERT_TRUE(h_.RunUntil([&] { return (error = PrepareError(all)).empty(); })) << error;

  // One CDI device with channel0..channel3, each c <major>:<n>, 0666.
  const json spec = json::parse(ReadFile(SpecPath(all.uid)));
  ASSERT_EQ(spec["devices"].size(), 1u) << spec.dump();
  EXPECT_EQ(spec["devices"][0]["name"], all.uid + "-channel-0");
  const json nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(nodes.size(), 4u) << spec.dump();
  for (uint32_t n = 0; n < 4; ++n) {
    EXPECT_EQ(nodes[n]["path"], "/dev/nvidia-caps-imex-channels/channel" + std::to_string(n));
    EXPECT_EQ(nodes[n]["type"], "c");
    EXPECT_EQ(nodes[n]["major"], kMajor);
    EXPECT_EQ(nodes[n]["minor"], n);
    EXPECT_EQ(nodes[n]["fileMode"], 0666);
  }
  ASSERT_EQ(Claims().claims.count(all.uid), 1u);
  EXPECT_EQ(ChannelsOf(Claims().claims.at(all.uid)), 4u);

  // A Single claim of the same domain beside it: channel 0 only, the same registration.
  const auto single = SeedChannelClaim("mode-single");
  EXPECT_EQ(PrepareError(single), "");
  const json single_spec = json::parse(ReadFile(SpecPath(single.uid)));
  EXPECT_EQ(single_spec["devices"][0]["containerEdits"]["deviceNodes"].size(), 1u) << single_spec.dump();
  const json entry = DomainEntry();

  // The All claim goes first: the Single claim keeps the domain here.
  const auto unprepared = Unprepare({all});
  ASSERT_TRUE(unprepared.ok());
  EXPECT_EQ(unprepared.claims.at(all.uid), "");
  EXPECT_FALSE(fs::exists(SpecPath(all.uid)));
  const auto record = LoadDomainRecord(paths_.state_dir + "/domains.json");
  ASSERT_EQ(record.status, RecordLoad::kLoaded) << record.error;
  ASSERT_EQ(record.record.domains.count(domain_uid_), 1u);
  const auto& kept = record.record.domains.at(domain_uid_).claims;
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept.count(single.uid), 1u);
  // Not torn down: another claim of the domain prepares at once (the daemon still runs and is
  // ready), and the label and the node's entry are as they were.
  const auto late = SeedChannelClaim("late-single");
  EXPECT_EQ(PrepareError(late), "");
  EXPECT_EQ(DomainLabel(), domain_uid_);
  EXPECT_EQ(DomainEntry(), entry);
  EXPECT_TRUE(fs::exists(paths_.state_dir + "/domains/" + domain_uid_ + "/config.cfg"));

  // The last claims go: now the domain leaves the node.
  ASSERT_TRUE(Unprepare({single, late}).ok());
  ASSERT_TRUE(h_.RunUntil([&] {
    return DomainEntry().empty() && DomainLabel().empty() && !fs::exists(paths_.state_dir + "/domains/" + domain_uid_);
  })) << DomainEntry().dump();
}

// ------------------------------------------------------------------------------ restart paths

TEST_F(DraModuleTest, ACrashBetweenPrepareStartedAndCompletedIsRolledBackOnStart) {
  const auto claim = SeedChannelClaim("crashed");
  // What a crash after "save PrepareStarted → write CDI spec" leaves behind, plus an orphan spec.
  Checkpoint checkpoint;
  PreparedClaim entry;
  entry.uid = claim.uid;
  entry.namespace_name = kModuleNs;
  entry.name = "crashed";
  entry.state = ClaimState::kPrepareStarted;
  SetChannelClaimFields(entry, domain_uid_, 1);
  entry.device = "channel-0";
  entry.pool_name = kModuleNode;
  entry.request_names = {"channel"};
  entry.cdi_spec_file = CdiSpecFileName(claim.uid);
  entry.cdi_device_id = CdiQualifiedDeviceId(claim.uid);
  entry.started_unix_ms = 1;
  checkpoint.claims[claim.uid] = entry;
  ASSERT_TRUE(SaveCheckpoint(paths_.checkpoint_file, checkpoint));
  ASSERT_TRUE(WriteChannelCdiSpec(paths_.cdi_dir, claim.uid, kMajor));
  const std::string orphan = "0b0b0b0b-0000-4000-8000-000000000a11";
  ASSERT_TRUE(WriteChannelCdiSpec(paths_.cdi_dir, orphan, kMajor));

  StartAndRegister();
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  EXPECT_FALSE(fs::exists(SpecPath(orphan)));
  EXPECT_EQ(Claims().claims.size(), 0u);
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_reconciled_total", {{"action", "rollback_prepare_started"}}), 1);
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_reconciled_total", {{"action", "delete_orphan_spec"}}), 1);

  // The kubelet retries the prepare it never got an answer for.
  EXPECT_EQ(PrepareError(claim), "");
  EXPECT_TRUE(fs::exists(SpecPath(claim.uid)));
  EXPECT_EQ(Claims().Find(claim.uid)->state, ClaimState::kPrepareCompleted);
}

TEST_F(DraModuleTest, OurInterruptedSpecWritesAreRemovedOnStartAndOtherProducersFilesAreNot) {
  fs::create_directories(paths_.cdi_dir);
  auto touch = [&](const std::string& name) { std::ofstream(JoinPath(paths_.cdi_dir, name)) << "{}"; };
  const std::string uid = "0b0b0b0b-0000-4000-8000-000000000b22";
  // A crash between creating our temp file and the rename (an earlier process, pid 77777).
  const std::string ours = AtomicWriteTempName(CdiSpecFileName(uid), 77777, 4);
  touch(ours);
  // Files of the shared directory's other producers, temp files included.
  const std::vector<std::string> foreign = {"nvidia.yaml", "nvidia.yaml.tmp.77777.4", "nvidia.json.tmp",
                                            "k8s.gpu.nvidia.com-claim_x.json.tmp.1.2", "other.tmp123"};
  for (const auto& name : foreign) touch(name);

  StartAndRegister();
  EXPECT_FALSE(fs::exists(JoinPath(paths_.cdi_dir, ours)));
  for (const auto& name : foreign) EXPECT_TRUE(fs::exists(JoinPath(paths_.cdi_dir, name))) << name;
  EXPECT_TRUE(ListCdiSpecClaimUids(paths_.cdi_dir).claim_uids.empty());
}

TEST_F(DraModuleTest, ACompletedClaimSurvivesARestart) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("survivor");
  ASSERT_EQ(PrepareError(claim), "");
  StopModule();
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->prepared_claims.size() == 1; }));
  EXPECT_TRUE(fs::exists(SpecPath(claim.uid)));
  ASSERT_TRUE(WaitForRegistrations(2));
  EXPECT_EQ(PrepareError(claim), "");
  EXPECT_EQ(Prepares("already_prepared"), 1);
}

// Issue #24 §6: the checkpoint and the claim log are read on the pool, not on the loop (a large
// log or a slow disk once stalled every module and /healthz). While they load the loop serves,
// the module says it is loading (not ready), and the kubelet cannot reach it: no socket, no
// registration, so no NodePrepare is answered without the claims it must know. Once they are
// back the prepared claim is known and answered as such: never prepared twice.
TEST_F(DraModuleTest, TheClaimStateIsReadOffTheLoopAndNothingIsServedBeforeIt) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("loaded");
  ASSERT_EQ(PrepareError(claim), "");
  StopModule();
  ASSERT_FALSE(fs::exists(paths_.dra_socket));

  gns::test::HeldPool held(h_.pool);  // the read cannot finish
  module_.Start(DraComputeDomainModule::Config{});
  bool served = false;
  h_.loop.Post([&] { served = true; });
  h_.Drain();
  EXPECT_TRUE(served) << "the loop did not turn while the claim state loads";
  EXPECT_TRUE(module_->Loading());
  EXPECT_EQ(module_.health, ModuleHealth::kUnhealthy);
  EXPECT_NE(module_.health_detail.find("loading " + paths_.checkpoint_file), std::string::npos)
      << module_.health_detail;
  EXPECT_FALSE(fs::exists(paths_.dra_socket)) << "served before the claim state was loaded";
  EXPECT_FALSE(fs::exists(paths_.registration_socket));

  held.Release();
  ASSERT_TRUE(h_.RunUntil([&] { return !module_->Loading(); }));
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered && State()->prepared_claims.size() == 1; }));
  EXPECT_TRUE(module_.failures.empty());
  ASSERT_TRUE(WaitForRegistrations(2));
  EXPECT_EQ(PrepareError(claim), "");
  EXPECT_EQ(Prepares("ok"), 1);
  EXPECT_EQ(Prepares("already_prepared"), 1);
}

// A stop while the claim state loads: the late read touches nothing of the gone instance (ASan
// would say), nothing is written, and the next start knows the claim.
TEST_F(DraModuleTest, AStopWhileTheClaimStateLoadsKeepsItForTheNextStart) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("kept");
  ASSERT_EQ(PrepareError(claim), "");
  StopModule();
  {
    gns::test::HeldPool held(h_.pool);
    module_.Start(DraComputeDomainModule::Config{});
    h_.Drain();
    StopModule();
  }
  ASSERT_TRUE(gns::test::FlushPool(h_));  // the late read has come back to no one
  EXPECT_FALSE(fs::exists(paths_.dra_socket));
  EXPECT_NE(LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file).state.Find(claim.uid), nullptr);
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->prepared_claims.size() == 1; }));
  EXPECT_TRUE(module_.failures.empty());
}

TEST_F(DraModuleTest, ACorruptCheckpointIsMovedAsideReportedAndTheModuleStartsClean) {
  WriteFile(paths_.checkpoint_file, "{\"version\": 1, \"data\": {\"claims\": {}}, \"checksum\": 12");
  StartAndRegister();
  // Moved aside; the start wrote a new, valid one (its compaction of checkpoint and claim log).
  EXPECT_EQ(LoadCheckpoint(paths_.checkpoint_file).status, CheckpointStatus::kLoaded);
  bool moved = false;
  for (const auto& file : fs::directory_iterator(paths_.state_dir)) {
    if (file.path().filename().string().starts_with("checkpoint.json.corrupt-")) moved = true;
  }
  EXPECT_TRUE(moved);
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_corrupt_checkpoints_total", {}), 1);
  // The Node Event, as the API holds it.
  json event;
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto list = api_->Call("GET", "/apis/events.k8s.io/v1/namespaces/default/events").Json();
    for (const auto& item : list["items"]) {
      if (item.value("reason", "") == "CorruptCheckpoint") event = item;
    }
    return !event.is_null();
  }));
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["regarding"]["kind"], "Node");
  EXPECT_EQ(event["regarding"]["name"], kModuleNode);
  EXPECT_NE(event["note"].get<std::string>().find("moved to"), std::string::npos);
  EXPECT_TRUE(module_.failures.empty());
  // Clean start: prepares work.
  EXPECT_EQ(PrepareError(SeedChannelClaim("after-corrupt")), "");
}

// ------------------------------------------------------------------------------ the claim log

TEST_F(DraModuleTest, ATornLastAppendIsLoggedAndEveryAcknowledgedClaimSurvives) {
  StartAndRegister();
  const auto kept = SeedChannelClaim("kept");
  ASSERT_EQ(PrepareError(kept), "");
  StopModule();
  // What kill -9 in the middle of the next append leaves: half a record after the last one.
  const auto before = LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file);
  ASSERT_EQ(before.log.records.size(), 1u);
  ClaimLogRecord next{before.log.last_seq + 1, ClaimLogRecord::Op::kUnprepared, {}};
  next.claim.uid = kept.uid;
  const std::string half = EncodeClaimLogRecord(next).substr(0, 30);
  {
    std::fstream log(paths_.claim_log_file, std::ios::in | std::ios::out | std::ios::binary);
    log.seekp(static_cast<std::streamoff>(before.log.end_offset));
    log.write(half.data(), static_cast<std::streamsize>(half.size()));
  }
  ASSERT_FALSE(LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file).log.torn_tail.empty());

  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->prepared_claims.size() == 1; }));
  EXPECT_TRUE(fs::exists(SpecPath(kept.uid)));
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_corrupt_checkpoints_total", {}), 0);
  EXPECT_EQ(State()->last_error, "");
  // The start compacted: the checkpoint holds the claim, the log is fresh.
  const auto after = LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file);
  EXPECT_NE(after.checkpoint.checkpoint.Find(kept.uid), nullptr);
  EXPECT_TRUE(after.log.records.empty());
  EXPECT_TRUE(after.log.torn_tail.empty());
}

TEST_F(DraModuleTest, ADamagedClaimLogIsReportedMovedAsideAndTheModuleServesWhatIsValid) {
  StartAndRegister();
  const auto first = SeedChannelClaim("first");
  const auto second = SeedChannelClaim("second");
  ASSERT_EQ(PrepareError(first), "");                       // seq 1
  ASSERT_EQ(Unprepare({first}).claims.at(first.uid), "");  // seq 2
  ASSERT_EQ(PrepareError(second), "");                      // seq 3
  StopModule();
  // A flipped byte inside the first record: damage in the middle, not a cut append.
  {
    std::fstream log(paths_.claim_log_file, std::ios::in | std::ios::out | std::ios::binary);
    log.seekg(kClaimLogHeaderSize + 15);
    char byte = 0;
    log.read(&byte, 1);
    byte ^= 0x01;
    log.seekp(kClaimLogHeaderSize + 15);
    log.write(&byte, 1);
  }

  StartModule();
  EXPECT_TRUE(module_.failures.empty());  // never a crash loop
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered; }));
  // The records after the damage were applied: the second claim is prepared, its spec is there.
  ASSERT_EQ(State()->prepared_claims.size(), 1u);
  EXPECT_EQ(State()->prepared_claims[0].uid, second.uid);
  EXPECT_TRUE(fs::exists(SpecPath(second.uid)));
  EXPECT_NE(State()->last_error.find("record seq 1 is lost"), std::string::npos) << State()->last_error;
  bool moved = false;
  for (const auto& file : fs::directory_iterator(paths_.state_dir)) {
    if (file.path().filename().string().starts_with("claims.log.corrupt-")) moved = true;
  }
  EXPECT_TRUE(moved);
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_corrupt_checkpoints_total", {}), 1);
  json event;
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto list = api_->Call("GET", "/apis/events.k8s.io/v1/namespaces/default/events").Json();
    for (const auto& item : list["items"]) {
      if (item.value("reason", "") == "CorruptCheckpoint") event = item;
    }
    return !event.is_null();
  }));
  EXPECT_NE(event["note"].get<std::string>().find("claim log"), std::string::npos) << event.dump();
  ASSERT_TRUE(WaitForRegistrations(2));
  // It keeps serving: the prepared claim answers from its record, unprepare works.
  EXPECT_EQ(PrepareError(second), "");
  EXPECT_EQ(Unprepare({second}).claims.at(second.uid), "");
  EXPECT_FALSE(fs::exists(SpecPath(second.uid)));
}

TEST_F(DraModuleTest, AnEmptiedOrStaleSpecOfAPreparedClaimIsMadeAgainAtStart) {
  StartAndRegister();
  const auto claim = SeedChannelClaim("respec");
  ASSERT_EQ(PrepareError(claim), "");
  StopModule();
  // A power loss after the (unsynced) spec write: an empty file; and the driver reloaded with
  // another channel major.
  WriteFile(SpecPath(claim.uid), "");
  WriteFile(paths_.proc_devices, "Character devices:\n511 nvidia-caps-imex-channels\n");
  StartModule();
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->prepared_claims.size() == 1; }));
  const json spec = json::parse(ReadFile(SpecPath(claim.uid)));
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["major"], 511);
  EXPECT_EQ(Metric("gpu_node_supervisor_dra_reconciled_total", {{"action", "rewrite_missing_spec"}}), 1);
}

TEST_F(DraModuleTest, TheClaimLogIsCompactedIntoTheCheckpointAndAppendsStartOver) {
  sim_->Start();
  DraComputeDomainModule::Config config;
  config.claim_log_compact_at = 1500;  // a few records
  StartModule(config);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  std::vector<sim::DraClaim> claims;
  for (int i = 0; i < 6; ++i) {
    claims.push_back(SeedChannelClaim("c" + std::to_string(i)));
    ASSERT_EQ(PrepareError(claims.back()), "");
    if (i < 5) {
      ASSERT_EQ(Unprepare({claims.back()}).claims.at(claims.back().uid), "");
    }
  }
  // 11 records went through the log; compactions moved them into the checkpoint.
  const auto loaded = LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file);
  EXPECT_GT(loaded.checkpoint.checkpoint.log_seq, 0u);
  EXPECT_LT(loaded.log.records.size(), 11u);
  EXPECT_TRUE(loaded.log.torn_tail.empty()) << loaded.log.torn_tail;
  EXPECT_TRUE(loaded.log.corruption.empty());
  EXPECT_EQ(loaded.state.log_seq, 11u);
  ASSERT_EQ(loaded.state.claims.size(), 1u);
  EXPECT_NE(loaded.state.Find(claims.back().uid), nullptr);
  // And a restart reads the same.
  StopModule();
  StartModule(config);
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->prepared_claims.size() == 1; }));
  EXPECT_TRUE(module_.failures.empty());
  EXPECT_EQ(ListCdiSpecClaimUids(paths_.cdi_dir).claim_uids, std::vector<std::string>{claims.back().uid});
}

TEST_F(DraModuleTest, AMissingChannelMajorFailsTheStartClearly) {
  WriteFile(paths_.proc_devices, ProcDevices(false));
  module_.Build(DraComputeDomainModule::Config{});
  try {
    module_->Start();
    FAIL() << "Start did not throw";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("nvidia-caps-imex-channels"), std::string::npos) << what;
    EXPECT_NE(what.find(paths_.proc_devices), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(paths_.dra_socket));
  EXPECT_FALSE(fs::exists(paths_.registration_socket));
  module_.Discard();
  fs::remove(paths_.proc_devices);
  module_.Build(DraComputeDomainModule::Config{});
  EXPECT_THROW(module_->Start(), std::runtime_error);
  module_.Discard();
}

// ------------------------------------------------------------------------------ config

DraComputeDomainModule::Config Parse(const std::string& yaml) {
  const ConfigValue value = ParseYaml(yaml, "site.yaml");
  ConfigMap section(value, "modules.dra-compute-domain");
  auto config = DraComputeDomainModule::ParseConfig(section, SiteConfig{});
  section.Finish();
  return config;
}

TEST(DraModuleConfigTest, DefaultsAndValues) {
  const auto defaults = Parse("");
  EXPECT_EQ(defaults.api_version, ResourceApiVersion::kV1);
  EXPECT_EQ(defaults.prepare_timeout, std::chrono::seconds(20));
  EXPECT_EQ(defaults.slice_resync, std::chrono::minutes(10));
  EXPECT_TRUE(defaults.node_events_on_corrupt_checkpoint);
  const auto set = Parse(
      "driverName: compute-domain.nvidia.com\nresourceApiVersion: v1beta1\nprepareTimeout: 5s\nsliceResync: 1m\n"
      "nodeEventsOnCorruptCheckpoint: false\n");
  EXPECT_EQ(set.api_version, ResourceApiVersion::kV1beta1);
  EXPECT_EQ(set.prepare_timeout, std::chrono::seconds(5));
  EXPECT_EQ(set.slice_resync, std::chrono::minutes(1));
  EXPECT_FALSE(set.node_events_on_corrupt_checkpoint);
}

TEST(DraModuleConfigTest, BadValuesAreRejectedWithTheirPosition) {
  const auto error_of = [](const std::string& yaml) {
    try {
      Parse(yaml);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(error_of("driverName: gpu.nvidia.com\n").find("site.yaml:1:13: modules.dra-compute-domain.driverName: is "
                                                         "fixed to compute-domain.nvidia.com"),
            std::string::npos)
      << error_of("driverName: gpu.nvidia.com\n");
  EXPECT_NE(error_of("resourceApiVersion: v1alpha3\n").find("resourceApiVersion"), std::string::npos);
  EXPECT_NE(error_of("prepareTimeout: 50s\n").find("prepareTimeout"), std::string::npos);
  EXPECT_NE(error_of("unknownKey: 1\n").find("unknownKey"), std::string::npos);
}

// -------------------------------------------------------------- requireImexReady (issue 13)

TEST_F(DraModuleTest, RequireImexReadyFailsPrepareRetryablyWhileHostImexIsNotReady) {
  sim_->Start();
  DraComputeDomainModule::Config config;
  config.require_imex_ready = true;
  StartModule(config);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered; }));
  const auto claim = SeedChannelClaim("train-a-pod-0-imex");
  // imex-health has not judged yet: not ready either.
  EXPECT_NE(PrepareError(claim).find("host IMEX is not ready (imex-health has not judged"), std::string::npos);
  imex_health::ImexHealth verdict;
  verdict.status = "False";
  verdict.reason = "ServiceInactive";
  verdict.message = "nvidia-imex.service is inactive (dead)";
  h_.bus.Publish(verdict);
  h_.Drain();
  EXPECT_NE(PrepareError(claim).find("ServiceInactive: nvidia-imex.service is inactive (dead)"), std::string::npos);
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  EXPECT_EQ(Prepares("retryable_error"), 2);
  verdict.ready = true;
  verdict.status = "True";
  verdict.reason = "ImexHealthy";
  h_.bus.Publish(verdict);
  h_.Drain();
  EXPECT_EQ(PrepareError(claim), "");
  EXPECT_TRUE(fs::exists(SpecPath(claim.uid)));
}

}  // namespace
}  // namespace gns::dra
