#pragma once
// A short-lived child process run from the loop with a deadline (nvidia-imex-ctl, nvidia-smi):
// forked in its own process group and killed when the supervisor dies (PR_SET_PDEATHSIG, so a
// kill -9 leaves no tool behind), stdin /dev/null, stdout and stderr
// captured (bounded; read when it exits, or as they come once it has run a second: one wake-up
// for a quick tool, however many times it flushed), its exit awaited through a pidfd on the loop — no SIGCHLD handler, no
// thread, no blocking wait. At the deadline the group is SIGKILLed and `done` runs at once with
// `timed_out`; a child that does not die (D state) is reaped in the background whenever it
// exits, so a hung tool never holds the loop or the caller.

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gns {

struct CommandSpec {
  std::vector<std::string> argv;  // argv[0]: a path, or a name searched in our PATH
  std::chrono::milliseconds timeout{5000};
  std::size_t max_output = 64 * 1024;  // per stream; the rest is read and dropped
  // The child's whole environment (nothing of ours leaks into it).
  std::vector<std::string> env{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"};
};

struct CommandResult {
  bool started = false;    // false: spawn failed (`error` says why)
  bool timed_out = false;  // killed at the deadline
  bool exited = false;     // exited by itself (exit_code) or by a signal (term_signal)
  int exit_code = -1;
  int term_signal = 0;
  std::string out;
  std::string err;
  bool truncated = false;  // a stream was longer than max_output
  std::string error;
  std::chrono::milliseconds elapsed{0};
  bool Ok() const { return exited && term_signal == 0 && exit_code == 0; }
  // "exit 3", "killed by signal 9", "no exit within 5000 ms (killed)", "cannot run …: …".
  std::string Describe() const;
};

class RunningCommand {
 public:
  virtual ~RunningCommand() = default;
  // Kills the child's group; `done` is not called. The child is still reaped when it exits.
  virtual void Cancel() = 0;
  // Kills the child's group now; `done` still reports how it ended (killed by signal 9).
  virtual void Kill() = 0;
  // True until the child was reaped (a killed child stuck in the kernel stays here).
  virtual bool Alive() const = 0;
};

// Our own environment as CommandSpec::env, for a node tool that must find what we find (the
// container's PATH, LD_LIBRARY_PATH, …): nvidia-smi for a reset or a time-slice.
std::vector<std::string> InheritedEnvironment();

// A configured command line with its placeholders filled: every "{key}" of `values` replaced in
// every argument (gpu-reset's `command`: {uuid}, {pci}; dra-gpu's `timeSliceCommand`).
std::vector<std::string> ExpandCommand(const std::vector<std::string>& argv,
                                       const std::vector<std::pair<std::string, std::string>>& values);

// Starts `spec` now; `done` runs on `io` exactly once (unless cancelled), never inside this
// call. The returned handle may be dropped: the run goes on and keeps itself alive.
std::shared_ptr<RunningCommand> RunCommand(boost::asio::io_context& io, CommandSpec spec,
                                           std::function<void(CommandResult)> done);

// Runs `spec` to completion on a private io_context (for subcommands such as preflight; never
// on the loop).
CommandResult RunCommandBlocking(CommandSpec spec);

}  // namespace gns
