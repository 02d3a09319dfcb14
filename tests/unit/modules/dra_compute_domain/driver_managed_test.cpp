// Driver-managed IMEX registration at scale (issue #16): N nodes, each the real
// DriverManagedDomains with its own bus, KubeClient and informers, registering in one
// ComputeDomain at the same moment against the API simulator, which has our CRD
// (deploy/crd-computedomains.yaml: status.nodes a list-map keyed by name). Each node applies its
// own entry under its own field manager, so no write conflicts: every node appears, Ready, with
// a unique index, every node's map agrees, no 409 was answered, and the requests per node stay
// a small constant; the last claims' teardown leaves status.nodes empty, again without a 409.
#include "modules/dra_compute_domain/driver_managed.hpp"
#include "support/api_sim.hpp"
#include "support/held_port.hpp"
#include "support/loop_harness.hpp"
#include "support/temp_dir.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

namespace gns::dra {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr std::size_t kNodes = 12;
constexpr const char* kScaleNs = "team-a";
constexpr const char* kScaleClique = "7d1c2b3a-0000-4000-8000-00000000abcd.3";
const std::string kScaleDomains = std::string("/apis/resource.nvidia.com/v1beta1/namespaces/") + kScaleNs + "/computedomains";

std::string Source(const std::string& rel) { return std::string(std::getenv("GNS_SOURCE_DIR")) + "/" + rel; }

// One simulated node (its own bus, client and informers on the shared loop and pool) and the
// module part under test.
struct ScaleNode : gns::test::SimNode {
  using SimNode::SimNode;
  std::unique_ptr<DriverManagedDomains> domains;
};

class DriverManagedScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::ApiServerOptions options;
    options.bookmark_interval = milliseconds(200);
    api_ = std::make_unique<gns::test::ApiSim>(root_ / "api", options);
    api_->SeedFile(Source("deploy/crd-computedomains.yaml"));
    for (std::size_t i = 0; i < kNodes; ++i) {
      api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", NodeName(i)}}}});
    }
    api_->Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                    {"kind", "ComputeDomain"},
                    {"metadata", {{"name", "train"}, {"namespace", kScaleNs}}},
                    {"spec", {{"numNodes", kNodes}, {"channel", {{"resourceClaimTemplate", {{"name", "t"}}}}}}},
                    {"_resource", kScaleDomains}});
    uid_ = Domain()["metadata"]["uid"].get<std::string>();

    const uint16_t server_port = server_port_.Port();
    const uint16_t cmd_port = cmd_port_.Port();
    // Loopback addresses of their own per test process, so parallel runs do not meet.
    const int base = 20 + static_cast<int>(::getpid() % 200);
    for (std::size_t i = 0; i < kNodes; ++i) {
      auto n = std::make_unique<ScaleNode>(h_.loop, h_.pool, h_.clock, *api_, NodeName(i), "dra-compute-domain",
                                           gns::test::QuietLogger("driver-managed-test"));
      DriverManagedSettings s;
      s.node_name = n->site.node_name;
      s.state_dir = (root_ / n->site.node_name).string();
      s.node_address = "127.0." + std::to_string(base) + "." + std::to_string(i + 1);
      s.server_port = server_port;
      s.cmd_port = cmd_port;
      s.ready_wait = milliseconds(0);
      s.daemon.daemon_path = Source("tools/sim/imex/nvidia-imex");
      s.daemon.ctl_path = Source("tools/sim/imex/nvidia-imex-ctl");
      // All nodes share this process's one loop: probes (a child process each) kept sparse.
      s.daemon.probe_interval = milliseconds(1000);
      s.daemon.restart.initial = milliseconds(100);
      n->domains = std::make_unique<DriverManagedDomains>(*n->context, s, n->client, n->informers);
      n->domains->Load(LoadDomainRecord(DriverManagedDomains::RecordFile(s.state_dir)));
      n->domains->SetClique(kScaleClique);
      nodes_.push_back(std::move(n));
    }
  }

  void TearDown() override {
    std::size_t left = nodes_.size();
    for (auto& n : nodes_) n->domains->Stop([&left] { --left; });
    EXPECT_TRUE(h_.RunUntil([&] { return left == 0; }, std::chrono::seconds(30)));
    for (auto& n : nodes_) {
      n->domains.reset();
      n->Shutdown();
    }
    h_.Drain();
    nodes_.clear();
    api_->Stop();
  }

  static std::string NodeName(std::size_t i) { return "node-" + std::to_string(i); }
  json Domain() { return api_->Call("GET", kScaleDomains + "/train").Json(); }
  json Entries() { return Domain().value(json::json_pointer("/status/nodes"), json::array()); }
  std::string ReadFile(const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  gns::test::LoopHarness h_;
  gns::test::TempDir dir_;
  const std::filesystem::path root_{dir_.Path()};
  // The IMEX ports all nodes share, held for the whole test (the daemons bind them with
  // SO_REUSEPORT, each on its node's address).
  gns::test::HeldPort server_port_;
  gns::test::HeldPort cmd_port_;
  std::unique_ptr<gns::test::ApiSim> api_;
  std::vector<std::unique_ptr<ScaleNode>> nodes_;
  std::string uid_;
};

TEST_F(DriverManagedScaleTest, NodesRegisteringAtOnceAllAppearWithoutConflicts) {
  api_->ResetRequestCounts();
  const ComputeDomainInfo info{uid_, kScaleNs, "train"};
  // Every node's first prepare at the same moment (as when the scheduler places all pods at once).
  for (std::size_t i = 0; i < kNodes; ++i) {
    nodes_[i]->domains->Attach("claim-" + std::to_string(i), kScaleNs, "pod-" + std::to_string(i), info, [](DomainVerdict) {});
  }
  // All registered, all Ready (each daemon saw every peer), indices unique within the clique.
  const auto settled = [&] {
    const json entries = Entries();
    std::set<int> indices;
    for (const auto& e : entries) {
      if (e.value("status", "") != "Ready") return false;
      indices.insert(e.value("index", -1));
    }
    return entries.size() == kNodes && indices.size() == kNodes && *indices.rbegin() == static_cast<int>(kNodes) - 1;
  };
  ASSERT_TRUE(h_.RunUntil(settled, std::chrono::seconds(120))) << Entries().dump();
  std::set<std::string> names;
  for (const auto& e : Entries()) {
    names.insert(e["name"].get<std::string>());
    EXPECT_EQ(e["cliqueID"], kScaleClique);
  }
  EXPECT_EQ(names.size(), kNodes);
  // Every node's map is the same one (the same names, by the same indices).
  const std::string map0 = ReadFile(root_ / "node-0/domains" / uid_ / "nodes_config.cfg");
  ASSERT_TRUE(h_.RunUntil([&] {
    for (std::size_t i = 0; i < kNodes; ++i) {
      if (ReadFile(root_ / NodeName(i) / "domains" / uid_ / "nodes_config.cfg") != map0) return false;
    }
    return true;
  }));
  EXPECT_EQ(static_cast<std::size_t>(std::count(map0.begin(), map0.end(), '\n')), kNodes) << map0;

  // No write was refused: no 409 anywhere, and a bounded number of requests per node: its
  // informer (list + watch), the label patch, the entry applied (NotReady, then Ready), and at
  // most a couple more re-applies where two nodes took the same index at once. (With a
  // whole-list PUT, 12 nodes made ~40 requests each, most of them conflict round trips.)
  const auto codes = api_->ResponseCounts();
  EXPECT_EQ(codes.count(409), 0u) << "conflicts: " << codes.at(409);
  for (const auto& n : nodes_) EXPECT_LE(n->domains->ApiRequests(), 8u) << n->site.node_name;
  const auto verbs = api_->RequestCounts();
  EXPECT_EQ(verbs.count("update"), 0u) << "entries are applied (patch), never PUT";
  EXPECT_EQ(verbs.count("get"), 0u) << "no fresh read before a write";
  EXPECT_LE(verbs.at("patch"), 6 * kNodes);

  // Every node's last claim goes at once: each withdraws its own entry, nothing else.
  for (std::size_t i = 0; i < kNodes; ++i) nodes_[i]->domains->Detach("claim-" + std::to_string(i), [](std::string) {});
  ASSERT_TRUE(h_.RunUntil([&] { return Entries().empty(); }, std::chrono::seconds(60))) << Entries().dump();
  ASSERT_TRUE(h_.RunUntil([&] {
    for (const auto& n : nodes_) {
      if (n->domains->Domains() != 0) return false;
    }
    return true;
  }, std::chrono::seconds(60)));
  EXPECT_EQ(api_->ResponseCounts().count(409), 0u);
  for (std::size_t i = 0; i < kNodes; ++i) {
    const json node = api_->Call("GET", "/api/v1/nodes/" + NodeName(i)).Json();
    EXPECT_FALSE(node.contains(json::json_pointer("/metadata/labels/resource.nvidia.com~1computeDomain")))
        << NodeName(i);
  }
}

// The API calls are coroutines holding a ticket of the owner's gate. An owner destroyed while
// they wait on the API (its entry's apply and its label's patch, held up by the simulator) is
// not touched when their answers arrive: under ASan a resumed run would read freed memory, and
// the registration's answer would have rendered the IMEX files.
TEST(DriverManagedLifetime, DestroyedWhileItsWritesWaitOnTheApiNothingRunsOnTheirAnswers) {
  gns::test::LoopHarness h;
  gns::test::TempDir dir;
  const std::filesystem::path root = dir.Path();
  sim::ApiServerOptions options;
  options.bookmark_interval = milliseconds(200);
  gns::test::ApiSim api(root / "api", options);
  api.SeedFile(Source("deploy/crd-computedomains.yaml"));
  api.Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-0"}}}});
  api.Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                {"kind", "ComputeDomain"},
                {"metadata", {{"name", "train"}, {"namespace", kScaleNs}}},
                {"spec", {{"numNodes", 1}, {"channel", {{"resourceClaimTemplate", {{"name", "t"}}}}}}},
                {"_resource", kScaleDomains}});
  const std::string uid = api.Call("GET", kScaleDomains + "/train").Json()["metadata"]["uid"].get<std::string>();

  gns::test::SimNode node(h.loop, h.pool, h.clock, api, "node-0", "dra-compute-domain",
                          gns::test::QuietLogger("driver-managed-test"));
  DriverManagedSettings s;
  s.node_name = "node-0";
  s.state_dir = (root / "node-0").string();
  s.node_address = "127.0.0.1";
  s.ready_wait = milliseconds(0);
  s.daemon.daemon_path = Source("tools/sim/imex/nvidia-imex");
  s.daemon.ctl_path = Source("tools/sim/imex/nvidia-imex-ctl");
  auto domains = std::make_unique<DriverManagedDomains>(*node.context, s, node.client, node.informers);
  domains->Load(LoadDomainRecord(DriverManagedDomains::RecordFile(s.state_dir)));
  domains->SetClique(kScaleClique);

  api.SetResponseDelay(milliseconds(1000));
  bool answered = false;
  domains->Attach("claim-0", kScaleNs, "pod-0", ComputeDomainInfo{uid, kScaleNs, "train"},
                  [&answered](DomainVerdict) { answered = true; });
  // The label's patch and the entry's apply reach the API, and wait there.
  ASSERT_TRUE(h.RunUntil([&] { return api.RequestCount("patch") >= 2; })) << api.RequestCount("patch");
  EXPECT_EQ(domains->ApiRequests(), 4u);  // and its informer's list and watch: nothing else
  EXPECT_TRUE(answered);  // readyWait 0: the prepare was answered once the claim was recorded
  api.ResetRequestCounts();
  domains.reset();

  // The answers come (the list, the patch, the apply), and the loop turns on them.
  const auto answers = [&api] {
    std::uint64_t n = 0;
    for (const auto& [code, count] : api.ResponseCounts()) n += count;
    return n;
  };
  ASSERT_TRUE(h.RunUntil([&] { return answers() >= 2; }, std::chrono::seconds(10))) << answers();
  h.RunUntil([] { return false; }, milliseconds(500));
  // The entry is in the API (the apply was made), but nothing acted on its answer.
  const json entries = api.Call("GET", kScaleDomains + "/train").Json().value(json::json_pointer("/status/nodes"),
                                                                               json::array());
  EXPECT_EQ(entries.size(), 1u) << entries.dump();
  EXPECT_FALSE(std::filesystem::exists(root / "node-0" / "domains" / uid / "nodes_config.cfg"));
  EXPECT_EQ(api.RequestCount("patch"), 0u) << "a write after the owner was gone";

  node.Shutdown();
  h.Drain();
  api.Stop();
}

}  // namespace
}  // namespace gns::dra
