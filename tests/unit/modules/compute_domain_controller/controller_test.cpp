// The ComputeDomain controller module against the simulated API server (seed 000 §14.1): the
// add path creates only the workload template and sets Ready with the finalizer; the delete
// path removes template, finalizers and metrics; a foreign template is reported, not
// overwritten; driver-managed mode judges Ready from the nodes' registrations; only the leader reconciles; losing
// the lease mid-reconcile stops the work, and the next leader finishes it.
#include "modules/compute_domain_controller/compute_domain_controller_module.hpp"
#include "modules/compute_domain_controller/work_queue.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/api/leader_election.hpp"
#include "support/prometheus.hpp"
#include "support/quiet_logger.hpp"
#include "unit/modules/kube/kube_test_util.hpp"

#include <gtest/gtest.h>

namespace gns::cd_controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kDomains = "/apis/resource.nvidia.com/v1beta1/namespaces/team/computedomains";
constexpr const char* kTemplates = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates";
constexpr const char* kLease = "/apis/coordination.k8s.io/v1/namespaces/default/leases/cdc-test";

// One supervisor process as far as the controller can tell: its own client, informers, events,
// services, bus, metrics and site; the loop and the simulator are shared.
struct Supervisor {
  explicit Supervisor(Loop& loop) : bus(loop) {}
  Bus bus;
  MetricsRegistry metrics;
  Services services;
  SiteConfig site;
  std::shared_ptr<kube::InformerRegistry> informers;
  std::unique_ptr<ModuleContext> context;
  std::unique_ptr<ComputeDomainControllerModule> module;
  bool stopped = false;

  const Reconciler::Stats& Stats() const { return module->GetReconciler()->GetStats(); }
  double Metric(const std::string& series) const {
    const auto scrape = test::ParsePrometheus(metrics.Render());
    const auto it = scrape.samples.find(series);
    return it == scrape.samples.end() ? -1 : it->second;
  }
};

class ControllerTest : public kube::test::KubeTestBase {
 protected:
  void TearDown() override {
    for (auto& s : supervisors_) StopSupervisor(*s);
    for (auto& s : supervisors_) {
      if (s->informers) s->informers->StopAll();
    }
    KubeTestBase::TearDown();
    supervisors_.clear();
  }

  ComputeDomainControllerModule::Config ControllerConfig(const std::string& identity) {
    ComputeDomainControllerModule::Config config;
    config.lease.ns = "default";
    config.lease.lease_name = "cdc-test";
    config.lease.identity = identity;
    config.lease.lease_duration = milliseconds(1000);
    config.lease.renew_deadline = milliseconds(700);
    config.lease.retry_period = milliseconds(100);
    config.retry.initial = milliseconds(50);
    config.retry.max = milliseconds(400);
    return config;
  }

  Supervisor& StartSupervisor(const std::string& identity, bool host_managed = true,
                              std::optional<ComputeDomainControllerModule::Config> config = std::nullopt,
                              bool cliques = false) {
    auto s = std::make_unique<Supervisor>(h_.loop);
    s->site.node_name = identity;
    s->site.gates.Set(gates::kHostManagedIMEX, host_managed);
    s->site.gates.Set(gates::kComputeDomainCliques, cliques);
    auto client = MakeClient(BaseConfig());
    kube::InformerOptions options;
    options.backoff = BackoffPolicy{milliseconds(50), milliseconds(500), 2.0, 0.5};
    s->informers = std::make_shared<kube::InformerRegistry>(client, s->bus, h_.loop.Io(), s->metrics,
                                                            gns::test::QuietLogger("controller-test"), options);
    kube::EventRecorderConfig events;
    events.qps = 100;
    events.burst = 100;
    events.reporting_instance = identity;
    s->services.Provide<kube::KubeClient>(client);
    s->services.Provide<kube::InformerRegistry>(s->informers);
    s->services.Provide<kube::EventRecorder>(std::make_shared<kube::EventRecorder>(
        client, h_.clock, s->metrics, gns::test::QuietLogger("controller-test"), events));
    RuntimeParts parts{h_.loop, s->bus, h_.pool, h_.clock, s->site, s->metrics, s->services};
    s->context = std::make_unique<ModuleContext>(parts, std::string(ComputeDomainControllerModule::kName),
                                                 [](std::string) {}, [](ModuleHealth, std::string) {});
    s->module = std::make_unique<ComputeDomainControllerModule>(*s->context, config.value_or(ControllerConfig(identity)));
    s->module->Start();
    supervisors_.push_back(std::move(s));
    return *supervisors_.back();
  }

  void StopSupervisor(Supervisor& s) {
    if (s.stopped || !s.module) return;
    s.stopped = true;
    bool done = false;
    s.module->Stop([&] { done = true; });
    EXPECT_TRUE(h_.RunUntil([&] { return done; }));
  }

  static json Domain(const std::string& name, const std::string& tmpl, const std::string& mode = "Single",
                     int num_nodes = 0) {
    return {{"apiVersion", "resource.nvidia.com/v1beta1"},
            {"kind", "ComputeDomain"},
            {"metadata", {{"name", name}, {"namespace", "team"}}},
            {"spec",
             {{"numNodes", num_nodes},
              {"channel", {{"resourceClaimTemplate", {{"name", tmpl}}}, {"allocationMode", mode}}}}}};
  }

  json CreateDomain(const json& domain) {
    const auto r = server_->Call("POST", kDomains, domain.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    return r.Json();
  }

  sim::SimResponse Get(const std::string& path) { return server_->Call("GET", path); }
  json GetDomain(const std::string& name) { return Get(std::string(kDomains) + "/" + name).Json(); }
  int DomainStatusCode(const std::string& name) { return Get(std::string(kDomains) + "/" + name).status; }
  int TemplateStatusCode(const std::string& name) { return Get(std::string(kTemplates) + "/" + name).status; }

  bool IsReady(const std::string& name) {
    const auto r = Get(std::string(kDomains) + "/" + name);
    if (r.status != 200) return false;
    const auto d = r.Json();
    return d.contains("status") && d["status"].value("status", "") == "Ready";
  }

  std::string ConditionReason(const std::string& name) {
    const auto d = GetDomain(name);
    if (!d.contains("status") || !d["status"].contains("conditions")) return {};
    return d["status"]["conditions"][0].value("reason", "");
  }

  std::size_t Count(const std::string& collection) {
    const auto r = Get(collection);
    return r.status == 200 ? r.Json()["items"].size() : 0;
  }

  std::vector<json> EventsFor(const std::string& name) {
    std::vector<json> out;
    const auto list = Get("/apis/events.k8s.io/v1/namespaces/team/events").Json();
    for (const auto& e : list["items"]) {
      if (e["regarding"].value("name", "") == name && e["regarding"].value("kind", "") == "ComputeDomain") {
        out.push_back(e);
      }
    }
    return out;
  }

  std::vector<std::unique_ptr<Supervisor>> supervisors_;
};

TEST_F(ControllerTest, AddPathCreatesOnlyTheWorkloadTemplateAndSetsReadyWithTheFinalizer) {
  auto& s = StartSupervisor("node-a");
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  const auto created = CreateDomain(Domain("train-a", "train-a-imex-channel", "Single", /*num_nodes=*/4));
  const std::string uid = created["metadata"]["uid"];
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a"); }));

  const auto domain = GetDomain("train-a");
  EXPECT_EQ(domain["metadata"]["finalizers"], json::array({"resource.nvidia.com/computeDomain"}));
  EXPECT_EQ(domain["status"], json({{"status", "Ready"}}));
  EXPECT_EQ(domain["spec"]["numNodes"], 4);  // ignored, never rejected or rewritten

  const auto tmpl = Get(std::string(kTemplates) + "/train-a-imex-channel").Json();
  EXPECT_EQ(tmpl["metadata"]["labels"], json({{"resource.nvidia.com/computeDomain", uid},
                                              {"resource.nvidia.com/computeDomainTarget", "Workload"}}));
  EXPECT_EQ(tmpl["metadata"]["finalizers"], json::array({"resource.nvidia.com/computeDomain"}));
  const json expected_spec = json::parse(R"({"spec": {"devices": {
      "requests": [{"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
      "config": [{"requests": ["channel"], "opaque": {"driver": "compute-domain.nvidia.com", "parameters": {
          "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
          "domainID": ")" + uid + R"(", "allocationMode": "Single"}}}]}}})");
  EXPECT_EQ(tmpl["spec"], expected_spec);

  // Nothing else: one template in the whole cluster, no DaemonSets, no node labels, no cliques.
  EXPECT_EQ(Count("/apis/resource.k8s.io/v1/resourceclaimtemplates"), 1u);
  EXPECT_EQ(Count("/apis/apps/v1/daemonsets"), 0u);
  EXPECT_EQ(Count("/api/v1/nodes"), 0u);
  EXPECT_EQ(Count("/apis/resource.nvidia.com/v1beta1/computedomaincliques"), 0u);
  EXPECT_EQ(s.Stats().templates_created, 1u);
  EXPECT_TRUE(h_.RunUntil([&] { return s.Metric("gpu_node_supervisor_compute_domains{status=\"Ready\"}") == 1; }));
  EXPECT_GE(s.Metric("gpu_node_supervisor_compute_domain_reconcile_duration_seconds_count"), 1);
  // One histogram family (issue 29): every reconcile is in the +Inf bucket.
  EXPECT_EQ(s.Metric("gpu_node_supervisor_compute_domain_reconcile_duration_seconds_bucket{le=\"+Inf\"}"),
            s.Metric("gpu_node_supervisor_compute_domain_reconcile_duration_seconds_count"));

  // Idempotent under a restart (a new leader): it reads, finds everything in place, writes nothing.
  StopSupervisor(s);
  auto& again = StartSupervisor("node-b");
  ASSERT_TRUE(h_.RunUntil([&] { return again.module->Leading() && again.Stats().finished >= 1; }));
  h_.RunUntil([&] { return again.module->Queue()->InFlight() == 0 && again.module->Queue()->Queued() == 0; });
  EXPECT_EQ(again.Stats().templates_created, 0u);
  EXPECT_EQ(again.Stats().status_writes, 0u);
  EXPECT_EQ(Count("/apis/resource.k8s.io/v1/resourceclaimtemplates"), 1u);
  EXPECT_TRUE(IsReady("train-a"));
}

TEST_F(ControllerTest, InformerFaultsAndRelistsReconcileOnlyWhatChanged) {
  auto& s = StartSupervisor("node-a");
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  for (int i = 0; i < 5; ++i) CreateDomain(Domain("d" + std::to_string(i), "d" + std::to_string(i) + "-channel"));
  auto idle = [&] { return s.module->Queue()->InFlight() == 0 && s.module->Queue()->Queued() == 0; };
  // Settled: every domain Ready, nothing queued, and the controller's caches hold what the
  // server holds (the events of its own last writes are in).
  const auto domains = s.informers->Acquire(kube::InformerSpec{
      "/apis/resource.nvidia.com/v1beta1/computedomains", {}, {}});
  auto cached = [&] {
    std::map<std::string, std::string> out;
    for (const auto& [key, object] : domains->Items()) out[key] = kube::ObjectMeta::From(*object)->resource_version;
    return out;
  };
  ASSERT_TRUE(h_.RunUntil([&] {
    for (int i = 0; i < 5; ++i) {
      if (!IsReady("d" + std::to_string(i))) return false;
    }
    return idle() && cached() == ServerState(kDomains);
  }));
  h_.RunUntil([] { return false; }, milliseconds(300));  // the reconciles those last events started
  ASSERT_TRUE(h_.RunUntil([&] { return idle() && cached() == ServerState(kDomains); }));
  const auto started = s.Stats().started;
  std::vector<std::string> seen;  // what the informers published from here on (for a failure's message)
  auto sub = s.bus.Subscribe<kube::ResourceEvent>([&](const kube::ResourceEvent& e) {
    seen.push_back(std::to_string(static_cast<int>(e.type)) + " " + e.object->value("/metadata/name"_json_pointer, ""));
  });

  // Cut watches, refused re-watches, and a compaction that forces a relist: the cache is the
  // source, so none of it makes the controller read the domains again.
  server_->CutWatches();
  server_->FailNextRequests(500, 2, "computedomains");
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 2; }));
  server_->ExpireWatches();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 2; }));
  // One change while it all happened is reconciled, and only that one.
  auto d2 = GetDomain("d2");
  d2["metadata"]["labels"]["touched"] = "yes";
  ASSERT_EQ(server_->Call("PUT", std::string(kDomains) + "/d2", d2.dump()).status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return s.Stats().started > started && idle(); }));
  h_.RunUntil([] { return false; }, milliseconds(300));  // anything else that would follow
  EXPECT_EQ(s.Stats().started, started + 1) << json(seen).dump();
}

TEST_F(ControllerTest, DeletePathRemovesTemplateFinalizersAndMetrics) {
  auto& s = StartSupervisor("node-a");
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  // The first template read fails: an error series for this domain exists before the delete.
  // As many as the client's own attempts (a GET is retried on a 500): the reconcile sees it.
  server_->FailNextRequests(500, kube::RetryPolicy{}.max_attempts, "namespaces/team/resourceclaimtemplates");
  CreateDomain(Domain("train-a", "train-a-channel"));
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a"); }));
  EXPECT_EQ(s.Metric("gpu_node_supervisor_compute_domain_reconcile_errors_total{domain=\"team/train-a\",reason="
                     "\"ApiError\"}"),
            1);

  ASSERT_EQ(server_->Call("DELETE", std::string(kDomains) + "/train-a").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return DomainStatusCode("train-a") == 404; }));
  EXPECT_EQ(TemplateStatusCode("train-a-channel"), 404);
  EXPECT_EQ(s.Stats().templates_deleted, 1u);
  ASSERT_TRUE(h_.RunUntil([&] { return s.Metric("gpu_node_supervisor_compute_domains{status=\"Ready\"}") == 0; }));
  EXPECT_EQ(s.metrics.Render().find("team/train-a"), std::string::npos) << s.metrics.Render();
}

TEST_F(ControllerTest, ATemplateNotMadeForTheDomainIsReportedAndNotOverwritten) {
  const json foreign = json::parse(R"({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
      "metadata": {"name": "shared-channel", "namespace": "team", "labels": {"app": "mine"}},
      "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})");
  ASSERT_EQ(server_->Call("POST", kTemplates, foreign.dump()).status, 201);
  const auto before = Get(std::string(kTemplates) + "/shared-channel").Json();

  auto& s = StartSupervisor("node-a");
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  CreateDomain(Domain("train-a", "shared-channel"));
  ASSERT_TRUE(h_.RunUntil([&] {
    return ConditionReason("train-a") == "ResourceClaimTemplateConflict" && !EventsFor("train-a").empty();
  }));
  const auto domain = GetDomain("train-a");
  EXPECT_EQ(domain["status"]["status"], "NotReady");
  const auto events = EventsFor("train-a");
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_EQ(events[0]["reason"], "ResourceClaimTemplateConflict");
  // Retried with backoff, never written.
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Queue()->Failures("team/train-a") >= 2; }));
  EXPECT_EQ(Get(std::string(kTemplates) + "/shared-channel").Json(), before);
  EXPECT_EQ(s.Stats().templates_created, 0u);

  // Deleting the domain leaves the foreign template alone.
  ASSERT_EQ(server_->Call("DELETE", std::string(kDomains) + "/train-a").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return DomainStatusCode("train-a") == 404; }));
  EXPECT_EQ(Get(std::string(kTemplates) + "/shared-channel").Json(), before);
}

// Issue #24 §8: a template name from the API is a path segment and an object name; one that is
// not a valid Kubernetes name ("../../x", "a?b") is refused, never sent.
TEST_F(ControllerTest, ATemplateNameThatIsNotAValidObjectNameIsRefusedAndNeverRequested) {
  auto& s = StartSupervisor("node-a");
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  CreateDomain(Domain("escape", "../../../api/v1/namespaces/kube-system/secrets/x"));
  CreateDomain(Domain("query", "a?b=c"));
  ASSERT_TRUE(h_.RunUntil([&] { return ConditionReason("escape") == "InvalidSpec" && ConditionReason("query") == "InvalidSpec"; }));
  const auto status = GetDomain("escape")["status"];
  EXPECT_EQ(status["status"], "NotReady");
  EXPECT_NE(status["conditions"][0].value("message", "").find("not a valid object name"), std::string::npos) << status;
  EXPECT_EQ(Count(kTemplates), 0u);
  EXPECT_EQ(s.Stats().templates_created, 0u);
}

// Driver-managed (issue #16): finalizer and workload template as with the gate, no DaemonSet;
// Ready only when the Ready nodes of the domain's clique reach numNodes; a deleted Node leaves
// status.nodes; the delete waits for the nodes to deregister.
TEST_F(ControllerTest, WithoutTheGateReadyComesFromTheNodesOfOneClique) {
  // The Nodes exist before the controller starts, as they do in a cluster: seeded later, the
  // controller's Node cache could lag the status write and drop n3 as a Node that does not exist.
  for (const char* node : {"n1", "n2", "n3"}) {
    server_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", node}}}});
  }
  auto& s = StartSupervisor("node-a", /*host_managed=*/false);
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  CreateDomain(Domain("train-a", "train-a-channel", "Single", 2));
  ASSERT_TRUE(h_.RunUntil([&] { return TemplateStatusCode("train-a-channel") == 200; }));
  ASSERT_TRUE(h_.RunUntil([&] { return GetDomain("train-a").value(json::json_pointer("/status/status"), "") == "NotReady"; }));
  EXPECT_EQ(GetDomain("train-a")["metadata"]["finalizers"], json::array({"resource.nvidia.com/computeDomain"}));
  EXPECT_EQ(Count("/apis/apps/v1/namespaces/team/daemonsets"), 0u);
  const auto set_nodes = [&](json nodes) {
    auto d = GetDomain("train-a");
    d["status"]["nodes"] = std::move(nodes);
    const auto r = server_->Call("PUT", std::string(kDomains) + "/train-a/status", d.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  };
  const auto node = [](const char* name, const char* clique, int index, const char* status) {
    return json{{"name", name}, {"ipAddress", "10.0.0.1"}, {"cliqueID", clique}, {"index", index}, {"status", status}};
  };
  // Two Ready nodes, but of two cliques: IMEX cannot span them.
  const auto before = s.Stats().finished;
  set_nodes(json::array({node("n1", "c.1", 0, "Ready"), node("n2", "c.2", 0, "Ready")}));
  ASSERT_TRUE(h_.RunUntil([&] { return s.Stats().finished > before && s.module->Queue()->InFlight() == 0; }));
  EXPECT_FALSE(IsReady("train-a"));
  // Two Ready nodes of the first node's clique (the third, of another clique, is not counted).
  set_nodes(json::array({node("n1", "c.1", 0, "Ready"), node("n2", "c.2", 0, "Ready"), node("n3", "c.1", 1, "Ready")}));
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a"); }));
  // n3's Node is deleted: its entry leaves the status, and the domain is no longer Ready.
  ASSERT_EQ(server_->Call("DELETE", "/api/v1/nodes/n3").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto nodes = GetDomain("train-a").value(json::json_pointer("/status/nodes"), json::array());
    return nodes.size() == 2 && !IsReady("train-a");
  }));

  // The delete waits while nodes are registered, then completes once they deregister.
  ASSERT_EQ(server_->Call("DELETE", std::string(kDomains) + "/train-a").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return TemplateStatusCode("train-a-channel") == 404; }));
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Queue()->Failures("team/train-a") >= 2; }));
  EXPECT_EQ(DomainStatusCode("train-a"), 200);
  set_nodes(json::array());
  ASSERT_TRUE(h_.RunUntil([&] { return DomainStatusCode("train-a") == 404; }));
}

TEST_F(ControllerTest, WithoutTheGateTheDeleteGivesUpWaitingAfterTheTimeout) {
  auto config = ControllerConfig("node-a");
  config.deregister_timeout = milliseconds(0);
  auto& s = StartSupervisor("node-a", /*host_managed=*/false, config);
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  CreateDomain(Domain("train-a", "train-a-channel", "Single", 1));
  ASSERT_TRUE(h_.RunUntil([&] { return GetDomain("train-a").value(json::json_pointer("/status/status"), "") == "NotReady"; }));
  auto d = GetDomain("train-a");
  d["status"]["nodes"] = json::array({{{"name", "gone-node"}, {"ipAddress", "10.0.0.9"}, {"cliqueID", "c"}, {"index", 0}}});
  ASSERT_EQ(server_->Call("PUT", std::string(kDomains) + "/train-a/status", d.dump()).status, 200);
  ASSERT_EQ(server_->Call("DELETE", std::string(kDomains) + "/train-a").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return DomainStatusCode("train-a") == 404; }));
}

// ComputeDomainCliques: the nodes register in ComputeDomainClique objects (written here by the
// test, as the nodes' applies would); status.nodes mirrors them, Ready needs numNodes Ready
// nodes of the first-listed clique; a vanished Node's entry leaves both the mirror and its
// clique object; the delete waits for the clique objects to empty, then deletes them.
TEST_F(ControllerTest, WithCliquesStatusNodesMirrorsTheCliqueObjects) {
  for (const char* node : {"n1", "n2", "n3"}) {
    server_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", node}}}});
  }
  auto& s = StartSupervisor("node-a", /*host_managed=*/false, std::nullopt, /*cliques=*/true);
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  const std::string uid = CreateDomain(Domain("train-a", "train-a-channel", "Single", 2))["metadata"]["uid"];
  ASSERT_TRUE(h_.RunUntil([&] { return GetDomain("train-a").value(json::json_pointer("/status/status"), "") == "NotReady"; }));
  const std::string cliques = "/apis/resource.nvidia.com/v1beta1/namespaces/team/computedomaincliques";
  const auto daemon = [](const char* name, const char* clique, int index, const char* status) {
    return json{{"nodeName", name}, {"ipAddress", "10.0.0.1"}, {"cliqueID", clique}, {"index", index}, {"status", status}};
  };
  const auto put_clique = [&](const std::string& clique, json daemons) {
    const std::string name = uid + "." + clique;
    json object{{"apiVersion", "resource.nvidia.com/v1beta1"},
                {"kind", "ComputeDomainClique"},
                {"metadata",
                 {{"name", name},
                  {"namespace", "team"},
                  {"labels", {{"resource.nvidia.com/computeDomain", uid}, {"resource.nvidia.com/computeDomain.cliqueID", clique}}}}},
                {"daemons", std::move(daemons)}};
    if (Get(cliques + "/" + name).status == 404) {
      ASSERT_EQ(server_->Call("POST", cliques, object.dump()).status, 201);
    } else {
      ASSERT_EQ(server_->Call("PUT", cliques + "/" + name, object.dump()).status, 200);
    }
  };
  const auto names = [&] {
    std::vector<std::string> out;
    for (const auto& e : GetDomain("train-a").value(json::json_pointer("/status/nodes"), json::array())) {
      out.push_back(e.value("name", "") + "/" + e.value("status", ""));
    }
    return out;
  };
  // Clique c.1 first (n1), then c.2 (n2): the domain's clique is c.1, one Ready node of two.
  put_clique("c.1", json::array({daemon("n1", "c.1", 0, "Ready")}));
  ASSERT_TRUE(h_.RunUntil([&] { return names() == std::vector<std::string>{"n1/Ready"}; }));
  put_clique("c.2", json::array({daemon("n2", "c.2", 0, "Ready")}));
  ASSERT_TRUE(h_.RunUntil([&] { return names() == std::vector<std::string>{"n1/Ready", "n2/Ready"}; }));
  EXPECT_FALSE(IsReady("train-a"));  // two Ready nodes, but of two cliques
  // n3 joins c.1 NotReady, then Ready: the domain is Ready, its entry mirrored after n2's.
  put_clique("c.1", json::array({daemon("n1", "c.1", 0, "Ready"), daemon("n3", "c.1", 1, "NotReady")}));
  ASSERT_TRUE(h_.RunUntil([&] { return names() == std::vector<std::string>{"n1/Ready", "n2/Ready", "n3/NotReady"}; }));
  EXPECT_FALSE(IsReady("train-a"));
  put_clique("c.1", json::array({daemon("n1", "c.1", 0, "Ready"), daemon("n3", "c.1", 1, "Ready")}));
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a"); }));
  EXPECT_EQ(GetDomain("train-a")["status"]["nodes"][2],
            json({{"name", "n3"}, {"ipAddress", "10.0.0.1"}, {"cliqueID", "c.1"}, {"index", 1}, {"status", "Ready"}}));

  // n3's Node is deleted: it leaves the mirror and its clique object; the domain is NotReady.
  ASSERT_EQ(server_->Call("DELETE", "/api/v1/nodes/n3").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return names() == std::vector<std::string>{"n1/Ready", "n2/Ready"} && !IsReady("train-a"); }));
  ASSERT_TRUE(h_.RunUntil([&] { return Get(cliques + "/" + uid + ".c.1").Json()["daemons"].size() == 1u; }));
  EXPECT_EQ(Get(cliques + "/" + uid + ".c.1").Json()["daemons"][0]["nodeName"], "n1");
  ASSERT_TRUE(h_.RunUntil([&] { return s.Stats().clique_entries_removed == 1u; }));

  // The delete waits while clique objects hold nodes; once empty they are deleted, then the domain.
  ASSERT_EQ(server_->Call("DELETE", std::string(kDomains) + "/train-a").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return TemplateStatusCode("train-a-channel") == 404; }));
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Queue()->Failures("team/train-a") >= 2; }));
  EXPECT_EQ(DomainStatusCode("train-a"), 200);
  EXPECT_EQ(Count(cliques), 2u);
  put_clique("c.1", json::array());
  put_clique("c.2", json::array());
  ASSERT_TRUE(h_.RunUntil([&] { return DomainStatusCode("train-a") == 404; }));
  EXPECT_EQ(Count(cliques), 0u);
  ASSERT_TRUE(h_.RunUntil([&] { return s.Stats().cliques_deleted == 2u; }));
}

TEST(MirrorCliquesTest, ListedEntriesKeepTheirPlaceNewOnesFollowByCliqueCreation) {
  const auto clique = [](const char* name, const char* created, json daemons) {
    return json{{"metadata", {{"name", name}, {"uid", std::string("u-") + name}, {"creationTimestamp", created}}},
                {"daemons", std::move(daemons)}};
  };
  const auto daemon = [](const char* name, const char* clique) {
    return json{{"nodeName", name}, {"ipAddress", "10.0.0.1"}, {"cliqueID", clique}, {"index", 0}};
  };
  json domain = {{"status", {{"nodes", json::array({{{"name", "b1"}}})}}}};
  const std::vector<json> cliques = {
      clique("d.b", "2026-01-01T00:00:02Z", json::array({daemon("b1", "b"), daemon("b2", "b")})),
      clique("d.a", "2026-01-01T00:00:01Z", json::array({daemon("a1", "a"), daemon("gone", "a")}))};
  const auto mirror = MirrorCliques(domain, cliques, [](const std::string& n) { return n != "gone"; });
  std::vector<std::string> order;
  for (const auto& e : mirror.nodes) order.push_back(e["name"]);
  // b1 was listed first and stays first (its clique stays the domain's); then by clique age.
  EXPECT_EQ(order, (std::vector<std::string>{"b1", "a1", "b2"}));
  EXPECT_EQ(mirror.nodes[1]["status"], "NotReady");  // an entry without status is NotReady
  ASSERT_EQ(mirror.stale.size(), 1u);
  EXPECT_EQ(mirror.stale[0].clique, "d.a");
  EXPECT_EQ(mirror.stale[0].uid, "u-d.a");
  EXPECT_EQ(mirror.stale[0].entries, (std::vector<std::pair<std::size_t, std::string>>{{1, "gone"}}));
  EXPECT_EQ(mirror.per_clique.at("b"), (std::pair<std::size_t, std::size_t>{0, 2}));
}

TEST_F(ControllerTest, TwoSupervisorsOnlyTheLeaderReconciles) {
  auto& a = StartSupervisor("node-a");
  auto& b = StartSupervisor("node-b");
  ASSERT_TRUE(h_.RunUntil([&] { return a.module->Leading() || b.module->Leading(); }));
  auto* leader = a.module->Leading() ? &a : &b;
  auto* follower = leader == &a ? &b : &a;
  for (const char* name : {"d1", "d2", "d3"}) CreateDomain(Domain(name, std::string(name) + "-channel"));
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("d1") && IsReady("d2") && IsReady("d3"); }));
  EXPECT_FALSE(follower->module->Leading());
  EXPECT_FALSE(follower->module->Watching());
  EXPECT_EQ(follower->Stats().started, 0u);
  EXPECT_EQ(leader->Stats().templates_created, 3u);
  std::size_t domain_watches = 0;
  for (const auto& w : server_->OpenWatches()) {
    if (w.path.find("computedomains") != std::string::npos) ++domain_watches;
  }
  EXPECT_EQ(domain_watches, 1u);
  EXPECT_EQ(follower->Metric("gpu_node_supervisor_compute_domains{status=\"Ready\"}"), 0);

  // The leader stops (hands the lease back): the other takes over and carries on.
  StopSupervisor(*leader);
  ASSERT_TRUE(h_.RunUntil([&] { return follower->module->Leading(); }));
  CreateDomain(Domain("d4", "d4-channel"));
  ASSERT_EQ(server_->Call("DELETE", std::string(kDomains) + "/d1").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("d4") && DomainStatusCode("d1") == 404; }));
  EXPECT_EQ(TemplateStatusCode("d1-channel"), 404);
  EXPECT_EQ(follower->Stats().templates_created, 1u);
  EXPECT_EQ(Count("/apis/resource.k8s.io/v1/resourceclaimtemplates"), 3u);
}

TEST_F(ControllerTest, LosingTheLeaseMidReconcileStopsTheWorkAndTheNextLeaderFinishesIt) {
  auto config = ControllerConfig("node-a");
  config.lease.lease_duration = milliseconds(1500);
  config.lease.renew_deadline = milliseconds(1000);
  auto& s = StartSupervisor("node-a", true, config);
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));

  // Every request now takes 300 ms: a reconcile (5 requests) outlives the lease.
  server_->SetResponseDelay(milliseconds(300));
  CreateDomain(Domain("train-a", "train-a-channel"));
  ASSERT_TRUE(h_.RunUntil([&] { return s.Stats().started >= 1; }));

  // Another candidate takes the lease (as if this one had stalled): the next renew fails.
  auto lease = Get(kLease).Json();
  lease["spec"]["holderIdentity"] = "node-thief";
  lease["spec"]["renewTime"] = kube::FormatMicroTime(h_.clock.WallNow());
  ASSERT_EQ(server_->Call("PUT", kLease, lease.dump()).status, 200);

  ASSERT_TRUE(h_.RunUntil([&] { return !s.module->Leading(); }));
  EXPECT_EQ(s.Stats().abandoned, 1u);  // the reconcile in flight was dropped mid-way
  EXPECT_EQ(s.Stats().finished, 0u);
  EXPECT_FALSE(s.module->Watching());
  EXPECT_EQ(s.module->Queue()->InFlight(), 0u);
  EXPECT_EQ(s.module->Queue()->Queued(), 0u);
  EXPECT_FALSE(IsReady("train-a"));

  // Nothing moves while nobody leads: no template appears and the status stays unset.
  bool progressed = false;
  server_->SetResponseDelay(milliseconds(0));
  ASSERT_TRUE(h_.RunUntil([&] {
    if (!s.module->Leading() && (IsReady("train-a") || TemplateStatusCode("train-a-channel") == 200)) progressed = true;
    return s.module->Leading();
  }));
  EXPECT_FALSE(progressed);
  EXPECT_EQ(s.Stats().templates_created, 0u);

  // The thief never renewed: node-a leads again and finishes the domain from where it was.
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a"); }));
  EXPECT_EQ(TemplateStatusCode("train-a-channel"), 200);
  EXPECT_EQ(GetDomain("train-a")["metadata"]["finalizers"], json::array({"resource.nvidia.com/computeDomain"}));
  EXPECT_EQ(Count("/apis/resource.k8s.io/v1/resourceclaimtemplates"), 1u);
}

// Config: defaults, a full section, and bad values rejected with their key.
TEST_F(ControllerTest, ATemplateDeletedByHandComesBackWithoutAnyChangeToTheDomain) {
  auto config = ControllerConfig("node-a");
  config.resync = milliseconds(0);  // the template watch alone must notice
  auto& s = StartSupervisor("node-a", true, config);
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  CreateDomain(Domain("train-a", "train-a-channel"));
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a"); }));
  const std::string first_uid = Get(std::string(kTemplates) + "/train-a-channel").Json()["metadata"]["uid"];
  const auto domain_rv = GetDomain("train-a")["metadata"]["resourceVersion"];

  // kubectl delete: our finalizer holds it in Terminating; the controller lets it go and makes it again.
  ASSERT_EQ(server_->Call("DELETE", std::string(kTemplates) + "/train-a-channel").status, 200);
  ASSERT_TRUE(h_.RunUntil([&] {
    const auto r = Get(std::string(kTemplates) + "/train-a-channel");
    if (r.status != 200) return false;
    const auto t = r.Json();
    return t["metadata"]["uid"] != first_uid && !t["metadata"].contains("deletionTimestamp") &&
           s.Stats().templates_created == 2;
  }));
  const auto tmpl = Get(std::string(kTemplates) + "/train-a-channel").Json();
  EXPECT_EQ(tmpl["metadata"]["finalizers"], json::array({"resource.nvidia.com/computeDomain"}));
  EXPECT_TRUE(IsReady("train-a"));
  EXPECT_EQ(GetDomain("train-a")["metadata"]["resourceVersion"], domain_rv);  // the domain never changed
}

TEST_F(ControllerTest, ResyncReconcilesEveryDomainAgainWithoutWritingAnything) {
  auto config = ControllerConfig("node-a");
  config.resync = milliseconds(100);
  auto& s = StartSupervisor("node-a", true, config);
  ASSERT_TRUE(h_.RunUntil([&] { return s.module->Leading(); }));
  CreateDomain(Domain("train-a", "train-a-channel"));
  CreateDomain(Domain("train-b", "train-b-channel"));
  ASSERT_TRUE(h_.RunUntil([&] { return IsReady("train-a") && IsReady("train-b") && s.Stats().status_writes == 2; }));
  const auto finished = s.Stats().finished;
  const auto writes = s.Stats().status_writes;
  ASSERT_TRUE(h_.RunUntil([&] { return s.Stats().finished >= finished + 4; }));
  EXPECT_EQ(s.Stats().status_writes, writes);
  EXPECT_EQ(s.Stats().templates_created, 2u);
}

TEST(ControllerConfigTest, DefaultsFullSectionAndBadValues) {
  using Module = ComputeDomainControllerModule;
  SiteConfig site;
  const auto parse = [&](const std::string& text) {
    const auto value = ParseYaml(text, "site.yaml");
    ConfigMap section(value, "modules.compute-domain-controller");
    auto config = Module::ParseConfig(section, site);
    section.Finish();
    return config;
  };
  const auto defaults = parse("{}");
  EXPECT_EQ(defaults.lease.ns, "kube-system");
  EXPECT_EQ(defaults.lease.lease_name, "gpu-node-supervisor-compute-domain-controller");
  EXPECT_EQ(defaults.lease.lease_duration, milliseconds(30000));
  EXPECT_EQ(defaults.lease.renew_deadline, milliseconds(20000));
  EXPECT_EQ(defaults.lease.retry_period, milliseconds(10000));
  EXPECT_FALSE(defaults.lease.identity.empty());
  EXPECT_EQ(defaults.resource_api, ResourceApi::kV1);
  EXPECT_EQ(defaults.workers, 4u);
  EXPECT_EQ(defaults.retry.initial, milliseconds(500));
  EXPECT_EQ(defaults.resync, milliseconds(600000));

  const auto full = parse(R"(
resourceApiVersion: v1beta1
workers: 2
conflictRetries: 3
resyncPeriod: 0s
retryBackoff: {initial: 1s, max: 2m}
leaderElection: {namespace: gns, leaseName: cdc, leaseDuration: 20s, renewDeadline: 15s, retryPeriod: 3s, identity: pod-1}
)");
  EXPECT_EQ(full.resource_api, ResourceApi::kV1beta1);
  EXPECT_EQ(full.workers, 2u);
  EXPECT_EQ(full.conflict_retries, 3);
  EXPECT_EQ(full.resync, milliseconds(0));
  EXPECT_EQ(full.retry.max, milliseconds(120000));
  EXPECT_EQ(full.lease.ns, "gns");
  EXPECT_EQ(full.lease.identity, "pod-1");

  EXPECT_THROW(parse("resourceApiVersion: v2"), ConfigError);
  EXPECT_THROW(parse("leaderElection: {leaseDuration: 5s, renewDeadline: 10s}"), ConfigError);
  EXPECT_THROW(parse("leaderElection: {namespace: \"\"}"), ConfigError);
  EXPECT_THROW(parse("retryBackoff: {initial: 2s, max: 1s}"), ConfigError);
  EXPECT_THROW(parse("surprise: 1"), ConfigError);
  EXPECT_THROW(parse("resyncPeriod: 2d"), ConfigError);
}

// The workload template in the v1beta1 shape: flat requests.
TEST(WorkloadTemplateTest, V1beta1RequestsAreFlatAndAnEmptyModeIsLeftOut) {
  const auto t = WorkloadTemplate(ResourceApi::kV1beta1, "ns", "t", "uid-1", "");
  EXPECT_EQ(t["apiVersion"], "resource.k8s.io/v1beta1");
  EXPECT_EQ(t["spec"]["spec"]["devices"]["requests"][0],
            json({{"name", "channel"}, {"deviceClassName", "compute-domain-default-channel.nvidia.com"}}));
  EXPECT_FALSE(t["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"].contains("allocationMode"));
  EXPECT_TRUE(MadeForDomain(t, "uid-1"));
  EXPECT_FALSE(MadeForDomain(t, "uid-2"));
}

// The work queue on its own: one run per key at a time, re-run when added meanwhile, backoff.
TEST(WorkQueueTest, OneRunPerKeyAtATimeAndBackoffAfterFailure) {
  gns::test::LoopHarness h;
  std::map<std::string, int> runs;
  std::vector<std::function<void(bool)>> pending;
  WorkQueue queue(h.loop.Io(), BackoffPolicy{milliseconds(20), milliseconds(100), 2.0, 0.0}, 2,
                  [&](const std::string& key, std::function<void(bool)> done) {
                    ++runs[key];
                    pending.push_back(std::move(done));
                  });
  queue.Add("a");
  queue.Add("a");
  h.Drain();
  EXPECT_EQ(runs["a"], 1);
  queue.Add("a");  // while running: once more afterwards
  h.Drain();
  EXPECT_EQ(runs["a"], 1);
  auto first = std::move(pending.back());
  pending.clear();
  first(true);
  h.Drain();
  EXPECT_EQ(runs["a"], 2);
  auto second = std::move(pending.back());
  pending.clear();
  second(false);  // retried after the backoff
  EXPECT_EQ(queue.WaitingRetry(), 1u);
  ASSERT_TRUE(h.RunUntil([&] { return runs["a"] == 3; }));
  EXPECT_EQ(queue.Failures("a"), 1);
  // Cleared: the run in flight no longer counts.
  queue.Clear();
  pending.back()(false);
  h.Drain();
  EXPECT_EQ(queue.WaitingRetry(), 0u);
  EXPECT_EQ(queue.InFlight(), 0u);
}

}  // namespace
}  // namespace gns::cd_controller
