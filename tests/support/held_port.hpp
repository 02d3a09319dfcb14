#pragma once
// A TCP port the test holds, for a child that must listen on a port fixed in advance (the IMEX
// daemons of a domain all listen on one port number, each on its own address). The kernel picks
// the port (bind to port 0, read back with getsockname), and the socket stays bound, not
// listening, for the object's life, with SO_REUSEPORT: no other process can bind the port
// meanwhile, on any address, unless it too sets SO_REUSEPORT (as tools/sim/imex does) and runs
// as the same user. So no test hands out a port it does not hold ("pick, close, hope").
// Where the child can bind port 0 itself and report it, prefer that.

#include <cstdint>
#include <string>

namespace gns::test {

class HeldPort {
 public:
  // Binds `ip`:0 ("0.0.0.0": the port on every address). Throws std::system_error.
  explicit HeldPort(const std::string& ip = "0.0.0.0");
  ~HeldPort();
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;

  std::uint16_t Port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace gns::test
