// nvidia-imex-ctl's answers parsed and judged, and DomainCheck running the host-mode fake
// (tools/sim/systemd/host-nvidia-imex-ctl) as a real child process.
#include "preflight/domain_check.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace gns::imex_health {
namespace {

namespace fs = std::filesystem;

constexpr const char* kNodesOutput =
    "Connectivity Table Legend:\n"
    "C - Connected - Ready for operation\n"
    "\n"
    "3/25/2025 10:39:43.659\n"
    "Nodes:\n"
    "Node #0   - 10.136.206.48   - READY\n"
    "Node #1   - 10.136.206.49   - UNAVAILABLE\n"
    "\n"
    " Nodes From\\To  0\n"
    "       0        C\n"
    "Domain State: DOWN\n";

CommandResult Exited(int code, std::string out, std::string err = "") {
  CommandResult r;
  r.started = true;
  r.exited = true;
  r.exit_code = code;
  r.out = std::move(out);
  r.err = std::move(err);
  return r;
}

TEST(ImexCtlParse, QueryAndNodes) {
  EXPECT_EQ(ParseImexCtlQuery("\n  READY \n"), "READY");
  EXPECT_EQ(ParseImexCtlQuery(""), "");
  const auto nodes = ParseImexCtlNodes(kNodesOutput);
  EXPECT_TRUE(nodes.parsed);
  EXPECT_EQ(nodes.domain_state, "DOWN");
  ASSERT_EQ(nodes.nodes.size(), 2u);
  EXPECT_EQ(nodes.nodes[0].address, "10.136.206.48");
  EXPECT_EQ(nodes.nodes[0].state, "READY");
  EXPECT_EQ(nodes.nodes[1].state, "UNAVAILABLE");
  EXPECT_FALSE(ParseImexCtlNodes("garbage\nNode #x\n").parsed);
}

TEST(ImexCtlJudge, EveryOutcomeHasItsReason) {
  DomainCheckOptions o;
  o.command = "/usr/bin/nvidia-imex-ctl";
  o.config_file = "/etc/nvidia-imex/config.cfg";
  const auto ready = Exited(0, "READY\n");
  const auto up = Exited(0, "Nodes:\nNode #0 - 10.0.0.1 - READY\nDomain State: UP\n");
  auto r = JudgeDomain(o, ready, &up);
  EXPECT_TRUE(r.ready);
  EXPECT_EQ(r.state, "READY/UP");
  EXPECT_TRUE(JudgeDomain(o, ready, nullptr).ready);

  const auto down = Exited(0, kNodesOutput);
  r = JudgeDomain(o, ready, &down);
  EXPECT_FALSE(r.ready);
  EXPECT_EQ(r.reason, "DomainNotReady");
  EXPECT_NE(r.message.find("Domain State DOWN"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("10.136.206.49 UNAVAILABLE"), std::string::npos) << r.message;

  r = JudgeDomain(o, Exited(0, "UNAVAILABLE\n"), nullptr);
  EXPECT_EQ(r.reason, "DomainNotReady");
  EXPECT_NE(r.message.find("nvidia-imex-ctl -q -c /etc/nvidia-imex/config.cfg answered \"UNAVAILABLE\""),
            std::string::npos)
      << r.message;

  r = JudgeDomain(o, Exited(1, "", "connection refused\n"), nullptr);
  EXPECT_EQ(r.reason, "DomainNotReady");
  EXPECT_NE(r.message.find("\"connection refused\" (exit 1)"), std::string::npos) << r.message;

  CommandResult hung;
  hung.started = true;
  hung.timed_out = true;
  hung.elapsed = std::chrono::milliseconds(5000);
  r = JudgeDomain(o, hung, nullptr);
  EXPECT_EQ(r.reason, "DomainCheckTimeout");
  EXPECT_NE(r.message.find("no exit within 5000 ms"), std::string::npos) << r.message;

  CommandResult missing;
  missing.error = "cannot run /usr/bin/nvidia-imex-ctl: Permission denied";
  r = JudgeDomain(o, missing, nullptr);
  EXPECT_EQ(r.reason, "DomainCheckFailed");
  EXPECT_NE(r.message.find("Permission denied"), std::string::npos);

  r = JudgeDomain(o, ready, &missing);
  EXPECT_EQ(r.reason, "DomainCheckFailed");
  r = JudgeDomain(o, ready, &hung);
  EXPECT_EQ(r.reason, "DomainCheckTimeout");
  const auto nothing = Exited(0, "huh\n");
  r = JudgeDomain(o, ready, &nothing);
  EXPECT_EQ(r.reason, "DomainNotReady");
  EXPECT_NE(r.message.find("no Domain State"), std::string::npos);
}

class DomainCheckFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("GNS_SOURCE_DIR");
    if (!src) GTEST_SKIP() << "GNS_SOURCE_DIR not set";
    char tmpl[] = "/tmp/gnsctl-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    fs::create_directories(dir_ / "etc");
    std::ofstream(dir_ / "etc/config.cfg") << "IMEX_CMD_PORT=50005\n";
    std::ofstream(dir_ / "etc/nodes_config.cfg") << "10.0.0.1\n10.0.0.2\n";
    fs::copy_file(fs::path(src) / "tools/sim/systemd/host-nvidia-imex-ctl", dir_ / "nvidia-imex-ctl");
    options_.command = (dir_ / "nvidia-imex-ctl").string();
    options_.config_file = (dir_ / "etc/config.cfg").string();
    options_.timeout = std::chrono::milliseconds(500);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void State(const std::string& s) { std::ofstream(dir_ / "nvidia-imex-ctl.state") << s << "\n"; }
  DomainResult Check() {
    std::optional<DomainResult> result;
    auto check = DomainCheck::Start(h_.loop.Io(), options_, [&](DomainResult r) { result = std::move(r); });
    h_.RunUntil([&] { return result.has_value(); });
    return result.value_or(DomainResult{false, "NoAnswer", "", "", {}});
  }

  test::LoopHarness h_;
  fs::path dir_;
  DomainCheckOptions options_;
};

TEST_F(DomainCheckFakeTest, ReadyDownHungFailing) {
  auto r = Check();
  EXPECT_TRUE(r.ready) << r.message;
  EXPECT_EQ(r.state, "READY/UP");
  ASSERT_EQ(r.nodes.size(), 2u);
  EXPECT_EQ(r.nodes[1].address, "10.0.0.2");

  State("down");
  r = Check();
  EXPECT_EQ(r.reason, "DomainNotReady");
  EXPECT_NE(r.message.find("10.0.0.2 UNAVAILABLE"), std::string::npos) << r.message;

  State("hang");
  r = Check();
  EXPECT_EQ(r.reason, "DomainCheckTimeout") << r.message;

  State("fail 4");
  r = Check();
  EXPECT_EQ(r.reason, "DomainNotReady");
  EXPECT_NE(r.message.find("exit 4"), std::string::npos) << r.message;

  State("READY");
  const auto blocking = RunDomainCheckBlocking(options_);
  EXPECT_TRUE(blocking.ready) << blocking.message;
}

}  // namespace
}  // namespace gns::imex_health
