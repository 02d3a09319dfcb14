// Driver-managed IMEX, the pure parts: status.nodes parsing, registration with stable indices,
// the domain's clique, the node map / hosts / config rendering, and the domain record file.
#include "modules/dra_compute_domain/domain_record.hpp"
#include "modules/dra_compute_domain/imex_domain.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>

namespace gns::dra {
namespace {

using nlohmann::json;

DomainNode Node(std::string name, std::string ip, std::string clique, int index = 0, std::string status = "") {
  return DomainNode{std::move(name), std::move(ip), std::move(clique), index, std::move(status)};
}

TEST(ImexDomainTest, CliqueObjectsAreUpstreamShaped) {
  // "<domainUID>.<cliqueID>", lower-case (a DNS subdomain).
  EXPECT_EQ(CliqueObjectName("6f1c-uid", "5B0E9C3A-1D2F.1"), "6f1c-uid.5b0e9c3a-1d2f.1");
  const json meta = CliqueObjectMeta("team-a", "train", "6f1c-uid", "5b0e.1");
  EXPECT_EQ(meta["name"], "6f1c-uid.5b0e.1");
  EXPECT_EQ(meta["namespace"], "team-a");
  EXPECT_EQ(meta["labels"], json({{"resource.nvidia.com/computeDomain", "6f1c-uid"},
                                  {"resource.nvidia.com/computeDomain.cliqueID", "5b0e.1"}}));
  EXPECT_EQ(meta["ownerReferences"], json::array({{{"apiVersion", "resource.nvidia.com/v1beta1"},
                                                   {"kind", "ComputeDomain"},
                                                   {"name", "train"},
                                                   {"uid", "6f1c-uid"}}}));
  // daemons: the status.nodes fields with nodeName for name, both ways.
  const std::vector<DomainNode> nodes = {Node("n1", "10.0.0.1", "c.1", 0, "Ready"), Node("n2", "10.0.0.2", "c.1", 1)};
  const json daemons = DaemonsToJson(nodes);
  EXPECT_EQ(daemons[0], json({{"nodeName", "n1"}, {"ipAddress", "10.0.0.1"}, {"cliqueID", "c.1"}, {"index", 0},
                              {"status", "Ready"}}));
  const auto parsed = ParseCliqueDaemons(json{{"daemons", daemons}});
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  EXPECT_EQ(parsed.nodes, nodes);
  EXPECT_EQ(ParseCliqueDaemons(json{{"daemons", json::array({{{"ipAddress", "x"}}})}}).error,
            "daemons[0].nodeName: missing");
  EXPECT_TRUE(ParseCliqueDaemons(json::object()).nodes.empty());
}

TEST(ImexDomainTest, ParsesUpstreamShapedStatusNodes) {
  const json domain = json::parse(R"({"status":{"status":"NotReady","nodes":[
      {"name":"n1","ipAddress":"10.0.0.1","cliqueID":"c.1","index":0,"status":"Ready"},
      {"name":"n2","ipAddress":"10.0.0.2","cliqueID":"c.1","index":1}]}})");
  const auto parsed = ParseDomainNodes(domain);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  ASSERT_EQ(parsed.nodes.size(), 2u);
  EXPECT_EQ(parsed.nodes[0], Node("n1", "10.0.0.1", "c.1", 0, "Ready"));
  EXPECT_TRUE(parsed.nodes[0].Ready());
  EXPECT_FALSE(parsed.nodes[1].Ready());
  EXPECT_EQ(NodesToJson(parsed.nodes), domain["status"]["nodes"]);
  EXPECT_TRUE(ParseDomainNodes(json::object()).nodes.empty());
}

TEST(ImexDomainTest, BadStatusNodesAreNamedPrecisely) {
  EXPECT_EQ(ParseDomainNodes(json::parse(R"({"status":{"nodes":{}}})")).error,
            "status.nodes: expected an array, got object");
  EXPECT_EQ(ParseDomainNodes(json::parse(R"({"status":{"nodes":[{"name":"a"},{"ipAddress":"x"}]}})")).error,
            "status.nodes[1].name: missing");
  EXPECT_EQ(ParseDomainNodes(json::parse(R"({"status":{"nodes":[{"name":"a","index":"3"}]}})")).error,
            "status.nodes[0].index: expected a non-negative integer, got \"3\"");
  EXPECT_EQ(ParseDomainNodes(json::parse(R"({"status":{"nodes":[{"name":"a","cliqueID":7}]}})")).error,
            "status.nodes[0].cliqueID: expected a string, got number");
}

TEST(ImexDomainTest, RegistrationGivesTheLowestFreeIndexOfTheCliqueAndKeepsIt) {
  std::vector<DomainNode> nodes{Node("a", "1.1.1.1", "c.1", 0), Node("b", "1.1.1.2", "c.1", 2),
                                Node("x", "2.2.2.2", "c.2", 0)};
  auto reg = RegisterNode(nodes, Node("c", "1.1.1.3", "c.1"));
  EXPECT_TRUE(reg.changed);
  EXPECT_EQ(reg.me.index, 1);  // the hole left by a departed node
  ASSERT_EQ(reg.nodes.size(), 4u);
  EXPECT_EQ(reg.nodes.back().name, "c");

  // Again with a new IP and status: same index (stable), changed entry in place.
  auto again = RegisterNode(reg.nodes, Node("c", "1.1.1.9", "c.1", 0, "Ready"));
  EXPECT_TRUE(again.changed);
  EXPECT_EQ(again.me.index, 1);
  EXPECT_EQ(again.nodes.size(), 4u);
  EXPECT_EQ(FindNode(again.nodes, "c")->ip_address, "1.1.1.9");
  // Nothing new: no write needed.
  EXPECT_FALSE(RegisterNode(again.nodes, Node("c", "1.1.1.9", "c.1", 5, "Ready")).changed);
  // Indices are per clique.
  EXPECT_EQ(RegisterNode(nodes, Node("y", "2.2.2.3", "c.2")).me.index, 1);
}

// Nodes that register at once each take the lowest index free in what they read: duplicates.
// Every reader resolves them the same way, in list order (registration order), and a node
// whose entry differs from its resolved index writes that one.
TEST(ImexDomainTest, ConcurrentRegistrationsResolveDuplicateIndicesInListOrder) {
  // Four nodes read an empty list and all took 0; then x (another clique) and e (which read
  // a, b with 0 and 1 after b had moved) joined.
  const std::vector<DomainNode> nodes{Node("a", "1", "c.1", 0), Node("b", "2", "c.1", 0), Node("c", "3", "c.1", 0),
                                      Node("x", "9", "c.2", 0), Node("d", "4", "c.1", 0), Node("e", "5", "c.1", 1)};
  const auto resolved = ResolveIndices(nodes);
  std::vector<int> indices;
  for (const auto& n : resolved) indices.push_back(n.index);
  // a keeps 0, e keeps 1 (the first holder of 1), b, c, d take 2, 3, 4; x's clique is its own.
  EXPECT_EQ(indices, (std::vector<int>{0, 2, 3, 0, 4, 1}));
  // What each node writes: its resolved index; once written, the list resolves to itself.
  std::vector<DomainNode> written = nodes;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto me = nodes[i];
    const auto reg = RegisterNode(nodes, me);
    EXPECT_EQ(reg.me.index, resolved[i].index) << me.name;
    EXPECT_EQ(reg.changed, resolved[i].index != nodes[i].index) << me.name;
    written[i] = reg.me;
  }
  EXPECT_EQ(ResolveIndices(written), written);
  // The map already agrees before the rewrites: unique names, by index.
  EXPECT_EQ(RenderNodeMap(CliquePeers(nodes, "c.1"), false), "1\n5\n2\n3\n4\n");
  // A newcomer takes the lowest index free after resolution, not a duplicate's old one.
  EXPECT_EQ(RegisterNode(nodes, Node("f", "6", "c.1")).me.index, 5);
}

TEST(ImexDomainTest, EachNodeHasItsOwnFieldManagerWithinTheApiServersLimit) {
  EXPECT_EQ(EntryFieldManager("node-a"), "gpu-node-supervisor/node-a");
  const std::string long_a(200, 'a');
  const std::string long_b = std::string(199, 'a') + "b";
  EXPECT_EQ(EntryFieldManager(long_a).size(), 128u);
  EXPECT_NE(EntryFieldManager(long_a), EntryFieldManager(long_b));
}

TEST(ImexDomainTest, TheDomainCliqueIsTheFirstRegisteredNodesAndMapsHoldOnlyItsPeers) {
  std::vector<DomainNode> nodes{Node("b", "1.1.1.2", "c.1", 1), Node("x", "2.2.2.2", "c.2", 0),
                                Node("a", "1.1.1.1", "c.1", 0)};
  EXPECT_EQ(DomainClique(nodes), "c.1");
  EXPECT_EQ(DomainClique({}), "");
  const auto peers = CliquePeers(nodes, "c.1");
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(RenderNodeMap(peers, false), "1.1.1.1\n1.1.1.2\n");
  EXPECT_EQ(RenderNodeMap(peers, true), "compute-domain-daemon-0\ncompute-domain-daemon-1\n");
  const std::string hosts = RenderHostsFile(peers);
  EXPECT_NE(hosts.find("1.1.1.1\tcompute-domain-daemon-0\n1.1.1.2\tcompute-domain-daemon-1\n"), std::string::npos);
  // An IP change rewrites the hosts file but not a DNS-name map.
  auto moved = peers;
  moved[1].ip_address = "1.1.1.7";
  EXPECT_EQ(RenderNodeMap(moved, true), RenderNodeMap(peers, true));
  EXPECT_NE(RenderHostsFile(moved), hosts);
}

TEST(ImexDomainTest, ConfigNamesTheDomainsOwnMapPortsAndAddress) {
  ImexSettings s;
  s.bind_ip = "10.1.2.3";
  s.server_port = 51000;
  s.cmd_port = 51005;
  s.node_map_file = "/state/domains/u/nodes_config.cfg";
  s.log_file = "/state/domains/u/nvidia-imex.log";
  const std::string config = RenderImexConfig(s);
  for (const char* line : {"BIND_INTERFACE_IP=10.1.2.3\n", "SERVER_PORT=51000\n", "IMEX_CMD_PORT=51005\n",
                           "IMEX_CMD_BIND_INTERFACE_IP=10.1.2.3\n", "DAEMONIZE=0\n",
                           "IMEX_NODE_CONFIG_FILE=/state/domains/u/nodes_config.cfg\n",
                           "LOG_FILE_NAME=/state/domains/u/nvidia-imex.log\n"}) {
    EXPECT_NE(config.find(line), std::string::npos) << line;
  }
}

TEST(DomainRecordTest, RoundTripsAndRejectsWhatIsNotOurs) {
  DomainRecord record;
  record.domains["d-1"] = RecordedDomain{"team-a", "train", {{"c-1", {"team-a", "pod-0-channel"}}}};
  record.domains["d-2"] = RecordedDomain{"team-b", "leaving", {}};
  DomainRecord back;
  std::string error;
  ASSERT_TRUE(ParseDomainRecord(SerializeDomainRecord(record), back, error)) << error;
  EXPECT_EQ(back, record);

  EXPECT_FALSE(ParseDomainRecord("{", back, error));
  EXPECT_EQ(error, "not a JSON object");
  EXPECT_FALSE(ParseDomainRecord(R"({"version":2,"domains":{}})", back, error));
  EXPECT_EQ(error, "version: expected 1, got 2");
  EXPECT_FALSE(ParseDomainRecord(R"({"version":1,"domains":{"d":{"namespace":"n","name":"x","claims":{"c":{}}}}})",
                                 back, error));
  EXPECT_EQ(error, "domains.d.claims.c.namespace: expected a non-empty string");

  gns::test::TempDir dir;
  const std::string path = dir / "domains.json";
  EXPECT_EQ(LoadDomainRecord(path).status, RecordLoad::kMissing);
  ASSERT_TRUE(SaveDomainRecord(path, record));
  const auto loaded = LoadDomainRecord(path);
  ASSERT_EQ(loaded.status, RecordLoad::kLoaded) << loaded.error;
  EXPECT_EQ(loaded.record, record);
  std::ofstream(path) << "{\"version\":1";  // a torn write cannot happen (atomic), a hand edit can
  const auto corrupt = LoadDomainRecord(path);
  EXPECT_EQ(corrupt.status, RecordLoad::kCorrupt);
  EXPECT_NE(corrupt.error.find(path), std::string::npos);
}

}  // namespace
}  // namespace gns::dra
