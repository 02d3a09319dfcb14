// Leader election on a Lease, Events aggregation, Node conditions and the module itself
// (config, services, in-cluster start), against the simulated API server.
#include "kube_test_util.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/kube_module.hpp"
#include "modules/kube/api/leader_election.hpp"
#include "modules/kube/messages.hpp"

#include <cstdlib>

namespace gns::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

class LeaderElectionTest : public test::KubeTestBase {
 protected:
  struct Candidate {
    std::unique_ptr<LeaderElector> elector;
    int started = 0;
    int stopped = 0;
  };

  std::unique_ptr<Candidate> MakeCandidate(const std::string& identity) {
    auto c = std::make_unique<Candidate>();
    LeaderElectionConfig config;
    config.ns = "default";
    config.lease_name = "gns-test";
    config.identity = identity;
    config.lease_duration = milliseconds(600);
    config.renew_deadline = milliseconds(400);
    config.retry_period = milliseconds(100);
    auto* raw = c.get();
    c->elector = std::make_unique<LeaderElector>(
        client_, h_.loop.Io(), h_.clock, &h_.bus, h_.metrics, gns::test::QuietLogger("kube-test"), config,
        LeaderElector::Callbacks{[raw] { ++raw->started; }, [raw] { ++raw->stopped; }, {}});
    return c;
  }

  void SetUp() override {
    KubeTestBase::SetUp();
    client_ = MakeClient(BaseConfig());
  }

  json Lease() { return server_->Call("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/gns-test").Json(); }

  std::shared_ptr<KubeClient> client_;
};

TEST_F(LeaderElectionTest, ExactlyOneLeadsAndTheLeaseMovesWhenTheHolderStopsRenewing) {
  auto a = MakeCandidate("node-a");
  auto b = MakeCandidate("node-b");
  a->elector->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return a->elector->IsLeader(); }));
  b->elector->Start();
  // b keeps trying for well over a lease duration while a renews: a stays the only leader.
  h_.RunUntil([] { return false; }, milliseconds(1200));
  EXPECT_TRUE(a->elector->IsLeader());
  EXPECT_FALSE(b->elector->IsLeader());
  EXPECT_EQ(b->elector->Holder(), "node-a");
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "node-a");
  EXPECT_EQ(b->started, 0);

  // The holder dies without releasing: b takes over after the lease duration.
  bool stopped = false;
  a->elector->Stop([&] { stopped = true; }, /*release=*/false);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(a->stopped, 1);
  const auto before = std::chrono::steady_clock::now();
  ASSERT_TRUE(h_.RunUntil([&] { return b->elector->IsLeader(); }, std::chrono::seconds(10)));
  EXPECT_GE(std::chrono::steady_clock::now() - before, milliseconds(400));
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "node-b");
  EXPECT_EQ(Lease()["spec"]["leaseTransitions"], 1);
  EXPECT_EQ(b->started, 1);
  EXPECT_FALSE(a->elector->IdentityShared());
  EXPECT_FALSE(b->elector->IdentityShared());
  h_.Drain();
  EXPECT_TRUE(h_.bus.LatestByKey<LeaderStatus>().at("default/gns-test").leading);
}

TEST_F(LeaderElectionTest, TwoCandidatesWithOneIdentityAreToldSoAndARestartIsNot) {
  // A restart under the same identity (the old process gone without releasing) is no twin.
  auto first = MakeCandidate("node-a");
  first->elector->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return first->elector->IsLeader(); }));
  bool stopped = false;
  first->elector->Stop([&] { stopped = true; }, /*release=*/false);
  EXPECT_TRUE(stopped);
  auto restarted = MakeCandidate("node-a");
  restarted->elector->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return restarted->elector->IsLeader(); }));
  h_.RunUntil([] { return false; }, milliseconds(800));  // several renews
  EXPECT_FALSE(restarted->elector->IdentityShared());

  // A second live process with the same identity: both write the lease as "node-a"; the
  // renewTimes they did not send give it away.
  auto twin = MakeCandidate("node-a");
  twin->elector->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return restarted->elector->IdentityShared() || twin->elector->IdentityShared(); },
                          std::chrono::seconds(10)));
  h_.Drain();
  EXPECT_TRUE(h_.bus.LatestByKey<LeaderStatus>().at("default/gns-test").identity_shared);
}

TEST_F(LeaderElectionTest, ReleaseOnStopHandsOverAtOnce) {
  auto a = MakeCandidate("node-a");
  auto b = MakeCandidate("node-b");
  a->elector->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return a->elector->IsLeader(); }));
  b->elector->Start();
  h_.RunUntil([] { return false; }, milliseconds(300));
  ASSERT_FALSE(b->elector->IsLeader());
  bool released = false;
  a->elector->Stop([&] { released = true; });
  EXPECT_FALSE(a->elector->IsLeader());  // work stops before the lease is handed back
  ASSERT_TRUE(h_.RunUntil([&] { return released; }));
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "");
  const auto before = std::chrono::steady_clock::now();
  ASSERT_TRUE(h_.RunUntil([&] { return b->elector->IsLeader(); }));
  // Without waiting for the lease to expire (one retry period, not a lease duration).
  EXPECT_LT(std::chrono::steady_clock::now() - before, milliseconds(500));
}

TEST_F(LeaderElectionTest, LeaderThatCannotRenewStopsLeading) {
  auto a = MakeCandidate("node-a");
  a->elector->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return a->elector->IsLeader(); }));
  server_->FailNextRequests(500, 1000, "/leases/");
  ASSERT_TRUE(h_.RunUntil([&] { return !a->elector->IsLeader(); }, std::chrono::seconds(5)));
  EXPECT_EQ(a->stopped, 1);
  bool done = false;
  a->elector->Stop([&] { done = true; });
  EXPECT_TRUE(done);
}

TEST_F(LeaderElectionTest, ElectorDestroyedWithARequestInFlightIsNeverResumed) {
  auto a = MakeCandidate("node-a");
  server_->SetResponseDelay(milliseconds(300));
  a->elector->Start();
  h_.RunUntil([] { return false; }, milliseconds(100));  // its read of the lease is in flight
  a.reset();
  const auto answered = [&] {
    return h_.metrics.Counter("gpu_node_supervisor_kube_requests_total", "", {{"verb", "get"}, {"code", "404"}})
               .Value() >= 1;
  };
  ASSERT_TRUE(h_.RunUntil(answered, std::chrono::seconds(5)));
  h_.RunUntil([] { return false; }, milliseconds(200));
  // The 404 would have made it create the lease: nothing did (and ASan saw no use after free).
  EXPECT_EQ(server_->Call("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/gns-test").status, 404);
  server_->SetResponseDelay(milliseconds(0));
}

TEST_F(LeaderElectionTest, EventsAreAggregatedIntoASeries) {
  EventRecorderConfig config;
  config.qps = 100;
  config.burst = 100;
  config.reporting_instance = "node-1";
  EventRecorder recorder(client_, h_.clock, h_.metrics, gns::test::QuietLogger("kube-test"), config);
  const ObjectReference node{"v1", "Node", "", "node-1", "uid-1"};
  recorder.Record(node, "Warning", "XidError", "Detected", "Xid 79 on GPU 0");
  ASSERT_TRUE(h_.RunUntil([&] { return recorder.GetStats().created == 1; }));
  for (int i = 0; i < 4; ++i) recorder.Record(node, "Warning", "XidError", "Detected", "Xid 79 on GPU 0");
  recorder.Record(node, "Normal", "Healthy", "Checked", "all GPUs healthy");
  ASSERT_TRUE(h_.RunUntil([&] {
    if (recorder.GetStats().created != 2) return false;
    const auto items = server_->Call("GET", "/apis/events.k8s.io/v1/namespaces/default/events").Json()["items"];
    for (const auto& e : items) {
      if (e["reason"] == "XidError" && e.contains("series") && e["series"]["count"] == 5) return true;
    }
    return false;
  }));
  const auto items = server_->Call("GET", "/apis/events.k8s.io/v1/namespaces/default/events").Json()["items"];
  EXPECT_EQ(items.size(), 2u);
  for (const auto& e : items) {
    EXPECT_EQ(e["regarding"]["name"], "node-1");
    EXPECT_EQ(e["reportingInstance"], "node-1");
  }
}

TEST_F(LeaderElectionTest, EventRateLimitDropsAndCounts) {
  EventRecorderConfig config;
  config.qps = 0.001;
  config.burst = 2;
  EventRecorder recorder(client_, h_.clock, h_.metrics, gns::test::QuietLogger("kube-test"), config);
  for (int i = 0; i < 5; ++i) {
    recorder.Record(ObjectReference{"v1", "Node", "", "n", ""}, "Normal", "R" + std::to_string(i), "A", "note");
  }
  ASSERT_TRUE(h_.RunUntil([&] { return recorder.GetStats().created == 2; }));
  EXPECT_EQ(recorder.GetStats().dropped, 3u);
}

TEST_F(LeaderElectionTest, NodeConditionIsPatchedAndOtherConditionsKept) {
  json node = Node("gpu-node");
  node["status"] = {{"conditions", json::array({{{"type", "Ready"}, {"status", "True"}, {"reason", "KubeletReady"}}})}};
  server_->Seed(node);
  NodeConditions conditions(client_, h_.clock, "gpu-node-supervisor");
  std::optional<Result> result;
  conditions.Set("gpu-node", NodeCondition{"GpuHealthy", "False", "XidError", "Xid 79"},
                 [&](Result r) { result = std::move(r); });
  ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }));
  ASSERT_TRUE(result->Ok()) << result->error;
  auto stored = server_->Call("GET", "/api/v1/nodes/gpu-node").Json()["status"]["conditions"];
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[0]["type"], "Ready");
  EXPECT_EQ(stored[1]["type"], "GpuHealthy");
  EXPECT_EQ(stored[1]["status"], "False");
  const auto transition = stored[1]["lastTransitionTime"];

  // Same status, new message: the transition time stays.
  result.reset();
  conditions.Set("gpu-node", NodeCondition{"GpuHealthy", "False", "XidError", "Xid 79 twice"},
                 [&](Result r) { result = std::move(r); });
  ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }));
  ASSERT_TRUE(result->Ok()) << result->error;
  stored = server_->Call("GET", "/api/v1/nodes/gpu-node").Json()["status"]["conditions"];
  EXPECT_EQ(stored[1]["message"], "Xid 79 twice");
  EXPECT_EQ(stored[1]["lastTransitionTime"], transition);

  // Unchanged: no write at all.
  server_->ResetRequestCounts();
  result.reset();
  conditions.Set("gpu-node", NodeCondition{"GpuHealthy", "False", "XidError", "Xid 79 twice"},
                 [&](Result r) { result = std::move(r); });
  ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }));
  EXPECT_EQ(server_->RequestCount("patch"), 0u);
}

// --- the module

ConfigValue Yaml(const std::string& text) { return ParseYaml(text, "site.yaml"); }

TEST(KubeModuleConfig, DefaultsAndValidation) {
  SiteConfig site;
  {
    const auto value = Yaml("qps: 5\nburst: 10\n");
    ConfigMap section(value, "modules.kube");
    const auto config = KubeModule::ParseConfig(section, site);
    section.Finish();
    EXPECT_EQ(config.qps, 5);
    EXPECT_EQ(config.burst, 10);
    EXPECT_EQ(config.request_timeout, milliseconds(30000));
    EXPECT_EQ(config.watch_idle_timeout, milliseconds(300000));
    EXPECT_FALSE(config.leader_election);
    EXPECT_FALSE(config.lease.identity.empty());
  }
  auto error_of = [&](const std::string& text) -> std::string {
    const auto value = Yaml(text);
    ConfigMap section(value, "modules.kube");
    try {
      KubeModule::ParseConfig(section, site);
      section.Finish();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("kubeconfig: relative/path\n").find("site.yaml:1:"), std::string::npos);
  EXPECT_NE(error_of("qps: 0\n").find("modules.kube.qps"), std::string::npos);
  EXPECT_NE(error_of("qps: 50\nburst: 10\n").find("burst"), std::string::npos);
  EXPECT_NE(error_of("leaderElection:\n  leaseDuration: 1s\n  renewDeadline: 2s\n").find("renewDeadline"),
            std::string::npos);
  EXPECT_NE(error_of("leaderElection:\n  bogus: 1\n").find("bogus"), std::string::npos);
  EXPECT_NE(error_of("requestTimeout: soon\n").find("requestTimeout"), std::string::npos);
  EXPECT_NE(error_of("events:\n  qps: -1\n").find("events.qps"), std::string::npos);
}

TEST_F(LeaderElectionTest, ModuleStartsInClusterOffersServicesAndLeads) {
  const auto state = dir_ / "state";
  ::setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", std::to_string(server_->Port()).c_str(), 1);
  const auto value = Yaml("leaderElection:\n  enabled: true\n  namespace: default\n  leaseName: module-lease\n"
                          "  identity: pod-1\n  leaseDuration: 600ms\n  renewDeadline: 400ms\n  retryPeriod: 100ms\n"
                          "inClusterPaths:\n  token: " + (state / "token").string() + "\n  ca: " +
                          (state / "ca.crt").string() + "\n");
  ConfigMap section(value, "modules.kube");
  const auto config = KubeModule::ParseConfig(section, h_.site);
  section.Finish();
  ModuleContext context(h_.Parts(), "kube", [](std::string) {}, [](ModuleHealth, std::string) {});
  auto module = std::make_unique<KubeModule>(context, config);
  module->Start();
  ASSERT_NE(h_.services.Find<KubeClient>(), nullptr);
  ASSERT_NE(h_.services.Find<InformerRegistry>(), nullptr);
  ASSERT_NE(h_.services.Find<EventRecorder>(), nullptr);
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto& leaders = h_.bus.LatestByKey<LeaderStatus>();
    const auto it = leaders.find("default/module-lease");
    return it != leaders.end() && it->second.leading;
  }));
  auto informer = h_.services.Find<InformerRegistry>()->Acquire(InformerSpec{"/api/v1/nodes", "", ""});
  ASSERT_TRUE(h_.RunUntil([&] { return informer->Synced(); }));
  bool stopped = false;
  module->Stop([&] { stopped = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
  EXPECT_EQ(h_.services.Find<KubeClient>(), nullptr);
  EXPECT_EQ(server_->Call("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/module-lease")
                .Json()["spec"]["holderIdentity"],
            "");
  informer.reset();
  module.reset();
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
}

}  // namespace
}  // namespace gns::kube
