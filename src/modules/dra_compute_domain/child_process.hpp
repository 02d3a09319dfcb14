#pragma once
// Child processes started from the loop (nvidia-imex, nvidia-imex-ctl): fork + exec with the
// child's stdout and stderr on one pipe, its exit awaited through a pidfd on the loop (no
// SIGCHLD handler, no thread, no blocking wait), its output delivered line by line on the loop.
// The child gets PR_SET_PDEATHSIG(SIGTERM), so a supervisor killed with -9 takes its daemons
// with it; the restarted supervisor starts them again from its checkpoint.

#include <boost/asio/io_context.hpp>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gns::dra {

struct ChildSpec {
  std::vector<std::string> argv;             // argv[0] is the path of the binary
  std::map<std::string, std::string> env;    // added to (or replacing) our environment
  std::string working_dir;                   // "" keeps ours
  // Files bind-mounted over paths in a private mount namespace of the child (needs
  // CAP_SYS_ADMIN): how one domain's daemon sees its own /etc/hosts under IMEXDaemonsWithDNSNames.
  std::vector<std::pair<std::string, std::string>> bind_mounts;  // {source, target}
};

struct ChildExit {
  int code = -1;    // exit status, or 128 + signal
  bool signaled = false;
  std::string Describe() const;
};

class ChildProcess {
 public:
  using LineFn = std::function<void(const std::string&)>;
  using ExitFn = std::function<void(ChildExit)>;

  // Starts the child; `on_line` gets each output line, `on_exit` runs once on the loop after
  // the output has been drained. Throws std::runtime_error when it cannot be started (the
  // binary missing or not executable is reported as such, from the child's exec).
  ChildProcess(boost::asio::io_context& io, const ChildSpec& spec, LineFn on_line, ExitFn on_exit);
  ~ChildProcess();  // kills (SIGKILL) a child still running and reaps it
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t Pid() const;
  bool Running() const;
  bool Signal(int signal);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Runs a short command to completion with a deadline (killed at the deadline): exit + output.
void RunCommand(boost::asio::io_context& io, const ChildSpec& spec, std::chrono::milliseconds deadline,
                std::function<void(ChildExit, std::string output)> done);

// The process start time (field 22 of /proc/<pid>/stat), "" when the process is gone: with the
// pid it identifies a process across pid reuse (our daemon pid files keep both).
std::string ProcessStartTime(pid_t pid);

}  // namespace gns::dra
