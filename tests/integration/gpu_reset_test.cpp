// The gpu-reset module through the real binary and real peers: the fake NVML (dlopen'd, its
// per-GPU maintenance state), the fake nvidia-smi as the reset command (a child process), real
// journal files fed by journald-sim.py from journald's native protocol, gpu-health reading them,
// `reset-gpu` over the admin socket, and GPUReset objects in the API-server simulator.
// Covers: a reset that validates (persistence mode restored, the others untouched); a failed
// command and a pending row remap (Unhealthy, RESTART_BM); a holder that refuses it; kill -9
// while the command runs, resumed after the restart and validated; GPUReset objects for this
// node, for another node, naming an unknown GPU and with malformed selectors; a read-only state
// directory (health still judged, /readyz says it is not persisted).
#include "support/api_sim.hpp"
#include "support/module_calls.hpp"
#include "support/eventually.hpp"
#include "support/http_client.hpp"
#include "support/prometheus.hpp"
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <regex>
#include <thread>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kGpu0 = "GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10";

// Whether a process whose command line contains `needle` (arguments NUL-separated) runs.
bool ProcessRunning(const std::string& needle) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(needle) != std::string::npos) return true;
  }
  return false;
}

using test::Eventually;

class GpuResetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: unix socket paths live under it (108 bytes at most).
    static int n = 0;
    dir_ = fs::temp_directory_path() / ("gns-gr-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "journal");
    fs::create_directories(dir_ / "state");
    fs::permissions(dir_ / "state", fs::perms::owner_all, fs::perm_options::replace);
    fs::create_directories(dir_ / "host/proc/sys/kernel/random");
    // This machine's boot (journald-sim stamps entries with it), as the kernel writes it.
    // (procfs reports size 0: read it, do not copy the file.)
    std::string boot;
    std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
    std::ofstream(dir_ / "host/proc/sys/kernel/random/boot_id") << boot << "\n";
    // The GPU description: the first GPUs of gpus-8.json.
    gpus_ = json::parse(std::ifstream(Source("tools/sim/fake_nvml/gpus-8.json")));
    for (const auto& g : gpus_["gpus"]) uuids_.push_back(g["uuid"].get<std::string>());
    ASSERT_EQ(uuids_.front(), kGpu0);
    journald_ = std::make_unique<test::Subprocess>(std::vector<std::string>{
        "/usr/bin/python3", Source("tools/sim/journal/journald-sim.py"), "--socket",
        (dir_ / "host/run/systemd/journal/socket").string(), "--output", (dir_ / "journal/native.journal").string()});
    ASSERT_TRUE(journald_->WaitForLine("journald-sim:")) << journald_->Output();
  }

  void TearDown() override {
    supervisor_.reset();
    journald_.reset();
    fs::remove_all(dir_);
  }

  std::string WriteConfig(const std::string& gpu_reset_extra = "", const std::string& kube = "") {
    const std::string path = (dir_ / "site.yaml").string();
    std::ofstream(path) << "version: v1\nnodeName: n1\npaths:\n  kubeletDir: " << (dir_ / "kubelet").string()
                        << "\n  cdiDir: " << (dir_ / "cdi").string() << "\n  stateDir: " << (dir_ / "state").string()
                        << "\n  hostRoot: " << (dir_ / "host").string()
                        << "\nmodules:\n  metrics:\n    enabled: true\n    listen: 127.0.0.1:0\n"
                        << kube
                        << "  gpu-inventory:\n    enabled: true\n    nvmlLibrary: "
                        << Built("tools/sim/fake_nvml/libnvidia-ml.so.1")
                        << "\n    eventWaitTimeout: 200ms\n"
                           "  journald:\n    enabled: true\n    directory: "
                        << (dir_ / "journal").string()
                        << "\n    units: []\n"
                           "  gpu-health:\n    enabled: true\n    checkpointInterval: 50ms\n"
                           "  gpu-reset:\n    enabled: true\n    holders: fail\n    command: ["
                        << Source("tools/sim/fake_nvml/nvidia-smi")
                        << ", --gpu-reset, -i, \"{uuid}\"]\n    commandTimeout: 3s\n    settle: 300ms\n"
                           "    healthyTimeout: 10s\n"
                        << gpu_reset_extra;
    return path;
  }

  // `prefix`: a command the supervisor runs under (it execs the rest of the arguments).
  void StartSupervisor(const std::string& config, std::vector<std::string> prefix = {}) {
    for (const auto& arg : {Binary(), std::string("run"), std::string("--config"), config}) prefix.push_back(arg);
    supervisor_ = std::make_unique<test::Subprocess>(
        std::move(prefix),
        std::map<std::string, std::string>{{"FAKE_NVML_CONFIG", Source("tools/sim/fake_nvml/gpus-8.json")},
                                           {"FAKE_NVML_CONTROL", (dir_ / "nvml.sock").string()}});
    const auto line = supervisor_->WaitForLine("serving /metrics");
    ASSERT_TRUE(line) << supervisor_->Output();
    port_ = PortIn(*line);
    ASSERT_NE(port_, 0u);
    // Every GPU seen and judged Healthy: the module can take requests.
    ASSERT_TRUE(Eventually([&] {
      const auto state = DebugState();
      return state.contains("gpu-inventory.devices") && state["gpu-inventory.devices"].value("available", false) &&
             state.contains("gpu-health.state");
    })) << supervisor_->Output();
  }

  json DebugState() {
    const auto r = test::HttpRequest("127.0.0.1", port_, "GET", "/debug/state");
    if (r.status != 200) return json::object();
    return json::parse(r.body, nullptr, false);
  }

  json Verdict(const std::string& uuid) {
    const auto state = DebugState();
    if (!state.contains("gpu-health.device") || !state["gpu-health.device"].contains(uuid)) return json();
    return state["gpu-health.device"][uuid];
  }

  bool Healthy(const std::string& uuid) {
    const auto v = Verdict(uuid);
    return v.is_null() || v.value("healthy", true);
  }

  json FakeNvml(const json& command) {
    const auto [code, out] = test::RunToCompletion(
        {"/usr/bin/python3", Source("tools/sim/fake_nvml/fakenvmlctl.py"), "--socket", (dir_ / "nvml.sock").string(),
         "raw", command.dump()});
    const auto reply = json::parse(out, nullptr, false);
    EXPECT_FALSE(reply.is_discarded()) << out;
    return reply;
  }

  json GpuState(const std::string& uuid) { return FakeNvml({{"getGpuState", {{"uuid", uuid}}}})["state"]; }

  std::pair<int, std::string> ResetGpu(const std::string& uuid) {
    return test::RunToCompletion({Binary(), "reset-gpu", "--state-dir", (dir_ / "state").string(), "--gpu", uuid});
  }

  std::string Journal() {
    const auto [code, out] = test::RunToCompletion(
        {"/usr/bin/journalctl", "--directory=" + (dir_ / "journal").string(), "-o", "cat", "SYSLOG_IDENTIFIER=gpu-reset"});
    return out;
  }

  fs::path dir_;
  json gpus_;
  std::vector<std::string> uuids_;
  std::unique_ptr<test::Subprocess> journald_;
  std::unique_ptr<test::Subprocess> supervisor_;
  unsigned short port_ = 0;
};

TEST_F(GpuResetTest, ResetValidatesRestoresPersistenceAndLeavesTheOtherGpusAlone) {
  StartSupervisor(WriteConfig());
  FakeNvml({{"setGpuState", {{"uuid", kGpu0}, {"persistence", true}}}});

  const auto [code, out] = ResetGpu(kGpu0);
  ASSERT_EQ(code, 0) << out << supervisor_->Output();
  // Every step, in order, then the verdict.
  std::size_t at = 0;
  for (const char* step : {"hold ok", "holders ok", "persistence ok", "release ok", "reset ok", "validate ok",
                           "restore ok", "ok: "}) {
    const auto found = out.find(step, at);
    ASSERT_NE(found, std::string::npos) << step << " missing or out of order in:\n" << out;
    at = found;
  }
  EXPECT_NE(out.find("persistence mode was on"), std::string::npos) << out;

  const auto gpu = GpuState(kGpu0);
  EXPECT_EQ(gpu["resets"], 1) << gpu.dump();
  EXPECT_EQ(gpu["persistence"], true) << "persistence mode restored";
  EXPECT_TRUE(Eventually([&] { return Healthy(kGpu0); })) << Verdict(kGpu0).dump();
  for (std::size_t i = 1; i < uuids_.size(); ++i) {
    EXPECT_TRUE(Healthy(uuids_[i])) << uuids_[i];
    EXPECT_EQ(GpuState(uuids_[i])["resets"], 0) << uuids_[i];
  }
  // Other monitors read the same lines: started, then occurred.
  const std::string journal = Journal();
  const auto started = journal.find(std::string("GPU reset started: ") + kGpu0);
  const auto occurred = journal.find(std::string("GPU reset occurred: ") + kGpu0);
  ASSERT_NE(started, std::string::npos) << journal;
  ASSERT_NE(occurred, std::string::npos) << journal;
  EXPECT_LT(started, occurred);

  // Its release is no longer announced: gpu-inventory's NVML event waits are long again.
  EXPECT_TRUE(Eventually([&] { return DebugState()["gpu-inventory.release-ahead"][kGpu0]["ahead"] == false; }))
      << DebugState()["gpu-inventory.release-ahead"].dump();

  // The record says so too, and survives the process.
  const auto state = DebugState()["gpu-reset.state"];
  ASSERT_EQ(state["jobs"].size(), 1u) << state.dump();
  EXPECT_EQ(state["jobs"][0]["phase"], "Succeeded") << state.dump();
  const auto scrape = test::ParsePrometheus(test::HttpRequest("127.0.0.1", port_, "GET", "/metrics").body);
  supervisor_->Signal(SIGTERM);
  EXPECT_EQ(supervisor_->Wait(), 0) << supervisor_->Output();
  const auto book = json::parse(std::ifstream(dir_ / "state/gpu-reset.json"));
  EXPECT_EQ(book["jobs"][0]["phase"], "Succeeded");
  // The last reset's times in seconds (issue 29: they were _ms gauges in milliseconds).
  const auto& times = book["jobs"][0]["gpus"][0];
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_gpu_resets_total{outcome=\"succeeded\"}"), 1);
  EXPECT_DOUBLE_EQ(scrape.Value("gpu_node_supervisor_gpu_reset_last_command_seconds"),
                   times.value("commandMs", 0) / 1000.0) << times.dump();
  EXPECT_DOUBLE_EQ(scrape.Value("gpu_node_supervisor_gpu_reset_last_overhead_seconds"),
                   (times.value("totalMs", 0) - times.value("commandMs", 0)) / 1000.0) << times.dump();
  EXPECT_GT(scrape.Value("gpu_node_supervisor_gpu_reset_last_command_seconds"), 0);
  EXPECT_EQ((fs::status(dir_ / "state/gpu-reset.json").permissions() & fs::perms::all), fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(GpuResetTest, AFailedCommandOrAPendingRemapKeepsTheGpuUnhealthyWithRestartBm) {
  StartSupervisor(WriteConfig());
  FakeNvml({{"setGpuState", {{"uuid", uuids_[1]}, {"resetMode", "fail"}}}});
  auto [code, out] = ResetGpu(uuids_[1]);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("ResetCommandFailed"), std::string::npos) << out;
  EXPECT_NE(out.find("Unknown Error (simulated)"), std::string::npos) << "the command's own words reach the operator: " << out;
  ASSERT_TRUE(Eventually([&] { return Verdict(uuids_[1]).value("recommendedAction", "") == "RESTART_BM"; }))
      << Verdict(uuids_[1]).dump() << supervisor_->Output();
  EXPECT_FALSE(Healthy(uuids_[1]));

  FakeNvml({{"setGpuState", {{"uuid", uuids_[2]}, {"resetMode", "leavePendingRemap"}}}});
  std::tie(code, out) = ResetGpu(uuids_[2]);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("PendingRowRemap"), std::string::npos) << out;
  EXPECT_EQ(GpuState(uuids_[2])["resets"], 1);
  ASSERT_TRUE(Eventually([&] { return Verdict(uuids_[2]).value("recommendedAction", "") == "RESTART_BM"; }));
  EXPECT_EQ(Journal().find("GPU reset occurred"), std::string::npos) << "no acknowledgement without validation";
  for (std::size_t i : {0u, 3u, 4u}) EXPECT_TRUE(Healthy(uuids_[i])) << uuids_[i];
}

TEST_F(GpuResetTest, AHoldingProcessRefusesTheResetAndTheGpuIsNotTouched) {
  StartSupervisor(WriteConfig());
  FakeNvml({{"setGpuState", {{"uuid", uuids_[3]}, {"processes", {4242}}}}});
  const auto [code, out] = ResetGpu(uuids_[3]);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("GpuInUse"), std::string::npos) << out;
  EXPECT_NE(out.find("process 4242"), std::string::npos) << out;
  EXPECT_EQ(GpuState(uuids_[3])["resets"], 0);
  // Refused: held Unhealthy (the reset began), but no reboot is recommended.
  EXPECT_FALSE(Healthy(uuids_[3]));
  EXPECT_NE(Verdict(uuids_[3]).value("recommendedAction", ""), "RESTART_BM");
  // Bad input: not a UUID, not on this node.
  auto bad = ResetGpu("not-a-gpu");
  EXPECT_EQ(bad.first, 1) << bad.second;
  EXPECT_NE(bad.second.find("is not a GPU UUID"), std::string::npos) << bad.second;
  bad = ResetGpu("GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(bad.first, 1) << bad.second;
  EXPECT_NE(bad.second.find("not on this node"), std::string::npos) << bad.second;
}

// NVML cannot interrupt an event wait. The waiter is a child process a release kills, so an
// operator's reset with no XID before it (nothing shortened any wait) does not sit out the one in
// progress: here it would last ten minutes, far past the CLI's own limit.
TEST_F(GpuResetTest, AResetWithNoXidBeforeItDoesNotWaitOutTheNvmlEventWait) {
  const std::string config = WriteConfig();
  {
    std::ifstream in(config);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find("eventWaitTimeout: 200ms");
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, std::string("eventWaitTimeout: 200ms").size(), "eventWaitTimeout: 10m");
    std::ofstream(config) << text;
  }
  StartSupervisor(config);
  const std::string gpu = uuids_[6];
  const auto [code, out] = ResetGpu(gpu);
  ASSERT_EQ(code, 0) << out << supervisor_->Output();
  EXPECT_NE(out.find("release ok"), std::string::npos) << out;
  EXPECT_EQ(GpuState(gpu)["resets"], 1);
  EXPECT_TRUE(Eventually([&] { return Healthy(gpu); })) << Verdict(gpu).dump();
  // Its events are watched again once it is back: an XID now is NVML's to report.
  const auto reply = FakeNvml({{"injectXid", {{"uuid", gpu}, {"xid", 79}}}});
  EXPECT_GE(reply.value("delivered", 0), 1) << reply.dump();
}

TEST_F(GpuResetTest, TheSettleWindowWatchesTheGpuBackInServiceAndAnXidInsideItFailsTheReset) {
  // A settle window far longer than the test: the GPU must be Healthy again inside it, not after it.
  const std::string config = WriteConfig();
  {
    std::ifstream in(config);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find("settle: 300ms");
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, std::string("settle: 300ms").size(), "settle: 10m");
    std::ofstream(config) << text;
  }
  StartSupervisor(config);
  const std::string gpu = uuids_[5];
  test::Subprocess cli({Binary(), "reset-gpu", "--state-dir", (dir_ / "state").string(), "--gpu", gpu});
  ASSERT_TRUE(cli.WaitForLine("watching for XIDs until the settle window", std::chrono::seconds(30)))
      << cli.Output() << supervisor_->Output();
  // Back in service while the window runs: Healthy at the kubelet, the job still open.
  EXPECT_TRUE(Healthy(gpu)) << Verdict(gpu).dump();
  EXPECT_EQ(Verdict(gpu).value("reason", ""), "GPU reset occurred") << Verdict(gpu).dump();
  {
    const auto state = DebugState()["gpu-reset.state"];
    ASSERT_EQ(state["jobs"].size(), 1u) << state.dump();
    EXPECT_NE(state["jobs"][0]["phase"], "Succeeded") << state.dump();
  }
  // An XID inside the window (NVML reports it): the reset failed, the GPU is Unhealthy again.
  const auto reply = FakeNvml({{"injectXid", {{"uuid", gpu}, {"xid", 79}}}});
  ASSERT_GE(reply.value("delivered", 0), 1) << reply.dump();
  EXPECT_EQ(cli.Wait(std::chrono::seconds(30)), 1) << cli.Output();
  EXPECT_NE(cli.Output().find("XidAfterReset"), std::string::npos) << cli.Output();
  ASSERT_TRUE(Eventually([&] { return Verdict(gpu).value("recommendedAction", "") == "RESTART_BM"; }))
      << Verdict(gpu).dump() << supervisor_->Output();
  EXPECT_FALSE(Healthy(gpu));
  const auto state = DebugState()["gpu-reset.state"];
  EXPECT_EQ(state["jobs"][0]["phase"], "Failed") << state.dump();
  EXPECT_EQ(state["jobs"][0]["reason"], "XidAfterReset") << state.dump();
  const std::string journal = Journal();
  const auto occurred = journal.find("GPU reset occurred: " + gpu);
  const auto failed = journal.find("GPU reset executed: " + gpu + ", success: false");
  ASSERT_NE(occurred, std::string::npos) << journal;
  ASSERT_NE(failed, std::string::npos) << journal;
  EXPECT_LT(occurred, failed);
}

TEST_F(GpuResetTest, KillNineWhileTheCommandRunsResumesAndValidatesAfterTheRestart) {
  const std::string config = WriteConfig();
  StartSupervisor(config);
  const std::string gpu = uuids_[4];
  FakeNvml({{"setGpuState", {{"uuid", gpu}, {"resetMode", "hang"}}}});
  test::Subprocess cli({Binary(), "reset-gpu", "--state-dir", (dir_ / "state").string(), "--gpu", gpu});
  ASSERT_TRUE(cli.WaitForLine("running ")) << cli.Output() << supervisor_->Output();
  const std::string command_line = std::string("--gpu-reset\0-i\0", 15) + gpu;
  ASSERT_TRUE(Eventually([&] { return ProcessRunning(command_line); }, std::chrono::seconds(10)))
      << "the hanging reset command runs";
  // While its reset runs, the GPU's release is announced (short NVML event waits).
  EXPECT_EQ(DebugState()["gpu-inventory.release-ahead"][gpu]["ahead"], true)
      << DebugState()["gpu-inventory.release-ahead"].dump();
  supervisor_->Signal(SIGKILL);
  ASSERT_EQ(supervisor_->Wait(), 128 + SIGKILL);
  EXPECT_EQ(cli.Wait(), 3) << cli.Output();
  const auto book = json::parse(std::ifstream(dir_ / "state/gpu-reset.json"));
  EXPECT_EQ(book["jobs"][0]["gpus"][0]["step"], "reset") << book.dump();
  // The hung nvidia-smi died with the supervisor (PR_SET_PDEATHSIG on its process group).
  EXPECT_TRUE(Eventually([&] { return !ProcessRunning(command_line); }, std::chrono::seconds(5)))
      << "the reset command died with the supervisor";

  // A new process: the fake NVML's per-GPU state starts afresh (resetMode ok, no resets).
  StartSupervisor(config);
  // Resumed: the reset runs again and validates; the GPU was not Healthy before that.
  ASSERT_TRUE(Eventually([&] {
    const auto state = DebugState()["gpu-reset.state"];
    return state.contains("jobs") && !state["jobs"].empty() && state["jobs"][0]["phase"] == "Succeeded";
  })) << DebugState()["gpu-reset.state"].dump() << supervisor_->Output();
  EXPECT_NE(supervisor_->Output().find("resuming the reset of " + gpu), std::string::npos) << supervisor_->Output();
  EXPECT_EQ(GpuState(gpu)["resets"], 1);
  EXPECT_TRUE(Eventually([&] { return Healthy(gpu); }));
  const std::string journal = Journal();
  EXPECT_NE(journal.find("GPU reset occurred: " + gpu), std::string::npos) << journal;
}

TEST_F(GpuResetTest, AReadOnlyStateDirDoesNotSilenceHealth) {
  // The supervisor in a mount namespace of its own, where stateDir is a read-only bind mount
  // (root writes through file modes; not through a read-only mount).
  const auto probe = test::RunToCompletion({"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/true"});
  if (probe.first != 0) GTEST_SKIP() << "no private mount namespace here: " << probe.second;
  const std::string state = (dir_ / "state").string();
  StartSupervisor(WriteConfig(), {"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                                  "mount --bind \"$0\" \"$0\" && mount -o remount,ro,bind \"$0\" \"$0\" && exec \"$@\"",
                                  state});
  // Every module runs, none restarting: the optional sockets and the cursor are not needed.
  const auto modules = DebugState()["supervisor.module-states"];
  for (const char* name : {"journald", "gpu-health", "gpu-reset", "gpu-inventory"}) {
    EXPECT_EQ(modules[name]["state"], "running") << name << ": " << modules.dump() << supervisor_->Output();
    EXPECT_EQ(modules[name]["restarts"], 0) << name;
  }
  // An XID 79: Unhealthy with RESTART_BM, as with a writable state dir.
  FakeNvml({{"injectXid", {{"uuid", uuids_[0]}, {"xid", 79}}}});
  ASSERT_TRUE(Eventually([&] { return Verdict(uuids_[0]).value("recommendedAction", "") == "RESTART_BM"; }))
      << Verdict(uuids_[0]).dump() << supervisor_->Output();
  EXPECT_FALSE(Healthy(uuids_[0]));
  // The write was tried and counted, and /readyz says health is not persisted.
  ASSERT_TRUE(Eventually([&] {
    const auto r = test::HttpRequest("127.0.0.1", port_, "GET", "/readyz");
    return r.status == 503 && r.body.find("gpu-health") != std::string::npos &&
           r.body.find("health is not persisted") != std::string::npos;
  })) << test::HttpRequest("127.0.0.1", port_, "GET", "/readyz").body;
  const auto metrics = test::HttpRequest("127.0.0.1", port_, "GET", "/metrics").body;
  EXPECT_EQ(metrics.find("gpu_node_supervisor_gpu_health_state_write_failures_total 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpu_node_supervisor_gpu_health_state_write_failures_total"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir_ / "state")) << "nothing could be written there";
  supervisor_->Signal(SIGTERM);
  EXPECT_EQ(supervisor_->Wait(), 0) << supervisor_->Output();
}

TEST_F(GpuResetTest, GpuResetObjectsOfThisNodeAreDoneOnceAndBadOnesGetAClearStatus) {
  gns::test::ApiSim server(dir_ / "api");
  server.Seed(json::parse(R"({"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}})"));
  // NVSentinel's janitor executes this one (it writes the status): never two executors.
  json janitors = json::parse(R"({"apiVersion": "janitor.dgxc.nvidia.com/v1alpha1", "kind": "GPUReset",
    "metadata": {"name": "reset-janitors",
                 "managedFields": [{"manager": "janitor", "operation": "Update", "subresource": "status"}]},
    "spec": {"nodeName": "n1", "selector": {}},
    "status": {"phase": "InProgress", "conditions": [{"type": "ServicesTornDown", "status": "True"}]}})");
  janitors["spec"]["selector"]["uuids"] = {uuids_[4]};
  server.Seed(janitors);
  const std::string kube = "  kube:\n    enabled: true\n    kubeconfig: " + (dir_ / "api/kubeconfig").string() + "\n";
  StartSupervisor(WriteConfig("", kube));
  const std::string path = "/apis/janitor.dgxc.nvidia.com/v1alpha1/gpuresets";
  auto create = [&](const std::string& name, const std::string& node, const json& uuids) {
    const json object{{"apiVersion", "janitor.dgxc.nvidia.com/v1alpha1"},
                      {"kind", "GPUReset"},
                      {"metadata", {{"name", name}}},
                      {"spec", {{"nodeName", node}, {"selector", {{"uuids", uuids}}}}}};
    ASSERT_EQ(server.Call("POST", path, object.dump()).status, 201);
  };
  auto complete = [&](const std::string& name) -> json {
    const auto r = server.Call("GET", path + "/" + name);
    const auto status = r.Json().value("status", json::object());
    for (const auto& c : status.value("conditions", json::array())) {
      if (c.value("type", "") == "Complete" && c.value("status", "") != "Unknown") return c;
    }
    return json();
  };
  create("reset-mine", "n1", {uuids_[5]});
  create("reset-other-node", "n2", {uuids_[6]});
  create("reset-unknown", "n1", {"GPU-00000000-1111-2222-3333-444444444444"});
  // Malformed selectors (issue #24): each refused naming its field, never read as "every GPU".
  const std::vector<std::pair<std::string, json>> malformed = {
      {"reset-selector-list", {{"nodeName", "n1"}, {"selector", json::array({uuids_[7]})}}},
      {"reset-uuids-string", {{"nodeName", "n1"}, {"selector", {{"uuids", uuids_[7]}}}}},
      {"reset-uuids-empty", {{"nodeName", "n1"}, {"selector", {{"uuids", json::array()}}}}},
      {"reset-selector-pruned", {{"nodeName", "n1"}, {"selector", json::object()}}},
      {"reset-no-selector", {{"nodeName", "n1"}}},
  };
  for (const auto& [name, spec] : malformed) {
    const json object{{"apiVersion", "janitor.dgxc.nvidia.com/v1alpha1"},
                      {"kind", "GPUReset"},
                      {"metadata", {{"name", name}}},
                      {"spec", spec}};
    ASSERT_EQ(server.Call("POST", path, object.dump()).status, 201) << name;
  }
  ASSERT_TRUE(Eventually([&] {
    if (complete("reset-mine").is_null() || complete("reset-unknown").is_null()) return false;
    for (const auto& [name, spec] : malformed) {
      if (complete(name).is_null()) return false;
    }
    return true;
  })) << server.Call("GET", path).body << supervisor_->Output();
  for (const auto& [name, spec] : malformed) {
    const auto c = complete(name);
    EXPECT_EQ(c["status"], "False") << name << ": " << c.dump();
    EXPECT_EQ(c["reason"], "InvalidRequest") << name << ": " << c.dump();
    EXPECT_EQ(c["message"].get<std::string>().rfind("spec.selector", 0), 0u) << name << ": " << c.dump();
  }
  EXPECT_NE(complete("reset-uuids-string")["message"].get<std::string>().find(
                "spec.selector.uuids: expected a non-empty list of GPU UUIDs, got a string"),
            std::string::npos);
  const auto mine = complete("reset-mine");
  EXPECT_EQ(mine["status"], "True") << mine.dump();
  const auto mine_status = server.Call("GET", path + "/reset-mine").Json()["status"];
  EXPECT_EQ(mine_status["phase"], "Succeeded");
  EXPECT_TRUE(mine_status.contains("startTime") && mine_status.contains("completionTime")) << mine_status.dump();
  EXPECT_EQ(mine_status["gpus"][0]["uuid"], uuids_[5]);
  EXPECT_GE(mine_status["gpus"][0]["steps"].size(), 7u) << mine_status.dump();
  const auto unknown = complete("reset-unknown");
  EXPECT_EQ(unknown["status"], "False");
  EXPECT_EQ(unknown["reason"], "InvalidRequest");
  EXPECT_NE(unknown["message"].get<std::string>().find("not on node n1"), std::string::npos) << unknown.dump();
  EXPECT_FALSE(server.Call("GET", path + "/reset-other-node").Json().contains("status"))
      << "another node's object is not ours to touch";
  const auto left = server.Call("GET", path + "/reset-janitors").Json();
  EXPECT_EQ(left["status"]["phase"], "InProgress") << "another executor's status is not ours to write: " << left.dump();
  EXPECT_EQ(left["status"]["conditions"].size(), 1u) << left.dump();
  EXPECT_NE(supervisor_->Output().find("GPUReset reset-janitors left alone: its status"),
            std::string::npos)
      << supervisor_->Output();
  EXPECT_EQ(GpuState(uuids_[4])["resets"], 0) << "the janitor's GPU is not reset by us";
  EXPECT_EQ(GpuState(uuids_[5])["resets"], 1);
  for (std::size_t i = 0; i < uuids_.size(); ++i) {
    if (i != 5) {
      EXPECT_EQ(GpuState(uuids_[i])["resets"], 0) << uuids_[i] << " was not asked for";
    }
  }

  // A restart does not act on a finished object again.
  supervisor_->Signal(SIGTERM);
  ASSERT_EQ(supervisor_->Wait(), 0) << supervisor_->Output();
  StartSupervisor(WriteConfig("", kube));
  std::this_thread::sleep_for(milliseconds(1500));
  // (A new process: the fake's reset count starts at 0 again; a second reset would show as 1.)
  EXPECT_EQ(GpuState(uuids_[5])["resets"], 0) << supervisor_->Output();
  EXPECT_EQ(supervisor_->Output().find("step hold"), std::string::npos) << supervisor_->Output();
  supervisor_->Signal(SIGTERM);
  EXPECT_EQ(supervisor_->Wait(), 0) << supervisor_->Output();
  // Every API call made, by module, is in the recording deploy/'s RBAC is checked against
  // (deploy/recorded-api-calls/gpu-reset.json, tests/support/module_calls.hpp).
  test::SiteView site;
  site.config = YAML::LoadFile(WriteConfig("", kube));
  for (const auto& problem : test::CheckRecordedCalls("gpu-reset", "integration_gpu_reset_test",
                                                      server.Call("GET", "/_sim/stats").Json(),
                                                      test::ResolvedImexGates(site))) {
    ADD_FAILURE() << problem;
  }
  server.Stop();
}

// autoReset through the real binary: an XID 48 (COMPONENT_RESET) from NVML on a GPU no pod holds
// (no pod-resources module here: the holders step checks NVML's processes) is reset without any
// request, once, and the GPU serves again.
TEST_F(GpuResetTest, AutoResetResetsAComponentResetGpuOnceWithoutARequest) {
  StartSupervisor(WriteConfig("    autoReset: true\n"));
  const std::string& gpu = uuids_[6];
  FakeNvml({{"injectXid", {{"uuid", gpu}, {"xid", 48}}}});
  ASSERT_TRUE(Eventually([&] { return GpuState(gpu)["resets"] == 1; }, std::chrono::seconds(30)))
      << GpuState(gpu).dump() << supervisor_->Output();
  ASSERT_TRUE(Eventually([&] {
    const auto jobs = DebugState()["gpu-reset.state"]["jobs"];
    return jobs.size() == 1 && jobs[0]["phase"] == "Succeeded";
  })) << DebugState()["gpu-reset.state"].dump() << supervisor_->Output();
  EXPECT_TRUE(Eventually([&] { return Healthy(gpu); })) << Verdict(gpu).dump();
  const auto jobs = DebugState()["gpu-reset.state"]["jobs"];
  ASSERT_EQ(jobs.size(), 1u) << jobs.dump();
  EXPECT_EQ(jobs[0]["id"].get<std::string>().rfind("auto/" + gpu + "/", 0), 0u) << jobs.dump();
  EXPECT_EQ(jobs[0]["phase"], "Succeeded") << jobs.dump();
  // The Healthy verdict after the reset asks for nothing more: still one reset.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(GpuState(gpu)["resets"], 1);
  for (std::size_t i = 0; i < uuids_.size(); ++i) {
    if (i != 6) {
      EXPECT_EQ(GpuState(uuids_[i])["resets"], 0) << uuids_[i];
    }
  }
}

// One maintenance at a time, in the order asked: a second reset-gpu while the first runs is
// queued behind it and starts only after the first's "GPU reset occurred".
TEST_F(GpuResetTest, QueuedResetsRunOneAtATimeInTheOrderAsked) {
  StartSupervisor(WriteConfig());
  auto first = std::async(std::launch::async, [&] { return ResetGpu(uuids_[1]); });
  ASSERT_TRUE(Eventually([&] { return Journal().find("GPU reset started: " + uuids_[1]) != std::string::npos; }))
      << supervisor_->Output();
  auto second = std::async(std::launch::async, [&] { return ResetGpu(uuids_[2]); });
  const auto [code1, out1] = first.get();
  const auto [code2, out2] = second.get();
  ASSERT_EQ(code1, 0) << out1;
  ASSERT_EQ(code2, 0) << out2;
  EXPECT_NE(out2.find("queued behind"), std::string::npos) << out2;
  const std::string journal = Journal();
  const auto started1 = journal.find("GPU reset started: " + uuids_[1]);
  const auto occurred1 = journal.find("GPU reset occurred: " + uuids_[1]);
  const auto started2 = journal.find("GPU reset started: " + uuids_[2]);
  const auto occurred2 = journal.find("GPU reset occurred: " + uuids_[2]);
  ASSERT_NE(occurred2, std::string::npos) << journal;
  EXPECT_LT(started1, occurred1) << journal;
  EXPECT_LT(occurred1, started2) << "the second starts after the first is done:\n" << journal;
  EXPECT_LT(started2, occurred2) << journal;
  EXPECT_EQ(GpuState(uuids_[1])["resets"], 1);
  EXPECT_EQ(GpuState(uuids_[2])["resets"], 1);
}

}  // namespace
}  // namespace gns
