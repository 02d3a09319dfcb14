// gkm-csi's pure parts: mountinfo lines (escapes, optional fields), a NodePublishVolume's
// attributes read into what to mount, the agent's verdict turned into the kubelet's error, and
// usage.json in the seed's shape (gkm_agent/api/usage.hpp).
#include "modules/gkm_agent/api/usage.hpp"
#include "modules/gkm_csi/mounts.hpp"
#include "modules/gkm_csi/volume_request.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace gns::gkm_csi {
namespace {

TEST(GkmCsiMountInfo, ParsesLinesWithOptionalFieldsAndEscapes) {
  const auto table = ParseMountInfo(
      "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
      "36 22 0:21 /var/lib/gkm/caches/cluster/llama /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/my\\040vol/mount "
      "ro,nosuid,nodev,relatime shared:1 master:2 - ext4 /dev/sda1 rw\n"
      "garbage line\n"
      "37 22 0:30 / /tmp/x rw - tmpfs tmp\\134fs rw");
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[1].root, "/var/lib/gkm/caches/cluster/llama");
  EXPECT_EQ(table[1].mount_point, "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/my vol/mount");
  EXPECT_TRUE(table[1].ReadOnly());
  EXPECT_FALSE(table[0].ReadOnly());
  EXPECT_EQ(table[1].fs_type, "ext4");
  EXPECT_EQ(table[2].source, "tmp\\fs");
  EXPECT_TRUE(MountAt(table, "/tmp/x"));
  EXPECT_FALSE(MountAt(table, "/tmp"));
  EXPECT_EQ(UnescapeMountField("a\\011b\\012c\\04"), "a\tb\nc\\04");  // a cut escape stays as it is
}

PublishRequest Request(std::map<std::string, std::string> context) {
  PublishRequest r;
  r.volume_id = "csi-1";
  r.target_path = "/pods/u/mount";
  r.has_capability = true;
  r.volume_context = std::move(context);
  return r;
}

TEST(GkmCsiRequest, ReadsTheSeedsVolumeAttributes) {
  auto p = ParsePublish(Request({{"cacheName", "kernel-x"},
                                 {"cacheNamespace", "ml-apps"},
                                 {"csi.storage.k8s.io/pod.name", "example-pod"},
                                 {"csi.storage.k8s.io/pod.namespace", "ml-apps"},
                                 {"csi.storage.k8s.io/pod.uid", "f009"}}));
  ASSERT_TRUE(p.wish) << p.error.message;
  EXPECT_EQ(p.wish->key, "namespaced/ml-apps/kernel-x");
  EXPECT_TRUE(p.wish->read_only);  // the default
  EXPECT_EQ(p.wish->pod_name, "example-pod");
  EXPECT_EQ(p.wish->pod_uid, "f009");
  EXPECT_EQ(p.wish->Describe(), "GKMCache ml-apps/kernel-x");

  // No cacheNamespace: the ClusterGKMCache of that name.
  p = ParsePublish(Request({{"cacheName", "kernel-x"}, {"readOnly", "false"}}));
  ASSERT_TRUE(p.wish);
  EXPECT_EQ(p.wish->key, "cluster/kernel-x");
  EXPECT_FALSE(p.wish->read_only);
  // The pod's volume is read-only: that wins over readOnly "false".
  auto r = Request({{"cacheName", "kernel-x"}, {"readOnly", "false"}});
  r.readonly_flag = true;
  EXPECT_TRUE(ParsePublish(r).wish->read_only);
}

TEST(GkmCsiRequest, RefusesWhatCanNeverWork) {
  const auto code = [](PublishRequest r) {
    const auto p = ParsePublish(r);
    EXPECT_FALSE(p.wish);
    return std::pair{p.error.code, p.error.message};
  };
  EXPECT_EQ(code(Request({})).first, kInvalidArgument);
  EXPECT_NE(code(Request({})).second.find("cacheName is required"), std::string::npos);
  EXPECT_EQ(code(Request({{"cacheName", "../../etc"}})).first, kInvalidArgument);
  EXPECT_EQ(code(Request({{"cacheName", "a"}, {"cacheNamespace", "x/y"}})).first, kInvalidArgument);
  EXPECT_EQ(code(Request({{"cacheName", "a"}, {"cacheNamespace", "a.b"}})).first, kInvalidArgument);
  EXPECT_NE(code(Request({{"cacheName", "a"}, {"readOnly", "yes"}})).second.find("readOnly"), std::string::npos);
  auto r = Request({{"cacheName", "a"}});
  r.block = true;
  EXPECT_EQ(code(r).first, kInvalidArgument);
  r = Request({{"cacheName", "a"}});
  r.target_path = "relative/mount";
  EXPECT_EQ(code(r).first, kInvalidArgument);
  r = Request({{"cacheName", "a"}});
  r.has_capability = false;
  EXPECT_EQ(code(r).first, kInvalidArgument);
  r = Request({{"cacheName", "a"}});
  r.volume_id.clear();
  EXPECT_EQ(code(r).first, kInvalidArgument);
}

TEST(GkmCsiRequest, FollowsTheAgentsVerdict) {
  auto wish = *ParsePublish(Request({{"cacheName", "llama"}, {"cacheNamespace", "ml"}})).wish;
  gkm::CacheStates states;
  EXPECT_EQ(CheckCache(wish, nullptr, "node-a")->code, kUnavailable);
  EXPECT_EQ(CheckCache(wish, &states, "node-a")->code, kUnavailable);  // not listed yet
  states.listed = true;
  const auto missing = CheckCache(wish, &states, "node-a");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code, kNotFound);
  EXPECT_EQ(missing->message, "GKMCache ml/llama does not exist (node node-a knows no such cache)");

  gkm::CacheView view;
  view.state = "Incompatible";
  view.reason = "Incompatible";
  view.message = "no GPU on this node can use the cache";
  states.caches["namespaced/ml/llama"] = view;
  const auto incompatible = CheckCache(wish, &states, "node-a");
  ASSERT_TRUE(incompatible);
  EXPECT_EQ(incompatible->code, kFailedPrecondition);
  EXPECT_EQ(incompatible->message,
            "GKMCache ml/llama is Incompatible on node node-a (Incompatible: no GPU on this node can use the cache): "
            "only a Ready cache is mounted");
  states.caches["namespaced/ml/llama"].state = "Pulling";
  states.caches["namespaced/ml/llama"].reason.clear();
  EXPECT_EQ(CheckCache(wish, &states, "node-a")->message,
            "GKMCache ml/llama is Pulling on node node-a: only a Ready cache is mounted");
  states.caches["namespaced/ml/llama"].state = "Ready";
  EXPECT_EQ(CheckCache(wish, &states, "node-a")->code, kFailedPrecondition);  // Ready, but no GPU here can use it
  states.caches["namespaced/ml/llama"].compatible_gpus = {0};
  EXPECT_FALSE(CheckCache(wish, &states, "node-a"));
  // A cluster cache of the same name is another cache.
  auto cluster = *ParsePublish(Request({{"cacheName", "llama"}})).wish;
  EXPECT_EQ(CheckCache(cluster, &states, "node-a")->code, kNotFound);
}

// Issue 30: a Ready cache pulled again (a new image or digest, a restart) was Pulling and
// refused every new mount although its installed copy kept serving the running pods. While the
// agent vouches for the installed copy (serving_gpus), new volumes get it, whatever the state of
// the newer pull; without such a copy a Pulling or Failed cache is refused as before.
TEST(GkmCsiRequest, ACacheBeingPulledAgainServesItsInstalledCopy) {
  auto wish = *ParsePublish(Request({{"cacheName", "llama"}, {"cacheNamespace", "ml"}})).wish;
  gkm::CacheStates states;
  states.listed = true;
  gkm::CacheView view;
  view.state = "Pulling";
  view.message = "pulling registry.example/llama:v2";
  states.caches["namespaced/ml/llama"] = view;
  EXPECT_EQ(CheckCache(wish, &states, "node-a")->code, kFailedPrecondition);  // the first pull: nothing to serve
  states.caches["namespaced/ml/llama"].serving_digest = "sha256:aaaa";
  states.caches["namespaced/ml/llama"].serving_gpus = {1};
  EXPECT_FALSE(CheckCache(wish, &states, "node-a"));
  states.caches["namespaced/ml/llama"].state = "Failed";  // the newer pull failed: the copy stays good
  states.caches["namespaced/ml/llama"].reason = "RegistryUnavailable";
  EXPECT_FALSE(CheckCache(wish, &states, "node-a"));
  states.caches["namespaced/ml/llama"].serving_gpus.clear();  // the agent withdrew it
  const auto refused = CheckCache(wish, &states, "node-a");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->code, kFailedPrecondition);
  EXPECT_NE(refused->message.find("is Failed on node node-a (RegistryUnavailable"), std::string::npos) << refused->message;
}

TEST(GkmCsiUsage, WritesTheSeedsShapeAndReadsItBack) {
  gkm::UsageRecord a{"pod-foo", "ml", "u1", "csi-a", "/pods/u1/mount", "2026-11-28T07:00:00Z", 80608, true};
  gkm::UsageRecord b{"", "", "", "csi-b", "/pods/u2/mount", "2026-11-28T07:00:01Z", 0, false};
  const std::string text = gkm::SerializeUsage({a, b});
  const auto j = nlohmann::json::parse(text);
  ASSERT_TRUE(j["pod-foo"].is_array());
  EXPECT_EQ(j["pod-foo"][0]["volumeId"], "csi-a");
  EXPECT_EQ(j["pod-foo"][0]["volumeSize"], 80608);
  EXPECT_EQ(j["pod-foo"][0]["targetPath"], "/pods/u1/mount");
  EXPECT_TRUE(j.contains("csi-b"));  // no pod info: keyed by the volume
  const auto back = gkm::ParseUsage(text);
  ASSERT_TRUE(back.ok);
  ASSERT_EQ(back.records.size(), 2u);
  EXPECT_EQ(back.records[0], b);  // keys in order: "csi-b" < "pod-foo"
  EXPECT_EQ(back.records[1], a);
  EXPECT_FALSE(gkm::ParseUsage("[1,2]").ok);
  EXPECT_TRUE(gkm::ParseUsage(R"({"p":[{"podName":"p"}], "q": 3})").records.empty());  // no volumeId: not ours
}

}  // namespace
}  // namespace gns::gkm_csi
