#pragma once
// Child processes started from the loop (nvidia-imex, nvidia-imex-ctl): fork + exec with the
// child's stdout and stderr on one pipe, its exit awaited through a pidfd on the loop (no
// SIGCHLD handler, no thread, no blocking wait), its output delivered line by line on the loop.
// The child gets PR_SET_PDEATHSIG(SIGTERM), so a supervisor killed with -9 takes its daemons
// with it; the restarted supervisor starts them again from its checkpoint.
//
// Every child is reaped, once, by the pidfd's handler, whatever state it is in when it ends or
// is killed (issue #23: a daemon SIGKILLed after its stop grace stayed a zombie and its Stop
// never finished): the exit is delivered as soon as the child is reaped, with the output it
// wrote before, never waiting for the pipe's end of file (a helper the child started may
// hold the pipe open for as long as it lives); a ChildProcess destroyed with its child still
// running SIGKILLs the child's process group and leaves the reap to that handler, so the loop
// never blocks in waitpid.

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

  // Starts the child (in a process group of its own); `on_line` gets each output line,
  // `on_exit` runs once on the loop when the child has been reaped, after the lines it wrote.
  // Throws std::runtime_error when it cannot be started (the binary missing or not executable
  // is reported as such, from the child's exec).
  ChildProcess(boost::asio::io_context& io, const ChildSpec& spec, LineFn on_line, ExitFn on_exit);
  // No callback after this. A child still running: its group SIGKILLed, reaped on the loop
  // once it is gone.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t Pid() const;
  bool Running() const;  // true until reaped (on_exit has run by then)
  bool Signal(int signal);       // the child
  bool SignalGroup(int signal);  // the child's process group (helpers it started too)

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Runs a short command to completion with a deadline: exit + output. At the deadline its group
// is SIGKILLed and `done` runs at once (killed by signal 9, the output so far); the child is
// reaped whenever it is gone.
void RunCommand(boost::asio::io_context& io, const ChildSpec& spec, std::chrono::milliseconds deadline,
                std::function<void(ChildExit, std::string output)> done);

// The process start time (field 22 of /proc/<pid>/stat), "" when the process is gone: with the
// pid it identifies a process across pid reuse (our daemon pid files keep both).
std::string ProcessStartTime(pid_t pid);

}  // namespace gns::dra
