#pragma once
// A service imex-health offers (Services::Find<ImexUnitControl>()): restart the IMEX unit
// through its sd-bus connection (Manager.RestartUnit). imex-peers uses it after rewriting
// nodes_config.cfg, so one module owns the connection to systemd.

#include <functional>
#include <string>

namespace gns::imex_health {

class ImexUnitControl {
 public:
  virtual ~ImexUnitControl() = default;
  // Loop thread. `done("")` once systemd accepted the job, else done(why).
  virtual void Restart(std::function<void(std::string error)> done) = 0;
  virtual const std::string& Unit() const = 0;
};

}  // namespace gns::imex_health
