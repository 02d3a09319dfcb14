// The imex-peers module with imex-health (its systemd connection) against a private dbus-daemon
// with the fake systemd, the API simulator holding two cliques of Nodes, and a real
// nodes_config.cfg under a host root.
#include "support/api_sim.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/imex_health/imex_health_module.hpp"
#include "modules/imex_peers/imex_peers_module.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "support/loop_harness.hpp"
#include "support/module_under_test.hpp"
#include "support/private_bus.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gns::imex_peers {
namespace {

namespace fs = std::filesystem;
constexpr const char* kUnit = "nvidia-imex.service";

nlohmann::json NodeObject(const std::string& name, const std::string& clique, const std::string& ip) {
  nlohmann::json node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}};
  if (!clique.empty()) node["metadata"]["labels"] = {{"nvidia.com/gpu.clique", clique}};
  node["status"]["addresses"] = nlohmann::json::array();
  if (!ip.empty()) node["status"]["addresses"].push_back({{"type", "InternalIP"}, {"address", ip}});
  return node;
}

class ImexPeersModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::PrivateBus::Available()) GTEST_SKIP() << "dbus-daemon or gns-fake-systemd missing";
    char tmpl[] = "/tmp/gnspeer-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    root_ = dir_ / "host";
    fs::create_directories(root_ / "proc");
    fs::create_directories(root_ / "etc/nvidia-imex");
    std::ofstream(root_ / "proc/devices") << "Character devices:\n234 nvidia-caps-imex-channels\n";
    std::ofstream(root_ / "etc/nvidia-imex/config.cfg") << "IMEX_CMD_PORT=50005\n";
    std::ofstream(root_ / "etc/nvidia-imex/nodes_config.cfg") << "10.0.0.1\n";
    bus_ = std::make_unique<test::PrivateBus>(dir_.string());
    bus_->StartBus();
    bus_->StartSystemd({kUnit});
    server_ = std::make_unique<gns::test::ApiSim>(dir_ / "api");
    // node1 (us) carries the clique label (node-labels writes it; imex-peers only reads it).
    server_->Seed(NodeObject("node1", "c1", "10.0.0.1"));
    server_->Seed(NodeObject("node2", "c1", "10.0.0.2"));
    server_->Seed(NodeObject("node9", "c2", "10.0.0.9"));
    kube::ClientConfig config = server_->ClientConfig();
    const auto log = gns::test::QuietLogger("imex-peers-test");
    client_ = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{h_.loop, h_.clock, h_.metrics, log}, config);
    kube::EventRecorderConfig events;
    events.reporting_instance = "node1";
    recorder_ = std::make_shared<kube::EventRecorder>(client_, h_.clock, h_.metrics, log, events);
    informers_ = std::make_shared<kube::InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics, log);
    h_.services.Provide<kube::KubeClient>(client_);
    h_.services.Provide<kube::EventRecorder>(recorder_);
    h_.services.Provide<kube::InformerRegistry>(informers_);
    h_.site.node_name = "node1";
    h_.site.paths.host_root = root_.string();
    health_sub_ = h_.bus.Subscribe<imex_health::ImexHealth>([this](const imex_health::ImexHealth& s) { health_ = s; });
    peers_sub_ = h_.bus.Subscribe<ImexPeersState>([this](const ImexPeersState& s) { peers_ = s; });
  }

  void TearDown() override {
    if (!bus_) return;
    peers_module_.Stop();
    health_module_.Stop();
    health_sub_.Reset();
    peers_sub_.Reset();
    h_.services.Withdraw<kube::KubeClient>();
    h_.services.Withdraw<kube::EventRecorder>();
    h_.services.Withdraw<kube::InformerRegistry>();
    informers_->StopAll();
    client_->Shutdown();
    h_.Drain();
    server_->Stop();
    bus_.reset();
    fs::remove_all(dir_);
  }

  void Start(const std::string& policy, bool dra_running, std::size_t prepared) {
    StartHealth();
    StartPeers(policy, dra_running, prepared);
  }

  void StartHealth() {
    const auto hv = ParseYaml("busAddress: " + bus_->Address() + "\nresolvePeers: false\n", "site.yaml");
    ConfigMap hs(hv, "modules.imex-health");
    health_module_.Start(imex_health::ImexHealthModule::ParseConfig(hs, h_.site));
    ASSERT_TRUE(h_.RunUntil([&] { return health_ && health_->active_enter_usec != 0; }));
  }

  void StartPeers(const std::string& policy, bool dra_running, std::size_t prepared) {
    ModuleStates states;
    if (dra_running) states.modules.push_back({"dra-compute-domain", ModuleState::kRunning, ModuleHealth::kOk, "", 0});
    h_.bus.Publish(states);
    if (dra_running) SetPrepared(prepared);
    h_.bus.Publish(gpu_inventory::NodeClique{"c1", ""});
    const auto pv = ParseYaml("restartPolicy: " + policy + "\n", "site.yaml");
    ConfigMap ps(pv, "modules.imex-peers");
    auto config = ImexPeersModule::ParseConfig(ps, h_.site);
    ps.Finish();
    peers_module_.Start(config);
  }

  void SetPrepared(std::size_t n) {
    dra::DraComputeDomainState state;
    for (std::size_t i = 0; i < n; ++i) state.prepared_claims.push_back({"uid-" + std::to_string(i), "ns", "c", "PrepareCompleted", "d"});
    h_.bus.Publish(state);
  }

  std::string Map() {
    std::ifstream in(root_ / "etc/nvidia-imex/nodes_config.cfg");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  nlohmann::json Condition() {
    const auto node = server_->Call("GET", "/api/v1/nodes/node1").Json();
    for (const auto& c : node.value("/status/conditions"_json_pointer, nlohmann::json::array())) {
      if (c.value("type", "") == "ImexRestartPending") return c;
    }
    return nullptr;
  }
  bool ConditionIs(const std::string& status, const std::string& reason) {
    return h_.RunUntil([&] {
      const auto c = Condition();
      return !c.is_null() && c["status"] == status && c["reason"] == reason;
    });
  }

  test::LoopHarness h_;
  fs::path dir_;
  fs::path root_;
  std::unique_ptr<test::PrivateBus> bus_;
  std::unique_ptr<gns::test::ApiSim> server_;
  std::shared_ptr<kube::KubeClient> client_;
  std::shared_ptr<kube::EventRecorder> recorder_;
  std::shared_ptr<kube::InformerRegistry> informers_;
  std::optional<imex_health::ImexHealth> health_;
  std::optional<ImexPeersState> peers_;
  test::ModuleUnderTest<imex_health::ImexHealthModule> health_module_{h_};
  test::ModuleUnderTest<ImexPeersModule> peers_module_{h_};
  Subscription health_sub_;
  Subscription peers_sub_;
};

TEST_F(ImexPeersModuleTest, RendersAndRestartsOnlyWhenNoClaimIsPrepared) {
  Start("whenIdle", true, 1);
  // The clique's map (node9 is in another clique), sorted; the restart waits for the claim.
  ASSERT_TRUE(h_.RunUntil([&] { return Map() == "10.0.0.1\n10.0.0.2\n"; })) << Map();
  ASSERT_TRUE(ConditionIs("True", "ChannelClaimPrepared"));
  const uint64_t started = health_->active_enter_usec;
  // A Node joins the clique: the map is rewritten, still no restart.
  server_->Seed(NodeObject("node3", "c1", "10.0.0.3"));
  ASSERT_TRUE(h_.RunUntil([&] { return Map() == "10.0.0.1\n10.0.0.2\n10.0.0.3\n"; })) << Map();
  // A Node of the clique without an address is left out and reported.
  server_->Seed(NodeObject("node4", "c1", ""));
  ASSERT_TRUE(h_.RunUntil([&] { return peers_ && peers_->without_address == std::vector<std::string>{"node4"}; }));
  EXPECT_EQ(Map(), "10.0.0.1\n10.0.0.2\n10.0.0.3\n");
  EXPECT_EQ(health_->active_enter_usec, started);
  EXPECT_EQ(peers_->restarts, 0u);
  EXPECT_EQ(health_->reason, "NodesConfigStale");  // imex-health sees the unloaded map
  // The claim is unprepared: the unit restarts and loads the map.
  SetPrepared(0);
  ASSERT_TRUE(ConditionIs("False", "MapLoaded"));
  EXPECT_EQ(peers_->restarts, 1u);
  ASSERT_TRUE(h_.RunUntil([&] { return health_->active_enter_usec > started && health_->reason == "ImexHealthy"; }))
      << health_->reason;
  // No change, no write.
  const auto writes = peers_->writes;
  server_->Call("PATCH", "/api/v1/nodes/node2", R"({"metadata":{"annotations":{"x":"y"}}})",
                "application/merge-patch+json");
  h_.Drain();
  EXPECT_EQ(peers_->writes, writes);
}

TEST_F(ImexPeersModuleTest, ALoadedMapThatDivergesFromTheCliqueIsItsOwnReasonAndIsRestartedAway) {
  StartHealth();
  const uint64_t first_run = health_->active_enter_usec;
  // A previous supervisor wrote the clique's map and died before restarting IMEX: the file is
  // right, the running IMEX is not.
  std::ofstream(root_ / "etc/nvidia-imex/nodes_config.cfg") << "10.0.0.1\n10.0.0.2\n";
  StartPeers("whenIdle", true, 1);
  ASSERT_TRUE(ConditionIs("True", "LoadedMapDiverges"));
  const std::string message = Condition()["message"];
  EXPECT_NE(message.find("changed after the running IMEX started"), std::string::npos) << message;
  EXPECT_NE(message.find("1 channel claim(s) prepared"), std::string::npos) << message;
  EXPECT_TRUE(peers_->diverged);
  EXPECT_EQ(peers_->writes, 0u);
  EXPECT_EQ(peers_->restarts, 0u);
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_imex_peers_map_diverged", "").Value(), 1);
  // The claim goes: restarted, and the new run loaded the clique's map.
  SetPrepared(0);
  ASSERT_TRUE(ConditionIs("False", "MapLoaded"));
  EXPECT_EQ(peers_->restarts, 1u);
  ASSERT_TRUE(h_.RunUntil([&] {
    return health_->active_enter_usec > first_run && peers_->loaded_known && !peers_->diverged;
  }));
  EXPECT_EQ(peers_->loaded, (std::vector<std::string>{"10.0.0.1", "10.0.0.2"}));
  // A hand edit, loaded by a restart outside us: seen at the new run, the file put right and
  // the unit restarted onto it — once.
  const uint64_t second_run = health_->active_enter_usec;
  std::ofstream(root_ / "etc/nvidia-imex/nodes_config.cfg") << "10.0.0.1\n";
  EXPECT_EQ(bus_->ManagerCall("RestartUnit", kUnit), "");
  ASSERT_TRUE(h_.RunUntil([&] { return Map() == "10.0.0.1\n10.0.0.2\n" && peers_->restarts == 2; })) << Map();
  ASSERT_TRUE(h_.RunUntil([&] {
    return health_->active_enter_usec > second_run && peers_->loaded == std::vector<std::string>{"10.0.0.1", "10.0.0.2"} &&
           !peers_->diverged && !peers_->restart_pending;
  }));
  h_.Drain();
  EXPECT_EQ(peers_->restarts, 2u);
  EXPECT_EQ(peers_->writes, 1u);
}

TEST_F(ImexPeersModuleTest, WithoutTheDraModuleWhenIdleWaitsAndNeverNeverRestarts) {
  Start("whenIdle", false, 0);
  ASSERT_TRUE(h_.RunUntil([&] { return Map() == "10.0.0.1\n10.0.0.2\n"; })) << Map();
  ASSERT_TRUE(ConditionIs("True", "PreparedClaimsUnknown"));
  EXPECT_EQ(peers_->restarts, 0u);
}

TEST_F(ImexPeersModuleTest, PolicyNever) {
  Start("never", true, 0);
  ASSERT_TRUE(h_.RunUntil([&] { return Map() == "10.0.0.1\n10.0.0.2\n"; })) << Map();
  ASSERT_TRUE(ConditionIs("True", "RestartPolicyNever"));
  EXPECT_EQ(peers_->restarts, 0u);
}

// At start node-labels may not have put the clique label on our own Node yet (or is not
// enabled here): the clique's Nodes are then only the peers. This node is in its clique by
// NVML's word, so the map always has its own entry, from its own Node: the first map written
// is the whole clique, and the label arriving later changes nothing (no second write, no
// second restart).
TEST_F(ImexPeersModuleTest, TheMapAlwaysHoldsThisNodeEvenBeforeItsCliqueLabelIsOn) {
  ASSERT_EQ(server_
                ->Call("PATCH", "/api/v1/nodes/node1", R"({"metadata":{"labels":null}})",
                       "application/merge-patch+json")
                .status,
            200);
  std::vector<std::vector<std::string>> written;  // the map at each write
  auto record = h_.bus.Subscribe<ImexPeersState>([&](const ImexPeersState& s) {
    if (s.writes > written.size()) written.push_back(s.peers);
  });
  Start("always", true, 0);
  ASSERT_TRUE(h_.RunUntil([&] { return peers_ && peers_->restarts == 1 && !peers_->restart_pending; }));
  EXPECT_EQ(Map(), "10.0.0.1\n10.0.0.2\n");
  // node-labels puts the label on; then a new peer joins (its event comes after ours on the
  // same watch, so once it is in the map ours has been seen).
  ASSERT_EQ(server_
                ->Call("PATCH", "/api/v1/nodes/node1", R"({"metadata":{"labels":{"nvidia.com/gpu.clique":"c1"}}})",
                       "application/merge-patch+json")
                .status,
            200);
  server_->Seed(NodeObject("node3", "c1", "10.0.0.3"));
  ASSERT_TRUE(h_.RunUntil([&] { return peers_->restarts == 2 && !peers_->restart_pending; })) << Map();
  EXPECT_EQ(Map(), "10.0.0.1\n10.0.0.2\n10.0.0.3\n");
  h_.Drain();
  EXPECT_EQ(peers_->writes, 2u);  // one per change of the clique, none for the label
  EXPECT_EQ(peers_->restarts, 2u);
  for (const auto& map : written) {
    EXPECT_NE(std::find(map.begin(), map.end(), "10.0.0.1"), map.end()) << "a map without this node was written";
  }
}

// Without this node's own address nothing is written (a map without this node would be
// wrong), and the state says why; once the address is there, the map is.
TEST_F(ImexPeersModuleTest, NoMapIsWrittenUntilThisNodesOwnAddressIsKnown) {
  auto set_address = [&](const std::string& addresses) {
    return server_
        ->Call("PATCH", "/api/v1/nodes/node1/status", R"({"status":{"addresses":)" + addresses + "}}",
               "application/merge-patch+json")
        .status;
  };
  ASSERT_EQ(set_address("[]"), 200);
  Start("never", true, 0);
  ASSERT_TRUE(h_.RunUntil([&] {
    return peers_ && peers_->last_error.find("own Node node1 has no InternalIP address") != std::string::npos;
  })) << (peers_ ? peers_->last_error : "");
  EXPECT_EQ(peers_->writes, 0u);
  EXPECT_EQ(Map(), "10.0.0.1\n");  // as it was
  ASSERT_EQ(set_address(R"([{"type":"InternalIP","address":"10.0.0.1"}])"), 200);
  ASSERT_TRUE(h_.RunUntil([&] { return Map() == "10.0.0.1\n10.0.0.2\n" && peers_->writes == 1; })) << Map();
  EXPECT_EQ(peers_->last_error, "");
}

TEST_F(ImexPeersModuleTest, BadConfig) {
  for (const char* yaml : {"restartPolicy: sometimes\n", "nodesConfig: relative\n", "addressType: mac\n", "bogus: 1\n"}) {
    const auto value = ParseYaml(yaml, "site.yaml");
    ConfigMap section(value, "modules.imex-peers");
    EXPECT_THROW(
        {
          ImexPeersModule::ParseConfig(section, h_.site);
          section.Finish();
        },
        ConfigError)
        << yaml;
  }
  EXPECT_EQ(ImexPeersModule::Render({"10.0.0.2", "10.0.0.1", "10.0.0.2", ""}), "10.0.0.1\n10.0.0.2\n");
}

}  // namespace
}  // namespace gns::imex_peers
