// Driver-managed IMEX (HostManagedIMEX off, issue #16) across three real supervisors: three
// simulated nodes (their own kubelet simulator, sandbox, fake NVML and loopback address), one
// API simulator, two cliques, the fake nvidia-imex / nvidia-imex-ctl of tools/sim/imex as the
// daemons each supervisor runs. A domain across the two nodes of one clique becomes Ready and
// both prepares succeed; the node of the other clique is refused; a crashed daemon is
// restarted; kill -9 of a supervisor is survived; unprepare stops the daemon and deregisters.
// Run twice: with ComputeDomainCliques off (each node's entry in the domain's status.nodes) and
// on (each node's entry in its clique's ComputeDomainClique object, status.nodes the
// controller's mirror of them, the objects deleted with the domain). Every API call the three
// made, by module, must be in the recording of its gate (deploy/recorded-api-calls/
// driver-managed-imex-{cliques,status-nodes}.json), against which deploy/'s RBAC is checked
// (tests/support/module_calls.hpp); GNS_RECORD_API_CALLS=1 records them instead.
#include "support/api_sim.hpp"
#include "support/module_calls.hpp"
#include "support/eventually.hpp"
#include "support/held_port.hpp"
#include "channel_claim.h"
#include "kubelet_sim.h"
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace gns {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kNs = "team-a";
constexpr const char* kDriver = "compute-domain.nvidia.com";
constexpr const char* kCluster = "5b0e9c3a-1d2f-4e6a-8b7c-9d0e1f2a3b4c";
const std::string kDomains = "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomains";
const std::string kClaims = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims";
const std::string kCliques = "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomaincliques";

// How long a condition that other processes make true (supervisors, daemons) may take.
constexpr milliseconds kSettle = seconds(60);
using test::Eventually;

// One node: its kubelet simulator and the supervisor process that runs on it.
struct NodeProcess {
  std::string name;
  std::string ip;
  int clique = 0;
  fs::path dir;
  std::unique_ptr<sim::KubeletSim> kubelet;
  std::unique_ptr<test::Subprocess> proc;
  std::string config;
  std::string nvml;
};

class DriverManagedImexTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gdm-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    sim::ApiServerOptions options;
    options.bookmark_interval = milliseconds(500);
    api_ = std::make_unique<gns::test::ApiSim>(dir_ / "api", options);
    // Our CRD: status.nodes is a list-map keyed by name, so each node's applied entry is its own.
    api_->SeedFile(Source("deploy/crd-computedomains.yaml"));
    api_->SeedFile(Source("deploy/crd-computedomaincliques.yaml"));
    // Three nodes: a and b in clique 1, c in clique 2; each its own loopback address.
    const int base = 100 + static_cast<int>(::getpid() % 100);
    nodes_.push_back(MakeNode("node-a", "127.0." + std::to_string(base) + ".1", 1));
    nodes_.push_back(MakeNode("node-b", "127.0." + std::to_string(base) + ".2", 1));
    nodes_.push_back(MakeNode("node-c", "127.0." + std::to_string(base) + ".3", 2));
    for (auto& n : nodes_) Launch(n);
    for (auto& n : nodes_) {
      ASSERT_TRUE(n.kubelet->WaitForDraDriver(kDriver, seconds(60))) << n.proc->Output();
    }
  }

  void TearDown() override {
    for (auto& n : nodes_) {
      if (n.proc) {
        n.proc->Signal(SIGTERM);
        EXPECT_EQ(n.proc->Wait(seconds(30)), 0) << n.name << ": " << n.proc->Output();
      }
    }
    // Every API call the three supervisors made is in the recording deploy/'s RBAC is checked
    // against (tests/support/module_calls.hpp): a call it lacks would be refused in a cluster.
    if (!nodes_.empty()) {
      test::SiteView site;
      site.config = YAML::LoadFile(nodes_.front().config);
      const auto stats = api_->Call("GET", "/_sim/stats").Json();
      EXPECT_FALSE(test::CallsByModule(stats).empty());
      const auto scenario = std::string("driver-managed-imex-") + (GetParam() ? "cliques" : "status-nodes");
      for (const auto& problem : test::CheckRecordedCalls(scenario, "integration_driver_managed_imex_test", stats,
                                                          test::ResolvedImexGates(site))) {
        ADD_FAILURE() << problem;
      }
    }
    nodes_.clear();
    api_->Stop();
    std::error_code ignored;  // best effort
    fs::remove_all(dir_, ignored);
  }

  NodeProcess MakeNode(const std::string& name, const std::string& ip, int clique) {
    NodeProcess n;
    n.name = name;
    n.ip = ip;
    n.clique = clique;
    n.dir = dir_ / name;
    fs::create_directories(n.dir / "host/proc");
    fs::create_directories(n.dir / "kubelet/plugins_registry");
    std::ofstream(n.dir / "host/proc/devices") << "Character devices:\n509 nvidia-caps-imex-channels\n\nBlock devices:\n";
    // One fabric-attached GPU: its fabric info is the node's clique.
    n.nvml = (n.dir / "gpus.json").string();
    std::ifstream shipped(Source("tools/sim/fake_nvml/gpus-8.json"));
    json gpus = json::parse(shipped);
    gpus["gpus"] = json::array({gpus["gpus"][0]});
    gpus["gpus"][0]["nvlinkPeers"] = json::array();
    gpus["gpus"][0]["fabric"]["clusterUuid"] = kCluster;
    gpus["gpus"][0]["fabric"]["cliqueId"] = clique;
    std::ofstream(n.nvml) << gpus.dump();
    api_->Seed(json{{"apiVersion", "v1"},
                    {"kind", "Node"},
                    {"metadata", {{"name", name}}},
                    {"status", {{"addresses", json::array({{{"type", "InternalIP"}, {"address", ip}}})}}}});
    n.config = (n.dir / "site.yaml").string();
    std::ofstream(n.config) << "version: v1\nnodeName: " << name << "\npaths:\n  kubeletDir: " << (n.dir / "kubelet").string()
                            << "\n  cdiDir: " << (n.dir / "cdi").string() << "\n  stateDir: " << (n.dir / "state").string()
                            << "\n  hostRoot: " << (n.dir / "host").string()
                            << "\nfeatureGates:\n  HostManagedIMEX: false\n  ComputeDomainCliques: "
                            << (GetParam() ? "true" : "false") << "\nmodules:\n"
                               "  kube:\n    enabled: true\n    kubeconfig: "
                            << (dir_ / "api/kubeconfig").string()
                            << "\n  gpu-inventory:\n    enabled: true\n    nvmlLibrary: "
                            << Built("tools/sim/fake_nvml/libnvidia-ml.so.1")
                            << "\n  dra-compute-domain:\n    enabled: true\n    driverManaged:\n"
                               "      imexDaemonPath: "
                            << Source("tools/sim/imex/nvidia-imex") << "\n      imexCtlPath: "
                            << Source("tools/sim/imex/nvidia-imex-ctl") << "\n      serverPort: " << server_port_
                            << "\n      cmdPort: " << cmd_port_
                            << "\n      readyWait: 2s\n      readyProbeInterval: 100ms\n      healthProbeInterval: 2s\n"
                               "      restartInitial: 200ms\n      restartMax: 1s\n"
                               "  compute-domain-controller:\n    enabled: true\n    retryBackoff: {initial: 100ms, max: 1s}\n"
                               "    deregisterTimeout: 20s\n"
                               "    leaderElection: {namespace: kube-system, leaseDuration: 3s, renewDeadline: 2s, "
                               "retryPeriod: 500ms}\n";
    sim::KubeletSimOptions options;
    options.kubelet_dir = n.dir / "kubelet";
    options.registration_retry_initial = milliseconds(100);
    n.kubelet = std::make_unique<sim::KubeletSim>(options);
    n.kubelet->Start();
    return n;
  }

  void Launch(NodeProcess& n) {
    n.proc = std::make_unique<test::Subprocess>(
        std::vector<std::string>{std::getenv("GNS_SUPERVISOR_BIN"), "run", "--config", n.config},
        // POD_NAME: the lease identity, as the DaemonSet sets it (all three share this host's name).
        std::map<std::string, std::string>{{"FAKE_NVML_CONFIG", n.nvml}, {"POD_NAME", "supervisor-" + n.name}});
  }

  json Get(const std::string& path) { return api_->Call("GET", path).Json(); }

  std::string SeedDomain(const std::string& name, int num_nodes) {
    api_->Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                    {"kind", "ComputeDomain"},
                    {"metadata", {{"name", name}, {"namespace", kNs}}},
                    {"spec",
                     {{"numNodes", num_nodes},
                      {"channel", {{"resourceClaimTemplate", {{"name", name + "-channel"}}}, {"allocationMode", "Single"}}}}},
                    {"_resource", kDomains}});
    return Get(kDomains + "/" + name)["metadata"]["uid"].get<std::string>();
  }

  sim::DraClaim SeedClaim(const std::string& name, const NodeProcess& node, const std::string& domain_uid) {
    api_->Seed(sim::AllocatedChannelClaim(
        kNs, name, node.name,
        json{{"apiVersion", "resource.nvidia.com/v1beta1"},
             {"kind", "ComputeDomainChannelConfig"},
             {"domainID", domain_uid},
             {"allocationMode", "Single"}},
        kDriver));
    return sim::DraClaim{kNs, Get(kClaims + "/" + name)["metadata"]["uid"].get<std::string>(), name};
  }

  std::string PrepareError(NodeProcess& n, const sim::DraClaim& claim) {
    const auto result = n.kubelet->NodePrepareResources(kDriver, {claim});
    if (!result.ok()) return "rpc: " + result.status.ToString();
    const auto it = result.claims.find(claim.uid);
    return it == result.claims.end() ? "<no entry>" : it->second.error;
  }

  // Prepares as the kubelet does: a failed prepare is retried (here at once; the plugin itself
  // waits up to readyWait for its domain) until it succeeds or the limit passes.
  std::string PrepareUntilDone(NodeProcess& n, const sim::DraClaim& claim, seconds limit = seconds(90)) {
    std::string error;
    Eventually([&] { return (error = PrepareError(n, claim)).empty(); }, limit);
    return error;
  }

  std::string UnprepareError(NodeProcess& n, const sim::DraClaim& claim) {
    const auto result = n.kubelet->NodeUnprepareResources(kDriver, {claim});
    if (!result.ok()) return "rpc: " + result.status.ToString();
    const auto it = result.claims.find(claim.uid);
    return it == result.claims.end() ? "<no entry>" : it->second;
  }

  // ComputeDomainCliques: the daemons' node names in the clique object of (domain, clique).
  std::vector<std::string> CliqueDaemons(const std::string& uid, int clique) {
    const auto r = api_->Call("GET", kCliques + "/" + uid + "." + kCluster + "." + std::to_string(clique));
    std::vector<std::string> out;
    if (r.status != 200) return out;
    for (const auto& d : r.Json().value("daemons", json::array())) out.push_back(d.value("nodeName", ""));
    std::sort(out.begin(), out.end());
    return out;
  }
  std::size_t Cliques() { return Get(kCliques).value("items", json::array()).size(); }

  json NodeEntry(const std::string& domain, const std::string& node) {
    const json d = Get(kDomains + "/" + domain);
    for (const auto& e : d.value(json::json_pointer("/status/nodes"), json::array())) {
      if (e.value("name", "") == node) return e;
    }
    return nullptr;
  }
  std::string Label(const NodeProcess& n) {
    return Get("/api/v1/nodes/" + n.name).value(json::json_pointer("/metadata/labels/resource.nvidia.com~1computeDomain"),
                                                std::string());
  }
  std::string DomainDir(const NodeProcess& n, const std::string& uid) {
    return (n.dir / "state/dra-compute-domain/domains" / uid).string();
  }
  std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  std::unique_ptr<gns::test::ApiSim> api_;
  // The IMEX ports all nodes share, held for the whole test (the daemons bind them with
  // SO_REUSEPORT, each on its node's address).
  test::HeldPort server_port_held_;
  test::HeldPort cmd_port_held_;
  uint16_t server_port_ = server_port_held_.Port();
  uint16_t cmd_port_ = cmd_port_held_.Port();
  std::vector<NodeProcess> nodes_;
};

TEST_P(DriverManagedImexTest, ADomainAcrossOneCliqueBecomesReadyAndItsDaemonsAreSupervised) {
  const bool cliques = GetParam();
  NodeProcess& a = nodes_[0];
  NodeProcess& b = nodes_[1];
  NodeProcess& c = nodes_[2];
  const std::string uid = SeedDomain("train", 2);
  // The controller (whichever supervisor leads) makes the workload template; no DaemonSet.
  ASSERT_TRUE(Eventually([&] {
    return api_->Call("GET", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates/train-channel").status ==
           200;
  }, kSettle));
  EXPECT_EQ(Get("/apis/apps/v1/daemonsets").value("items", json::array()).size(), 0u);

  const auto ca = SeedClaim("pod-a-channel", a, uid);
  const auto cb = SeedClaim("pod-b-channel", b, uid);
  const auto cc = SeedClaim("pod-c-channel", c, uid);

  // The first node alone: registered, labelled, its daemon runs, but the domain needs 2 nodes.
  const std::string first = PrepareError(a, ca);
  EXPECT_NE(first.find("ComputeDomain team-a/train is not Ready yet"), std::string::npos) << first;
  EXPECT_NE(first.find("the kubelet retries"), std::string::npos) << first;
  EXPECT_EQ(Label(a), uid);
  if (cliques) {
    // Registered in its clique's object; status.nodes follows through the controller.
    EXPECT_EQ(CliqueDaemons(uid, 1), std::vector<std::string>{"node-a"});
    ASSERT_TRUE(Eventually([&] { return !NodeEntry("train", "node-a").is_null(); }, kSettle));
  } else {
    EXPECT_EQ(Cliques(), 0u);
  }
  EXPECT_EQ(NodeEntry("train", "node-a").value("cliqueID", ""), std::string(kCluster) + ".1");
  EXPECT_EQ(NodeEntry("train", "node-a").value("ipAddress", ""), a.ip);

  // The second node of the clique: both prepares succeed.
  EXPECT_EQ(PrepareUntilDone(b, cb), "");
  EXPECT_EQ(PrepareUntilDone(a, ca), "");
  EXPECT_EQ(Get(kDomains + "/train")["status"]["status"], "Ready");
  EXPECT_EQ(NodeEntry("train", "node-a")["status"], "Ready");
  EXPECT_EQ(NodeEntry("train", "node-b")["status"], "Ready");
  std::set<int> indices{NodeEntry("train", "node-a")["index"].get<int>(), NodeEntry("train", "node-b")["index"].get<int>()};
  EXPECT_EQ(indices, (std::set<int>{0, 1}));
  EXPECT_TRUE(fs::exists(a.dir / "cdi" / ("k8s.compute-domain.nvidia.com-claim_" + ca.uid + ".json")));
  // IMEXDaemonsWithDNSNames (the default with the gate off): fixed names in the map, the
  // addresses in the domain's hosts file, which the daemon sees as its /etc/hosts.
  EXPECT_EQ(ReadFile(DomainDir(a, uid) + "/nodes_config.cfg"), "compute-domain-daemon-0\ncompute-domain-daemon-1\n");
  const std::string hosts = ReadFile(DomainDir(a, uid) + "/hosts");
  EXPECT_NE(hosts.find(a.ip + "\tcompute-domain-daemon-" + NodeEntry("train", "node-a")["index"].dump()),
            std::string::npos) << hosts;
  EXPECT_NE(hosts.find(b.ip + "\tcompute-domain-daemon-" + NodeEntry("train", "node-b")["index"].dump()),
            std::string::npos) << hosts;

  // The node of the other clique: registered, never in the others' maps, refused for good.
  std::string refused;
  Eventually([&] { return (refused = PrepareError(c, cc)).find("clique") != std::string::npos; }, kSettle);
  EXPECT_NE(refused.find("this node's NVLink clique \"" + std::string(kCluster) + ".2\" is not ComputeDomain "
                         "team-a/train's clique \"" + std::string(kCluster) + ".1\""),
            std::string::npos)
      << refused;
  // (Gate on: the controller's mirror may list it a moment after its clique object does.)
  EXPECT_TRUE(Eventually([&] { return !NodeEntry("train", "node-c").is_null(); }, kSettle));
  if (cliques) {
    // One object per clique: node-c's own, and a and b together in theirs.
    EXPECT_EQ(CliqueDaemons(uid, 1), (std::vector<std::string>{"node-a", "node-b"}));
    EXPECT_EQ(CliqueDaemons(uid, 2), std::vector<std::string>{"node-c"});
    const json obj = Get(kCliques + "/" + uid + "." + kCluster + ".1");
    EXPECT_EQ(obj["metadata"]["labels"]["resource.nvidia.com/computeDomain"], uid);
    EXPECT_EQ(obj["metadata"]["labels"]["resource.nvidia.com/computeDomain.cliqueID"], std::string(kCluster) + ".1");
    EXPECT_EQ(obj["metadata"]["ownerReferences"][0]["uid"], uid);
    EXPECT_EQ(obj["metadata"]["ownerReferences"][0]["kind"], "ComputeDomain");
  }
  EXPECT_EQ(ReadFile(DomainDir(a, uid) + "/hosts").find(c.ip), std::string::npos);
  EXPECT_EQ(ReadFile(DomainDir(a, uid) + "/nodes_config.cfg").find("compute-domain-daemon-2"), std::string::npos);
  EXPECT_EQ(Get(kDomains + "/train")["status"]["status"], "Ready");
  EXPECT_EQ(UnprepareError(c, cc), "");
  ASSERT_TRUE(Eventually([&] { return NodeEntry("train", "node-c").is_null() && Label(c).empty(); }, kSettle));
  if (cliques) {
    EXPECT_TRUE(CliqueDaemons(uid, 2).empty());
  }

  // A daemon crash: restarted by its supervisor, the node goes NotReady and Ready again.
  ASSERT_TRUE(a.proc->WaitForLine("IMEX daemon of ComputeDomain team-a/train is ready"));
  const auto crash = test::RunToCompletion(
      {Source("tools/sim/imex/nvidia-imex-ctl"), "--crash", "-c", DomainDir(a, uid) + "/config.cfg"});
  EXPECT_EQ(crash.first, 0) << crash.second;
  ASSERT_TRUE(a.proc->WaitForLine("exited with status 134; restarting in", seconds(30))) << a.proc->Output();
  ASSERT_TRUE(a.proc->WaitForLine("[nvidia-imex team-a/train] crashing on request")) << a.proc->Output();
  ASSERT_TRUE(Eventually([&] { return NodeEntry("train", "node-a")["status"] == "Ready"; }, kSettle)) << a.proc->Output();

  // kill -9 of node-b's supervisor: its daemon dies with it; the restarted supervisor finds the
  // claim in its checkpoint and the domain in its record, starts the daemon again, stays Ready.
  b.proc->Signal(SIGKILL);
  EXPECT_EQ(b.proc->Wait(seconds(30)), 128 + SIGKILL);
  Launch(b);
  ASSERT_TRUE(b.proc->WaitForLine("driver-managed IMEX: resuming ComputeDomain team-a/train (1 claim(s))", seconds(60)))
      << b.proc->Output();
  ASSERT_TRUE(b.proc->WaitForLine("IMEX daemon of ComputeDomain team-a/train is ready", seconds(60)))
      << b.proc->Output();
  EXPECT_EQ(PrepareUntilDone(b, cb), "");  // answered from the checkpoint once it serves again

  // The last claim of node-a goes: its daemon stops, the node deregisters, the label goes.
  EXPECT_EQ(UnprepareError(a, ca), "");
  ASSERT_TRUE(a.proc->WaitForLine("IMEX daemon of ComputeDomain team-a/train stopped")) << a.proc->Output();
  ASSERT_TRUE(Eventually(
      [&] { return NodeEntry("train", "node-a").is_null() && Label(a).empty() && !fs::exists(DomainDir(a, uid)); },
      kSettle));
  // node-b's map loses node-a: the domain is no longer Ready (1 of 2).
  ASSERT_TRUE(Eventually([&] {
    return ReadFile(DomainDir(b, uid) + "/hosts").find(a.ip) == std::string::npos &&
           ReadFile(DomainDir(b, uid) + "/nodes_config.cfg") == "compute-domain-daemon-" +
                                                                   NodeEntry("train", "node-b")["index"].dump() + "\n";
  }, kSettle));
  ASSERT_TRUE(Eventually([&] { return Get(kDomains + "/train")["status"]["status"] == "NotReady"; }, kSettle));

  // Deleting the domain waits for node-b to deregister, then the finalizer goes.
  api_->Call("DELETE", kDomains + "/train");
  EXPECT_EQ(api_->Call("GET", kDomains + "/train").status, 200);  // held by the finalizer
  EXPECT_EQ(UnprepareError(b, cb), "");
  ASSERT_TRUE(Eventually([&] { return api_->Call("GET", kDomains + "/train").status == 404; }, kSettle));
  EXPECT_TRUE(Label(b).empty());
  EXPECT_EQ(Cliques(), 0u);  // deleted with their domain (gate on), never made (gate off)
}

INSTANTIATE_TEST_SUITE_P(Gate, DriverManagedImexTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ComputeDomainCliques" : "StatusNodes";
                         });

}  // namespace
}  // namespace gns
