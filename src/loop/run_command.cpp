// A short-lived child process on the loop: see run_command.hpp.
#include "loop/run_command.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace gns {
namespace {

namespace asio = boost::asio;
using Steady = std::chrono::steady_clock;

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// How long a child's output may wait in its pipes before it is read as it comes.
constexpr std::chrono::milliseconds kReadAfter{1000};

class Run final : public RunningCommand, public std::enable_shared_from_this<Run> {
 public:
  Run(asio::io_context& io, CommandSpec spec, std::function<void(CommandResult)> done)
      : io_(io),
        spec_(std::move(spec)),
        done_(std::move(done)),
        out_(io),
        err_(io),
        exit_(io),
        deadline_(io),
        read_after_(io) {}

  ~Run() override {
    // Only reached once the child was reaped, or when the io_context goes away first (process
    // exit): then make sure it does not outlive us running.
    if (pid_ > 0 && !reaped_) ::kill(-pid_, SIGKILL);
    CloseRawOutput();
  }

  void Start() {
    start_ = Steady::now();
    if (spec_.argv.empty()) return FailToStart("no command");
    int out_pipe[2] = {-1, -1};
    int err_pipe[2] = {-1, -1};
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
        if (fd >= 0) ::close(fd);
      }
      return FailToStart(std::string("pipe: ") + std::strerror(e));
    }
    std::vector<char*> argv;
    for (auto& a : spec_.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : spec_.env) envp.push_back(e.data());
    envp.push_back(nullptr);
    // Reports an exec failure to us: it closes (CLOEXEC) on a successful exec.
    int status_pipe[2] = {-1, -1};
    if (::pipe2(status_pipe, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      return FailToStart(std::string("pipe: ") + std::strerror(e));
    }
    const pid_t parent = ::getpid();
    // fork, not posix_spawn: the child must die with us (PR_SET_PDEATHSIG), so a kill -9 of the
    // supervisor leaves no tool behind (a GPU reset command holding the GPU, say).
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The child: async-signal-safe calls only.
      ::setpgid(0, 0);  // its own group: the deadline kills helpers too
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (devnull >= 0) ::dup2(devnull, 0);
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);  // nor our dispositions
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the loop's blocked signals must not leak in
      if (std::strchr(argv[0], '/') != nullptr) {
        ::execve(argv[0], argv.data(), envp.data());
      } else {
        ::execvpe(argv[0], argv.data(), envp.data());  // searched in our PATH
      }
      const int e = errno;
      [[maybe_unused]] const ssize_t n = ::write(status_pipe[1], &e, sizeof(e));
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    ::close(status_pipe[1]);
    if (pid < 0) {
      ::close(status_pipe[0]);
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      return FailToStart(std::string("fork: ") + std::strerror(fork_errno));
    }
    ::setpgid(pid, pid);  // also from here: a kill of the group right away finds it
    int exec_errno = 0;
    ssize_t got;
    do {
      got = ::read(status_pipe[0], &exec_errno, sizeof(exec_errno));
    } while (got < 0 && errno == EINTR);
    ::close(status_pipe[0]);
    if (got == static_cast<ssize_t>(sizeof(exec_errno))) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      reaped_ = true;
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      return FailToStart(std::string(std::strerror(exec_errno)));
    }
    pid_ = pid;
    const int pidfd = PidfdOpen(pid);
    if (pidfd < 0) {
      // The child is ours and unreaped, so the pid cannot have been reused: kill and reap it.
      const int e = errno;
      ::kill(-pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      reaped_ = true;
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      return FailToStart(std::string("pidfd_open: ") + std::strerror(e));
    }
    result_.started = true;
    exit_.assign(pidfd);
    // The output is read once, when the child has exited (OnExit), not as each chunk arrives:
    // a tool that flushes every line would otherwise wake the loop once per line. So the pipes
    // are not given to the reactor yet (Asio registers a descriptor with epoll when it is
    // assigned, and its readiness would wake the loop though nothing waits on it). A pipe holds
    // 64 KiB; a child still running after kReadAfter may be blocked on a full one, so from then
    // on its output is read as it comes.
    out_fd_ = out_pipe[0];
    err_fd_ = err_pipe[0];
    for (const int fd : {out_fd_, err_fd_}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    out_open_ = err_open_ = true;
    read_after_.expires_after(std::min<Steady::duration>(kReadAfter, spec_.timeout));
    read_after_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->finished_) return;
      self->ReadAsItComes();
    });
    exit_.async_wait(asio::posix::stream_descriptor::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) { self->OnExit(ec); });
    deadline_.expires_after(spec_.timeout);
    deadline_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->OnDeadline();
    });
  }

  void Cancel() override {
    if (reaped_ || pid_ <= 0) {
      done_ = nullptr;
      return;
    }
    ::kill(-pid_, SIGKILL);
    done_ = nullptr;
    finished_ = true;
    deadline_.cancel();
    read_after_.cancel();
    CloseOutput();
  }

  bool Alive() const override { return pid_ > 0 && !reaped_; }

 private:
  void Kill() override {
    if (pid_ > 0 && !reaped_) ::kill(-pid_, SIGKILL);
  }

  void FailToStart(std::string why) {
    result_.error = "cannot run " + (spec_.argv.empty() ? std::string("(nothing)") : spec_.argv[0]) + ": " + why;
    asio::post(io_, [self = shared_from_this()] { self->Finish(); });
  }

  // From kReadAfter on: the pipes go to the reactor and are read as data comes.
  void ReadAsItComes() {
    if (out_fd_ >= 0) out_.assign(std::exchange(out_fd_, -1));
    if (err_fd_ >= 0) err_.assign(std::exchange(err_fd_, -1));
    WaitReadable(out_, result_.out, out_open_);
    WaitReadable(err_, result_.err, err_open_);
  }

  // A pipe's descriptor: the reactor's once handed over, ours before.
  int OutFd() { return out_.is_open() ? out_.native_handle() : out_fd_; }
  int ErrFd() { return err_.is_open() ? err_.native_handle() : err_fd_; }

  void CloseRawOutput() {
    for (int* fd : {&out_fd_, &err_fd_}) {
      if (*fd >= 0) ::close(std::exchange(*fd, -1));
    }
  }

  // Reads what is there now, without blocking; false at end of file or on an error.
  bool Drain(int fd, std::string& into) {
    if (fd < 0) return false;
    std::array<char, 4096> buf;
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n > 0) {
        const std::size_t room = spec_.max_output > into.size() ? spec_.max_output - into.size() : 0;
        const std::size_t take = std::min<std::size_t>(room, static_cast<std::size_t>(n));
        into.append(buf.data(), take);
        if (take < static_cast<std::size_t>(n)) result_.truncated = true;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }

  void WaitReadable(asio::posix::stream_descriptor& d, std::string& into, bool& open) {
    if (!open || !d.is_open()) return;
    d.async_wait(asio::posix::stream_descriptor::wait_read,
                 [self = shared_from_this(), &d, &into, &open](const boost::system::error_code& ec) {
                   if (ec || !d.is_open()) return;
                   if (self->Drain(d.native_handle(), into)) {
                     self->WaitReadable(d, into, open);
                     return;
                   }
                   open = false;
                   boost::system::error_code ignored;  // closing a pipe cannot fail in a way we could act on
                   d.close(ignored);
                 });
  }

  void OnExit(const boost::system::error_code& ec) {
    if (ec) return;  // the io_context is going away
    siginfo_t info{};
    const int rc = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(exit_.native_handle()), &info,
                            WEXITED | WNOHANG);
    if (rc != 0 || info.si_pid == 0) {
      // Spurious readiness: wait again.
      exit_.async_wait(asio::posix::stream_descriptor::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& e) { self->OnExit(e); });
      return;
    }
    reaped_ = true;
    boost::system::error_code ignored;  // the pidfd has done its job
    exit_.close(ignored);
    if (finished_) return;  // reported at the deadline, or cancelled
    result_.exited = true;
    if (info.si_code == CLD_EXITED) {
      result_.exit_code = info.si_status;
    } else {
      result_.term_signal = info.si_status;
    }
    // Whatever it wrote is in the pipes now; a grandchild keeping them open does not hold us.
    if (out_open_) Drain(OutFd(), result_.out);
    if (err_open_) Drain(ErrFd(), result_.err);
    Finish();
  }

  void OnDeadline() {
    if (finished_) return;
    ::kill(-pid_, SIGKILL);
    result_.timed_out = true;
    if (out_open_) Drain(OutFd(), result_.out);
    if (err_open_) Drain(ErrFd(), result_.err);
    Finish();
  }

  void CloseOutput() {
    boost::system::error_code ignored;  // closing pipes we only read
    out_.close(ignored);
    err_.close(ignored);
    CloseRawOutput();
    out_open_ = err_open_ = false;
  }

  void Finish() {
    finished_ = true;
    deadline_.cancel();
    read_after_.cancel();
    CloseOutput();
    result_.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - start_);
    if (auto done = std::move(done_)) {
      done_ = nullptr;
      done(std::move(result_));
    }
  }

  asio::io_context& io_;
  CommandSpec spec_;
  std::function<void(CommandResult)> done_;
  asio::posix::stream_descriptor out_;
  asio::posix::stream_descriptor err_;
  asio::posix::stream_descriptor exit_;
  asio::steady_timer deadline_;
  asio::steady_timer read_after_;  // kReadAfter: from then on the output is read as it comes
  CommandResult result_;
  Steady::time_point start_;
  pid_t pid_ = -1;
  int out_fd_ = -1;  // the pipes' read ends until ReadAsItComes hands them to out_ and err_
  int err_fd_ = -1;
  bool out_open_ = false;
  bool err_open_ = false;
  bool reaped_ = false;
  bool finished_ = false;
};

}  // namespace

std::string CommandResult::Describe() const {
  if (!started) return error;
  if (timed_out) return "no exit within " + std::to_string(elapsed.count()) + " ms (killed)";
  if (term_signal != 0) return std::string("killed by signal ") + std::to_string(term_signal);
  return "exit " + std::to_string(exit_code);
}

std::vector<std::string> InheritedEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::vector<std::string> ExpandCommand(const std::vector<std::string>& argv,
                                       const std::vector<std::pair<std::string, std::string>>& values) {
  std::vector<std::string> out;
  for (std::string arg : argv) {
    for (const auto& [key, value] : values) {
      for (std::size_t p = arg.find(key); p != std::string::npos; p = arg.find(key, p + value.size())) {
        arg.replace(p, key.size(), value);
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

std::shared_ptr<RunningCommand> RunCommand(asio::io_context& io, CommandSpec spec,
                                           std::function<void(CommandResult)> done) {
  auto run = std::make_shared<Run>(io, std::move(spec), std::move(done));
  run->Start();
  return run;
}

CommandResult RunCommandBlocking(CommandSpec spec) {
  asio::io_context io;
  CommandResult out;
  auto run = RunCommand(io, std::move(spec), [&out](CommandResult r) { out = std::move(r); });
  // Returns at the deadline even when the child cannot be reaped (the io_context stops then).
  while (!io.stopped()) {
    io.run_one();
    if (out.started ? (out.exited || out.timed_out) : !out.error.empty()) break;
  }
  return out;
}

}  // namespace gns
