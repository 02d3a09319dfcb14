// Names and host paths of the compute-domain DRA driver.
#include "modules/dra_compute_domain/driver_paths.hpp"

namespace gns::dra {

DriverPaths MakeDriverPaths(const SitePaths& site) {
  DriverPaths paths;
  static_cast<PluginPaths&>(paths) = MakePluginPaths(site, kDriverName, kStateFolder);
  paths.proc_devices = JoinPath(site.host_root.empty() ? "/" : site.host_root, "proc/devices");
  return paths;
}

}  // namespace gns::dra
