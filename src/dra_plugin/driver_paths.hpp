#pragma once
// The names and host paths of the compute-domain DRA driver, in one place: the driver name the
// kubelet and the API know us by, the device names we publish, and where our sockets, checkpoint
// and /proc/devices live under the site's (sandboxable) paths.

#include "loop/atomic_file.hpp"
#include "loop/site.hpp"

#include <sys/types.h>

#include <string>
#include <string_view>

namespace gns::dra {

// ResourceSlice.spec.driver, PluginInfo.name and the opaque-config driver, all the same string.
inline constexpr std::string_view kDriverName = "compute-domain.nvidia.com";
// The one IMEX channel we publish and inject under HostManagedIMEX (seed 000 §7.1).
inline constexpr std::string_view kChannelDeviceName = "channel-0";
// Published only without the gate (driver-managed mode), never prepared by this build.
inline constexpr std::string_view kDaemonDeviceName = "daemon-0";

struct DriverPaths {
  std::string plugins_registry_dir;  // <kubeletDir>/plugins_registry
  std::string registration_socket;   // <registry>/compute-domain.nvidia.com-reg.sock
  std::string plugin_dir;            // <kubeletDir>/plugins/compute-domain.nvidia.com
  std::string dra_socket;            // <plugin_dir>/dra.sock
  std::string state_dir;             // <stateDir>/dra-compute-domain
  std::string checkpoint_file;       // <state_dir>/checkpoint.json
  std::string claim_log_file;        // <state_dir>/claims.log (claim_log.hpp)
  std::string cdi_dir;               // paths.cdiDir
  std::string proc_devices;          // <hostRoot>/proc/devices
};

DriverPaths MakeDriverPaths(const SitePaths& site);

// "a" + "b" with exactly one slash between them ("/" + "proc/devices" → "/proc/devices").
std::string JoinPath(std::string_view dir, std::string_view name);

// EnsureDirectory (creating `path` and its missing parents with an exact mode) is
// loop/atomic_file.hpp's, found from here as gns::EnsureDirectory.

}  // namespace gns::dra
