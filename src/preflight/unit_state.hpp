#pragma once
// What systemd says of one unit (its Unit and Service properties), as the unit watcher reads it
// over D-Bus. A plain value without Asio or sd-bus, so pure judges (imex-health's preflight,
// gpu-health's host services) can take it.

#include <cstdint>
#include <string>

namespace gns::imex_health {

struct UnitState {
  bool bus_connected = false;    // the connection to the system bus is up
  bool systemd_present = false;  // org.freedesktop.systemd1 answered
  bool known = false;            // the unit's properties were read at least once on this connection
  std::string error;             // why the state is not known (bus down, call failed)
  std::string load_state;        // "loaded", "not-found", "masked", …
  std::string active_state;      // "active", "inactive", "failed", "activating", …
  std::string sub_state;
  std::string unit_file_state;   // "enabled", "disabled", … ("" when unknown)
  std::string result;            // Service.Result: "success", "exit-code", …
  uint32_t n_restarts = 0;       // Service.NRestarts (automatic restarts)
  int32_t exec_main_status = 0;
  int32_t exec_main_code = 0;
  uint32_t main_pid = 0;
  uint64_t active_enter_usec = 0;  // Unit.ActiveEnterTimestamp, µs since the epoch
};

}  // namespace gns::imex_health
