// The gkm-csi module as the kubelet sees it: every call goes through gns-csi-client, built from
// the CSI spec's own csi.proto, over the plugin's unix socket; the mounts are real bind mounts in
// this executable's private mount namespace (mount_namespace.hpp). The agent's verdicts come as
// its retained CacheStates on the bus.
#include "modules/gkm_agent/api/usage.hpp"
#include "modules/gkm_agent/messages.hpp"
#include "modules/gkm_csi/gkm_csi_module.hpp"
#include "modules/gkm_csi/mounts.hpp"
#include "mount_namespace.hpp"
#include "support/loop_harness.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

#include "pluginregistration/v1/api.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gns::gkm_csi {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

#define REQUIRE_PRIVATE_MOUNTS()                                                                  \
  if (!test::MountsSkipReason().empty()) {                                                        \
    GTEST_SKIP() << "NOT TESTED: real bind mounts need a private mount namespace: " << test::MountsSkipReason(); \
  }

class GkmCsiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = gns::test::MakeTempDir("gkm-csi");
    h_.site.node_name = "node-a";
    config_.plugin_dir = (root_ / "plugins/csi.gkm.io").string();
    config_.registration_dir = (root_ / "plugins_registry").string();
    config_.register_plugin = false;
    states_.cache_root = (root_ / "caches").string();
    states_.usage_root = (root_ / "usage").string();
    states_.listed = true;
    AddCache("namespaced/ml/llama", false, "ml", "llama", "Ready");
    AddCache("cluster/shared", true, "", "shared", "Ready");
  }

  void TearDown() override {
    StopModule();
    // Whatever a failed test left mounted goes before the files (private namespace: nothing leaks).
    for (const auto& e : ReadMountTable()) {
      if (e.mount_point.rfind(root_.string(), 0) == 0) ::umount2(e.mount_point.c_str(), MNT_DETACH);
    }
    fs::remove_all(root_);
  }

  // A cache on disk with one kernel file, and the agent's view of it.
  void AddCache(const std::string& key, bool cluster, const std::string& ns, const std::string& name,
                const std::string& state) {
    const fs::path dir = root_ / "caches" / key;
    fs::create_directories(dir);
    std::ofstream(dir / "add_kernel.json") << R"({"hash":"abc","target":{"backend":"cuda","arch":90}})";
    gkm::CacheView v;
    v.cluster = cluster;
    v.ns = ns;
    v.name = name;
    v.state = state;
    v.directory = dir.string();
    v.usage_dir = (root_ / "usage" / key).string();
    v.size_bytes = 4096;
    v.compatible_gpus = {0};
    states_.caches[key] = v;
  }

  void StartModule() {
    context_ = std::make_unique<ModuleContext>(h_.Parts(), std::string(GkmCsiModule::kName), [](std::string) {},
                                               [](ModuleHealth, std::string) {});
    module_ = std::make_unique<GkmCsiModule>(*context_, config_);
    module_->Start();
    h_.bus.Publish(states_);
    ASSERT_TRUE(h_.RunUntil([&] { return fs::exists(module_->SocketPath()); })) << "the CSI socket never appeared";
  }

  void StopModule() {
    if (!module_) return;
    bool done = false;
    module_->Stop([&] { done = true; });
    EXPECT_TRUE(h_.RunUntil([&] { return done; }));
    module_.reset();
    context_.reset();
  }

  void Publish(const gkm::CacheStates& states) {
    h_.bus.Publish(states);
    h_.Drain();
  }

  // One call through the spec's client: {"code", "codeName", "message", "response"}.
  json Call(const std::string& method, const json& request = json::object()) {
    const std::string client = std::string(std::getenv("GNS_BINARY_DIR")) + "/tools/sim/csi_client/gns-csi-client";
    const std::string socket = config_.plugin_dir + "/csi.sock";
    auto [code, output] = h_.OffLoop([&] {
      return gns::test::RunToCompletion({client, "--socket", socket, method, request.dump(), "--timeout-ms", "20000"});
    });
    EXPECT_EQ(code, 0) << output;
    std::istringstream lines(output);
    json answer;
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.front() == '{') answer = json::parse(line, nullptr, false);
    }
    EXPECT_TRUE(answer.is_object()) << method << ": " << output;
    return answer;
  }

  fs::path Target(const std::string& pod_uid) {
    const fs::path parent = root_ / "pods" / pod_uid / "volumes/kubernetes.io~csi/kernel-cache";
    fs::create_directories(parent);  // the kubelet makes the parent; the plugin makes the target
    return parent / "mount";
  }

  json PublishRequest(const std::string& volume_id, const fs::path& target, json attributes) {
    return {{"volume_id", volume_id},
            {"target_path", target.string()},
            {"volume_capability", {{"mount", json::object()}, {"access_mode", {{"mode", "SINGLE_NODE_WRITER"}}}}},
            {"volume_context", attributes}};
  }

  static json Attributes(const std::string& cache, const std::string& ns, const std::string& pod = "pod-foo") {
    json a = {{"cacheName", cache},
              {"csi.storage.k8s.io/pod.name", pod},
              {"csi.storage.k8s.io/pod.namespace", "ml"},
              {"csi.storage.k8s.io/pod.uid", "uid-" + pod},
              {"csi.storage.k8s.io/ephemeral", "true"}};
    if (!ns.empty()) a["cacheNamespace"] = ns;
    return a;
  }

  std::vector<gkm::UsageRecord> Usage(const std::string& key) {
    const auto read = gkm::ReadUsageFile((root_ / "usage" / key).string());
    EXPECT_TRUE(read.ok) << read.error;
    return read.records;
  }

  int MountsAt(const fs::path& target) {
    int n = 0;
    for (const auto& e : ReadMountTable()) n += e.mount_point == target.string();
    return n;
  }

  fs::path root_;
  gns::test::LoopHarness h_;
  GkmCsiModule::Config config_;
  gkm::CacheStates states_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<GkmCsiModule> module_;
};

TEST_F(GkmCsiTest, IdentityAndNodeAnswerTheSpecsClient) {
  StartModule();
  auto info = Call("GetPluginInfo");
  EXPECT_EQ(info["codeName"], "OK");
  EXPECT_EQ(info["response"]["name"], "csi.gkm.io");
  EXPECT_FALSE(info["response"].value("vendor_version", "").empty());
  auto caps = Call("GetPluginCapabilities");
  EXPECT_EQ(caps["codeName"], "OK");
  EXPECT_FALSE(caps["response"].contains("capabilities"));  // no controller service
  auto probe = Call("Probe");
  EXPECT_EQ(probe["response"]["ready"], true);
  auto node_caps = Call("NodeGetCapabilities");
  EXPECT_EQ(node_caps["codeName"], "OK");
  // Volume stats only: no staging (the kubelet never stages), no expansion.
  EXPECT_EQ(node_caps["response"]["capabilities"], json::parse(R"([{"rpc":{"type":"GET_VOLUME_STATS"}}])"));
  auto node = Call("NodeGetInfo");
  EXPECT_EQ(node["response"]["node_id"], "node-a");
  // A volume that is not published here: NOT_FOUND, as the spec wants.
  const auto stats = Call("NodeGetVolumeStats", {{"volume_id", "v"}, {"volume_path", "/x"}});
  EXPECT_EQ(stats["codeName"], "NOT_FOUND");
  EXPECT_EQ(stats["message"], "volume v is not published on node node-a");
  // The socket is the kubelet's alone.
  EXPECT_EQ(fs::status(module_->SocketPath()).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(GkmCsiTest, RegistersWithThePluginWatcherAsACsiPlugin) {
  config_.register_plugin = true;
  StartModule();
  const std::string socket = config_.registration_dir + "/csi.gkm.io-reg.sock";
  ASSERT_TRUE(fs::exists(socket));
  auto [status, info] = h_.OffLoop([&] {
    auto stub = pluginregistration::Registration::NewStub(
        grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pluginregistration::PluginInfo out;
    const auto s = stub->GetInfo(&context, pluginregistration::InfoRequest(), &out);
    return std::pair{s.ok(), out};
  });
  ASSERT_TRUE(status);
  EXPECT_EQ(info.type(), "CSIPlugin");
  EXPECT_EQ(info.name(), "csi.gkm.io");
  EXPECT_EQ(info.endpoint(), module_->SocketPath());
  ASSERT_EQ(info.supported_versions_size(), 1);
  EXPECT_EQ(info.supported_versions(0), "1.0.0");
}

TEST_F(GkmCsiTest, PublishesAReadyCacheReadOnlyAndRecordsThePod) {
  REQUIRE_PRIVATE_MOUNTS();
  StartModule();
  const fs::path target = Target("u1");
  const json request = PublishRequest("csi-vol-1", target, Attributes("llama", "ml"));
  auto r = Call("NodePublishVolume", request);
  ASSERT_EQ(r["codeName"], "OK") << r.dump();

  // The pod sees the cache's files, and cannot change them.
  std::ifstream kernel(target / "add_kernel.json");
  std::string content((std::istreambuf_iterator<char>(kernel)), {});
  EXPECT_NE(content.find("\"arch\":90"), std::string::npos);
  const int fd = ::open((target / "new-file").c_str(), O_CREAT | O_WRONLY, 0644);
  const int write_errno = errno;
  EXPECT_LT(fd, 0);
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(write_errno, EROFS);
  auto mount = MountAt(ReadMountTable(), target.string());
  ASSERT_TRUE(mount);
  EXPECT_TRUE(mount->ReadOnly());
  EXPECT_NE(mount->options.find("nosuid"), std::string::npos);

  // usage.json: the seed's record of the pod.
  auto usage = Usage("namespaced/ml/llama");
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].pod_name, "pod-foo");
  EXPECT_EQ(usage[0].pod_namespace, "ml");
  EXPECT_EQ(usage[0].pod_uid, "uid-pod-foo");
  EXPECT_EQ(usage[0].volume_id, "csi-vol-1");
  EXPECT_EQ(usage[0].target_path, target.string());
  EXPECT_EQ(usage[0].volume_size, 4096u);
  EXPECT_TRUE(usage[0].read_only);
  EXPECT_FALSE(usage[0].start_time.empty());

  // NodeGetVolumeStats (the kubelet's volume metrics): what the cache takes on disk, and its file
  // system's size; the wrong path is NOT_FOUND.
  auto stats = Call("NodeGetVolumeStats", {{"volume_id", "csi-vol-1"}, {"volume_path", target.string()}});
  ASSERT_EQ(stats["codeName"], "OK") << stats.dump();
  ASSERT_EQ(stats["response"]["usage"].size(), 2u) << stats.dump();
  const json bytes = stats["response"]["usage"][0];
  EXPECT_EQ(bytes["unit"], "BYTES");
  struct stat kernel_stat {};
  ASSERT_EQ(::stat((target / "add_kernel.json").c_str(), &kernel_stat), 0);
  // int64 is a string in protobuf's JSON.
  EXPECT_GE(std::stoll(bytes["used"].get<std::string>()), static_cast<long long>(kernel_stat.st_blocks) * 512);
  EXPECT_GE(std::stoll(bytes["total"].get<std::string>()), std::stoll(bytes["used"].get<std::string>()));
  const json inodes = stats["response"]["usage"][1];
  EXPECT_EQ(inodes["unit"], "INODES");
  EXPECT_GE(std::stoll(inodes["used"].get<std::string>()), 2);  // the directory and its kernel file at least
  EXPECT_EQ(Call("NodeGetVolumeStats", {{"volume_id", "csi-vol-1"}, {"volume_path", "/elsewhere"}})["codeName"],
            "NOT_FOUND");

  // The same publish again (a kubelet retry): OK, nothing mounted twice.
  EXPECT_EQ(Call("NodePublishVolume", request)["codeName"], "OK");
  EXPECT_EQ(MountsAt(target), 1);
  EXPECT_EQ(Usage("namespaced/ml/llama").size(), 1u);

  // Unpublish: unmounted, the target gone, the record gone; again: OK.
  const json unpublish = {{"volume_id", "csi-vol-1"}, {"target_path", target.string()}};
  EXPECT_EQ(Call("NodeUnpublishVolume", unpublish)["codeName"], "OK");
  EXPECT_EQ(MountsAt(target), 0);
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(Usage("namespaced/ml/llama").empty());
  EXPECT_TRUE(fs::exists(root_ / "caches/namespaced/ml/llama/add_kernel.json"));  // the cache stays
  EXPECT_EQ(Call("NodeUnpublishVolume", unpublish)["codeName"], "OK");
}

TEST_F(GkmCsiTest, ReadOnlyFalseOptsIntoAWritableClusterCache) {
  REQUIRE_PRIVATE_MOUNTS();
  StartModule();
  const fs::path target = Target("u2");
  json attributes = Attributes("shared", "");  // no cacheNamespace: the ClusterGKMCache
  attributes["readOnly"] = "false";
  auto r = Call("NodePublishVolume", PublishRequest("csi-vol-2", target, attributes));
  ASSERT_EQ(r["codeName"], "OK") << r.dump();
  std::ofstream(target / "written-by-pod") << "x";
  EXPECT_TRUE(fs::exists(root_ / "caches/cluster/shared/written-by-pod"));
  EXPECT_FALSE(MountAt(ReadMountTable(), target.string())->ReadOnly());
  ASSERT_EQ(Usage("cluster/shared").size(), 1u);
  EXPECT_FALSE(Usage("cluster/shared")[0].read_only);

  // The pod's volume says readOnly: true wins over the attribute.
  const fs::path target3 = Target("u3");
  json request = PublishRequest("csi-vol-3", target3, attributes);
  request["readonly"] = true;
  ASSERT_EQ(Call("NodePublishVolume", request)["codeName"], "OK");
  EXPECT_TRUE(MountAt(ReadMountTable(), target3.string())->ReadOnly());
}

TEST_F(GkmCsiTest, RefusesWhatTheAgentDoesNotHoldReadyWithThePreciseReason) {
  REQUIRE_PRIVATE_MOUNTS();
  auto pulling = states_;
  pulling.caches["namespaced/ml/llama"].state = "Pulling";
  auto incompatible = states_;
  incompatible.caches["namespaced/ml/llama"].state = "Incompatible";
  incompatible.caches["namespaced/ml/llama"].reason = "Incompatible";
  incompatible.caches["namespaced/ml/llama"].message = "no GPU on this node can use the cache";
  incompatible.caches["namespaced/ml/llama"].compatible_gpus.clear();
  auto unlisted = states_;
  unlisted.listed = false;
  StartModule();
  const fs::path target = Target("u4");
  const json request = PublishRequest("csi-vol-4", target, Attributes("llama", "ml"));

  auto r = Call("NodePublishVolume", PublishRequest("csi-vol-4", target, Attributes("nope", "ml")));
  EXPECT_EQ(r["codeName"], "NOT_FOUND");
  EXPECT_EQ(r["message"], "GKMCache ml/nope does not exist (node node-a knows no such cache)");
  Publish(pulling);
  r = Call("NodePublishVolume", request);
  EXPECT_EQ(r["codeName"], "FAILED_PRECONDITION");
  EXPECT_EQ(r["message"], "GKMCache ml/llama is Pulling on node node-a: only a Ready cache is mounted");
  Publish(incompatible);
  r = Call("NodePublishVolume", request);
  EXPECT_EQ(r["codeName"], "FAILED_PRECONDITION");
  EXPECT_NE(r["message"].get<std::string>().find("Incompatible: no GPU on this node can use the cache"),
            std::string::npos);
  Publish(unlisted);
  EXPECT_EQ(Call("NodePublishVolume", request)["codeName"], "UNAVAILABLE");
  json bad = request;
  bad["volume_context"].erase("cacheName");
  EXPECT_EQ(Call("NodePublishVolume", bad)["codeName"], "INVALID_ARGUMENT");
  bad = request;
  bad["volume_capability"] = {{"block", json::object()}};
  EXPECT_EQ(Call("NodePublishVolume", bad)["codeName"], "INVALID_ARGUMENT");
  // Nothing of any of them reached the disk.
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(Usage("namespaced/ml/llama").empty());
  EXPECT_TRUE(module_->Volumes().empty());
}

TEST_F(GkmCsiTest, OneTargetHoldsOneVolume) {
  REQUIRE_PRIVATE_MOUNTS();
  StartModule();
  const fs::path target = Target("u5");
  ASSERT_EQ(Call("NodePublishVolume", PublishRequest("csi-vol-5", target, Attributes("llama", "ml")))["codeName"], "OK");
  // Another cache at the same target.
  auto r = Call("NodePublishVolume", PublishRequest("csi-vol-6", target, Attributes("shared", "")));
  EXPECT_EQ(r["codeName"], "ALREADY_EXISTS");
  EXPECT_NE(r["message"].get<std::string>().find("holds volume csi-vol-5"), std::string::npos);
  // The same volume with another cache, or writable now.
  EXPECT_EQ(Call("NodePublishVolume", PublishRequest("csi-vol-5", target, Attributes("shared", "")))["codeName"],
            "ALREADY_EXISTS");
  json rw = Attributes("llama", "ml");
  rw["readOnly"] = "false";
  EXPECT_EQ(Call("NodePublishVolume", PublishRequest("csi-vol-5", target, rw))["codeName"], "ALREADY_EXISTS");
  EXPECT_EQ(MountsAt(target), 1);
  EXPECT_TRUE(MountAt(ReadMountTable(), target.string())->ReadOnly());
  EXPECT_EQ(Usage("namespaced/ml/llama").size(), 1u);
  EXPECT_TRUE(Usage("cluster/shared").empty());
}

TEST_F(GkmCsiTest, ARestartFindsItsVolumesAndUnpublishesThem) {
  REQUIRE_PRIVATE_MOUNTS();
  StartModule();
  const fs::path target = Target("u7");
  ASSERT_EQ(Call("NodePublishVolume", PublishRequest("csi-vol-7", target, Attributes("llama", "ml")))["codeName"], "OK");
  // A record whose mount never happened (a crash between the two): dropped at the next start.
  auto records = Usage("namespaced/ml/llama");
  records.push_back(gkm::UsageRecord{"pod-gone", "ml", "u8", "csi-vol-8", (root_ / "pods/u8/mount").string(), "", 0, true});
  gkm::WriteUsageFile((root_ / "usage/namespaced/ml/llama").string(), records);

  // The module goes (as after kill -9, nothing is undone: the mounts stay for the pods).
  StopModule();
  ASSERT_EQ(MountsAt(target), 1);
  StartModule();
  ASSERT_EQ(module_->Volumes().count("csi-vol-7"), 1u);
  EXPECT_EQ(module_->Volumes().count("csi-vol-8"), 0u);
  auto usage = Usage("namespaced/ml/llama");
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].volume_id, "csi-vol-7");

  // The kubelet retries the publish: the same volume, no second mount. Then unpublishes it.
  EXPECT_EQ(Call("NodePublishVolume", PublishRequest("csi-vol-7", target, Attributes("llama", "ml")))["codeName"], "OK");
  EXPECT_EQ(MountsAt(target), 1);
  EXPECT_EQ(Call("NodeUnpublishVolume", {{"volume_id", "csi-vol-7"}, {"target_path", target.string()}})["codeName"], "OK");
  EXPECT_EQ(MountsAt(target), 0);
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(Usage("namespaced/ml/llama").empty());
}

TEST_F(GkmCsiTest, ACacheRemovedUnderAPublishIsRefusedNotMountedEmpty) {
  REQUIRE_PRIVATE_MOUNTS();
  StartModule();
  // The agent still says Ready, but the directory went (deleted under the lock, api/usage.hpp).
  fs::remove_all(root_ / "caches/namespaced/ml/llama");
  const fs::path target = Target("u9");
  auto r = Call("NodePublishVolume", PublishRequest("csi-vol-9", target, Attributes("llama", "ml")));
  EXPECT_EQ(r["codeName"], "FAILED_PRECONDITION");
  EXPECT_NE(r["message"].get<std::string>().find("is gone"), std::string::npos);
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(Usage("namespaced/ml/llama").empty());
}

}  // namespace
}  // namespace gns::gkm_csi
