#pragma once
// A unix socket that appears at its path with its final mode. bind() creates the socket file
// with 0777 & ~umask, and a chmod after it leaves a window in which anyone may connect (under
// umask 000, to the admin and reset sockets the root CLI talks to). So the socket is bound in a
// private directory (0700, next to its final path, so on the same file system), given its mode
// there, where nobody else can reach it, and renamed into place.

#include <sys/types.h>

#include <string>

namespace gns {

class PrivateSocketBind {
 public:
  // Creates "<dir of final_path>/.gnsXXXXXX/" (0700). Throws std::runtime_error naming the path.
  explicit PrivateSocketBind(std::string final_path);
  // Removes what is left of the private directory.
  ~PrivateSocketBind();
  PrivateSocketBind(const PrivateSocketBind&) = delete;
  PrivateSocketBind& operator=(const PrivateSocketBind&) = delete;

  // Where to bind.
  const std::string& BindPath() const { return bind_path_; }
  // After the bind: chmod `mode` in the private directory, then rename onto the final path
  // (replacing a stale socket there). Throws std::runtime_error.
  void Publish(mode_t mode);

 private:
  std::string final_path_;
  std::string dir_;
  std::string bind_path_;
};

}  // namespace gns
