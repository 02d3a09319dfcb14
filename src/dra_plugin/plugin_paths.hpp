#pragma once
// Where a DRA kubelet plugin's sockets and state live, for any driver: the kubelet's plugin
// watcher directory and the driver's own plugin directory under <kubeletDir>, and a state folder
// of the driver's under the site's <stateDir> (sandboxable: tests and the simulator point the
// site's paths into a temp tree).

#include "loop/atomic_file.hpp"
#include "loop/site.hpp"

#include <string>
#include <string_view>

namespace gns::dra {

struct PluginPaths {
  std::string plugins_registry_dir;  // <kubeletDir>/plugins_registry
  std::string registration_socket;   // <registry>/<driver>-reg.sock
  std::string plugin_dir;            // <kubeletDir>/plugins/<driver>
  std::string dra_socket;            // <plugin_dir>/dra.sock
  std::string state_dir;             // <stateDir>/<state folder>
  std::string checkpoint_file;       // <state_dir>/checkpoint.json (checkpoint.hpp)
  std::string claim_log_file;        // <state_dir>/claims.log (claim_log.hpp)
  std::string cdi_dir;               // paths.cdiDir
};

// `driver_name` names the sockets and the plugin directory as the kubelet expects
// (WIRE-FACTS §2); `state_folder` is the driver's folder under the state dir, fixed per driver
// once released (nodes upgrade in place: "dra-compute-domain" for compute-domain.nvidia.com).
PluginPaths MakePluginPaths(const SitePaths& site, std::string_view driver_name, std::string_view state_folder);

// "a" + "b" with exactly one slash between them ("/" + "proc/devices" → "/proc/devices").
std::string JoinPath(std::string_view dir, std::string_view name);

// EnsureDirectory (creating `path` and its missing parents with an exact mode) is
// loop/atomic_file.hpp's, found from here as gns::EnsureDirectory.

}  // namespace gns::dra
