// Subprocess runner for integration tests.
#include "support/subprocess.hpp"

#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace gns::test {

Subprocess::Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && env.count(entry.substr(0, eq))) continue;
    env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (auto& e : env_strings) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  out_fd_ = fds[0];
  reader_ = std::thread([this] {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard lock(mutex_);
      if (n <= 0) {
        eof_ = true;
        changed_.notify_all();
        return;
      }
      output_.append(buf, static_cast<std::size_t>(n));
      changed_.notify_all();
    }
  });
}

Subprocess::~Subprocess() {
  if (!exit_code_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(10));
  }
  if (reader_.joinable()) reader_.join();
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::optional<std::string> Subprocess::WaitForLine(const std::string& needle, std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  std::optional<std::string> found;
  changed_.wait_for(lock, limit, [&] {
    std::size_t start = 0;
    for (;;) {
      const auto end = output_.find('\n', start);
      if (end == std::string::npos) break;
      const std::string line = output_.substr(start, end - start);
      if (line.find(needle) != std::string::npos) {
        found = line;
        return true;
      }
      start = end + 1;
    }
    return eof_;
  });
  return found;
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !exit_code_) ::kill(pid_, signal);
}

std::optional<int> Subprocess::Wait(std::chrono::milliseconds limit) {
  if (exit_code_) return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    // Child exit has no fd to wait on without signal plumbing; a short poll is fine in a test.
    ::usleep(5000);
  }
}

std::string Subprocess::Output() const {
  std::lock_guard lock(mutex_);
  return output_;
}

std::pair<int, std::string> RunToCompletion(std::vector<std::string> argv, std::map<std::string, std::string> env) {
  Subprocess p(std::move(argv), std::move(env));
  const auto code = p.Wait(std::chrono::seconds(60));
  p.WaitForLine("\x01never", std::chrono::seconds(5));  // drain output until EOF
  return {code.value_or(-1), p.Output()};
}

}  // namespace gns::test
