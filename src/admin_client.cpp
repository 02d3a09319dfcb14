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

}  // namespace gns
