// The admin socket client: plain blocking POSIX, run once by the CLI.
#include "admin_client.hpp"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

namespace gns {

bool AdminRequest(const std::string& socket_path, const std::string& line, std::string& answer, std::string& error,
                  int timeout_ms) {
  sockaddr_un address{};
  if (socket_path.size() >= sizeof(address.sun_path)) {
    error = "socket path too long: " + socket_path;
    return false;
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    error = "connecting to " + socket_path + ": " + std::strerror(errno) + " (is the supervisor running?)";
    ::close(fd);
    return false;
  }
  const std::string request = line + "\n";
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = std::string("sending: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    sent += static_cast<std::size_t>(n);
  }
  answer.clear();
  char buffer[4096];
  while (answer.find('\n') == std::string::npos && answer.size() < 1 << 20) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = std::string("reading the answer: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    answer.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (const auto end = answer.find('\n'); end != std::string::npos) answer.resize(end);
  if (answer.empty()) {
    error = "the supervisor closed the connection without an answer";
    return false;
  }
  return true;
}

int RunSetHealthy(const std::string& state_dir, const std::string& gpu) {
  if (gpu.empty() || gpu.find_first_of(" \t\r\n") != std::string::npos) {
    std::cerr << "error: --gpu takes one GPU UUID (GPU-…) or all\n";
    return 2;
  }
  std::string answer;
  std::string error;
  if (!AdminRequest(state_dir + "/admin.sock", "set-healthy " + gpu, answer, error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  if (answer.rfind("ok", 0) == 0) {
    std::cout << answer << "\n";
    return 0;
  }
  std::cerr << answer << "\n";
  return 1;
}

namespace {

// Connects to a unix stream socket; -1 with `error` when it cannot.
int ConnectUnix(const std::string& path, std::string& error) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) {
    error = "socket path too long: " + path;
    return -1;
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    error = "connecting to " + path + ": " + std::strerror(errno) + " (is the supervisor running with gpu-reset?)";
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int RunResetGpu(const std::string& state_dir, const std::string& gpu, std::ostream& out, std::ostream& err) {
  if (gpu.empty() || gpu.find_first_of(" \t\r\n") != std::string::npos) {
    err << "error: --gpu takes one GPU UUID (GPU-…)\n";
    return 2;
  }
  std::string error;
  const int fd = ConnectUnix(state_dir + "/reset.sock", error);
  if (fd < 0) {
    err << "error: " << error << "\n";
    return 3;
  }
  const std::string request = "reset-gpu " + gpu + "\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    err << "error: sending the request: " << std::strerror(errno) << "\n";
    ::close(fd);
    return 3;
  }
  // No deadline: a reset takes as long as its steps (each has its own in the supervisor).
  std::string pending;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<std::size_t>(n));
    for (std::size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (line.rfind("ok:", 0) == 0) {
        out << line << std::endl;
        ::close(fd);
        return 0;
      }
      if (line.rfind("error:", 0) == 0) {
        err << line << std::endl;
        ::close(fd);
        return 1;
      }
      out << line << std::endl;
    }
  }
  ::close(fd);
  err << "error: the supervisor closed the connection before the reset ended (it resumes the reset when it runs again)\n";
  return 3;
}

}  // namespace gns
