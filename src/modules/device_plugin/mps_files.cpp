// MPS control-daemon files and the daemon's readiness probe (api/mps.hpp).
#include "modules/device_plugin/api/mps.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gns::device_plugin {

namespace {

std::string JoinPath(std::string a, const std::string& b) {
  while (!a.empty() && a.back() == '/') a.pop_back();
  return a + "/" + b;
}

}  // namespace

std::string MpsPipeDir(const std::string& root, const std::string& resource) {
  return JoinPath(JoinPath(root, resource), "pipe");
}

std::string MpsShmDir(const std::string& root) { return JoinPath(root, "shm"); }

std::string MpsControlPath(const std::string& pipe_dir) { return JoinPath(pipe_dir, "control"); }

std::string ProbeMpsControl(const std::string& control_path) {
  struct stat st {};
  if (::stat(control_path.c_str(), &st) != 0) return control_path + ": " + std::strerror(errno);
  if (S_ISFIFO(st.st_mode)) {
    // A FIFO opened for writing without blocking fails with ENXIO while nobody reads it.
    const int fd = ::open(control_path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      return control_path + ": " + (errno == ENXIO ? std::string("no control daemon reads this FIFO") : std::strerror(errno));
    }
    ::close(fd);
    return {};
  }
  if (!S_ISSOCK(st.st_mode)) return control_path + " is neither a unix socket nor a FIFO";
  const int err = ProbeUnixListener(control_path);
  if (err == 0) return {};
  if (err == ENAMETOOLONG) {
    return control_path + ": path longer than a unix socket address allows (" +
           std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes)";
  }
  if (err == ECONNREFUSED) return control_path + ": connection refused (no control daemon listens)";
  return control_path + ": " + std::strerror(err);
}

int ProbeUnixListener(const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  // EAGAIN: a listener whose backlog is full; it is there.
  return rc == 0 || err == EAGAIN ? 0 : err;
}

}  // namespace gns::device_plugin
