#pragma once
// `gpu-node-supervisor preflight`: the node checks of seed 000's operator guide (§3.4, §3.6,
// §3.7) run now on this host, through the same check code as the imex-health module
// (modules/imex_health/host_checks, unit_watcher's ReadUnitOnce): binaries, unit enabled and
// active, config keys, node map rules and freshness, channel major, channel0, NVML clique.
// Printed as a table or as {"checks":[{"name","status","message","fix"}]}.

#include <string>
#include <vector>

namespace gns {

struct PreflightOptions {
  std::string host_root = "/";
  std::string unit = "nvidia-imex.service";
  std::string bus_address;                 // "": $DBUS_SYSTEM_BUS_ADDRESS, else the system bus
  std::vector<std::string> config_files;   // empty: the module's defaults
  std::string nodes_config;                // empty: the module's default
  std::vector<std::string> self;           // this node in the map; empty: the host's global addresses
  std::string nvml_library = "libnvidia-ml.so.1";
  bool skip_nvml = false;
  bool resolve = true;
  std::string output = "text";             // text | json
};

// Exit code: 0 nothing failed (warnings allowed), 1 a check failed.
int RunPreflight(const PreflightOptions& options);

}  // namespace gns
