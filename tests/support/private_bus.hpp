#pragma once
// A private system bus for tests and benchmarks: Debian's dbus-daemon on a socket in a temp
// directory, and tools/sim/systemd's gns-fake-systemd owning org.freedesktop.systemd1 on it,
// so sd-bus clients run over the real D-Bus wire. Either can be stopped and started again
// (the same socket path), to test a bus or a systemd that goes away and comes back.
// The control calls are blocking sd-bus calls from the test thread (the fake is another
// process, so the loop need not turn for them).

#include "support/subprocess.hpp"

#include <memory>
#include <string>
#include <vector>

namespace gns::test {

class PrivateBus {
 public:
  // `dir` must exist; bus.conf and bus.sock are made there.
  explicit PrivateBus(std::string dir);
  ~PrivateBus();

  static bool Available();  // dbus-daemon and the fake are installed/built
  std::string Address() const { return "unix:path=" + socket_; }

  void StartBus();
  void StopBus();  // the daemon is killed (the fake loses its connection and exits)
  // Units given as NAME or NAME:inactive.
  void StartSystemd(const std::vector<std::string>& units);
  void StopSystemd();

  // Manager.StartUnit/StopUnit/RestartUnit; returns "" or the D-Bus error.
  std::string ManagerCall(const std::string& method, const std::string& unit);
  // The fake's Crash(unit, status, restart).
  std::string Crash(const std::string& unit, int status, bool restart);
  // A Unit/Service property as text (busctl-like), or "error: …".
  std::string Property(const std::string& unit, const std::string& interface, const std::string& name);

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<Subprocess> systemd_;
  std::vector<std::string> units_;
};

}  // namespace gns::test
