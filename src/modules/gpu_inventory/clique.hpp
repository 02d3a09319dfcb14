#pragma once
// The node's NVLink clique from per-GPU fabric info, as the NVIDIA DRA driver derives it
// (WIRE-FACTS §8.5): fabric-attached GPUs (state completed, status success) must all agree on
// one cluster UUID and one clique id, giving "<clusterUuid>.<cliqueId>". A GPU whose cluster UUID
// is all zero (NVSwitch node without multi-node NVLink) counts as not attached, as upstream's
// kubelet plugin treats it: such a node has no clique. Pure functions, so the rules are tested
// without NVML.

#include "modules/gpu_inventory/messages.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

// NVML's 16 raw bytes as a canonical lower-case 8-4-4-4-12 UUID.
std::string FormatClusterUuid(const unsigned char* bytes, std::size_t size);

// `fabric_errors` are GPUs whose fabric info could not be read (other than "not supported"):
// the clique is then unknown, because the GPU we could not read might disagree.
NodeClique ComputeClique(const std::vector<GpuInfo>& gpus, const std::vector<std::string>& fabric_errors = {});

}  // namespace gns::gpu_inventory
