// Child processes on the loop: fork/exec, pidfd exit wait, line-split output.
#include "modules/dra_compute_domain/child_process.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace gns::dra {

namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

std::string ChildExit::Describe() const {
  if (signaled) return "killed by signal " + std::to_string(code - 128);
  return "exited with status " + std::to_string(code);
}

struct ChildProcess::State {
  explicit State(boost::asio::io_context& io) : pidfd(io), out(io) {}
  boost::asio::posix::stream_descriptor pidfd;
  boost::asio::posix::stream_descriptor out;
  pid_t pid = -1;
  bool reaped = false;
  bool gone = false;  // on_exit delivered, or the owner destroyed: no more callbacks
  ChildExit exit;
  std::array<char, 4096> buffer{};
  std::string partial;
  LineFn on_line;
  ExitFn on_exit;

  // Output bytes as they come: every complete line to on_line.
  void Take(const char* data, std::size_t bytes) {
    if (gone) return;
    partial.append(data, bytes);
    std::size_t start = 0;
    for (std::size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (on_line) on_line(partial.substr(start, nl - start));
    }
    partial.erase(0, start);
  }

  // The pidfd turned readable: the child has ended, so it is waitable. One reap, from here only.
  // False when it was not (readiness without an exit): the caller waits again.
  bool Reap() {
    if (reaped) return true;
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return false;
    reaped = true;
    if (r != pid) {  // ECHILD: nobody else reaps our children, but never hang on it
      exit.code = 255;
      return true;
    }
    if (WIFSIGNALED(status)) {
      exit.signaled = true;
      exit.code = 128 + WTERMSIG(status);
    } else {
      exit.code = WEXITSTATUS(status);
    }
    return true;
  }

  // Reaped: what the child wrote is in the pipe now (it can write no more); read it without
  // waiting, deliver the exit, close the pipe. The exit never waits for the pipe's end of file:
  // a grandchild that inherited the pipe may keep it open for as long as it lives, and the
  // exit (a daemon's Stop) must not wait for that.
  void Finish() {
    boost::system::error_code ignored;  // the pidfd has done its job
    pidfd.close(ignored);
    if (out.is_open()) {
      for (;;) {
        const ssize_t n = ::read(out.native_handle(), buffer.data(), buffer.size());
        if (n > 0) {
          Take(buffer.data(), static_cast<std::size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        break;  // end of file, or nothing more now (a grandchild still holds the pipe)
      }
      out.close(ignored);  // a read still queued ends with operation_aborted
    }
    if (gone) return;
    if (!partial.empty() && on_line) on_line(partial);
    partial.clear();
    gone = true;  // once
    auto fn = std::move(on_exit);
    on_exit = nullptr;
    on_line = nullptr;
    if (fn) fn(exit);
  }

  // Exit: the pidfd becomes readable when the child has ended. The handler owns the state, so a
  // child whose owner is gone is still reaped when it ends (never a zombie, never a blocking wait).
  static void WaitForExit(const std::shared_ptr<State>& s) {
    s->pidfd.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                        [s](const boost::system::error_code& ec) {
                          if (ec) return;  // the io_context is going away
                          if (!s->Reap()) {
                            WaitForExit(s);  // readable without an exit: look again
                            return;
                          }
                          s->Finish();
                        });
  }

  // Output: read until the end of file (every writer closed it) or until Finish closes it.
  static void Read(const std::shared_ptr<State>& s) {
    s->out.async_read_some(boost::asio::buffer(s->buffer),
                           [s](const boost::system::error_code& ec, std::size_t bytes) {
                             if (ec == boost::asio::error::operation_aborted) return;
                             s->Take(s->buffer.data(), bytes);
                             if (ec) return;  // end of file: the exit comes through the pidfd
                             Read(s);
                           });
  }
};

ChildProcess::ChildProcess(boost::asio::io_context& io, const ChildSpec& spec, LineFn on_line, ExitFn on_exit)
    : state_(std::make_shared<State>(io)) {
  if (spec.argv.empty()) throw std::runtime_error("no command to run");
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (spec.env.count(entry.substr(0, eq)) != 0) continue;
    env_strings.push_back(entry);
  }
  for (const auto& [key, value] : spec.env) env_strings.push_back(key + "=" + value);
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error(Errno("pipe2"));
  int exec_pipe[2];  // reports the child's exec errno; closed by a successful exec
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::runtime_error(Errno("pipe2"));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], exec_pipe[0], exec_pipe[1]}) ::close(fd);
    throw std::runtime_error(Errno("fork"));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    // Our own process group: a terminal's Ctrl-C reaches the supervisor, which stops us.
    ::setpgid(0, 0);
    // Our dispositions are not the child's: SIGPIPE is ignored in the supervisor.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(out_pipe[1], 2);
    if (!spec.working_dir.empty() && ::chdir(spec.working_dir.c_str()) != 0) {
      const int e = errno;
      (void)!::write(exec_pipe[1], &e, sizeof e);
      ::_exit(127);
    }
    if (!spec.bind_mounts.empty()) {
      bool ok = ::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
      for (const auto& [source, target] : spec.bind_mounts) {
        ok = ok && ::mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) == 0;
      }
      if (!ok) {
        const int e = errno;
        (void)!::write(exec_pipe[1], &e, sizeof e);
        ::_exit(127);
      }
    }
    ::execve(argv[0], argv.data(), envp.data());
    const int e = errno;
    (void)!::write(exec_pipe[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(exec_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  state_->pid = pid;
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    ::close(out_pipe[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    state_->reaped = true;
    state_->gone = true;
    throw std::runtime_error("cannot execute " + spec.argv[0] + ": " + std::strerror(child_errno));
  }
  state_->on_line = std::move(on_line);
  state_->on_exit = std::move(on_exit);
  ::fcntl(out_pipe[0], F_SETFL, ::fcntl(out_pipe[0], F_GETFL) | O_NONBLOCK);
  state_->out.assign(out_pipe[0]);
  const int pidfd = PidfdOpen(pid);
  if (pidfd < 0) {
    const std::string why = Errno("pidfd_open");
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    state_->reaped = true;
    state_->gone = true;
    throw std::runtime_error(why);
  }
  state_->pidfd.assign(pidfd);

  State::WaitForExit(state_);
  State::Read(state_);
}

ChildProcess::~ChildProcess() {
  state_->gone = true;
  state_->on_line = nullptr;
  state_->on_exit = nullptr;
  if (!state_->reaped && state_->pid > 0) {
    // Its group (helpers it started included). The exit wait keeps the state and reaps the
    // child when it is gone: no blocking wait on the loop (a child in the kernel's D state
    // may take a while), and no zombie left.
    ::kill(-state_->pid, SIGKILL);
    ::kill(state_->pid, SIGKILL);
  }
}

pid_t ChildProcess::Pid() const { return state_->pid; }
bool ChildProcess::Running() const { return !state_->reaped; }
bool ChildProcess::Signal(int signal) {
  if (state_->reaped) return false;
  return ::kill(state_->pid, signal) == 0;
}
bool ChildProcess::SignalGroup(int signal) {
  if (state_->reaped) return false;
  const bool group = ::kill(-state_->pid, signal) == 0;
  return ::kill(state_->pid, signal) == 0 || group;
}

void RunCommand(boost::asio::io_context& io, const ChildSpec& spec, std::chrono::milliseconds deadline,
                std::function<void(ChildExit, std::string)> done) {
  struct Run {
    std::unique_ptr<ChildProcess> child;
    std::string output;
    std::unique_ptr<boost::asio::steady_timer> timer;
    std::function<void(ChildExit, std::string)> done;
  };
  // Ownership: the deadline timer's handler owns the run (it always completes: at the deadline,
  // when the exit cancels it, or when the io_context goes); the child's callbacks only point
  // at it, so nothing is kept alive in a cycle.
  auto run = std::make_shared<Run>();
  run->done = std::move(done);
  run->timer = std::make_unique<boost::asio::steady_timer>(io, deadline);
  std::weak_ptr<Run> weak = run;
  try {
    run->child = std::make_unique<ChildProcess>(
        io, spec,
        [weak](const std::string& line) {
          if (auto r = weak.lock()) r->output += line + "\n";
        },
        [weak](ChildExit exit) {
          auto r = weak.lock();
          if (!r) return;
          r->timer->cancel();
          if (auto fn = std::move(r->done)) fn(exit, r->output);
        });
  } catch (const std::exception& e) {
    boost::asio::post(io, [run, why = std::string(e.what())] {
      ChildExit exit;
      exit.code = 127;
      if (auto fn = std::move(run->done)) fn(exit, why);
    });
    return;
  }
  run->timer->async_wait([run](const boost::system::error_code& ec) {
    if (ec || !run->child) return;  // the exit came first (or the io_context is going away)
    // Killed with its helpers (~ChildProcess: the group), reaped on the loop once it is gone;
    // the caller hears now, not when (or whether) the kernel lets the child go.
    run->child.reset();
    ChildExit exit;
    exit.code = 128 + SIGKILL;
    exit.signaled = true;
    if (auto fn = std::move(run->done)) fn(exit, run->output);
  });
}

std::string ProcessStartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return {};
  // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  // Field 3 is the first after ')'; the start time is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return {};
  }
  return field;
}

}  // namespace gns::dra
