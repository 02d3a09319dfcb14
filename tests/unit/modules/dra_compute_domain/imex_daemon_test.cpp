// ImexDaemon against the fake nvidia-imex / nvidia-imex-ctl of tools/sim/imex: real child
// processes, real loopback sockets. Ready only once every peer of the map answers; a crash is
// restarted; a map change reaches the running daemon through SIGUSR1; Stop ends the process.
#include "modules/dra_compute_domain/child_process.hpp"
#include "modules/dra_compute_domain/imex_daemon.hpp"
#include "modules/dra_compute_domain/imex_domain.hpp"
#include "support/loop_harness.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace gns::dra {
namespace {

using std::chrono::milliseconds;

std::string Sim(const char* name) { return std::string(std::getenv("GNS_SOURCE_DIR")) + "/tools/sim/imex/" + name; }

std::shared_ptr<spdlog::logger> Logger() {
  if (std::getenv("GNS_TEST_LOG")) return spdlog::default_logger()->clone("imex-test");
  return std::make_shared<spdlog::logger>("imex-test", std::make_shared<spdlog::sinks::null_sink_mt>());
}

// A port the kernel just handed out on `ip` (free for the test's purposes).
uint16_t FreePort(const std::string& ip) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct FakeNode {
  std::string ip;
  std::string dir;
  std::string config;
  std::string map;
};

class ImexDaemonTest : public ::testing::Test {
 protected:
  // Both daemons share the ports (as on real nodes) on different loopback addresses.
  FakeNode Make(const std::string& name, const std::string& ip) {
    FakeNode node{ip, tmp_ / name, tmp_ / (name + "/config.cfg"), tmp_ / (name + "/nodes_config.cfg")};
    std::filesystem::create_directories(node.dir);
    ImexSettings s;
    s.bind_ip = ip;
    s.server_port = server_port_;
    s.cmd_port = cmd_port_;
    s.node_map_file = node.map;
    s.log_file = node.dir + "/imex.log";
    std::ofstream(node.config) << RenderImexConfig(s);
    return node;
  }
  void WriteMap(const FakeNode& node, const std::vector<std::string>& ips) {
    std::vector<DomainNode> peers;
    for (std::size_t i = 0; i < ips.size(); ++i) peers.push_back({"n" + std::to_string(i), ips[i], "c", int(i), ""});
    std::ofstream(node.map) << RenderNodeMap(peers, false);
  }
  std::unique_ptr<ImexDaemon> Daemon(const FakeNode& node, std::vector<bool>* changes = nullptr) {
    ImexDaemonSettings s;
    s.label = "team-a/" + node.ip;
    s.daemon_path = Sim("nvidia-imex");
    s.ctl_path = Sim("nvidia-imex-ctl");
    s.config_file = node.config;
    s.restart = BackoffPolicy{milliseconds(50), milliseconds(200), 2.0, 0.0};
    s.probe_interval = milliseconds(50);
    s.health_interval = milliseconds(200);
    s.stop_grace = milliseconds(2000);
    return std::make_unique<ImexDaemon>(h_.loop.Io(), Logger(), s, [changes](bool ready, const std::string&) {
      if (changes) changes->push_back(ready);
    });
  }
  void StopAll(std::initializer_list<ImexDaemon*> daemons) {
    for (auto* d : daemons) {
      bool stopped = false;
      d->Stop([&] { stopped = true; });
      ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
      EXPECT_FALSE(d->Running());
    }
  }

  test::TempDir tmp_;
  gns::test::LoopHarness h_;
  uint16_t server_port_ = FreePort("127.0.0.1");
  uint16_t cmd_port_ = FreePort("127.0.0.1");
};

TEST_F(ImexDaemonTest, ReadyOnlyWhenEveryPeerOfTheMapAnswers) {
  const auto a = Make("a", "127.0.61.1");
  const auto b = Make("b", "127.0.61.2");
  WriteMap(a, {a.ip, b.ip});
  WriteMap(b, {a.ip, b.ip});
  std::vector<bool> a_changes;
  auto da = Daemon(a, &a_changes);
  da->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return da->Running(); }));
  // Its peer is not up: the daemon says why, and is not ready.
  std::string answer;
  for (int i = 0; i < 100 && (answer.empty() || answer.starts_with("UNAVAILABLE")); ++i) {
    bool answered = false;
    RunCommand(h_.loop.Io(), ChildSpec{{Sim("nvidia-imex-ctl"), "-q", "-c", a.config}, {}, "", {}},
               milliseconds(5000), [&](ChildExit, std::string out) {
                 answer = out;
                 answered = true;
               });
    ASSERT_TRUE(h_.RunUntil([&] { return answered; }));
  }
  EXPECT_NE(answer.find("NOT_READY: unreachable 127.0.61.2"), std::string::npos) << answer;
  EXPECT_FALSE(da->Ready());

  auto db = Daemon(b);
  db->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return da->Ready() && db->Ready(); })) << da->LastExit() << " / " << db->LastExit();
  EXPECT_EQ(a_changes, std::vector<bool>{true});
  StopAll({da.get(), db.get()});
  EXPECT_EQ(a_changes, (std::vector<bool>{true, false}));
}

TEST_F(ImexDaemonTest, ACrashedDaemonIsRestartedAndBecomesReadyAgain) {
  const auto a = Make("a", "127.0.62.1");
  WriteMap(a, {a.ip});
  auto da = Daemon(a);
  da->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return da->Ready(); })) << da->LastExit();
  const int first_pid = da->Pid();
  bool asked = false;
  RunCommand(h_.loop.Io(), ChildSpec{{Sim("nvidia-imex-ctl"), "--crash", "-c", a.config}, {}, "", {}},
             milliseconds(5000), [&](ChildExit, std::string) { asked = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return asked && da->Exits() == 1; }));
  EXPECT_EQ(da->LastExit(), "exited with status 134");
  ASSERT_TRUE(h_.RunUntil([&] { return da->Starts() == 2 && da->Ready(); }));
  EXPECT_NE(da->Pid(), first_pid);
  StopAll({da.get()});
  EXPECT_EQ(da->LastExit(), "exited with status 0");  // SIGTERM handled: a clean stop
}

TEST_F(ImexDaemonTest, AMapChangeReachesTheRunningDaemonThroughSigusr1) {
  const auto a = Make("a", "127.0.63.1");
  const auto b = Make("b", "127.0.63.2");
  WriteMap(a, {a.ip});
  auto da = Daemon(a);
  da->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return da->Ready(); }));
  // A peer joins the map but is not up yet: the reload makes the daemon not ready.
  WriteMap(a, {a.ip, b.ip});
  da->Reload();
  ASSERT_TRUE(h_.RunUntil([&] { return !da->Ready(); }));
  EXPECT_EQ(da->Starts(), 1u);  // reloaded, not restarted
  WriteMap(b, {a.ip, b.ip});
  auto db = Daemon(b);
  db->Start();
  ASSERT_TRUE(h_.RunUntil([&] { return da->Ready() && db->Ready(); }));
  StopAll({da.get(), db.get()});
}

TEST_F(ImexDaemonTest, AMissingBinaryIsReportedAndRetried) {
  const auto a = Make("a", "127.0.64.1");
  ImexDaemonSettings s;
  s.label = "team-a/missing";
  s.daemon_path = tmp_ / "no-such-imex";
  s.ctl_path = Sim("nvidia-imex-ctl");
  s.config_file = a.config;
  s.restart = BackoffPolicy{milliseconds(20), milliseconds(40), 2.0, 0.0};
  ImexDaemon d(h_.loop.Io(), Logger(), s, nullptr);
  d.Start();
  ASSERT_TRUE(h_.RunUntil([&] { return d.Exits() >= 3; }));
  EXPECT_NE(d.LastExit().find("cannot execute " + s.daemon_path + ": No such file or directory"), std::string::npos)
      << d.LastExit();
  bool stopped = false;
  d.Stop([&] { stopped = true; });
  EXPECT_TRUE(stopped);
}

TEST(ChildProcessTest, RunCommandCollectsOutputAndKillsAtTheDeadline) {
  gns::test::LoopHarness h;
  bool done = false;
  ChildExit exit;
  std::string output;
  RunCommand(h.loop.Io(), ChildSpec{{"/bin/sh", "-c", "echo one; echo two >&2; exit 3"}, {}, "", {}},
             milliseconds(5000), [&](ChildExit e, std::string out) {
               exit = e;
               output = out;
               done = true;
             });
  ASSERT_TRUE(h.RunUntil([&] { return done; }));
  EXPECT_EQ(exit.code, 3);
  EXPECT_EQ(output, "one\ntwo\n");
  done = false;
  RunCommand(h.loop.Io(), ChildSpec{{"/bin/sleep", "30"}, {}, "", {}}, milliseconds(100),
             [&](ChildExit e, std::string) {
               exit = e;
               done = true;
             });
  ASSERT_TRUE(h.RunUntil([&] { return done; }));
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.code, 128 + SIGKILL);
}

}  // namespace
}  // namespace gns::dra
