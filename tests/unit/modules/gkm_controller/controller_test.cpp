// The gkm-controller: the roll-up of per-node reports (pure), and the module against the
// simulated API server — a cache's status counts the nodes whose status objects report it
// (total / ready / failed, failed nodes by reason, the Error condition), follows a node that
// fails, and is not written again when nothing it shows changed.
#include "modules/gkm_controller/gkm_controller_module.hpp"
#include "modules/gkm_controller/rollup.hpp"
#include "support/quiet_logger.hpp"
#include "unit/modules/kube/kube_test_util.hpp"

#include <gtest/gtest.h>

namespace gns::gkm_controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kCaches = "/apis/gkm.io/v1alpha1/namespaces/ml/gkmcaches";
constexpr const char* kNodes = "/apis/gkm.io/v1alpha1/namespaces/ml/gkmcachenodes";
constexpr const char* kClusterCaches = "/apis/gkm.io/v1alpha1/clustergkmcaches";
constexpr const char* kClusterNodes = "/apis/gkm.io/v1alpha1/clustergkmcachenodes";

TEST(RollUpTest, CountsReadyAndFailedNodesAndKeysFailuresByReason) {
  const auto r = RollUp({{"node-a", "Ready", ""},
                         {"node-b", "Incompatible", "ArchitectureMismatch"},
                         {"node-c", "Failed", "DeadlineExceeded"},
                         {"node-d", "Incompatible", "ArchitectureMismatch"},
                         {"node-e", "Pulling", ""}});
  EXPECT_EQ(r["totalNodes"], 5);
  EXPECT_EQ(r["readyNodes"], 1);
  EXPECT_EQ(r["failedNodes"], 3);
  EXPECT_EQ(r["failedNodeConditions"],
            json::parse(R"({"ArchitectureMismatch":["node-b","node-d"],"DeadlineExceeded":["node-c"]})"));
  EXPECT_EQ(r["conditions"][0]["type"], "Error");
  EXPECT_EQ(r["conditions"][0]["status"], "True");
  EXPECT_EQ(r["conditions"][0]["reason"], "NodeFailuresPresent");

  const auto fine = RollUp({{"node-a", "Ready", ""}, {"node-b", "Pending", ""}});
  EXPECT_EQ(fine["failedNodes"], 0);
  EXPECT_EQ(fine["conditions"][0]["status"], "False");
  EXPECT_EQ(fine["conditions"][0]["reason"], "NoNodeFailures");
}

TEST(RollUpTest, ATransitionTimeStaysWhileTheConditionsStatusDoesNot) {
  const auto failing = RollUp({{"node-a", "Failed", "NotFound"}});
  const json current = {{"conditions", json::array({{{"type", "Error"}, {"status", "True"},
                                                     {"lastTransitionTime", "2026-01-01T00:00:00Z"}},
                                                    {{"type", "Verified"}, {"status", "True"}}})}};
  EXPECT_EQ(StatusToApply(failing, current, "2026-02-02T00:00:00Z")["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z");
  const auto fine = RollUp({{"node-a", "Ready", ""}});
  EXPECT_EQ(StatusToApply(fine, current, "2026-02-02T00:00:00Z")["conditions"][0]["lastTransitionTime"],
            "2026-02-02T00:00:00Z");
  // What the object holds, timestamps and others' conditions aside, equals the roll-up.
  auto written = StatusToApply(failing, current, "2026-02-02T00:00:00Z");
  written["conditions"].push_back({{"type", "Verified"}, {"status", "True"}});
  written["resolvedDigest"] = "sha256:abc";
  EXPECT_EQ(OwnedFields(written), failing);
}

class GkmControllerTest : public kube::test::KubeTestBase {
 protected:
  void TearDown() override {
    if (module_) {
      bool done = false;
      module_->Stop([&] { done = true; });
      EXPECT_TRUE(h_.RunUntil([&] { return done; }));
      module_.reset();
    }
    if (informers_) informers_->StopAll();
    KubeTestBase::TearDown();
  }

  void StartController() {
    auto client = MakeClient(BaseConfig());
    kube::InformerOptions options;
    options.backoff = BackoffPolicy{milliseconds(50), milliseconds(500), 2.0, 0.5};
    informers_ = std::make_shared<kube::InformerRegistry>(client, h_.bus, h_.loop.Io(), h_.metrics,
                                                          gns::test::QuietLogger("kube-test"), options);
    h_.services.Provide<kube::KubeClient>(client);
    h_.services.Provide<kube::InformerRegistry>(informers_);
    GkmControllerModule::Config config;
    config.lease.ns = "default";
    config.lease.lease_name = "gkm-controller-test";
    config.lease.identity = "node-a";
    config.lease.lease_duration = milliseconds(1000);
    config.lease.renew_deadline = milliseconds(700);
    config.lease.retry_period = milliseconds(100);
    context_ = std::make_unique<ModuleContext>(h_.Parts(), std::string(GkmControllerModule::kName), [](std::string) {},
                                               [](ModuleHealth, std::string) {});
    module_ = std::make_unique<GkmControllerModule>(*context_, config);
    module_->Start();
  }

  static json Cache(const std::string& name, bool cluster = false) {
    json c = {{"_resource", cluster ? kClusterCaches : kCaches},
              {"apiVersion", "gkm.io/v1alpha1"},
              {"kind", cluster ? "ClusterGKMCache" : "GKMCache"},
              {"metadata", {{"name", name}}},
              {"spec", {{"image", "registry.example/caches/" + name + ":v1"}}},
              {"status", {{"resolvedDigest", "sha256:0123"}}}};
    if (!cluster) c["metadata"]["namespace"] = "ml";
    return c;
  }

  // An agent's status object of (cache, node), as gkm-agent writes it.
  static json NodeObject(const std::string& cache, const std::string& node, const std::string& state,
                         const std::string& reason = "", bool cluster = false) {
    json entry = {{"state", state}, {"digest", "sha256:0123"}};
    if (!reason.empty()) entry["reason"] = reason;
    json o = {{"_resource", cluster ? kClusterNodes : kNodes},
              {"apiVersion", "gkm.io/v1alpha1"},
              {"kind", cluster ? "ClusterGKMCacheNode" : "GKMCacheNode"},
              {"metadata",
               {{"name", ObjectName(cache, node)}, {"labels", {{"gkm.node", node}, {"gkm.io/cache", cache}}}}},
              {"spec", {{"nodeName", node}, {"cacheName", cache}}},
              {"status", {{"nodeName", node}, {"caches", {{cache, entry}}}}}};
    if (!cluster) o["metadata"]["namespace"] = "ml";
    return o;
  }
  // A Node of the cluster: status objects count only for nodes that exist.
  static json Node(const std::string& name) {
    return {{"_resource", "/api/v1/nodes"}, {"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}};
  }
  static std::string ObjectName(const std::string& cache, const std::string& node) {
    return std::to_string(cache.size()) + "." + cache + "." + node;
  }

  // The cache's status once `pred` holds for it.
  json WaitForStatus(const std::string& path, const std::function<bool(const json&)>& pred) {
    json status;
    EXPECT_TRUE(h_.RunUntil(
        [&] {
          const auto r = server_->Call("GET", path);
          if (r.status != 200) return false;
          status = r.Json().value("status", json::object());
          return pred(status);
        },
        std::chrono::seconds(20)))
        << path << ": last status " << status.dump();
    return status;
  }

  std::shared_ptr<kube::InformerRegistry> informers_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<GkmControllerModule> module_;
};

TEST_F(GkmControllerTest, ACachesStatusCountsItsNodesFollowsAFailureAndIsNotRewrittenForNothing) {
  server_->Seed(json::array({Node("node-a"), Node("node-b"), Node("node-c"), Cache("llama"), Cache("other"),
                             NodeObject("llama", "node-a", "Ready"),
                             NodeObject("llama", "node-b", "Ready"), NodeObject("other", "node-c", "Failed", "NotFound")}));
  StartController();

  const std::string path = std::string(kCaches) + "/llama";
  auto status = WaitForStatus(path, [](const json& s) { return s.value("totalNodes", -1) == 2; });
  EXPECT_EQ(status["readyNodes"], 2);
  EXPECT_EQ(status["failedNodes"], 0);
  EXPECT_EQ(status["failedNodeConditions"], json::object());
  ASSERT_EQ(status["conditions"].size(), 1u) << status.dump();
  EXPECT_EQ(status["conditions"][0]["type"], "Error");
  EXPECT_EQ(status["conditions"][0]["status"], "False");
  EXPECT_EQ(status["resolvedDigest"], "sha256:0123") << "the operator's field is left alone";
  EXPECT_TRUE(status.contains("lastUpdated"));
  // The other cache counts only its own node.
  auto other = WaitForStatus(std::string(kCaches) + "/other", [](const json& s) { return s.contains("totalNodes"); });
  EXPECT_EQ(other["totalNodes"], 1);
  EXPECT_EQ(other["failedNodeConditions"], json::parse(R"({"NotFound":["node-c"]})"));

  // node-b's GPUs cannot use the cache: counts, the failed nodes by reason and the condition follow.
  const auto patched = server_->Call(
      "PATCH", std::string(kNodes) + "/" + ObjectName("llama", "node-b") + "/status",
      R"({"status":{"caches":{"llama":{"state":"Incompatible","reason":"ArchitectureMismatch"}}}})",
      "application/merge-patch+json");
  ASSERT_EQ(patched.status, 200) << patched.body;
  status = WaitForStatus(path, [](const json& s) { return s.value("failedNodes", -1) == 1; });
  EXPECT_EQ(status["totalNodes"], 2);
  EXPECT_EQ(status["readyNodes"], 1);
  EXPECT_EQ(status["failedNodeConditions"], json::parse(R"({"ArchitectureMismatch":["node-b"]})"));
  EXPECT_EQ(status["conditions"][0]["status"], "True");
  EXPECT_EQ(status["conditions"][0]["reason"], "NodeFailuresPresent");
  EXPECT_EQ(status["conditions"][0]["message"], "1 of 2 nodes reported errors. See failedNodeConditions.");

  // A change of a node object that changes nothing the roll-up shows: no write.
  const auto writes = module_->Writes();
  const auto patches = server_->RequestCount("patch");
  const auto touched = server_->Call("PATCH", std::string(kNodes) + "/" + ObjectName("llama", "node-a"),
                                     R"({"metadata":{"annotations":{"gkm.io/lastUpdated":"2026-11-28T10:00:00Z"}}})",
                                     "application/merge-patch+json");
  ASSERT_EQ(touched.status, 200) << touched.body;
  EXPECT_FALSE(h_.RunUntil([] { return false; }, milliseconds(1500)));
  EXPECT_EQ(module_->Writes(), writes);
  EXPECT_EQ(server_->RequestCount("patch"), patches);

  // A node object deleted: it no longer counts.
  ASSERT_EQ(server_->Call("DELETE", std::string(kNodes) + "/" + ObjectName("llama", "node-b")).status, 200);
  status = WaitForStatus(path, [](const json& s) { return s.value("totalNodes", -1) == 1; });
  EXPECT_EQ(status["failedNodes"], 0);
  EXPECT_EQ(status["conditions"][0]["status"], "False");
}

TEST_F(GkmControllerTest, AClusterCacheCountsItsClusterScopedNodeObjects) {
  server_->Seed(json::array({Node("node-a"), Node("node-b"), Node("node-c"), Cache("shared", true),
                             NodeObject("shared", "node-a", "Pulling", "", true),
                             NodeObject("shared", "node-b", "Ready", "", true),
                             // A namespaced cache of the same name is another cache.
                             NodeObject("shared", "node-c", "Failed", "NotFound")}));
  StartController();
  auto status = WaitForStatus(std::string(kClusterCaches) + "/shared",
                              [](const json& s) { return s.value("totalNodes", -1) == 2; });
  EXPECT_EQ(status["readyNodes"], 1);
  EXPECT_EQ(status["failedNodes"], 0);
  EXPECT_EQ(status["conditions"][0]["message"], "1 of 2 nodes ready, none failed.");
}

// Issue 30: a node gone for good leaves its agents' status objects behind (the agent that would
// delete them is gone with it), and they were counted forever: totalNodes and failedNodes never
// came down. Only nodes of the cluster count, from the first roll-up on (objects of a node that
// was gone before this leader started) and as Nodes go and come back.
TEST_F(GkmControllerTest, StatusObjectsOfANodeNoLongerInTheClusterDoNotCount) {
  server_->Seed(json::array({Node("node-a"), Node("node-b"), Cache("llama"), NodeObject("llama", "node-a", "Ready"),
                             NodeObject("llama", "node-b", "Failed", "DeadlineExceeded"),
                             // node-gone left before the controller started.
                             NodeObject("llama", "node-gone", "Incompatible", "ArchitectureMismatch")}));
  StartController();
  const std::string path = std::string(kCaches) + "/llama";
  auto status = WaitForStatus(path, [](const json& s) { return s.contains("totalNodes"); });
  EXPECT_EQ(status["totalNodes"], 2) << status.dump();
  EXPECT_EQ(status["failedNodes"], 1);
  EXPECT_EQ(status["failedNodeConditions"], json::parse(R"({"DeadlineExceeded":["node-b"]})"));

  // node-b leaves the cluster; its object stays behind: it no longer counts, and no node failed.
  ASSERT_EQ(server_->Call("DELETE", "/api/v1/nodes/node-b").status, 200);
  status = WaitForStatus(path, [](const json& s) { return s.value("totalNodes", -1) == 1; });
  EXPECT_EQ(status["readyNodes"], 1);
  EXPECT_EQ(status["failedNodes"], 0);
  EXPECT_EQ(status["failedNodeConditions"], json::object());
  EXPECT_EQ(status["conditions"][0]["status"], "False");
  EXPECT_EQ(server_->Call("GET", std::string(kNodes) + "/" + ObjectName("llama", "node-b")).status, 200)
      << "the object is left as it is (the agent's to delete)";

  // node-gone joins (again): its object counts.
  ASSERT_EQ(server_->Call("POST", "/api/v1/nodes", Node("node-gone").dump()).status, 201);
  status = WaitForStatus(path, [](const json& s) { return s.value("totalNodes", -1) == 2; });
  EXPECT_EQ(status["failedNodeConditions"], json::parse(R"({"ArchitectureMismatch":["node-gone"]})"));
}

}  // namespace
}  // namespace gns::gkm_controller
