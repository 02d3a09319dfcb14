// The host IMEX checks on their own: /proc/devices, the IMEX config, the node-map rules of
// seed 000 §3.2, and a scan of real files under a host root.
#include "preflight/host_checks.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sys/stat.h>

namespace gns::imex_health {
namespace {

namespace fs = std::filesystem;

constexpr const char* kProcDevices =
    "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps-imex-channels\n\nBlock devices:\n  8 sd\n";

TEST(HostChecks, ChannelMajor) {
  EXPECT_EQ(FindChannelMajor(kProcDevices, "/proc/devices").major, 234u);
  const auto missing = FindChannelMajor("Character devices:\n195 nvidia\n", "/proc/devices");
  EXPECT_FALSE(missing.major);
  EXPECT_NE(missing.error.find("not registered"), std::string::npos) << missing.error;
  // Only the character section counts.
  EXPECT_FALSE(FindChannelMajor("Block devices:\n234 nvidia-caps-imex-channels\n", "x").major);
  const auto bad = FindChannelMajor("Character devices:\n23x nvidia-caps-imex-channels\n", "/proc/devices");
  EXPECT_FALSE(bad.major);
  EXPECT_NE(bad.error.find("malformed"), std::string::npos) << bad.error;
}

TEST(HostChecks, ImexConfig) {
  const auto good = ParseImexConfig(
      "# comment\nDAEMONIZE=0\nIMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\nIMEX_CMD_PORT=50005\n", "c.cfg");
  EXPECT_TRUE(good.errors.empty());
  EXPECT_EQ(good.keys.at("IMEX_CMD_PORT"), "50005");
  const auto bad = ParseImexConfig("IMEX_CMD_PORT=99999\nnot a line\nDAEMONIZE=0\nDAEMONIZE=1\nIMEX_NODE_CONFIG_FILE=rel\n",
                                   "c.cfg");
  ASSERT_EQ(bad.errors.size(), 4u);
  EXPECT_NE(bad.errors[0].find("c.cfg:1: IMEX_CMD_PORT"), std::string::npos) << bad.errors[0];
  EXPECT_NE(bad.errors[1].find("c.cfg:2: not KEY=VALUE"), std::string::npos) << bad.errors[1];
  EXPECT_NE(bad.errors[2].find("set twice"), std::string::npos) << bad.errors[2];
  EXPECT_NE(bad.errors[3].find("absolute"), std::string::npos) << bad.errors[3];
}

TEST(HostChecks, NodesConfigRules) {
  const std::vector<std::string> self{"10.0.0.1"};
  const auto good = ParseNodesConfig("10.0.0.1\n10.0.0.2\nfd00::3\nnode-4.example", "n.cfg", self);
  EXPECT_TRUE(good.errors.empty()) << good.errors.front();
  EXPECT_EQ(good.peers.size(), 4u);
  EXPECT_TRUE(good.self_present);
  const auto bad = ParseNodesConfig("10.0.0.1\n# rack a\n\n10.0.0.2 10.0.0.3\n10.0.0.1\nbad_name!", "n.cfg", self);
  ASSERT_EQ(bad.errors.size(), 5u);
  EXPECT_NE(bad.errors[0].find("n.cfg:2: comment line"), std::string::npos);
  EXPECT_NE(bad.errors[1].find("n.cfg:3: blank line"), std::string::npos);
  EXPECT_NE(bad.errors[2].find("n.cfg:4: more than one entry"), std::string::npos);
  EXPECT_NE(bad.errors[3].find("n.cfg:5: duplicate peer 10.0.0.1"), std::string::npos);
  EXPECT_NE(bad.errors[4].find("n.cfg:6: not an IP address or a DNS name"), std::string::npos);
  const auto without_self = ParseNodesConfig("10.0.0.2\n", "n.cfg", self);
  ASSERT_EQ(without_self.errors.size(), 1u);
  EXPECT_NE(without_self.errors[0].find("this node (10.0.0.1) is not in the map"), std::string::npos);
  // Self unknown: not checked, not failed.
  EXPECT_TRUE(ParseNodesConfig("10.0.0.2\n", "n.cfg", {}).errors.empty());
  EXPECT_FALSE(ParseNodesConfig("", "n.cfg", {}).errors.empty());
}

TEST(HostChecks, ResolvePeers) {
  const auto bad = ResolvePeers({"10.0.0.9", "localhost", "no-such-host.invalid"});
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].rfind("no-such-host.invalid: ", 0), 0u) << bad[0];
}

TEST(HostChecks, ScanOfRealFiles) {
  char tmpl[] = "/tmp/gnsimex-XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  fs::create_directories(root / "proc");
  fs::create_directories(root / "etc/nvidia-imex");
  std::ofstream(root / "proc/devices") << kProcDevices;
  // The second name of guide §3.3, pointing at a node map elsewhere.
  std::ofstream(root / "etc/nvidia-imex/imexd.cfg") << "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/peers.cfg\n";
  std::ofstream(root / "etc/nvidia-imex/peers.cfg") << "10.0.0.1\n10.0.0.2\n";
  HostPaths paths;
  paths.host_root = root.string();
  auto scan = ScanHost(paths, {"10.0.0.1"}, true);
  EXPECT_EQ(scan.major.major, 234u);
  EXPECT_EQ(scan.config_path, (root / "etc/nvidia-imex/imexd.cfg").string());
  EXPECT_EQ(scan.nodes_config_path, (root / "etc/nvidia-imex/peers.cfg").string());
  EXPECT_TRUE(scan.nodes.errors.empty());
  EXPECT_TRUE(scan.nodes_config_mtime_known);
  EXPECT_FALSE(scan.channel0_present);
  auto checks = FileChecks(scan);
  ASSERT_GE(checks.size(), 4u);
  EXPECT_EQ(checks[0].status, CheckStatus::kPass);
  EXPECT_EQ(checks[1].name, "channel0");
  EXPECT_EQ(checks[1].status, CheckStatus::kWarn);  // §13: major registered → warning
  EXPECT_NE(checks[1].fix.find("mknod"), std::string::npos);
  // Without the major, the missing channel0 is a failure too.
  std::ofstream(root / "proc/devices") << "Character devices:\n195 nvidia\n";
  scan = ScanHost(paths, {"10.0.0.1"}, false);
  checks = FileChecks(scan);
  EXPECT_EQ(checks[0].status, CheckStatus::kFail);
  EXPECT_EQ(checks[1].status, CheckStatus::kFail);
  fs::remove(root / "etc/nvidia-imex/imexd.cfg");
  scan = ScanHost(paths, {}, false);
  EXPECT_NE(scan.config_error.find("no IMEX config"), std::string::npos) << scan.config_error;
  fs::remove_all(root);
}

}  // namespace
}  // namespace gns::imex_health
