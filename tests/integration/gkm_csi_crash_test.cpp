// gkm-csi through the real binary across kill -9 (issue 30): a pod's volume of a Ready kernel
// cache is published (a read-only bind mount), the supervisor is killed with SIGKILL, the cache's
// object is deleted while it is down, and a new process must find the volume again (mountinfo +
// usage.json): the kubelet's retried publish is OK without a second mount, the cache directory
// stays while the pod has it, the unpublish works and is idempotent, and the directory goes once
// the last pod let go.
//
// The mounts live in a private mount namespace that outlives every supervisor process: a holder
// (`unshare --mount --propagation private sleep`) owns it, and each supervisor enters it
// (`nsenter --mount=/proc/<holder>/ns/mnt`), as a node's mounts outlive a crashed plugin. This
// process looks at them through /proc/<holder>/{mountinfo,root}. Needs root (CAP_SYS_ADMIN);
// skipped, saying so, without it.
#include "process_paths.hpp"
#include "support/api_sim.hpp"
#include "support/subprocess.hpp"
#include "unit/modules/gkm_agent/registry_fixture.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace gns::gkm_csi_crash {  // its own: tests/integration is compiled as one unit
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kNode = "gkm-node";
constexpr const char* kCaches = "/apis/gkm.io/v1alpha1/namespaces/ml/gkmcaches";
constexpr const char* kUid = "7a0d3c1e-9b8f-4c2d-a1e0-5f6e7d8c9b0a";

class GkmCsiCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: the plugin bind-mounts in a mount namespace of its own";
    char pattern[] = "/tmp/gkc-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    holder_ = std::make_unique<test::Subprocess>(
        std::vector<std::string>{"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sleep", "300"});
    // unshare execs sleep once the namespace is made: until then /proc/<pid>/ns/mnt is ours.
    std::string own;
    {
      std::error_code ec;
      own = fs::read_symlink("/proc/self/ns/mnt", ec).string();
    }
    const auto until = std::chrono::steady_clock::now() + seconds(10);
    for (;;) {
      std::error_code ec;
      const auto ns = fs::read_symlink("/proc/" + std::to_string(holder_->Pid()) + "/ns/mnt", ec).string();
      std::ifstream comm("/proc/" + std::to_string(holder_->Pid()) + "/comm");
      std::string name;
      std::getline(comm, name);
      if (!ec && ns != own && name == "sleep") break;
      if (ec || std::chrono::steady_clock::now() > until) {
        GTEST_SKIP() << "no private mount namespace (unshare --mount): " << holder_->Output();
      }
      std::this_thread::sleep_for(milliseconds(20));  // a process start, not a state of ours
    }

    registry_dir_ = dir_ / "registry";
    fs::create_directories(registry_dir_);
    registry_ = std::make_unique<gkm::test::TestRegistry>(registry_dir_);
    std::ofstream(dir_ / "ca.pem") << registry_->CaPem();
    pushed_ = registry_->Push("caches/llama", "v1", {"--triton", "90"});  // the fake NVML's GPUs are sm_90

    api_ = std::make_unique<test::ApiSim>(dir_ / "api");
    api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
    api_->Seed(json{{"_resource", kCaches},
                    {"apiVersion", "gkm.io/v1alpha1"},
                    {"kind", "GKMCache"},
                    {"metadata", {{"name", "llama"}, {"namespace", "ml"}}},
                    {"spec", {{"image", registry_->Host() + "/caches/llama:v1"}}}});

    fs::create_directories(dir_ / "kubelet/pods");
    fs::create_directories(dir_ / "host/proc");
    config_ = (dir_ / "site.yaml").string();
    std::ofstream(config_) << "version: v1\nnodeName: " << kNode << "\npaths:\n  kubeletDir: "
                           << (dir_ / "kubelet").string() << "\n  cdiDir: " << (dir_ / "cdi").string()
                           << "\n  stateDir: " << (dir_ / "state").string()
                           << "\n  hostRoot: " << (dir_ / "host").string()
                           << "\nmodules:\n  kube:\n    enabled: true\n    kubeconfig: "
                           << (dir_ / "api/kubeconfig").string()
                           << "\n  gpu-inventory:\n    enabled: true\n    nvmlLibrary: "
                           << Built("tools/sim/fake_nvml/libnvidia-ml.so.1")
                           << "\n  gkm-agent:\n    enabled: true\n    cacheRoot: " << (dir_ / "caches").string()
                           << "\n    usageRoot: " << (dir_ / "usage").string()
                           << "\n    registryCaFile: " << (dir_ / "ca.pem").string()
                           << "\n  gkm-csi:\n    enabled: true\n    register: false\n";
    target_ = (dir_ / "kubelet/pods" / kUid / "volumes/kubernetes.io~csi/kernel-cache/mount").string();
    fs::create_directories(fs::path(target_).parent_path());  // the kubelet's part
  }

  void TearDown() override {
    if (proc_) {
      proc_->Signal(SIGKILL);
      proc_->Wait(seconds(30));
    }
    if (holder_) {
      holder_->Signal(SIGKILL);  // the namespace, and every mount in it, goes with its last process
      holder_->Wait(seconds(30));
    }
    if (api_) api_->Stop();
    registry_.reset();
    std::error_code ignored;  // best effort
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  std::string Holder() const { return "/proc/" + std::to_string(holder_->Pid()); }

  // A supervisor inside the holder's mount namespace, up once its CSI socket answers Probe ready.
  void Launch() {
    proc_ = std::make_unique<test::Subprocess>(
        std::vector<std::string>{"/usr/bin/nsenter", "--mount=" + Holder() + "/ns/mnt", "--", Binary(), "run",
                                 "--config", config_},
        // (docs_test.cpp, compiled in the same unit, has a Source() of its own)
        std::map<std::string, std::string>{
            {"FAKE_NVML_CONFIG", std::string(std::getenv("GNS_SOURCE_DIR")) + "/tools/sim/fake_nvml/gpus-8.json"}});
    const auto until = std::chrono::steady_clock::now() + seconds(60);
    for (;;) {
      const json probe = Csi("Probe", json::object());
      if (probe.value("code", -1) == 0 && probe["response"].value("ready", false)) return;
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "never ready: " << probe.dump() << "\n" << proc_->Output();
      ASSERT_FALSE(proc_->Wait(milliseconds(1)).has_value()) << "the supervisor exited:\n" << proc_->Output();
      std::this_thread::sleep_for(milliseconds(200));  // polling another process's socket
    }
  }

  void Kill() {
    proc_->Signal(SIGKILL);
    ASSERT_EQ(proc_->Wait(seconds(30)), 128 + SIGKILL);
    proc_.reset();
  }

  // One call through gns-csi-client (the CSI spec's own stubs), as the kubelet makes it.
  json Csi(const std::string& method, const json& request) {
    const auto [rc, out] = test::RunToCompletion({Built("tools/sim/csi_client/gns-csi-client"), "--socket",
                                                  (dir_ / "kubelet/plugins/csi.gkm.io/csi.sock").string(), method,
                                                  request.dump(), "--timeout-ms", "5000"});
    std::istringstream lines(out);
    json last;
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.front() == '{') last = json::parse(line, nullptr, false);
    }
    return last.is_object() ? last : json{{"code", -1}, {"out", out}};
  }

  json Publish() {
    return Csi("NodePublishVolume",
               json{{"volume_id", "csi-crash-1"},
                    {"target_path", target_},
                    {"readonly", true},
                    {"volume_capability", {{"mount", json::object()}, {"access_mode", {{"mode", "SINGLE_NODE_WRITER"}}}}},
                    {"volume_context",
                     {{"cacheName", "llama"},
                      {"cacheNamespace", "ml"},
                      {"csi.storage.k8s.io/pod.name", "trainer"},
                      {"csi.storage.k8s.io/pod.namespace", "ml"},
                      {"csi.storage.k8s.io/pod.uid", kUid},
                      {"csi.storage.k8s.io/ephemeral", "true"}}}});
  }
  json Unpublish() { return Csi("NodeUnpublishVolume", json{{"volume_id", "csi-crash-1"}, {"target_path", target_}}); }

  // The mounts at the target in the holder's namespace, with their options ("ro,nosuid,…").
  std::vector<std::string> MountsAtTarget() const {
    std::ifstream in(Holder() + "/mountinfo");
    std::vector<std::string> found;
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string id, parent, dev, root, point, options;
      fields >> id >> parent >> dev >> root >> point >> options;
      if (point == target_) found.push_back(options);
    }
    return found;
  }

  std::vector<std::string> UsageVolumes() const {
    std::ifstream in(dir_ / "usage/namespaced/ml/llama/usage.json");
    std::vector<std::string> ids;
    const json usage = json::parse(in, nullptr, false);
    if (!usage.is_object()) return ids;
    for (const auto& [pod, records] : usage.items()) {
      for (const auto& r : records) ids.push_back(r.value("volumeId", ""));
    }
    return ids;
  }

  fs::path dir_;
  fs::path registry_dir_;
  std::string config_;
  std::string target_;
  json pushed_;
  std::unique_ptr<test::Subprocess> holder_;
  std::unique_ptr<gkm::test::TestRegistry> registry_;
  std::unique_ptr<test::ApiSim> api_;
  std::unique_ptr<test::Subprocess> proc_;
};

TEST_F(GkmCsiCrashTest, AKilledPluginFindsItsVolumeAndTheCacheGoesOnlyWhenThePodLetsGo) {
  Launch();
  const fs::path cache = dir_ / "caches/namespaced/ml/llama";
  // Ready is the agent's word: until then the plugin refuses (FAILED_PRECONDITION) or has not
  // listed (UNAVAILABLE); the kubelet retries the same way.
  json published;
  const auto until = std::chrono::steady_clock::now() + seconds(60);
  while ((published = Publish()).value("code", -1) != 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << published.dump() << "\n" << proc_->Output();
    std::this_thread::sleep_for(milliseconds(200));
  }
  auto mounts = MountsAtTarget();
  ASSERT_EQ(mounts.size(), 1u) << "not mounted in the holder's namespace";
  EXPECT_EQ(mounts[0].substr(0, 3), "ro,") << mounts[0];
  EXPECT_TRUE(fs::exists(Holder() + "/root" + target_ + "/.")) << "the pod's view of the cache";
  EXPECT_EQ(UsageVolumes(), std::vector<std::string>{"csi-crash-1"});

  Kill();
  // The pod keeps its cache: the mount and the record outlive the process.
  EXPECT_EQ(MountsAtTarget().size(), 1u);
  EXPECT_EQ(UsageVolumes(), std::vector<std::string>{"csi-crash-1"});
  // The cache's object is deleted while nobody runs: the next start must not take the
  // directory from under the pod.
  ASSERT_EQ(api_->Call("DELETE", std::string(kCaches) + "/llama").status, 200);

  Launch();
  // The kubelet retries the publish whose answer it may have missed: OK, not a second mount.
  published = Publish();
  EXPECT_EQ(published.value("code", -1), 0) << published.dump() << "\n" << proc_->Output();
  EXPECT_EQ(MountsAtTarget().size(), 1u) << "mounted twice";
  // Probe said ready: the agent has listed and swept (no object refers to the cache any more),
  // and left it, in use.
  ASSERT_TRUE(proc_->WaitForLine("its object is gone but pods still use it", seconds(10)).has_value()) << proc_->Output();
  EXPECT_TRUE(fs::is_directory(cache)) << "a cache in use was removed under its pod";
  EXPECT_EQ(UsageVolumes(), std::vector<std::string>{"csi-crash-1"});

  // The pod lets go: unmounted, the record gone, and with it the cache's directory.
  const json unpublished = Unpublish();
  EXPECT_EQ(unpublished.value("code", -1), 0) << unpublished.dump();
  EXPECT_TRUE(MountsAtTarget().empty());
  EXPECT_TRUE(UsageVolumes().empty());
  const auto gone_by = std::chrono::steady_clock::now() + seconds(20);
  while (fs::exists(cache) && std::chrono::steady_clock::now() < gone_by) {
    std::this_thread::sleep_for(milliseconds(100));  // the agent reacts to usage.json (inotify)
  }
  EXPECT_FALSE(fs::exists(cache)) << "the last pod let go, the deleted cache's directory stayed\n" << proc_->Output();
  // Idempotent: again, and once more after another kill -9.
  EXPECT_EQ(Unpublish().value("code", -1), 0);
  Kill();
  Launch();
  EXPECT_EQ(Unpublish().value("code", -1), 0);
  EXPECT_TRUE(MountsAtTarget().empty());
}

}  // namespace
}  // namespace gns::gkm_csi_crash
