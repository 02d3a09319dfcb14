#pragma once
// `gpu-node-supervisor inventory`: what gpu-inventory sees on this node, read once through NVML
// (the same dlopen and reads the module makes) and printed as JSON — the GPUs with UUID, PCI,
// minor, memory, NUMA, NVLink peers and fabric info, and the node's clique. For an operator
// comparing with nvidia-smi, and for checking a new driver or GPU model before rollout.

#include <string>

namespace gns {

// Prints {"inventory": …, "clique": …, "warnings": […]} on stdout and returns 0; when NVML cannot be
// loaded or read, says why on stderr and returns 1.
int RunInventory(const std::string& nvml_library, const std::string& host_root);

}  // namespace gns
