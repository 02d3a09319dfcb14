// Names and host paths of the compute-domain DRA driver.
#include "dra_plugin/driver_paths.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace gns::dra {

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string out(dir);
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  if (out.empty()) return "/" + std::string(name);
  if (out.back() != '/') out.push_back('/');
  out.append(name);
  return out;
}

DriverPaths MakeDriverPaths(const SitePaths& site) {
  DriverPaths paths;
  const std::string driver(kDriverName);
  paths.plugins_registry_dir = JoinPath(site.kubelet_dir, "plugins_registry");
  paths.registration_socket = JoinPath(paths.plugins_registry_dir, driver + "-reg.sock");
  paths.plugin_dir = JoinPath(JoinPath(site.kubelet_dir, "plugins"), driver);
  paths.dra_socket = JoinPath(paths.plugin_dir, "dra.sock");
  paths.state_dir = JoinPath(site.state_dir, "dra-compute-domain");
  paths.checkpoint_file = JoinPath(paths.state_dir, "checkpoint.json");
  paths.claim_log_file = JoinPath(paths.state_dir, "claims.log");
  paths.cdi_dir = site.cdi_dir;
  paths.proc_devices = JoinPath(site.host_root.empty() ? "/" : site.host_root, "proc/devices");
  return paths;
}

}  // namespace gns::dra
