// The dra-gpu module (gpu.nvidia.com) end to end: the kubelet simulator's plugin watcher and DRA
// calls through real gRPC on unix sockets, the API simulator serving the Node, the claims and the
// ResourceSlice, gpu-inventory's devices on the bus (two fake GPUs), and the files on disk
// (claim state under <stateDir>/dra-gpu, per-claim CDI specs). Also the site config's GPU split:
// validate-config refuses a GPU given to both DRA and the device plugin.
#include "support/api_sim.hpp"
#include "kubelet_sim.h"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/plugin_paths.hpp"
#include "loop/config.hpp"
#include "loop/site_loader.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/dra_gpu/dra_gpu_module.hpp"
#include "modules/dra_gpu/gpu_claims.hpp"
#include "modules/dra_gpu/messages.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/dra_gpu/gpu_health_view.hpp"
#include "modules/dra_gpu/time_slices.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/kube_module.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/quiet_logger.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gns::dra_gpu::module_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::seconds;

constexpr const char* kNode = "h200-node-01";
constexpr const char* kNs = "team-a";
const std::string kDriver(kDriverName);
const std::string kClaims = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims";
const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

gpu_inventory::GpuInventory TwoGpus() {
  gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  inventory.driver_version = "550.54.15";
  inventory.cuda_driver_version = 12040;
  for (uint32_t i = 0; i < 2; ++i) {
    gpu_inventory::GpuInfo gpu;
    gpu.index = i;
    gpu.minor = i;
    gpu.uuid = "GPU-1111111" + std::to_string(i) + "-2222-3333-4444-555555555555";
    gpu.name = "NVIDIA H200";
    gpu.pci_bus_id = "00000000:" + std::string(i == 0 ? "1B" : "9C") + ":00.0";
    gpu.memory_total_bytes = uint64_t{141} << 30;
    gpu.cc_major = 9;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

// TwoGpus with GPU 1 in MIG mode: two 1g GPU instances (9 at slice 0, 10 at slice 1, profile id
// 19), one compute instance each.
gpu_inventory::GpuInventory OneGpuInMigMode() {
  auto inventory = TwoGpus();
  auto& gpu = inventory.gpus[1];
  gpu.mig_enabled = true;
  for (uint32_t i = 0; i < 2; ++i) {
    gpu_inventory::MigDeviceInfo mig;
    mig.index = i;
    mig.uuid = "MIG-2222222" + std::to_string(i) + "-0000-5000-8000-000000000000";
    mig.gpu_instance = 9 + i;
    mig.profile = "1g.18gb";
    mig.memory_bytes = uint64_t{18} << 30;
    mig.multiprocessors = 16;
    mig.placement_known = true;
    mig.gi_profile_id = 19;
    mig.placement_start = i;
    mig.placement_size = 1;
    gpu.mig_devices.push_back(mig);
  }
  return inventory;
}

// A claim the scheduler allocated `devices` of this node's gpu.nvidia.com pool, with `config`
// (GpuConfig parameters, or null for none).
json GpuClaim(const std::string& name, const std::vector<std::string>& devices, const json& parameters = json()) {
  json results = json::array();
  for (const auto& d : devices) {
    results.push_back({{"request", "gpu"}, {"driver", kDriver}, {"pool", kNode}, {"device", d}});
  }
  json configs = json::array();
  if (!parameters.is_null()) {
    configs.push_back({{"source", "FromClaim"}, {"requests", {"gpu"}}, {"opaque", {{"driver", kDriver}, {"parameters", parameters}}}});
  }
  return json{{"apiVersion", "resource.k8s.io/v1"},
              {"kind", "ResourceClaim"},
              {"metadata", {{"name", name}, {"namespace", kNs}}},
              {"spec", {{"devices", {{"requests", json::array({{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}})}}}}},
              {"status", {{"allocation", {{"devices", {{"results", results}, {"config", configs}}}}}}}};
}

class DraGpuModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_.site.node_name = kNode;
    h_.site.paths.kubelet_dir = dir_ / "k";
    h_.site.paths.cdi_dir = dir_ / "cdi";
    h_.site.paths.state_dir = dir_ / "s";
    h_.site.paths.host_root = dir_ / "h";
    h_.site.gates.Resolve();
    paths_ = dra::MakePluginPaths(h_.site.paths, kDriverName, kStateFolder);
    // A control node on the "host": the claim's spec carries it, as the device plugin's does.
    fs::create_directories(dir_ / "h" / "dev");
    std::ofstream(dir_ / "h" / "dev" / "nvidiactl") << "";

    sim::ApiServerOptions api_options;
    api_options.bookmark_interval = std::chrono::milliseconds(200);
    api_ = std::make_unique<gns::test::ApiSim>(dir_ / "api", api_options);
    kube::ClientConfig config = api_->ClientConfig();
    const auto logger = test::QuietLogger("dra-gpu-test");
    config.request_timeout = std::chrono::milliseconds(5000);
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, logger},
                                                 config);
    informers_ = std::make_shared<kube::InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics, logger);
    events_ = std::make_shared<kube::EventRecorder>(client_, h_.clock, h_.metrics, logger,
                                                    kube::EventRecorderConfig{});
    h_.services.Provide<kube::KubeClient>(client_);
    h_.services.Provide<kube::InformerRegistry>(informers_);
    h_.services.Provide<kube::EventRecorder>(events_);
    api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
    h_.bus.Publish(TwoGpus());

    sim::KubeletSimOptions sim_options;
    sim_options.kubelet_dir = h_.site.paths.kubelet_dir;
    sim_options.registration_retry_initial = std::chrono::milliseconds(50);
    sim_ = std::make_unique<sim::KubeletSim>(sim_options);
  }

  void TearDown() override {
    module_.Stop();
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

  sim::DraClaim Seed(const json& claim) {
    api_->Seed(claim);
    const std::string name = claim["metadata"]["name"];
    return sim::DraClaim{kNs, Get(kClaims + "/" + name)["metadata"]["uid"].get<std::string>(), name};
  }

  void StartModule(DraGpuModule::Config config = {}) {
    module_.Start(config);
    EXPECT_TRUE(h_.RunUntil([&] { return !module_->Loading(); })) << "the claim state never loaded";
    h_.Drain();
  }

  void StartAndRegister(DraGpuModule::Config config = {}) {
    sim_->Start();
    StartModule(config);
    ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
    ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered; }));
  }

  const DraGpuState* State() { return h_.bus.Latest<DraGpuState>(); }

  sim::DraPrepareResult Prepare(const std::vector<sim::DraClaim>& claims) {
    return h_.OffLoop([&] { return sim_->NodePrepareResources(kDriver, claims); });
  }
  sim::DraUnprepareResult Unprepare(const std::vector<sim::DraClaim>& claims) {
    return h_.OffLoop([&] { return sim_->NodeUnprepareResources(kDriver, claims); });
  }
  std::string PrepareError(const sim::DraClaim& claim) {
    const auto result = Prepare({claim});
    EXPECT_TRUE(result.ok()) << result.status.ToString();
    const auto it = result.claims.find(claim.uid);
    return it == result.claims.end() ? "<no entry>" : it->second.error;
  }

  json Slice() { return Get(kSlices + "/" + dra::SliceName(kNode, kDriver)); }
  static json DeviceOf(const json& slice, const std::string& name) {
    for (const auto& d : slice["spec"]["devices"]) {
      if (d["name"] == name) return d;
    }
    return json();
  }
  double SliceWrites(const char* result) {
    return h_.metrics
        .Counter("gpu_node_supervisor_dra_slice_publishes_total", "", {{"driver", kDriver}, {"result", result}})
        .Value();
  }
  // gpu-health's verdict for GPU `index` of TwoGpus(), as it publishes one.
  void Verdict(uint32_t index, bool healthy, uint64_t xid, const std::string& reason, int64_t since_ms) {
    gpu_health::DeviceHealth v;
    v.uuid = TwoGpus().gpus[index].uuid;
    v.healthy = healthy;
    v.xid = xid;
    v.reason = reason;
    v.since_unix_ms = since_ms;
    h_.bus.Publish(v);
  }

  dra::Checkpoint Claims() const { return dra::LoadClaimState(paths_.checkpoint_file, paths_.claim_log_file).state; }
  std::string SpecPath(const std::string& uid) const {
    return dra::JoinPath(paths_.cdi_dir, GpuSpecNames().FileName(uid));
  }
  double Prepares(const char* result) {
    return h_.metrics.Counter("gpu_node_supervisor_dra_prepares_total", "", {{"driver", kDriver}, {"result", result}})
        .Value();
  }

  gns::test::TempDir tmp_;
  fs::path dir_{tmp_.Path()};
  gns::test::LoopHarness h_;
  dra::PluginPaths paths_;
  std::unique_ptr<gns::test::ApiSim> api_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::shared_ptr<kube::EventRecorder> events_;
  std::unique_ptr<sim::KubeletSim> sim_;
  gns::test::ModuleUnderTest<DraGpuModule> module_{h_};
};

TEST_F(DraGpuModuleTest, PublishesTheNodesTwoGpusWithTheirAttributes) {
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return State()->slice_publishes >= 1 && State()->slice_generation >= 1; }));
  const json slice = Get(kSlices + "/" + dra::SliceName(kNode, kDriver));
  EXPECT_EQ(slice["spec"]["driver"], "gpu.nvidia.com");
  EXPECT_EQ(slice["spec"]["pool"]["name"], kNode);
  const json& devices = slice["spec"]["devices"];
  ASSERT_EQ(devices.size(), 2u) << slice.dump();
  EXPECT_EQ(devices[0]["name"], "gpu-0");
  EXPECT_EQ(devices[1]["name"], "gpu-1");
  EXPECT_EQ(devices[1]["attributes"]["uuid"]["string"], TwoGpus().gpus[1].uuid);
  EXPECT_EQ(devices[1]["attributes"]["productName"]["string"], "NVIDIA H200");
  EXPECT_EQ(devices[1]["attributes"]["cudaComputeCapability"]["version"], "9.0.0");
  EXPECT_EQ(devices[1]["attributes"]["driverVersion"]["version"], "550.54.15");
  EXPECT_EQ(devices[1]["attributes"]["pcieBusID"]["string"], "00000000:9C:00.0");
  EXPECT_EQ(devices[1]["capacity"]["memory"]["value"], "141Gi");

  // A GPU that turns MIG on is offered as its MIG devices, never whole.
  h_.bus.Publish(OneGpuInMigMode());
  ASSERT_TRUE(h_.RunUntil([&] { return Slice()["spec"]["devices"].size() == 3; }));
  const json mig_slice = Slice();
  EXPECT_TRUE(DeviceOf(mig_slice, "gpu-1").is_null());
  EXPECT_EQ(DeviceOf(mig_slice, "gpu-1-mig-19-0-1")["attributes"]["type"]["string"], "mig");
  EXPECT_EQ(DeviceOf(mig_slice, "gpu-1-mig-19-1-1")["attributes"]["parentUUID"]["string"], TwoGpus().gpus[1].uuid);
  EXPECT_EQ(DeviceOf(mig_slice, "gpu-1-mig-19-1-1")["capacity"]["memorySlice1"]["value"], "1");
}

TEST_F(DraGpuModuleTest, PrepareWritesTheClaimsSpecAndUnprepareRemovesIt) {
  StartAndRegister();
  const auto claim = Seed(GpuClaim("train", {"gpu-0", "gpu-1"},
                                   {{"apiVersion", "resource.nvidia.com/v1beta1"},
                                    {"kind", "GpuConfig"},
                                    {"sharing", {{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Default"}}}}}}));
  const auto result = Prepare({claim});
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  const auto& answer = result.claims.at(claim.uid);
  ASSERT_EQ(answer.error, "");
  ASSERT_EQ(answer.devices.size(), 2u);
  EXPECT_EQ(answer.devices[0].device_name, "gpu-0");
  EXPECT_EQ(answer.devices[1].device_name, "gpu-1");
  EXPECT_EQ(answer.devices[1].pool_name, kNode);
  EXPECT_EQ(answer.devices[1].cdi_device_ids,
            std::vector<std::string>{"k8s.gpu.nvidia.com/claim=" + claim.uid + "-gpu-1"});

  const json spec = json::parse(ReadFile(SpecPath(claim.uid)));
  EXPECT_EQ(spec["kind"], "k8s.gpu.nvidia.com/claim");
  ASSERT_EQ(spec["devices"].size(), 2u);
  EXPECT_EQ(spec["devices"][1]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia1");
  EXPECT_EQ(spec["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidiactl");
  EXPECT_EQ(device_plugin::ValidateCdiSpec(spec), "");

  const dra::Checkpoint state = Claims();
  const auto* entry = state.Find(claim.uid);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->state, dra::ClaimState::kPrepareCompleted);
  EXPECT_EQ(GpusOf(*entry).size(), 2u);
  EXPECT_EQ(Prepares("ok"), 1);

  // The kubelet lost the answer: the same devices from the claim state, nothing written again.
  const auto again = Prepare({claim});
  EXPECT_EQ(again.claims.at(claim.uid).devices.size(), 2u);
  EXPECT_EQ(Prepares("already_prepared"), 1);
  // A second claim for a GPU the first holds waits for it (retryable).
  const auto other = Seed(GpuClaim("other", {"gpu-1"}));
  EXPECT_NE(PrepareError(other).find("gpu-1 is held by prepared claim team-a/train"), std::string::npos);
  EXPECT_EQ(Prepares("retryable_error"), 1);

  const auto unprepared = Unprepare({claim});
  ASSERT_TRUE(unprepared.ok());
  EXPECT_EQ(unprepared.claims.at(claim.uid), "");
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  EXPECT_EQ(Claims().claims.size(), 0u);
  EXPECT_EQ(PrepareError(other), "");
}

TEST_F(DraGpuModuleTest, ARefusedConfigIsThatClaimsErrorAndLeavesNothingBehind) {
  StartAndRegister();
  const auto multi = Seed(GpuClaim("multi", {"gpu-0"},
                                   {{"apiVersion", "resource.nvidia.com/v1beta1"},
                                    {"kind", "GpuConfig"},
                                    {"sharing", {{"strategy", "MPS"}, {"mpsConfig", {{"multiUser", true}}}}}}));
  const auto fine = Seed(GpuClaim("fine", {"gpu-1"}));
  const auto result = Prepare({multi, fine});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.claims.at(multi.uid).error,
            "ResourceClaim team-a/multi: gpu-0: sharing.mpsConfig.multiUser is the control daemon's setting, which "
            "the operator runs here; this driver does not set it");
  EXPECT_EQ(result.claims.at(fine.uid).error, "");
  EXPECT_FALSE(fs::exists(SpecPath(multi.uid)));
  EXPECT_TRUE(fs::exists(SpecPath(fine.uid)));
  EXPECT_EQ(Prepares("permanent_error"), 1);
}

// A stand-in for `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>`: appends "<uuid> <n>"
// to ts.log, or fails as nvidia-smi does while ts.fail exists.
class DraGpuTimeSliceTest : public DraGpuModuleTest {
 protected:
  DraGpuModule::Config SliceConfig() {
    const fs::path tool = dir_ / "set-timeslice";
    std::ofstream(tool) << "#!/bin/sh\n"
                        << "if [ -e '" << (dir_ / "ts.fail").string() << "' ]; then\n"
                        << "  echo \"Failed to set timeslice for GPU $1: Not Supported\" >&2; exit 1\n"
                        << "fi\n"
                        << "echo \"$1 $2\" >> '" << (dir_ / "ts.log").string() << "'\n";
    fs::permissions(tool, fs::perms::owner_all);
    DraGpuModule::Config config;
    config.time_slice_command = {tool.string(), "{uuid}", "{interval}"};
    return config;
  }
  // The tool's runs since the last call, one "<uuid> <n>" each.
  std::vector<std::string> Runs() {
    std::vector<std::string> out;
    std::ifstream in(dir_ / "ts.log");
    for (std::string line; std::getline(in, line);) out.push_back(line);
    fs::remove(dir_ / "ts.log");
    return out;
  }
  json Book() { return json::parse(ReadFile(paths_.state_dir + "/time-slices.json"))["gpus"]; }
  static json Sliced(const std::string& interval) {
    return {{"apiVersion", "resource.nvidia.com/v1beta1"},
            {"kind", "GpuConfig"},
            {"sharing", {{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", interval}}}}}};
  }
  const std::string gpu0_ = TwoGpus().gpus[0].uuid;
  const std::string gpu1_ = TwoGpus().gpus[1].uuid;
};

TEST_F(DraGpuTimeSliceTest, ANonDefaultIntervalIsSetBeforeThePrepareAndPutBackAfterTheUnprepare) {
  StartAndRegister(SliceConfig());
  const auto claim = Seed(GpuClaim("long", {"gpu-0"}, Sliced("Long")));
  ASSERT_EQ(PrepareError(claim), "");
  EXPECT_EQ(Runs(), std::vector<std::string>{gpu0_ + " 3"});
  EXPECT_EQ(Book(), json({{gpu0_, 3}}));
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->time_slices.count(gpu0_) == 1; }));
  // The kubelet asks again: answered from the claim state, the GPU not touched.
  ASSERT_EQ(PrepareError(claim), "");
  // A claim without sharing on the other GPU leaves it alone.
  const auto plain = Seed(GpuClaim("plain", {"gpu-1"}));
  ASSERT_EQ(PrepareError(plain), "");
  EXPECT_TRUE(Runs().empty());

  ASSERT_EQ(Unprepare({claim}).claims.at(claim.uid), "");
  EXPECT_EQ(Runs(), std::vector<std::string>{gpu0_ + " 0"});
  EXPECT_EQ(Book(), json::object());
  ASSERT_EQ(Unprepare({plain}).claims.at(plain.uid), "");
  EXPECT_TRUE(Runs().empty());
}

TEST_F(DraGpuTimeSliceTest, ASliceThatCannotBeSetIsARetryableErrorAndTheGpuIsPutBackAtTheNextCall) {
  StartAndRegister(SliceConfig());
  std::ofstream(dir_ / "ts.fail") << "";
  const auto claim = Seed(GpuClaim("medium", {"gpu-1"}, Sliced("Medium")));
  const std::string error = PrepareError(claim);
  EXPECT_NE(error.find("ResourceClaim team-a/medium: gpu-1: sharing.timeSlicingConfig.interval Medium: `" +
                       (dir_ / "set-timeslice").string() + " " + gpu1_ + " 2`: exit 1: Failed to set timeslice for GPU " +
                       gpu1_ + ": Not Supported"),
            std::string::npos)
      << error;
  EXPECT_EQ(Prepares("retryable_error"), 1);
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  // The GPU stays in the book: its state is unknown.
  EXPECT_EQ(Book(), json({{gpu1_, 2}}));

  // The pod went away instead: the next call (here another claim's prepare) puts the GPU back.
  fs::remove(dir_ / "ts.fail");
  const auto plain = Seed(GpuClaim("plain", {"gpu-0"}));
  ASSERT_EQ(PrepareError(plain), "");
  EXPECT_EQ(Runs(), std::vector<std::string>{gpu1_ + " 0"});
  EXPECT_EQ(Book(), json::object());
}

TEST_F(DraGpuTimeSliceTest, ARestartSetsBookedGpusAgainAndPutsBackWhatNoClaimWants) {
  StartAndRegister(SliceConfig());
  const auto claim = Seed(GpuClaim("long", {"gpu-0"}, Sliced("Long")));
  ASSERT_EQ(PrepareError(claim), "");
  module_.Stop();
  Runs();
  // A crash after the book was written for a prepare on gpu-1 and before its record: the book
  // holds gpu-1 too.
  std::ofstream(paths_.state_dir + "/time-slices.json") << TimeSliceBookText({{gpu0_, 3}, {gpu1_, 1}});

  StartModule(SliceConfig());
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered; }));
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  const auto plain = Seed(GpuClaim("plain", {"gpu-1"}));
  ASSERT_EQ(PrepareError(plain), "");
  // gpu-0 again (it may have been reset meanwhile), gpu-1 back to Default.
  EXPECT_EQ(Runs(), (std::vector<std::string>{gpu0_ + " 3", gpu1_ + " 0"}));
  EXPECT_EQ(Book(), json({{gpu0_, 3}}));
  ASSERT_EQ(Unprepare({claim}).claims.at(claim.uid), "");
  EXPECT_EQ(Runs(), std::vector<std::string>{gpu0_ + " 0"});
}

// MPS with the control daemon left to the operator, as the device plugin's MPS: a claim waits
// (retryable) until the daemon of its device answers, then its containers get its pipe.
TEST_F(DraGpuModuleTest, AnMpsClaimIsPreparedOnceTheOperatorsControlDaemonAnswers) {
  DraGpuModule::Config config;
  config.mps_root = (dir_ / "mps").string();
  StartAndRegister(config);
  const auto mps = Seed(GpuClaim("mps", {"gpu-0"},
                                 {{"apiVersion", "resource.nvidia.com/v1beta1"},
                                  {"kind", "GpuConfig"},
                                  {"sharing", {{"strategy", "MPS"}, {"mpsConfig", {{"defaultActiveThreadPercentage", 50}}}}}}));
  const std::string pipe = config.mps_root + "/gpu.nvidia.com/gpu-0/pipe";
  const std::string error = PrepareError(mps);
  EXPECT_NE(error.find("gpu-0: sharing.strategy MPS, but its control daemon does not answer (" + pipe + "/control: "),
            std::string::npos)
      << error;
  EXPECT_EQ(Prepares("retryable_error"), 1);
  EXPECT_FALSE(fs::exists(SpecPath(mps.uid)));

  // The operator's daemon comes up: a unix socket listening at <pipe>/control.
  fs::create_directories(pipe);
  const int daemon = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(daemon, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string control = pipe + "/control";
  ASSERT_LT(control.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, control.c_str(), control.size() + 1);
  ASSERT_EQ(::bind(daemon, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(daemon, 4), 0);
  EXPECT_EQ(PrepareError(mps), "");
  ::close(daemon);
  const json spec = json::parse(ReadFile(SpecPath(mps.uid)));
  const json& edits = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(edits["env"], json::array({"CUDA_MPS_PIPE_DIRECTORY=/mps/gpu.nvidia.com/gpu-0/pipe",
                                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"}));
  EXPECT_EQ(edits["mounts"][0]["hostPath"], pipe);
  // The record carries it: a restart rewrites the same spec without asking the daemon again.
  EXPECT_EQ(Claims().claims.at(mps.uid).driver_data["mps"]["pipeDir"], pipe);
}

TEST_F(DraGpuModuleTest, ARestartKeepsPreparedClaimsRemakesTheirSpecsAndDropsOrphans) {
  StartAndRegister();
  const auto claim = Seed(GpuClaim("kept", {"gpu-0"}));
  ASSERT_EQ(PrepareError(claim), "");
  const std::string spec = ReadFile(SpecPath(claim.uid));
  module_.Stop();
  // A cleaned CDI dir loses the spec; a crash before a record leaves an orphan spec.
  fs::remove(SpecPath(claim.uid));
  const std::string orphan = "0dd0dd00-0000-4000-8000-000000000001";
  std::ofstream(SpecPath(orphan)) << "{}";

  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  EXPECT_EQ(ReadFile(SpecPath(claim.uid)), spec);
  EXPECT_FALSE(fs::exists(SpecPath(orphan)));
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_dra_reconciled_total", "",
                               {{"action", "rewrite_missing_spec"}, {"driver", kDriver}}).Value(), 1);
  EXPECT_EQ(h_.metrics.Counter("gpu_node_supervisor_dra_reconciled_total", "",
                               {{"action", "delete_orphan_spec"}, {"driver", kDriver}}).Value(), 1);
  EXPECT_NE(Claims().Find(claim.uid), nullptr);
}

TEST_F(DraGpuModuleTest, AMigClaimGetsItsMigDeviceWithItsCapsNodesAndAWrongConfigKindIsRefused) {
  // The host's MIG capability minors: the claim's spec carries the GPU instance's and compute
  // instance's /dev/nvidia-caps nodes, as the device plugin's does.
  fs::create_directories(dir_ / "h" / "proc" / "driver" / "nvidia-caps");
  std::ofstream(dir_ / "h" / "proc" / "driver" / "nvidia-caps" / "mig-minors")
      << "config 1\nmonitor 2\ngpu1/gi10/access 183\ngpu1/gi10/ci0/access 184\n";
  h_.bus.Publish(OneGpuInMigMode());
  StartAndRegister();
  const json mig_config{{"apiVersion", "resource.nvidia.com/v1beta1"},
                        {"kind", "MigDeviceConfig"},
                        {"sharing", {{"strategy", "TimeSlicing"}}}};
  const auto claim = Seed(GpuClaim("mig", {"gpu-1-mig-19-1-1"}, mig_config));
  const auto result = Prepare({claim});
  ASSERT_TRUE(result.ok()) << result.status.ToString();
  const auto& answer = result.claims.at(claim.uid);
  ASSERT_EQ(answer.error, "");
  ASSERT_EQ(answer.devices.size(), 1u);
  EXPECT_EQ(answer.devices[0].device_name, "gpu-1-mig-19-1-1");
  EXPECT_EQ(answer.devices[0].cdi_device_ids,
            std::vector<std::string>{"k8s.gpu.nvidia.com/claim=" + claim.uid + "-gpu-1-mig-19-1-1"});
  const json spec = json::parse(ReadFile(SpecPath(claim.uid)));
  EXPECT_EQ(device_plugin::ValidateCdiSpec(spec), "");
  const json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(nodes.size(), 3u) << spec.dump();
  EXPECT_EQ(nodes[0]["path"], "/dev/nvidia1");
  EXPECT_EQ(nodes[1]["path"], "/dev/nvidia-caps/nvidia-cap183");
  EXPECT_EQ(nodes[2]["path"], "/dev/nvidia-caps/nvidia-cap184");
  const dra::Checkpoint state = Claims();
  const auto* entry = state.Find(claim.uid);
  ASSERT_NE(entry, nullptr);
  ASSERT_EQ(GpusOf(*entry).size(), 1u);
  EXPECT_EQ(GpusOf(*entry)[0].mig_uuid, "MIG-22222221-0000-5000-8000-000000000000");

  // A restart re-makes the MIG claim's spec from its record, byte for byte.
  const std::string before = ReadFile(SpecPath(claim.uid));
  module_.Stop();
  fs::remove(SpecPath(claim.uid));
  StartModule();
  EXPECT_TRUE(module_.failures.empty());
  EXPECT_EQ(ReadFile(SpecPath(claim.uid)), before);

  // A GpuConfig on a MIG device, a MigDeviceConfig on a whole GPU: refused, nothing written.
  const auto gpu_on_mig = Seed(GpuClaim("gpu-on-mig", {"gpu-1-mig-19-0-1"},
                                        {{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "GpuConfig"}}));
  EXPECT_EQ(PrepareError(gpu_on_mig),
            "ResourceClaim team-a/gpu-on-mig: status.allocation.devices.config[0]: a GpuConfig applies to request "
            "\"gpu\", but gpu-1-mig-19-0-1 is a MIG device (use MigDeviceConfig)");
  const auto mig_on_gpu = Seed(GpuClaim("mig-on-gpu", {"gpu-0"}, mig_config));
  EXPECT_EQ(PrepareError(mig_on_gpu),
            "ResourceClaim team-a/mig-on-gpu: status.allocation.devices.config[0]: a MigDeviceConfig applies to "
            "request \"gpu\", but gpu-0 is a whole GPU (use GpuConfig)");
  EXPECT_FALSE(fs::exists(SpecPath(gpu_on_mig.uid)));
  EXPECT_FALSE(fs::exists(SpecPath(mig_on_gpu.uid)));

  const auto unprepared = Unprepare({claim});
  ASSERT_TRUE(unprepared.ok());
  EXPECT_EQ(unprepared.claims.at(claim.uid), "");
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  EXPECT_EQ(Claims().claims.size(), 0u);
}

// A MIG device whose capability entries the host's mig-minors lacks: its container could not
// open it, so the claim waits (retryable), and the file is read again at the next try.
TEST_F(DraGpuModuleTest, AMigClaimWaitsUntilTheHostListsItsCapabilityMinors) {
  const fs::path minors = dir_ / "h" / "proc" / "driver" / "nvidia-caps" / "mig-minors";
  fs::create_directories(minors.parent_path());
  std::ofstream(minors) << "config 1\nmonitor 2\ngpu1/gi9/access 174\ngpu1/gi9/ci0/access 175\ngpu1/gi10/access 183\n";
  h_.bus.Publish(OneGpuInMigMode());
  StartAndRegister();
  const auto claim = Seed(GpuClaim("mig", {"gpu-1-mig-19-1-1"},
                                   {{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "MigDeviceConfig"}}));
  EXPECT_EQ(PrepareError(claim),
            "ResourceClaim team-a/mig: gpu-1-mig-19-1-1: no gpu1/gi10/ci0/access in "
            "/proc/driver/nvidia-caps/mig-minors: a container could not open the MIG device");
  EXPECT_EQ(Prepares("retryable_error"), 1);
  EXPECT_FALSE(fs::exists(SpecPath(claim.uid)));
  // The sibling's entries are there.
  const auto sibling = Seed(GpuClaim("sibling", {"gpu-1-mig-19-0-1"}));
  ASSERT_EQ(PrepareError(sibling), "");

  std::ofstream(minors, std::ios::app) << "gpu1/gi10/ci0/access 184\n";
  ASSERT_EQ(PrepareError(claim), "");
  const json spec = json::parse(ReadFile(SpecPath(claim.uid)));
  const json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(nodes.size(), 3u) << spec.dump();
  EXPECT_EQ(nodes[2]["path"], "/dev/nvidia-caps/nvidia-cap184");
}

// ------------------------------------------------------------------------------ device taints

constexpr int64_t kTurnedMs = 1795858800000;  // 2026-11-28T09:40:00Z

TEST_F(DraGpuModuleTest, AFatalXidTaintsTheGpusDeviceAndHealthyAgainRemovesIt) {
  h_.bus.Publish(gpu_health::GpuHealthState{});  // gpu-health runs
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  EXPECT_FALSE(DeviceOf(Slice(), "gpu-1").contains("taints"));

  Verdict(1, false, 79, "XID 79 (GPU has fallen off the bus)", kTurnedMs);
  ASSERT_TRUE(h_.RunUntil([&] { return DeviceOf(Slice(), "gpu-1").contains("taints"); }));
  json slice = Slice();
  EXPECT_EQ(DeviceOf(slice, "gpu-1")["taints"],
            json::array({{{"key", "gpu.nvidia.com/xid"},
                          {"value", "79"},
                          {"effect", "NoSchedule"},
                          {"timeAdded", "2026-11-28T09:40:00Z"}}}));
  EXPECT_FALSE(DeviceOf(slice, "gpu-0").contains("taints")) << "only the GPU the verdict names";
  EXPECT_EQ(slice["spec"]["pool"]["generation"], 2) << "a taint change is a new pool generation";
  ASSERT_TRUE(h_.RunUntil([&] { return State()->tainted.size() == 1; }));
  EXPECT_EQ(State()->tainted[0], "gpu-1: gpu.nvidia.com/xid=79:NoSchedule");

  // The same verdict again (gpu-health restarted, say) changes no taint: no write.
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("updated") == 1; }));
  const double writes = SliceWrites("updated");
  Verdict(1, false, 79, "XID 79 (GPU has fallen off the bus)", kTurnedMs);
  h_.Drain();
  EXPECT_EQ(SliceWrites("updated"), writes);

  // A validated reset: gpu-health's verdict turns healthy, and the taint goes.
  Verdict(1, true, 0, "GPU reset acknowledged", kTurnedMs + 60000);
  ASSERT_TRUE(h_.RunUntil([&] { return !DeviceOf(Slice(), "gpu-1").contains("taints"); }));
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("updated") == writes + 1; }));
  EXPECT_EQ(Slice()["spec"]["pool"]["generation"], 3);
  EXPECT_TRUE(State()->tainted.empty());
}

// Upstream's gpu.nvidia.com/unmonitored (no value, effect None: informational) where the site asks
// for it: while no judge watches the GPUs (gpu-health not running) every device carries it, and
// gpu-health coming up takes it off in one write. Not asked (the default): no taint without a judge.
TEST_F(DraGpuModuleTest, WithoutAJudgeEveryDeviceCarriesUpstreamsUnmonitoredTaintWhenTheSiteAsks) {
  // The slice publisher's informer showing its own slice back (after which nothing else makes
  // it compare again: only the judge's arrival may take the taints off).
  const std::string slice_name = dra::SliceName(kNode, kDriver);
  int slice_events = 0;
  auto events = h_.bus.Subscribe<kube::ResourceEvent>([&](const kube::ResourceEvent& event) {
    if (event.object && event.object->value("/metadata/name"_json_pointer, std::string()) == slice_name) ++slice_events;
  });
  DraGpuModule::Config config;
  config.unmonitored_taint = true;
  StartAndRegister(config);
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  const json slice = Slice();
  for (const char* name : {"gpu-0", "gpu-1"}) {
    const json device = DeviceOf(slice, name);
    ASSERT_TRUE(device.contains("taints")) << name << ": " << slice.dump();
    ASSERT_EQ(device["taints"].size(), 1u) << name;
    const json& taint = device["taints"][0];
    EXPECT_EQ(taint["key"], "gpu.nvidia.com/unmonitored");
    EXPECT_EQ(taint["effect"], "None");
    EXPECT_FALSE(taint.contains("value"));
    EXPECT_TRUE(taint.contains("timeAdded")) << "ours, so the API's copy compares equal";
  }
  ASSERT_TRUE(h_.RunUntil([&] { return State()->tainted.size() == 2; }));
  EXPECT_EQ(State()->tainted[0], "gpu-0: gpu.nvidia.com/unmonitored:None");
  // Settled: the publisher has seen its own slice back, and nothing more is to be written.
  ASSERT_TRUE(h_.RunUntil([&] { return slice_events >= 1; }));
  h_.Drain();
  ASSERT_EQ(SliceWrites("updated"), 0);

  h_.bus.Publish(gpu_health::GpuHealthState{});  // gpu-health comes up: the GPUs are watched
  ASSERT_TRUE(h_.RunUntil([&] {
    const json now = Slice();
    return !DeviceOf(now, "gpu-0").contains("taints") && !DeviceOf(now, "gpu-1").contains("taints");
  }));
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("updated") == 1; }));
  EXPECT_TRUE(State()->tainted.empty());
  h_.Drain();
  EXPECT_EQ(SliceWrites("updated"), 1);
}

TEST_F(DraGpuModuleTest, NoUnmonitoredTaintUnlessTheSiteAsks) {
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  EXPECT_FALSE(DeviceOf(Slice(), "gpu-0").contains("taints"));
  EXPECT_TRUE(State()->tainted.empty());
}

TEST_F(DraGpuModuleTest, AGpuInstanceVerdictTaintsThatMigDeviceOnlyAndAWholeGpuVerdictAllOfThem) {
  h_.bus.Publish(OneGpuInMigMode());
  h_.bus.Publish(gpu_health::GpuHealthState{});
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  gpu_health::DeviceHealth instance;
  instance.uuid = TwoGpus().gpus[1].uuid;
  instance.healthy = false;
  instance.xid = 94;
  instance.reason = "XID 94 (contained ECC error)";
  instance.since_unix_ms = kTurnedMs;
  instance.gpu_instance = 10;
  h_.bus.Publish(instance);
  ASSERT_TRUE(h_.RunUntil([&] { return DeviceOf(Slice(), "gpu-1-mig-19-1-1").contains("taints"); }));
  json slice = Slice();
  EXPECT_EQ(DeviceOf(slice, "gpu-1-mig-19-1-1")["taints"][0]["key"], "gpu.nvidia.com/xid");
  EXPECT_EQ(DeviceOf(slice, "gpu-1-mig-19-1-1")["taints"][0]["value"], "94");
  EXPECT_FALSE(DeviceOf(slice, "gpu-1-mig-19-0-1").contains("taints")) << "the other GPU instance";
  EXPECT_FALSE(DeviceOf(slice, "gpu-0").contains("taints"));

  // The whole GPU's verdict covers its MIG devices.
  Verdict(1, false, 79, "XID 79 (GPU has fallen off the bus)", kTurnedMs + 1000);
  ASSERT_TRUE(h_.RunUntil([&] { return DeviceOf(Slice(), "gpu-1-mig-19-0-1").contains("taints"); }));
  slice = Slice();
  EXPECT_EQ(DeviceOf(slice, "gpu-1-mig-19-0-1")["taints"][0]["value"], "79");
  EXPECT_EQ(DeviceOf(slice, "gpu-1-mig-19-1-1")["taints"][0]["value"], "79");
  EXPECT_FALSE(DeviceOf(slice, "gpu-0").contains("taints"));

  // Both healthy again: no taint left.
  Verdict(1, true, 0, "GPU reset acknowledged", kTurnedMs + 60000);
  instance.healthy = true;
  instance.xid = 0;
  instance.reason = "GPU reset acknowledged";
  h_.bus.Publish(instance);
  ASSERT_TRUE(h_.RunUntil([&] {
    const json now = Slice();
    return !DeviceOf(now, "gpu-1-mig-19-0-1").contains("taints") && !DeviceOf(now, "gpu-1-mig-19-1-1").contains("taints");
  }));
}

// Issue #28: "a GPU taken out for a reset is withdrawn from the slice or tainted, then offered
// again". gpu-health's reset-in-progress verdict taints it while gpu-inventory has released it
// (prepare refused, retryable), and the validated reset's healthy verdict removes the taint.
TEST_F(DraGpuModuleTest, AGpuUnderResetIsTaintedMeanwhileAndOfferedAgainAfter) {
  h_.bus.Publish(gpu_health::GpuHealthState{});
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  gpu_health::DeviceHealth resetting;
  resetting.uuid = TwoGpus().gpus[1].uuid;
  resetting.healthy = false;
  resetting.reason = std::string(gpu_health::kResetInProgress);
  resetting.since_unix_ms = kTurnedMs;
  h_.bus.Publish(resetting);
  auto released = TwoGpus();
  released.gpus[1].released = true;
  released.gpus[1].release_reason = "gpu-reset";
  h_.bus.Publish(released);
  ASSERT_TRUE(h_.RunUntil([&] { return DeviceOf(Slice(), "gpu-1").contains("taints"); }));
  EXPECT_EQ(DeviceOf(Slice(), "gpu-1")["taints"],
            json::array({{{"key", "gpu.nvidia.com/unhealthy"},
                          {"value", "GPU-reset-in-progress"},
                          {"effect", "NoSchedule"},
                          {"timeAdded", "2026-11-28T09:40:00Z"}}}));
  const auto claim = Seed(GpuClaim("during-reset", {"gpu-1"}));
  EXPECT_NE(PrepareError(claim).find("taken out for a reset"), std::string::npos);
  EXPECT_EQ(Prepares("retryable_error"), 1);

  // Taken back and judged healthy: untainted, and the claim the kubelet retries is prepared.
  h_.bus.Publish(TwoGpus());
  Verdict(1, true, 0, "GPU reset acknowledged", kTurnedMs + 30000);
  ASSERT_TRUE(h_.RunUntil([&] { return !DeviceOf(Slice(), "gpu-1").contains("taints"); }));
  EXPECT_EQ(PrepareError(claim), "");
}

TEST_F(DraGpuModuleTest, TheSiteMayAskForNoExecute) {
  h_.bus.Publish(gpu_health::GpuHealthState{});
  Verdict(0, false, 0, "RowRemapFailure: 2 rows failed to remap", kTurnedMs);
  DraGpuModule::Config config;
  config.taint_effect = TaintEffect::kNoExecute;
  StartAndRegister(config);
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  EXPECT_EQ(DeviceOf(Slice(), "gpu-0")["taints"][0],
            (json{{"key", "gpu.nvidia.com/unhealthy"},
                  {"value", "RowRemapFailure"},
                  {"effect", "NoExecute"},
                  {"timeAdded", "2026-11-28T09:40:00Z"}}));
}

TEST_F(DraGpuModuleTest, ARestartWithAnUnhealthyGpuKeepsItsTaintWithoutAWrite) {
  h_.bus.Publish(gpu_health::GpuHealthState{});
  StartAndRegister();
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("created") == 1; }));
  Verdict(0, false, 48, "XID 48 (double-bit ECC error)", kTurnedMs);
  ASSERT_TRUE(h_.RunUntil([&] { return SliceWrites("updated") == 1; }));
  const json before = Slice();
  ASSERT_TRUE(DeviceOf(before, "gpu-0").contains("taints"));
  module_.Stop();
  ASSERT_FALSE(State()->registered);

  // The retained verdict is on the bus when the module comes back: its first slice carries the
  // taint, which the slice in the API already has.
  StartModule();
  ASSERT_TRUE(module_.failures.empty());
  // The new instance's first check of the slice is done (its count starts at 0).
  ASSERT_TRUE(h_.RunUntil([&] { return State()->registered && State()->slice_publishes >= 1; }));
  h_.Drain();
  const json after = Slice();
  EXPECT_EQ(DeviceOf(after, "gpu-0")["taints"], DeviceOf(before, "gpu-0")["taints"]);
  EXPECT_EQ(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"]) << "no write";
  EXPECT_EQ(SliceWrites("updated"), 1) << "no write after the restart";
  EXPECT_EQ(SliceWrites("created"), 1);
}

// A process restart: the slice in the API carries the taint the last process wrote, and
// gpu-health restores its verdicts after dra-gpu has read its own files. The first slice waits
// for gpu-health's state, so the taint is never written away and back.
TEST_F(DraGpuModuleTest, AProcessRestartWaitsForGpuHealthsRestoredVerdictsBeforeItsFirstSlice) {
  const std::string node_uid = Get("/api/v1/nodes/" + std::string(kNode))["metadata"]["uid"];
  const auto inventory = TwoGpus();
  GpuHealth sick;
  sick.status = HealthStatus::kUnhealthy;
  sick.taint_key = "gpu.nvidia.com/xid";
  sick.taint_value = "48";
  sick.since_unix_ms = kTurnedMs;
  dra::SliceSpec spec;
  spec.driver_name = kDriver;
  spec.node_name = kNode;
  spec.node_uid = node_uid;
  spec.devices = GpuSliceDevices(inventory, ServedGpus(inventory, GpuSelection{true, {}}), dra::ResourceApiVersion::kV1,
                                 {{"gpu-0", TaintsFor(sick, TaintEffect::kNoSchedule)}});
  api_->Seed(dra::BuildSlice(spec));
  const json before = Slice();

  ModuleStates states;
  for (const char* name : {"gpu-health", "dra-gpu"}) {
    ModuleStatus status;
    status.name = name;
    states.modules.push_back(status);
  }
  h_.bus.Publish(states);
  sim_->Start();
  StartModule();
  // Long enough for a module that did not wait to register and check its slice (it would find
  // the taint it does not know of yet, and write it away).
  EXPECT_FALSE(h_.RunUntil([&] { return State() != nullptr && State()->slice_publishes >= 1; },
                           std::chrono::milliseconds(1500)));
  EXPECT_EQ(State(), nullptr) << "not serving before gpu-health's state";

  Verdict(0, false, 48, "XID 48 (double-bit ECC error)", kTurnedMs);
  h_.bus.Publish(gpu_health::GpuHealthState{});
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDriver(kDriver, seconds(20)); }));
  ASSERT_TRUE(h_.RunUntil([&] { return State() && State()->registered && State()->slice_publishes >= 1; }));
  h_.Drain();
  EXPECT_EQ(Slice()["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"]) << "no write";
  EXPECT_EQ(SliceWrites("updated"), 0);
  EXPECT_EQ(SliceWrites("created"), 0);
}

// ------------------------------------------------------------------------------ KEP-4680 health

TEST_F(DraGpuModuleTest, TheKubeletSeesAFatalXidAsUnhealthyAndARecoveryAsHealthy) {
  StartAndRegister();
  const auto driver = sim_->DraDriver(kDriver);
  ASSERT_TRUE(driver.has_value());
  EXPECT_EQ(driver->Latest()->supported_versions,
            (std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                      "v1beta1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}));
  EXPECT_EQ(driver->health_service, "v1.DRAResourceHealth") << "the newest version both sides know";
  // gpu-health has not been seen: nobody watches the GPUs.
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "UNKNOWN", seconds(20)); }));
  auto known = sim_->DraDriver(kDriver);
  ASSERT_EQ(known->health.size(), 2u) << "every device of the slice, in each message";
  EXPECT_EQ(known->health[0].pool_name, kNode);

  h_.bus.Publish(gpu_health::GpuHealthState{});
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "HEALTHY", seconds(20)); }));

  Verdict(1, false, 79, "XID 79 (GPU has fallen off the bus)", kTurnedMs);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "UNHEALTHY", seconds(20)); }));
  auto sick = sim_->DraDriver(kDriver);
  EXPECT_EQ(sick->FindHealth("gpu-1")->last_updated_time, kTurnedMs / 1000);
  EXPECT_EQ(sick->FindHealth("gpu-0")->health, "HEALTHY");
  ASSERT_EQ(sick->health.size(), 2u);

  Verdict(1, true, 0, "GPU reset acknowledged", kTurnedMs + 60000);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "HEALTHY", seconds(20)); }));
  EXPECT_EQ(sim_->DraDriver(kDriver)->FindHealth("gpu-1")->last_updated_time, kTurnedMs / 1000 + 60);
  EXPECT_EQ(sim_->DraDriver(kDriver)->health_streams, 1);

  // Stop ends the stream cleanly.
  module_.Stop();
  ASSERT_TRUE(h_.OffLoop([&] {
    return sim_->WaitFor([](const sim::KubeletState& s) { return !s.FindDraDriver(kDriver)->health_stream_open; },
                         seconds(20));
  }));
  const std::string end = sim_->DraDriver(kDriver)->health_stream_end;
  EXPECT_TRUE(end == "OK" || end == "dropped by the kubelet") << end;
}

// The kubelet forgets a report after its timeout (pkg/kubelet/cm/dra/healthinfo.go): a device
// whose health does not change must be reported again in time, or the pod's status reads Unknown.
TEST_F(DraGpuModuleTest, TheKubeletKeepsSeeingAStillHealthyGpuPastItsTimeoutAndReadsWhyOneIsNot) {
  sim::KubeletSimOptions options;
  options.kubelet_dir = h_.site.paths.kubelet_dir;
  options.registration_retry_initial = std::chrono::milliseconds(50);
  options.dra_health_timeout = std::chrono::milliseconds(1500);
  sim_ = std::make_unique<sim::KubeletSim>(options);
  DraGpuModule::Config config;
  config.health_resend = std::chrono::milliseconds(300);
  StartAndRegister(config);
  h_.bus.Publish(gpu_health::GpuHealthState{});
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "HEALTHY", seconds(20)); }));
  EXPECT_EQ(sim_->DraDriver(kDriver)->FindHealth("gpu-1")->health_check_timeout_seconds, 1) << "three resends";

  const auto messages = sim_->DraDriver(kDriver)->health_messages;
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(4000));  // past every timeout, nothing changed
  EXPECT_EQ(sim_->DraDeviceHealthNow(kDriver, "gpu-1"), "HEALTHY");
  EXPECT_EQ(sim_->DraDeviceHealthNow(kDriver, "gpu-0"), "HEALTHY");
  EXPECT_GE(sim_->DraDriver(kDriver)->health_messages, messages + 5) << "resent about every 300 ms";

  Verdict(1, false, 79, "XID 79 (GPU has fallen off the bus)", kTurnedMs);
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "UNHEALTHY", seconds(20)); }));
  EXPECT_NE(sim_->DraDriver(kDriver)->FindHealth("gpu-1")->message.find("XID 79"), std::string::npos)
      << sim_->DraDriver(kDriver)->FindHealth("gpu-1")->message;
  EXPECT_EQ(sim_->DraDriver(kDriver)->FindHealth("gpu-0")->message, "");
}

TEST_F(DraGpuModuleTest, AKubeletThatKnowsOnlyV1alpha1GetsTheStreamInV1alpha1) {
  sim::KubeletSimOptions options;
  options.kubelet_dir = h_.site.paths.kubelet_dir;
  options.registration_retry_initial = std::chrono::milliseconds(50);
  options.dra_health_services = {std::string(sim::kDraHealthServiceV1alpha1)};  // a 1.34 kubelet
  sim_ = std::make_unique<sim::KubeletSim>(options);
  StartAndRegister();
  h_.bus.Publish(gpu_health::GpuHealthState{});
  ASSERT_TRUE(h_.OffLoop([&] { return sim_->WaitForDraDeviceHealth(kDriver, "gpu-1", "HEALTHY", seconds(20)); }));
  const auto driver = sim_->DraDriver(kDriver);
  EXPECT_EQ(driver->health_service, "v1alpha1.DRAResourceHealth");
  EXPECT_EQ(driver->FindHealth("gpu-1")->health_check_timeout_seconds, 0) << "v1alpha1 has no such field";
}

// ------------------------------------------------------------------------------ the GPU split

class GpuSplitConfigTest : public ::testing::Test {
 protected:
  std::string ErrorOf(const std::string& modules) {
    const std::string path = (dir_ / "site.yaml").string();
    std::ofstream(path) << "version: v1\nnodeName: node-a\npaths:\n  kubeletDir: /var/lib/kubelet\n"
                           "  cdiDir: /var/run/cdi\n  stateDir: /var/lib/gns\n  hostRoot: /host\nmodules:\n"
                        << modules;
    static const std::vector<ModuleDescriptor> manifest = {DescribeModule<kube::KubeModule>(),
                                                           DescribeModule<device_plugin::DevicePluginModule>(),
                                                           DescribeModule<DraGpuModule>()};
    try {
      loaded_ = LoadSiteConfig({path}, {}, manifest);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  gns::test::TempDir tmp_;
  fs::path dir_{tmp_.Path()};
  LoadedConfig loaded_;
};

TEST_F(GpuSplitConfigTest, AGpuGivenToBothIsRefusedWhicheverSectionComesFirst) {
  EXPECT_EQ(ErrorOf("  dra-gpu:\n    enabled: true\n    gpus: [\"1\"]\n"
                    "  device-plugin:\n    enabled: true\n    gpus: [\"0\"]\n"),
            "");
  EXPECT_EQ(loaded_.site.gpu_split->dra.ids, std::vector<std::string>{"1"});
  // The device plugin without `gpus:` takes what DRA leaves.
  EXPECT_EQ(ErrorOf("  dra-gpu:\n    enabled: true\n  device-plugin:\n    enabled: true\n"), "");
  const std::string both = ErrorOf("  dra-gpu:\n    enabled: true\n    gpus: [\"0\", \"GPU-abc\"]\n"
                                   "  device-plugin:\n    enabled: true\n    gpus: [\"GPU-abc\"]\n");
  EXPECT_NE(both.find("modules.device-plugin.gpus: a GPU is served by the device plugin or by DRA, never both: "
                      "modules.dra-gpu.gpus ([0, GPU-abc]) and modules.device-plugin.gpus ([GPU-abc]) both select "
                      "GPU-abc"),
            std::string::npos)
      << both;
  const std::string reversed = ErrorOf("  device-plugin:\n    enabled: true\n    gpus: all\n"
                                       "  dra-gpu:\n    enabled: true\n    gpus: [\"1\"]\n");
  EXPECT_NE(reversed.find("modules.dra-gpu.gpus: a GPU is served by the device plugin or by DRA, never both"),
            std::string::npos)
      << reversed;
  // A disabled module's selection is checked for its shape, not against the other's.
  EXPECT_EQ(ErrorOf("  dra-gpu:\n    enabled: false\n  device-plugin:\n    enabled: true\n    gpus: all\n"), "");
  EXPECT_NE(ErrorOf("  dra-gpu:\n    enabled: true\n    gpus: [\"nvidia0\"]\n").find("is neither a GPU UUID"),
            std::string::npos);
}

}  // namespace
}  // namespace gns::dra_gpu::module_test
