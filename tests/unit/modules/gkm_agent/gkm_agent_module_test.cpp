// The gkm-agent module against the simulated API server and a real registry: a GKMCache
// becomes Ready with its compatible and incompatible GPU sets in a GKMCacheNode; pod usage
// from the CSI driver's file shows up; deleting the cache removes files and status; caches no
// GPU can use are not kept; tampered images fail with a precise reason; a start sweeps caches
// no object refers to and migrates an old layout; namespaced and cluster caches never share a
// directory; two nodes' status objects never share a name; a deleted cache a pod still uses
// (usage.json) stays until the last pod lets go; the verdicts reach the CSI side (CacheStates).
#include "modules/gkm_agent/gkm_agent_module.hpp"
#include "modules/gkm_agent/messages.hpp"
#include "registry_fixture.hpp"
#include "support/held_pool.hpp"
#include "support/quiet_logger.hpp"
#include "unit/modules/kube/kube_test_util.hpp"

#include <boost/asio/steady_timer.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>
#include <system_error>

namespace gns::gkm {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
namespace fs = std::filesystem;

// A registry that never answers: a TCP listener the test never accepts on. The kernel completes
// each connection (the backlog), so a client connects and then waits for a TLS answer that
// never comes.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::system_error(errno, std::generic_category(), "silent listener");
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  std::string Host() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

constexpr const char* kCaches = "/apis/gkm.io/v1alpha1/namespaces/ml/gkmcaches";
constexpr const char* kClusterCaches = "/apis/gkm.io/v1alpha1/clustergkmcaches";
constexpr const char* kNodes = "/apis/gkm.io/v1alpha1/namespaces/ml/gkmcachenodes";
constexpr const char* kClusterNodes = "/apis/gkm.io/v1alpha1/clustergkmcachenodes";

class GkmAgentTest : public kube::test::KubeTestBase {
 protected:
  static void SetUpTestSuite() {
    reg_dir_ = new fs::path(gns::test::MakeTempDir("gkm-module-registry"));
    registry_ = new test::TestRegistry(*reg_dir_);
  }
  static void TearDownTestSuite() {
    delete registry_;
    fs::remove_all(*reg_dir_);
    delete reg_dir_;
  }

  void SetUp() override {
    KubeTestBase::SetUp();
    root_ = gns::test::MakeTempDir("gkm-module");
    config_.cache_root = (root_ / "caches").string();
    config_.usage_root = (root_ / "usage").string();
    std::ofstream(root_ / "ca.pem") << registry_->CaPem();
    config_.registry_ca_file = (root_ / "ca.pem").string();
    config_.request_timeout = milliseconds(5000);
    config_.retry_interval = milliseconds(60000);
  }

  void TearDown() override {
    for (auto* m : {&module_, &second_}) {
      if (!*m) continue;
      bool done = false;
      (*m)->Stop([&] { done = true; });
      EXPECT_TRUE(h_.RunUntil([&] { return done; }));
      m->reset();
    }
    if (informers_) informers_->StopAll();
    KubeTestBase::TearDown();
    fs::remove_all(root_);
  }

  void StartAgent(std::vector<gpu_inventory::GpuInfo> gpus, const std::string& node = "node-a") {
    h_.site.node_name = node;
    auto client = MakeClient(BaseConfig());
    kube::InformerOptions options;
    options.backoff = BackoffPolicy{milliseconds(50), milliseconds(500), 2.0, 0.5};
    informers_ = std::make_shared<kube::InformerRegistry>(client, h_.bus, h_.loop.Io(), h_.metrics,
                                                          gns::test::QuietLogger("kube-test"), options);
    h_.services.Provide<kube::KubeClient>(client);
    h_.services.Provide<kube::InformerRegistry>(informers_);
    gpu_inventory::GpuInventory inv;
    inv.available = true;
    inv.driver_version = "550.90.07";
    inv.cuda_driver_version = 12040;
    inv.gpus = std::move(gpus);
    h_.bus.Publish(inv);
    context_ = std::make_unique<ModuleContext>(h_.Parts(), std::string(GkmAgentModule::kName), [](std::string) {},
                                               [](ModuleHealth, std::string) {});
    module_ = std::make_unique<GkmAgentModule>(*context_, config_);
    module_->Start();
  }

  // Another node's agent beside the first (its own cacheRoot), sharing the API and the GPUs.
  void StartSecondAgent(const std::string& node) {
    h_.site.node_name = node;
    auto config = config_;
    config.cache_root = (root_ / ("caches-" + node)).string();
    config.usage_root = (root_ / ("usage-" + node)).string();
    second_context_ = std::make_unique<ModuleContext>(h_.Parts(), std::string(GkmAgentModule::kName),
                                                      [](std::string) {}, [](ModuleHealth, std::string) {});
    second_ = std::make_unique<GkmAgentModule>(*second_context_, config);
    second_->Start();
  }

  // The status object of `cache` on `node`: "<length of the cache's name>.<cache>.<node>".
  static std::string StatusName(const std::string& cache, const std::string& node = "node-a") {
    return std::to_string(cache.size()) + "." + cache + "." + node;
  }

  static gpu_inventory::GpuInfo Gpu(uint32_t index, const std::string& name, int major, int minor) {
    gpu_inventory::GpuInfo g;
    g.index = index;
    g.uuid = "GPU-" + std::to_string(index);
    g.name = name;
    g.cc_major = major;
    g.cc_minor = minor;
    return g;
  }

  static json Cache(const std::string& name, const std::string& image, bool cluster = false) {
    json c = {{"apiVersion", "gkm.io/v1alpha1"},
              {"kind", cluster ? "ClusterGKMCache" : "GKMCache"},
              {"metadata", {{"name", name}}},
              {"spec", {{"image", image}}}};
    if (!cluster) c["metadata"]["namespace"] = "ml";
    return c;
  }

  // The cache entry of a (Cluster)GKMCacheNode once its state is `state`.
  json WaitForState(const std::string& nodes, const std::string& cache, const std::string& state) {
    json entry;
    const std::string path = nodes + "/" + StatusName(cache);
    EXPECT_TRUE(h_.RunUntil(
        [&] {
          const auto r = server_->Call("GET", path);
          if (r.status != 200) return false;
          auto obj = r.Json();
          entry = obj["status"]["caches"][cache];
          return entry.is_object() && entry["state"] == state;
        },
        std::chrono::seconds(60)))
        << path << " never " << state << "; last: " << entry.dump();
    return entry;
  }

  static std::vector<std::string> Entries(const fs::path& dir) {
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  static std::size_t Kernels(const fs::path& dir) {
    std::size_t n = 0;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      n += it->path().filename() == "add_kernel.json";
    }
    return n;
  }

  static fs::path* reg_dir_;
  static test::TestRegistry* registry_;
  fs::path root_;
  GkmAgentModule::Config config_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<GkmAgentModule> module_;
  std::unique_ptr<ModuleContext> second_context_;
  std::unique_ptr<GkmAgentModule> second_;
};

fs::path* GkmAgentTest::reg_dir_ = nullptr;
test::TestRegistry* GkmAgentTest::registry_ = nullptr;

TEST_F(GkmAgentTest, ACacheBecomesReadyPerGpuThenGoesAwayWithItsObject) {
  const auto pushed = registry_->Push("caches/llama", "v1", {"--triton", "80,90"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0), Gpu(1, "NVIDIA H200", 9, 0), Gpu(2, "NVIDIA L40S", 8, 9)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("llama", registry_->Host() + "/caches/llama:v1").dump()).status, 201);

  auto entry = WaitForState(kNodes, "llama", "Ready");
  EXPECT_EQ(entry["digest"], pushed["manifest"]);
  EXPECT_EQ(entry["compatibleGPUs"], json::parse(R"([{"ids":[0,1]}])"));
  ASSERT_EQ(entry["incompatibleGPUs"].size(), 1u);
  EXPECT_EQ(entry["incompatibleGPUs"][0]["ids"], json::parse("[2]"));
  EXPECT_EQ(entry["incompatibleGPUs"][0]["reason"], "ArchitectureMismatch");
  auto node = server_->Call("GET", std::string(kNodes) + "/5.llama.node-a").Json();
  EXPECT_EQ(node["metadata"]["labels"]["gkm.node"], "node-a");
  EXPECT_TRUE(node["metadata"]["annotations"].contains("gkm.io/lastUpdated"));
  EXPECT_EQ(node["spec"]["nodeName"], "node-a");
  EXPECT_EQ(node["status"]["gpus"].size(), 2u);  // H200 ×2 and L40S, grouped by type

  // The cache is on disk, in place, with nothing half-written beside it.
  const fs::path dir = root_ / "caches/namespaced/ml/llama";
  EXPECT_EQ(Kernels(dir), 2u);
  EXPECT_EQ(Entries(root_ / "caches"), (std::vector<std::string>{".layout", "namespaced"}));  // no .pull-* left

  // The CSI driver records a pod (atomically, by rename): the status follows.
  const fs::path usage = root_ / "usage/namespaced/ml/llama";
  ASSERT_TRUE(h_.RunUntil([&] { return fs::exists(usage); }));
  std::ofstream(usage / "usage.json.tmp")
      << R"({"pod-foo":[{"podName":"pod-foo","podNamespace":"ml","volumeId":"csi-1","targetPath":"/x"}]})";
  fs::rename(usage / "usage.json.tmp", usage / "usage.json");
  ASSERT_TRUE(h_.RunUntil([&] {
    auto n = server_->Call("GET", std::string(kNodes) + "/" + StatusName("llama")).Json();
    return n["status"]["caches"]["llama"]["pods"] == json::parse(R"([{"podName":"pod-foo","podNamespace":"ml","volumeId":"csi-1"}])");
  }));

  // Issue #24 §6: usage.json is read on the pool, never on the loop (the CSI side writes it;
  // a slow disk or a large file there once stalled every module). With the pool held the loop
  // keeps turning and the status keeps what was read last; once the pool is free it follows.
  auto pods = [&] {
    return server_->Call("GET", std::string(kNodes) + "/" + StatusName("llama")).Json()["status"]["caches"]["llama"]["pods"];
  };
  {
    gns::test::HeldPool held(h_.pool);
    std::ofstream(usage / "usage.json.tmp")
        << R"({"pod-bar":[{"podName":"pod-bar","podNamespace":"ml","volumeId":"csi-2"}]})";
    fs::rename(usage / "usage.json.tmp", usage / "usage.json");
    int turns = 0;
    boost::asio::steady_timer tick(h_.loop.Io());
    std::function<void()> arm = [&] {
      tick.expires_after(std::chrono::milliseconds(10));
      tick.async_wait([&](const boost::system::error_code& ec) {
        if (!ec && ++turns < 30) arm();
      });
    };
    arm();
    ASSERT_TRUE(h_.RunUntil([&] { return turns == 30; })) << "the loop stalled";
    EXPECT_EQ(pods()[0]["podName"], "pod-foo") << "usage.json was read on the loop";
  }
  ASSERT_TRUE(h_.RunUntil([&] { return pods() == json::parse(R"([{"podName":"pod-bar","podNamespace":"ml","volumeId":"csi-2"}])"); }));

  // The CSI side follows the agent's verdict: the cache is Ready in CacheStates, with its paths.
  std::optional<CacheStates> states;
  auto states_sub = h_.bus.Subscribe<CacheStates>([&](const CacheStates& s) { states = s; });
  ASSERT_TRUE(h_.RunUntil([&] { return states && states->caches.count("namespaced/ml/llama"); }));
  EXPECT_TRUE(states->listed);
  EXPECT_EQ(states->caches.at("namespaced/ml/llama").state, "Ready");
  EXPECT_EQ(states->caches.at("namespaced/ml/llama").directory, dir.string());
  EXPECT_EQ(states->caches.at("namespaced/ml/llama").compatible_gpus, (std::vector<uint32_t>{0, 1}));

  // Deleted while a pod still mounts it (pod-bar's record): the status object goes, the cache
  // leaves CacheStates (no new mounts), but its files stay under the pod.
  ASSERT_EQ(server_->Call("DELETE", std::string(kCaches) + "/llama").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] {
    return server_->Call("GET", std::string(kNodes) + "/" + StatusName("llama")).status == 404 &&
           !states->caches.count("namespaced/ml/llama");
  }));
  h_.RunUntil([] { return false; }, milliseconds(300));  // the removal's pool job had its chance
  EXPECT_EQ(Kernels(dir), 2u) << "a cache in use was removed under its pod";
  // The last pod lets go (the CSI side rewrites usage.json): the directory goes.
  std::ofstream(usage / "usage.json.tmp") << "{}";
  fs::rename(usage / "usage.json.tmp", usage / "usage.json");
  EXPECT_TRUE(h_.RunUntil([&] { return !fs::exists(dir); }));
}

// Issue 30: the agent pulls every cache again at its start. A cache a pod mounts is never
// replaced under it: the installed copy stays (same inode), Ready, and the newer image waits
// until the last pod lets go.
TEST_F(GkmAgentTest, ARestartNeverReplacesACacheUnderItsPods) {
  const auto first = registry_->Push("caches/inuse", "v1", {"--triton", "80,90"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("inuse", registry_->Host() + "/caches/inuse:v1").dump()).status, 201);
  auto entry = WaitForState(kNodes, "inuse", "Ready");
  ASSERT_EQ(entry["digest"], first["manifest"]);
  const fs::path dir = root_ / "caches/namespaced/ml/inuse";
  auto inode = [&] {
    struct stat st {};
    return ::stat(dir.c_str(), &st) == 0 ? st.st_ino : 0;
  };
  const auto before = inode();
  ASSERT_NE(before, 0u);
  const fs::path usage = root_ / "usage/namespaced/ml/inuse";
  ASSERT_TRUE(h_.RunUntil([&] { return fs::exists(usage); }));
  std::ofstream(usage / "usage.json.tmp") << R"({"pod-foo":[{"podName":"pod-foo","podNamespace":"ml","volumeId":"csi-1"}]})";
  fs::rename(usage / "usage.json.tmp", usage / "usage.json");

  // A new image under the same tag, and the agent restarts: its pull gets the new digest.
  const auto second = registry_->Push("caches/inuse", "v1", {"--triton", "90"});
  ASSERT_NE(second["manifest"], first["manifest"]);
  bool stopped = false;
  module_->Stop([&] { stopped = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
  module_.reset();
  second_context_ = std::make_unique<ModuleContext>(h_.Parts(), std::string(GkmAgentModule::kName),
                                                    [](std::string) {}, [](ModuleHealth, std::string) {});
  second_ = std::make_unique<GkmAgentModule>(*second_context_, config_);
  second_->Start();
  json cache;
  ASSERT_TRUE(h_.RunUntil([&] {
    cache = server_->Call("GET", std::string(kNodes) + "/" + StatusName("inuse")).Json()["status"]["caches"]["inuse"];
    return cache.value("reason", "") == "UpdateDeferred";
  }, std::chrono::seconds(60))) << cache.dump();
  EXPECT_EQ(cache["state"], "Ready");
  EXPECT_NE(cache["message"].get<std::string>().find(second["manifest"].get<std::string>() + " waits"), std::string::npos);
  EXPECT_EQ(inode(), before) << "the cache was replaced under its pod";
  EXPECT_EQ(Kernels(dir), 2u);  // the first image's kernels (sm_80 and sm_90)
  EXPECT_EQ(cache["compatibleGPUs"], json::parse(R"([{"ids":[0]}])"));

  // The pod lets go: the newer image goes in.
  std::ofstream(usage / "usage.json.tmp") << "{}";
  fs::rename(usage / "usage.json.tmp", usage / "usage.json");
  ASSERT_TRUE(h_.RunUntil([&] {
    cache = server_->Call("GET", std::string(kNodes) + "/" + StatusName("inuse")).Json()["status"]["caches"]["inuse"];
    return cache["digest"] == second["manifest"] && cache["state"] == "Ready";
  }, std::chrono::seconds(60))) << cache.dump();
  EXPECT_FALSE(cache.contains("reason"));
  EXPECT_EQ(Kernels(dir), 1u);
}

// Issue 30: a Ready cache pulled again (another image; a restart with another one) turned
// Pulling and the CSI side refused new mounts, although the installed copy stayed in place. The
// agent now vouches for that copy (CacheStates serving_*) until a new one is installed Ready:
// through a failed pull of another image, through a restart (found on disk) whose pull hangs,
// and it withdraws it when the directory goes. No step waits for a pull deadline (a loaded
// machine makes those flaky): a hanging pull ends with its agent.
TEST_F(GkmAgentTest, APulledAgainCacheKeepsServingItsInstalledCopyUntilTheNewOneIsReady) {
  const auto first = registry_->Push("caches/again", "v1", {"--triton", "90"});
  SilentListener silent;
  std::optional<CacheStates> states;
  auto states_sub = h_.bus.Subscribe<CacheStates>([&](const CacheStates& s) { states = s; });
  auto view = [&]() -> CacheView {
    if (!states || !states->caches.count("namespaced/ml/again")) return {};
    return states->caches.at("namespaced/ml/again");
  };
  const std::string path = std::string(kCaches) + "/again";
  auto set_image = [&](const std::string& image) {
    const auto r = server_->Call("PATCH", path, json{{"spec", {{"image", image}}}}.dump(), "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.body;
  };
  // Stops the running agent (a pull under way ends with it) and starts another on the same roots.
  auto restart = [&](const std::function<void()>& while_down) {
    for (auto* m : {&module_, &second_}) {
      if (!*m) continue;
      bool stopped = false;
      (*m)->Stop([&] { stopped = true; });
      ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
      m->reset();
    }
    states.reset();
    while_down();
    second_context_ = std::make_unique<ModuleContext>(h_.Parts(), std::string(GkmAgentModule::kName),
                                                      [](std::string) {}, [](ModuleHealth, std::string) {});
    second_ = std::make_unique<GkmAgentModule>(*second_context_, config_);
    second_->Start();
  };
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("again", registry_->Host() + "/caches/again:v1").dump()).status, 201);
  ASSERT_TRUE(h_.RunUntil([&] { return view().state == "Ready"; }, std::chrono::seconds(120))) << view().state;
  EXPECT_EQ(view().serving_digest, first["manifest"]);
  EXPECT_EQ(view().serving_gpus, (std::vector<uint32_t>{0}));
  const fs::path dir = root_ / "caches/namespaced/ml/again";

  // Another image that the registry does not have: Failed (the status says so); the installed
  // copy still serves.
  set_image(registry_->Host() + "/caches/again:missing");
  ASSERT_TRUE(h_.RunUntil([&] { return view().state == "Failed"; }, std::chrono::seconds(120))) << view().state;
  EXPECT_EQ(view().reason, "NotFound");
  EXPECT_EQ(view().serving_digest, first["manifest"]);
  EXPECT_EQ(view().serving_gpus, (std::vector<uint32_t>{0}));
  EXPECT_EQ(Kernels(dir), 1u);

  // A restart while the object names an image whose registry never answers: nothing of the
  // last run is known; the copy on disk is checked and serves while the pull hangs.
  restart([&] { set_image(silent.Host() + "/caches/again:v2"); });
  ASSERT_TRUE(h_.RunUntil([&] { return view().state == "Pulling" && !view().serving_gpus.empty(); },
                          std::chrono::seconds(120)))
      << view().state;
  EXPECT_EQ(view().serving_gpus, (std::vector<uint32_t>{0}));
  if (!view().serving_digest.empty()) {
    EXPECT_EQ(view().serving_digest, first["manifest"]);  // with user xattrs
  }

  // The new image, and it is Ready: it serves from now on.
  const auto second = registry_->Push("caches/again", "v2", {"--triton", "80,90"});
  restart([&] { set_image(registry_->Host() + "/caches/again:v2"); });
  ASSERT_TRUE(h_.RunUntil([&] { return view().state == "Ready" && view().digest == second["manifest"]; },
                          std::chrono::seconds(120)))
      << view().state << " " << view().digest;
  EXPECT_EQ(view().serving_digest, second["manifest"]);
  EXPECT_EQ(Kernels(dir), 2u);

  // A newer image no GPU here can use: the installed copy goes, and with it the serving.
  registry_->Push("caches/again", "v3", {"--triton", "70"});
  set_image(registry_->Host() + "/caches/again:v3");
  ASSERT_TRUE(h_.RunUntil([&] { return view().state == "Incompatible"; }, std::chrono::seconds(120))) << view().state;
  EXPECT_TRUE(view().serving_gpus.empty());
  EXPECT_TRUE(view().serving_digest.empty());
}

TEST_F(GkmAgentTest, ADeletedCacheNobodyUsesGoesAtOnce) {
  registry_->Push("caches/idle", "v1", {"--triton", "90"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("idle", registry_->Host() + "/caches/idle:v1").dump()).status, 201);
  WaitForState(kNodes, "idle", "Ready");
  const fs::path dir = root_ / "caches/namespaced/ml/idle";
  ASSERT_TRUE(fs::exists(dir));
  ASSERT_EQ(server_->Call("DELETE", std::string(kCaches) + "/idle").status, 200);
  EXPECT_TRUE(h_.RunUntil([&] {
    return !fs::exists(dir) && server_->Call("GET", std::string(kNodes) + "/" + StatusName("idle")).status == 404;
  }));
}

TEST_F(GkmAgentTest, AStatusWriteThatFailsIsWrittenAgainWithoutAnotherChange) {
  registry_->Push("caches/flaky", "v1", {"--triton", "90"});
  // The Ready write and its first retry fail (a 500 on a PATCH: the client does not retry it
  // by itself); nothing else changes afterwards, so only the module's own retry lands it.
  server_->FailNextRequests(500, 2, "/gkmcachenodes/5.flaky.node-a", 0);
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("flaky", registry_->Host() + "/caches/flaky:v1").dump()).status, 201);
  const auto entry = WaitForState(kNodes, "flaky", "Ready");
  EXPECT_EQ(entry["compatibleGPUs"], json::parse(R"([{"ids":[0]}])"));
}

TEST_F(GkmAgentTest, ARegistryThatNeverAnswersHoldsBackOnlyItsOwnCacheUntilItsDeadline) {
  const auto pushed = registry_->Push("caches/good", "v1", {"--triton", "90"});
  SilentListener silent;
  config_.request_timeout = milliseconds(120000);  // one request alone would wait far longer
  config_.pull_timeout = milliseconds(8000);
  config_.max_concurrent_pulls = 2;
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  // The silent one first: pulled one at a time, the good cache would wait behind it.
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("stuck", silent.Host() + "/caches/stuck:v1").dump()).status, 201);
  const auto posted = std::chrono::steady_clock::now();
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("good", registry_->Host() + "/caches/good:v1").dump()).status, 201);

  // Its status says Pulling while the pull hangs; the good cache becomes Ready meanwhile.
  auto stuck = WaitForState(kNodes, "stuck", "Pulling");
  EXPECT_NE(stuck["message"].get<std::string>().find(silent.Host()), std::string::npos) << stuck.dump();
  const auto pulling_version =
      server_->Call("GET", std::string(kNodes) + "/" + StatusName("stuck")).Json()["metadata"]["resourceVersion"];
  auto good = WaitForState(kNodes, "good", "Ready");
  EXPECT_EQ(good["digest"], pushed["manifest"]);
  auto now_stuck = server_->Call("GET", std::string(kNodes) + "/" + StatusName("stuck")).Json();
  EXPECT_EQ(now_stuck["status"]["caches"]["stuck"]["state"], "Pulling") << "the good cache waited for the stuck one";
  // Written once as the pull started, not again while it waits.
  EXPECT_EQ(now_stuck["metadata"]["resourceVersion"], pulling_version);

  // At its deadline it fails, saying which registry and which limit (the pull's 8 s, not the
  // request timeout's 120 s); not before.
  auto failed = WaitForState(kNodes, "stuck", "Failed");
  const auto took = std::chrono::steady_clock::now() - posted;
  EXPECT_GE(took, milliseconds(8000));
  EXPECT_EQ(failed["reason"], "DeadlineExceeded") << failed.dump();
  const std::string message = failed["message"];
  EXPECT_NE(message.find("registry " + silent.Host()), std::string::npos) << message;
  EXPECT_NE(message.find("8 s"), std::string::npos) << message;
  // Nothing of the stopped pull is left behind (removed on the pool).
  EXPECT_TRUE(h_.RunUntil([&] { return Entries(root_ / "caches") == std::vector<std::string>{".layout", "namespaced"}; }))
      << "left: " << ::testing::PrintToString(Entries(root_ / "caches"));
  EXPECT_EQ(Entries(root_ / "caches/namespaced/ml"), std::vector<std::string>{"good"});
}

TEST_F(GkmAgentTest, ACacheNoGpuCanUseIsReportedAndNotKept) {
  registry_->Push("caches/turing", "v1", {"--triton", "75", "--index"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kClusterCaches, Cache("turing", registry_->Host() + "/caches/turing:v1", true).dump()).status,
            201);
  auto entry = WaitForState(kClusterNodes, "turing", "Incompatible");
  // The cache-level reason is the GPUs' (what the cluster roll-up keys failed nodes by).
  EXPECT_EQ(entry["reason"], "ArchitectureMismatch");
  EXPECT_NE(entry["message"].get<std::string>().find("GPU 0 (NVIDIA H200) is sm_90"), std::string::npos)
      << entry["message"];
  EXPECT_EQ(entry["incompatibleGPUs"][0]["message"],
            "kernels built for sm_75, GPU 0 (NVIDIA H200) is sm_90 (compute capability 9.0)");
  EXPECT_FALSE(fs::exists(root_ / "caches/cluster/turing"));
}

TEST_F(GkmAgentTest, ACacheLevelReasonIsTheReasonOfMostGpus) {
  // sm_90 kernels with PTX 8.5 (CUDA 12.5): the driver's CUDA 12.4 is too old for the two
  // H200s, and the L40S (sm_89) has no kernels at all.
  registry_->Push("caches/newptx", "v1", {"--triton", "90", "--ptx", "85"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0), Gpu(1, "NVIDIA H200", 9, 0), Gpu(2, "NVIDIA L40S", 8, 9)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("newptx", registry_->Host() + "/caches/newptx:v1").dump()).status, 201);
  auto entry = WaitForState(kNodes, "newptx", "Incompatible");
  EXPECT_EQ(entry["reason"], "DriverTooOld") << entry.dump();
  const std::string message = entry["message"];
  EXPECT_NE(message.find("need CUDA 12.5"), std::string::npos) << message;
  EXPECT_NE(message.find("GPU 2 (NVIDIA L40S) is sm_89"), std::string::npos) << message;
}

TEST_F(GkmAgentTest, ANodeWithoutGpusKeepsNothing) {
  registry_->Push("caches/nogpu", "v1", {"--triton", "90"});
  StartAgent({});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("nogpu", registry_->Host() + "/caches/nogpu:v1").dump()).status, 201);
  auto entry = WaitForState(kNodes, "nogpu", "Incompatible");
  EXPECT_EQ(entry["reason"], "NoGpus");
  EXPECT_EQ(Entries(root_ / "caches"), std::vector<std::string>{".layout"});
}

TEST_F(GkmAgentTest, BadImagesFailWithAPreciseReasonAndLeaveNothing) {
  const auto pushed = registry_->Push("caches/bad", "v1", {"--triton", "90"});
  std::string bytes = test::ReadText(registry_->BlobData(pushed["layer"]));
  bytes[100] ^= 1;
  std::ofstream(registry_->BlobData(pushed["layer"]), std::ios::binary | std::ios::trunc) << bytes;
  registry_->Push("caches/evil", "v1", {"--triton", "90", "--evil", "dotdot"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("bad", registry_->Host() + "/caches/bad:v1").dump()).status, 201);
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("evil", registry_->Host() + "/caches/evil:v1").dump()).status, 201);
  auto bad = WaitForState(kNodes, "bad", "Failed");
  EXPECT_EQ(bad["reason"], "DigestMismatch");
  auto evil = WaitForState(kNodes, "evil", "Failed");
  EXPECT_EQ(evil["reason"], "UnsafeArchive");
  EXPECT_NE(evil["message"].get<std::string>().find("\"..\" component refused"), std::string::npos) << evil;
  EXPECT_EQ(Entries(root_ / "caches"), std::vector<std::string>{".layout"});
}

TEST_F(GkmAgentTest, StartSweepsCachesNoObjectRefersTo) {
  registry_->Push("caches/kept", "v1", {"--triton", "90"});
  std::ofstream(root_ / "caches/.layout") << "2\n";  // already the new layout
  fs::create_directories(root_ / "caches/namespaced/ml/stale/x");
  fs::create_directories(root_ / "caches/namespaced/gone/old");
  fs::create_directories(root_ / "caches/namespaced/ml/kept");
  fs::create_directories(root_ / "caches/cluster/gone");
  fs::create_directories(root_ / "caches/.pull-123/blobs");
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("kept", registry_->Host() + "/caches/kept:v1").dump()).status, 201);
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  WaitForState(kNodes, "kept", "Ready");
  EXPECT_TRUE(h_.RunUntil([&] {
    return !fs::exists(root_ / "caches/namespaced/ml/stale") && !fs::exists(root_ / "caches/.pull-123") &&
           !fs::exists(root_ / "caches/cluster/gone") && !fs::exists(root_ / "caches/namespaced/gone");
  }));
  EXPECT_EQ(Kernels(root_ / "caches/namespaced/ml/kept"), 1u);
}

// A cache whose object went while the agent was down, but that a pod still mounts (usage.json):
// the start's sweep leaves it, and it goes when the last pod lets go.
TEST_F(GkmAgentTest, StartSweepLeavesACacheAPodStillUses) {
  fs::create_directories(root_ / "caches/cluster/mounted");
  std::ofstream(root_ / "caches/.layout") << "2\n";  // the new layout: no migration
  std::ofstream(root_ / "caches/cluster/mounted/add_kernel.json") << "{}";
  fs::create_directories(root_ / "caches/cluster/unused");
  const fs::path usage = root_ / "usage/cluster/mounted";
  fs::create_directories(usage);
  std::ofstream(usage / "usage.json") << R"({"pod-foo":[{"podName":"pod-foo","volumeId":"csi-1"}]})";
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_TRUE(h_.RunUntil([&] { return !fs::exists(root_ / "caches/cluster/unused"); }));
  h_.RunUntil([] { return false; }, milliseconds(300));
  EXPECT_TRUE(fs::exists(root_ / "caches/cluster/mounted/add_kernel.json"));
  std::ofstream(usage / "usage.json.tmp") << "{}";
  fs::rename(usage / "usage.json.tmp", usage / "usage.json");
  EXPECT_TRUE(h_.RunUntil([&] { return !fs::exists(root_ / "caches/cluster/mounted"); }));
}

// The issue: a GKMCache in a namespace named "cluster-scoped" had the ClusterGKMCache's key and
// directory: its pull replaced the cluster cache's files and its deletion removed them. Now
// the two never share a path, whatever the names.
TEST_F(GkmAgentTest, ANamespacedCacheNeverReachesAClusterCachesFiles) {
  constexpr const char* kOddCaches = "/apis/gkm.io/v1alpha1/namespaces/cluster-scoped/gkmcaches";
  constexpr const char* kOddNodes = "/apis/gkm.io/v1alpha1/namespaces/cluster-scoped/gkmcachenodes";
  const auto cluster_image = registry_->Push("caches/shared", "v1", {"--triton", "90"});
  const auto tenant_image = registry_->Push("caches/tenant", "v1", {"--triton", "80,90"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  ASSERT_EQ(server_->Call("POST", kClusterCaches, Cache("llama", registry_->Host() + "/caches/shared:v1", true).dump()).status,
            201);
  const auto cluster_entry = WaitForState(kClusterNodes, "llama", "Ready");
  auto tenant = Cache("llama", registry_->Host() + "/caches/tenant:v1");
  tenant["metadata"]["namespace"] = "cluster-scoped";
  ASSERT_EQ(server_->Call("POST", kOddCaches, tenant.dump()).status, 201);
  const auto tenant_entry = WaitForState(kOddNodes, "llama", "Ready");
  EXPECT_EQ(tenant_entry["digest"], tenant_image["manifest"]);
  // Each in its own directory, the cluster cache's files untouched.
  EXPECT_EQ(Kernels(root_ / "caches/cluster/llama"), 1u);
  EXPECT_EQ(Kernels(root_ / "caches/namespaced/cluster-scoped/llama"), 2u);
  // The namespaced one goes: only its own files go with it.
  ASSERT_EQ(server_->Call("DELETE", std::string(kOddCaches) + "/llama").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return !fs::exists(root_ / "caches/namespaced/cluster-scoped/llama"); }));
  h_.Drain();
  EXPECT_EQ(Kernels(root_ / "caches/cluster/llama"), 1u);
  const auto cluster_now = server_->Call("GET", std::string(kClusterNodes) + "/" + StatusName("llama")).Json();
  EXPECT_EQ(cluster_now["status"]["caches"]["llama"]["state"], "Ready");
  EXPECT_EQ(cluster_now["status"]["caches"]["llama"]["digest"], cluster_image["manifest"]);
  EXPECT_EQ(cluster_entry["digest"], cluster_image["manifest"]);
}

// The issue: "<cache>-<node>" made cache llama-gpu on node1 and cache llama on gpu-node1 one
// object, flipped by two agents and deleted by either. Now each (node, cache) has its own.
TEST_F(GkmAgentTest, TwoNodesStatusObjectsNeverShareAName) {
  registry_->Push("caches/llama", "v1", {"--triton", "90"});
  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)}, "node1");
  StartSecondAgent("gpu-node1");
  for (const char* name : {"llama-gpu", "llama"}) {
    ASSERT_EQ(server_->Call("POST", kCaches, Cache(name, registry_->Host() + "/caches/llama:v1").dump()).status, 201);
  }
  // One object per (node, cache), each Ready, each saying whose it is.
  auto pairs = [&] {
    std::set<std::pair<std::string, std::string>> out;
    const json list = server_->Call("GET", kNodes).Json();
    for (const auto& item : list.value("items", json::array())) {
      const std::string node = item.value(json::json_pointer("/spec/nodeName"), "");
      const std::string cache = item.value(json::json_pointer("/spec/cacheName"), "");
      if (item.value(json::json_pointer("/status/caches/" + cache + "/state"), "") != "Ready") continue;
      out.insert({node, cache});
      EXPECT_EQ(item.value(json::json_pointer("/metadata/labels/gkm.node"), ""), node) << item.dump();
    }
    return out;
  };
  const std::set<std::pair<std::string, std::string>> all = {
      {"node1", "llama"}, {"node1", "llama-gpu"}, {"gpu-node1", "llama"}, {"gpu-node1", "llama-gpu"}};
  ASSERT_TRUE(h_.RunUntil([&] { return pairs() == all && server_->Call("GET", kNodes).Json()["items"].size() == 4; },
                          std::chrono::seconds(60)))
      << server_->Call("GET", kNodes).Json().dump();
  EXPECT_EQ(server_->Call("GET", std::string(kNodes) + "/9.llama-gpu.node1").status, 200);
  EXPECT_EQ(server_->Call("GET", std::string(kNodes) + "/5.llama.gpu-node1").status, 200);
  // Cache llama goes: both nodes' llama objects go, both llama-gpu objects stay.
  ASSERT_EQ(server_->Call("DELETE", std::string(kCaches) + "/llama").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return server_->Call("GET", kNodes).Json()["items"].size() == 2; }));
  h_.Drain();
  EXPECT_EQ(pairs(), (std::set<std::pair<std::string, std::string>>{{"node1", "llama-gpu"}, {"gpu-node1", "llama-gpu"}}));
}

// A cacheRoot of the old layout (<ns>/<name>, cluster-scoped/<name>) and status objects of the
// old names: at start the caches objects still claim move to the new layout, with their files
// (a pull that fails then leaves them in place, as for any Ready cache); a directory both a
// GKMCache and a ClusterGKMCache could own is dropped; old status objects are deleted.
TEST_F(GkmAgentTest, AnOldLayoutIsMigratedWithoutLosingACache) {
  constexpr const char* kOddCaches = "/apis/gkm.io/v1alpha1/namespaces/cluster-scoped/gkmcaches";
  for (const char* dir : {"ml/llama", "cluster-scoped/turing", "cluster-scoped/both", "ml/stale"}) {
    fs::create_directories(root_ / "caches" / dir / "kernels");
    std::ofstream(root_ / "caches" / dir / "kernels/add_kernel.json") << "{}";
  }
  fs::create_directories(root_ / "caches/.pull-123/blobs");
  const std::string absent = registry_->Host() + "/caches/absent:v1";  // every pull fails: NotFound
  ASSERT_EQ(server_->Call("POST", kCaches, Cache("llama", absent).dump()).status, 201);
  ASSERT_EQ(server_->Call("POST", kClusterCaches, Cache("turing", absent, true).dump()).status, 201);
  ASSERT_EQ(server_->Call("POST", kClusterCaches, Cache("both", absent, true).dump()).status, 201);
  auto odd = Cache("both", absent);
  odd["metadata"]["namespace"] = "cluster-scoped";
  ASSERT_EQ(server_->Call("POST", kOddCaches, odd.dump()).status, 201);
  // A status object of the old name ("<cache>-<node>") this agent wrote before.
  const json old_status = {{"apiVersion", "gkm.io/v1alpha1"},
                           {"kind", "GKMCacheNode"},
                           {"metadata", {{"name", "llama-node-a"}, {"namespace", "ml"}, {"labels", {{"gkm.node", "node-a"}}}}},
                           {"spec", {{"nodeName", "node-a"}, {"cacheName", "llama"}}}};
  ASSERT_EQ(server_->Call("POST", kNodes, old_status.dump()).status, 201);

  StartAgent({Gpu(0, "NVIDIA H200", 9, 0)});
  EXPECT_EQ(WaitForState(kNodes, "llama", "Failed")["reason"], "NotFound");
  WaitForState(kClusterNodes, "turing", "Failed");
  EXPECT_EQ(Kernels(root_ / "caches/namespaced/ml/llama"), 1u);
  EXPECT_EQ(Kernels(root_ / "caches/cluster/turing"), 1u);
  EXPECT_EQ(Entries(root_ / "caches"), (std::vector<std::string>{".layout", "cluster", "namespaced"}));
  EXPECT_EQ(Entries(root_ / "caches/cluster"), std::vector<std::string>{"turing"});
  EXPECT_EQ(Entries(root_ / "caches/namespaced"), std::vector<std::string>{"ml"});
  EXPECT_EQ(Entries(root_ / "caches/namespaced/ml"), std::vector<std::string>{"llama"});
  EXPECT_TRUE(h_.RunUntil([&] { return server_->Call("GET", std::string(kNodes) + "/llama-node-a").status == 404; }));
}

}  // namespace
}  // namespace gns::gkm
