// Host paths of a DRA kubelet plugin.
#include "dra_plugin/plugin_paths.hpp"

namespace gns::dra {

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string out(dir);
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  if (out.empty()) return "/" + std::string(name);
  if (out.back() != '/') out.push_back('/');
  out.append(name);
  return out;
}

PluginPaths MakePluginPaths(const SitePaths& site, std::string_view driver_name, std::string_view state_folder) {
  PluginPaths paths;
  const std::string driver(driver_name);
  paths.plugins_registry_dir = JoinPath(site.kubelet_dir, "plugins_registry");
  paths.registration_socket = JoinPath(paths.plugins_registry_dir, driver + "-reg.sock");
  paths.plugin_dir = JoinPath(JoinPath(site.kubelet_dir, "plugins"), driver);
  paths.dra_socket = JoinPath(paths.plugin_dir, "dra.sock");
  paths.state_dir = JoinPath(site.state_dir, state_folder);
  paths.checkpoint_file = JoinPath(paths.state_dir, "checkpoint.json");
  paths.claim_log_file = JoinPath(paths.state_dir, "claims.log");
  paths.cdi_dir = site.cdi_dir;
  return paths;
}

}  // namespace gns::dra
