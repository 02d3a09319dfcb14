#pragma once
// The names and host paths of the compute-domain DRA driver, in one place: the driver name the
// kubelet and the API know us by, the device names we publish, and where our sockets, checkpoint
// and /proc/devices live under the site's (sandboxable) paths. The plugin's paths are the DRA
// plugin core's (dra_plugin/plugin_paths.hpp) for this driver's name and state folder.

#include "dra_plugin/plugin_paths.hpp"
#include "loop/site.hpp"

#include <string>
#include <string_view>

namespace gns::dra {

// ResourceSlice.spec.driver, PluginInfo.name and the opaque-config driver, all the same string.
inline constexpr std::string_view kDriverName = "compute-domain.nvidia.com";
// <stateDir>/dra-compute-domain: the checkpoint and the claim log of nodes already running.
inline constexpr std::string_view kStateFolder = "dra-compute-domain";
// The one IMEX channel we publish and inject under HostManagedIMEX (seed 000 §7.1).
inline constexpr std::string_view kChannelDeviceName = "channel-0";
// Published only without the gate (driver-managed mode), never prepared by this build.
inline constexpr std::string_view kDaemonDeviceName = "daemon-0";

// registration_socket: <registry>/compute-domain.nvidia.com-reg.sock; plugin_dir:
// <kubeletDir>/plugins/compute-domain.nvidia.com; state_dir: <stateDir>/dra-compute-domain.
struct DriverPaths : PluginPaths {
  std::string proc_devices;  // <hostRoot>/proc/devices
};

DriverPaths MakeDriverPaths(const SitePaths& site);

}  // namespace gns::dra
