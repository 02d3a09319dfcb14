#pragma once
// `gpu-node-supervisor preflight`: the node checks of seed 000's operator guide (§3.4, §3.6,
// §3.7) run now on this host, through the same check code as the imex-health module
// (modules/imex_health/host_checks, unit_watcher's ReadUnitOnce): binaries, unit enabled and
// active, config keys, node map rules and freshness, channel major, channel0, NVML clique,
// nvidia-imex-ctl's domain state (modules/imex_health/domain_check), and — with API
// credentials — the map against the Nodes of this clique (as imex-peers renders it).
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
  // The node map against the Nodes of this clique in the API (skipped without credentials):
  std::string kubeconfig;                  // "": $KUBECONFIG, else in-cluster when it runs in a pod
  std::string node_name;                   // "": $NODE_NAME, else the host name
  std::string clique_label = "nvidia.com/gpu.clique";
  std::string address_type = "internalIP"; // internalIP | hostname: what the map lists
  std::string imex_ctl = "/usr/bin/nvidia-imex-ctl";  // under host_root
  int timeout_seconds = 5;                 // per nvidia-imex-ctl call and per API request
};

// Exit code: 0 nothing failed (warnings allowed), 1 a check failed.
int RunPreflight(const PreflightOptions& options);

}  // namespace gns
