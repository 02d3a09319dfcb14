// ImexDaemon against the fake nvidia-imex / nvidia-imex-ctl of tools/sim/imex: real child
// processes, real loopback sockets. Ready only once every peer of the map answers; a crash is
// restarted; a map change reaches the running daemon through SIGUSR1; Stop ends the process.
#include "modules/dra_compute_domain/child_process.hpp"
#include "modules/dra_compute_domain/imex_daemon.hpp"
#include "modules/dra_compute_domain/imex_domain.hpp"
#include "support/held_port.hpp"
#include "support/loop_harness.hpp"
#include "support/temp_dir.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gns::dra {
namespace {

using std::chrono::milliseconds;

std::string Sim(const char* name) { return std::string(std::getenv("GNS_SOURCE_DIR")) + "/tools/sim/imex/" + name; }

// True once `pid` is gone for good: reaped (no such process), or a zombie that is not ours
// (a killed grandchild, reparented to a reaper of the machine's that may be slow).
bool Ended(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}
// Our own child is reaped: no zombie of it is left (kill(2) still finds a zombie).
bool Reaped(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// A daemon that ignores SIGTERM and keeps a helper process holding its output pipe (as a
// wrapper script or a daemon with a helper does): only a SIGKILL of its group ends it all.
std::string WriteStubbornDaemon(const std::string& dir) {
  const std::string path = dir + "/stubborn-imex";
  std::ofstream(path) << "#!/bin/sh\n"
                         "trap '' TERM\n"
                         "sleep 1000 &\n"
                         "echo \"stubborn daemon $$ helper $!\"\n"
                         "while :; do sleep 1; done\n";
  ::chmod(path.c_str(), 0755);
  return path;
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
    return std::make_unique<ImexDaemon>(h_.loop.Io(), gns::test::QuietLogger("imex-test"), s,
                                        [changes](bool ready, const std::string&) {
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

  gns::test::TempDir tmp_;
  gns::test::LoopHarness h_;
  // Held for the whole test, on every address: the daemons bind them with SO_REUSEPORT.
  gns::test::HeldPort server_port_held_;
  gns::test::HeldPort cmd_port_held_;
  uint16_t server_port_ = server_port_held_.Port();
  uint16_t cmd_port_ = cmd_port_held_.Port();
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
  ImexDaemon d(h_.loop.Io(), gns::test::QuietLogger("imex-test"), s, nullptr);
  d.Start();
  ASSERT_TRUE(h_.RunUntil([&] { return d.Exits() >= 3; }));
  EXPECT_NE(d.LastExit().find("cannot execute " + s.daemon_path + ": No such file or directory"), std::string::npos)
      << d.LastExit();
  bool stopped = false;
  d.Stop([&] { stopped = true; });
  EXPECT_TRUE(stopped);
}

// Issue #23 item 4: every child is reaped and its exit delivered, whatever state it is in when
// it ends or is killed. Before: the exit waited for the output pipe's end of file, so a child
// whose helper kept the pipe open was never reported (its Stop never finished).
TEST(ChildProcessTest, EveryChildIsReapedAndReportedWhateverStateItIsKilledIn) {
  gns::test::LoopHarness h;
  struct Run {
    std::vector<std::string> lines;
    bool exited = false;
    ChildExit exit;
  };
  const auto start = [&h](std::vector<std::string> argv, Run& run) {
    return std::make_unique<ChildProcess>(
        h.loop.Io(), ChildSpec{std::move(argv), {}, "", {}},
        [&run](const std::string& line) { run.lines.push_back(line); },
        [&run](ChildExit e) {
          run.exit = e;
          run.exited = true;
        });
  };
  const auto finished = [&h](Run& run, ChildProcess& child) {
    return h.RunUntil([&] { return run.exited; }) && !child.Running() && Reaped(child.Pid());
  };

  {  // Ends by itself: its status and every line it wrote, the last one without a newline.
    Run run;
    auto child = start({"/bin/sh", "-c", "echo one; printf two; exit 7"}, run);
    ASSERT_TRUE(finished(run, *child));
    EXPECT_EQ(run.exit.code, 7);
    EXPECT_FALSE(run.exit.signaled);
    EXPECT_EQ(run.lines, (std::vector<std::string>{"one", "two"}));
  }
  {  // Ends while a helper it started still holds the output pipe: reported all the same.
    Run run;
    auto child = start({"/bin/sh", "-c", "sleep 1000 & echo helper $!; exit 3"}, run);
    ASSERT_TRUE(finished(run, *child)) << "the exit waited for the helper's pipe";
    EXPECT_EQ(run.exit.code, 3);
    ASSERT_EQ(run.lines.size(), 1u);
    const pid_t helper = std::stoi(run.lines[0].substr(7));
    ::kill(helper, SIGKILL);
    EXPECT_TRUE(h.RunUntil([&] { return Ended(helper); }));
  }
  {  // Ended, not yet seen by the loop (a zombie), then signalled: its own exit is reported.
    Run run;
    auto child = start({"/bin/sh", "-c", "exit 5"}, run);
    siginfo_t info{};
    ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child->Pid()), &info, WEXITED | WNOWAIT), 0);  // no reap
    EXPECT_TRUE(child->Signal(SIGKILL));  // a zombie can be signalled; nothing changes
    ASSERT_TRUE(finished(run, *child));
    EXPECT_EQ(run.exit.code, 5);
  }
  {  // Killed at once, before it did anything.
    Run run;
    auto child = start({"/bin/sleep", "1000"}, run);
    EXPECT_TRUE(child->Signal(SIGKILL));
    ASSERT_TRUE(finished(run, *child));
    EXPECT_TRUE(run.exit.signaled);
    EXPECT_EQ(run.exit.code, 128 + SIGKILL);
  }
  {  // Ignores SIGTERM, with a helper: SIGTERM changes nothing, a SIGKILL of its group ends both.
    Run run;
    auto child = start({"/bin/sh", "-c", "trap '' TERM; sleep 1000 & echo helper $!; wait"}, run);
    ASSERT_TRUE(h.RunUntil([&] { return !run.lines.empty(); }));
    const pid_t helper = std::stoi(run.lines[0].substr(7));
    EXPECT_TRUE(child->Signal(SIGTERM));
    EXPECT_TRUE(child->Running());
    EXPECT_TRUE(child->SignalGroup(SIGKILL));
    ASSERT_TRUE(finished(run, *child));
    EXPECT_EQ(run.exit.code, 128 + SIGKILL);
    EXPECT_TRUE(h.RunUntil([&] { return Ended(helper); }));
    EXPECT_FALSE(child->Signal(SIGTERM));  // reaped: its pid is no longer ours to signal
  }
  {  // Stopped (SIGSTOP), then killed.
    Run run;
    auto child = start({"/bin/sh", "-c", "echo ready; exec sleep 1000"}, run);
    ASSERT_TRUE(h.RunUntil([&] { return !run.lines.empty(); }));
    EXPECT_TRUE(child->Signal(SIGSTOP));
    siginfo_t info{};
    ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child->Pid()), &info, WSTOPPED | WNOWAIT), 0);
    EXPECT_TRUE(child->Signal(SIGTERM));  // pending while stopped
    EXPECT_TRUE(child->Signal(SIGKILL));
    ASSERT_TRUE(finished(run, *child));
    EXPECT_TRUE(run.exit.signaled);
  }
  {  // Destroyed while running (with a helper): no callback, both killed, the child reaped on
     // the loop — no zombie, and the loop never blocked on it.
    Run run;
    auto child = start({"/bin/sh", "-c", "sleep 1000 & echo helper $!; wait"}, run);
    ASSERT_TRUE(h.RunUntil([&] { return !run.lines.empty(); }));
    const pid_t pid = child->Pid();
    const pid_t helper = std::stoi(run.lines[0].substr(7));
    child.reset();
    EXPECT_TRUE(h.RunUntil([&] { return Reaped(pid) && Ended(helper); }));
    EXPECT_FALSE(run.exited);
  }
}

// Issue #23 item 4, the daemon side: many daemons stopped at once on one loop that is busy
// probing them (as in driver_managed_bench at 32 nodes), half of them ignoring SIGTERM with a
// helper holding their pipe: every Stop completes, every daemon is reaped, no helper is left.
TEST_F(ImexDaemonTest, EveryStopCompletesUnderLoadEvenForDaemonsThatIgnoreSigterm) {
  constexpr int kDaemons = 12;
  const std::string stubborn = WriteStubbornDaemon(tmp_.Path());
  std::vector<std::unique_ptr<ImexDaemon>> daemons;
  for (int i = 0; i < kDaemons; ++i) {
    const auto node = Make("n" + std::to_string(i), "127.0.65." + std::to_string(i + 1));
    WriteMap(node, {node.ip});
    ImexDaemonSettings s;
    s.label = "team-a/" + node.ip;
    s.daemon_path = i % 2 == 0 ? Sim("nvidia-imex") : stubborn;
    s.ctl_path = Sim("nvidia-imex-ctl");
    s.config_file = node.config;
    s.restart = BackoffPolicy{milliseconds(50), milliseconds(200), 2.0, 0.0};
    s.probe_interval = milliseconds(50);  // the loop forks a probe per daemon every 50 ms
    s.health_interval = milliseconds(50);
    // Short: under load the fake daemon's own exit on SIGTERM and the SIGKILL at the grace's
    // end race (both orders must end the Stop).
    s.stop_grace = milliseconds(300);
    daemons.push_back(std::make_unique<ImexDaemon>(h_.loop.Io(), gns::test::QuietLogger("imex-test"), s, nullptr));
    daemons.back()->Start();
  }
  ASSERT_TRUE(h_.RunUntil([&] {
    for (int i = 0; i < kDaemons; i += 2) {
      if (!daemons[i]->Ready()) return false;
    }
    return true;
  }, std::chrono::seconds(60)));
  std::vector<pid_t> pids;
  for (const auto& d : daemons) pids.push_back(d->Pid());
  int stopped = 0;
  for (auto& d : daemons) d->Stop([&] { ++stopped; });
  // A second Stop of one daemon waits for the same exit.
  daemons[1]->Stop([&] { ++stopped; });
  ASSERT_TRUE(h_.RunUntil([&] { return stopped == kDaemons + 1; }, std::chrono::seconds(60)))
      << stopped << " of " << kDaemons + 1 << " stops completed";
  for (int i = 0; i < kDaemons; ++i) {
    EXPECT_FALSE(daemons[i]->Running()) << i;
    EXPECT_TRUE(Reaped(pids[i])) << "daemon " << i << " (pid " << pids[i] << ") left unreaped";
    if (i % 2 == 1) {
      EXPECT_EQ(daemons[i]->LastExit(), "killed by signal 9") << i;
    }
  }
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
