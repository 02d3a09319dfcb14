// loop/run_command: real child processes (/bin/sh) on the loop: exit status, output, deadline,
// a grandchild keeping the pipes open, spawn failures, cancellation.
#include "loop/run_command.hpp"
#include "support/loop_harness.hpp"

#include <boost/asio/steady_timer.hpp>
#include <gtest/gtest.h>

#include <signal.h>

#include <optional>

namespace gns {
namespace {

CommandSpec Sh(const std::string& script, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.timeout = timeout;
  return spec;
}

class RunCommandTest : public ::testing::Test {
 protected:
  std::optional<CommandResult> Run(CommandSpec spec) {
    std::optional<CommandResult> result;
    RunCommand(h_.loop.Io(), std::move(spec), [&](CommandResult r) { result = std::move(r); });
    h_.RunUntil([&] { return result.has_value(); });
    return result;
  }
  test::LoopHarness h_;
};

TEST_F(RunCommandTest, ExitStatusAndBothStreams) {
  const auto r = Run(Sh("echo READY; echo oops >&2; exit 3"));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->started);
  EXPECT_TRUE(r->exited);
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_FALSE(r->Ok());
  EXPECT_EQ(r->out, "READY\n");
  EXPECT_EQ(r->err, "oops\n");
  EXPECT_EQ(r->Describe(), "exit 3");
  const auto ok = Run(Sh("printf 'a\\nb'"));
  ASSERT_TRUE(ok);
  EXPECT_TRUE(ok->Ok());
  EXPECT_EQ(ok->out, "a\nb");
}

TEST_F(RunCommandTest, TheChildGetsOnlyTheEnvironmentItIsGiven) {
  ::setenv("GNS_SECRET_FOR_TEST", "x", 1);
  const auto r = Run(Sh("echo \"[${GNS_SECRET_FOR_TEST:-}] $LC_ALL\""));
  ::unsetenv("GNS_SECRET_FOR_TEST");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->out, "[] C\n");
}

TEST_F(RunCommandTest, KilledBySignal) {
  const auto r = Run(Sh("kill -TERM $$"));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->exited);
  EXPECT_EQ(r->term_signal, SIGTERM);
  EXPECT_FALSE(r->Ok());
  EXPECT_EQ(r->Describe(), "killed by signal 15");
}

TEST_F(RunCommandTest, AHungChildIsKilledAtTheDeadlineAndTheLoopKeepsTurning) {
  std::optional<CommandResult> result;
  auto run = RunCommand(h_.loop.Io(), Sh("echo started; exec sleep 60", std::chrono::milliseconds(300)),
                        [&](CommandResult r) { result = std::move(r); });
  // The loop serves other work while the child hangs.
  bool ticked = false;
  boost::asio::steady_timer tick(h_.loop.Io());
  tick.expires_after(std::chrono::milliseconds(10));
  tick.async_wait([&](const boost::system::error_code&) { ticked = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return ticked; }));
  EXPECT_FALSE(result.has_value());
  ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }));
  EXPECT_TRUE(result->timed_out);
  EXPECT_FALSE(result->exited);
  EXPECT_EQ(result->out, "started\n");
  EXPECT_NE(result->Describe().find("killed"), std::string::npos) << result->Describe();
  // SIGKILL of the group: the sleep dies and is reaped.
  ASSERT_TRUE(h_.RunUntil([&] { return !run->Alive(); }));
}

TEST_F(RunCommandTest, AGrandchildHoldingThePipesDoesNotHoldTheResult) {
  // The child exits at once; the background sleep keeps stdout open. The result comes at the
  // child's exit, long before the deadline.
  const auto r = Run(Sh("sleep 30 & echo done", std::chrono::seconds(20)));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->exited);
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->out, "done\n");
}

TEST_F(RunCommandTest, OutputIsBounded) {
  auto spec = Sh("head -c 100000 /dev/zero | tr '\\0' x");
  spec.max_output = 1000;
  const auto r = Run(spec);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->Ok());
  EXPECT_EQ(r->out.size(), 1000u);
  EXPECT_TRUE(r->truncated);
}

// The output waits in the pipes until the child exits (one wake-up of the loop, however often
// the tool flushed); a child that writes more than a pipe holds is read as it goes once it has
// run a second. Nothing is lost either way.
TEST_F(RunCommandTest, OutputFlushedLineByLineOrMoreThanAPipeHoldsArrivesWhole) {
  const auto lines = Run(Sh("for i in 1 2 3 4 5; do echo line$i; echo err$i >&2; sleep 0.05; done"));
  ASSERT_TRUE(lines);
  EXPECT_TRUE(lines->Ok());
  EXPECT_EQ(lines->out, "line1\nline2\nline3\nline4\nline5\n");
  EXPECT_EQ(lines->err, "err1\nerr2\nerr3\nerr4\nerr5\n");

  auto spec = Sh("head -c 300000 /dev/zero | tr '\\0' y; echo tail >&2");
  spec.max_output = 400000;
  const auto big = Run(spec);
  ASSERT_TRUE(big);
  EXPECT_TRUE(big->Ok()) << big->Describe();
  EXPECT_EQ(big->out, std::string(300000, 'y'));
  EXPECT_EQ(big->err, "tail\n");
  EXPECT_FALSE(big->truncated);
}

TEST_F(RunCommandTest, MissingBinaryIsAnErrorNamingIt) {
  CommandSpec spec;
  spec.argv = {"/nonexistent/nvidia-imex-ctl", "-q"};
  const auto r = Run(spec);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->started);
  EXPECT_FALSE(r->Ok());
  EXPECT_NE(r->error.find("/nonexistent/nvidia-imex-ctl"), std::string::npos) << r->error;
  EXPECT_NE(r->Describe().find("No such file"), std::string::npos) << r->Describe();
}

TEST_F(RunCommandTest, CancelKillsWithoutACallback) {
  bool called = false;
  auto run = RunCommand(h_.loop.Io(), Sh("exec sleep 60"), [&](CommandResult) { called = true; });
  h_.Drain();
  EXPECT_TRUE(run->Alive());
  run->Cancel();
  ASSERT_TRUE(h_.RunUntil([&] { return !run->Alive(); }));
  h_.Drain();
  EXPECT_FALSE(called);
}

TEST_F(RunCommandTest, BlockingVariantForSubcommands) {
  const auto r = RunCommandBlocking(Sh("echo hi"));
  EXPECT_TRUE(r.Ok());
  EXPECT_EQ(r.out, "hi\n");
  const auto slow = RunCommandBlocking(Sh("exec sleep 60", std::chrono::milliseconds(200)));
  EXPECT_TRUE(slow.timed_out);
}

}  // namespace
}  // namespace gns
