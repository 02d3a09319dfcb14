// Unix sockets bound privately and renamed into place.
#include "loop/socket_path.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace gns {

PrivateSocketBind::PrivateSocketBind(std::string final_path) : final_path_(std::move(final_path)) {
  const auto slash = final_path_.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : final_path_.substr(0, slash);
  std::string tmpl = parent + (parent.back() == '/' ? "" : "/") + ".gnsXXXXXX";
  std::vector<char> buffer(tmpl.begin(), tmpl.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr) {
    throw std::runtime_error("cannot create a private directory in " + parent + " for " + final_path_ + ": " +
                             std::strerror(errno));
  }
  dir_ = buffer.data();
  // mkdtemp asks for 0700 but the umask applies: say it exactly.
  if (::chmod(dir_.c_str(), 0700) != 0) {
    const int err = errno;
    ::rmdir(dir_.c_str());
    throw std::runtime_error("chmod 0700 " + dir_ + ": " + std::strerror(err));
  }
  bind_path_ = dir_ + "/s";
}

PrivateSocketBind::~PrivateSocketBind() {
  // A bind that failed or was never published: nothing of it may stay behind.
  ::unlink(bind_path_.c_str());
  ::rmdir(dir_.c_str());
}

void PrivateSocketBind::Publish(mode_t mode) {
  if (::chmod(bind_path_.c_str(), mode) != 0) {
    throw std::runtime_error("chmod " + bind_path_ + ": " + std::strerror(errno));
  }
  if (std::rename(bind_path_.c_str(), final_path_.c_str()) != 0) {
    throw std::runtime_error("rename " + bind_path_ + " to " + final_path_ + ": " + std::strerror(errno));
  }
}

}  // namespace gns
