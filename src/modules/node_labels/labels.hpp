#pragma once
// The GPU node labels (the part of NVIDIA's GPU Feature Discovery every scheduler needs), from
// the GPU inventory, the node's clique and what the device plugin advertises (pure).
//   nvidia.com/gpu.product       the first GPU's name, spaces as '-', "-SHARED" when nvidia.com/gpu
//                                is time-sliced without renaming (GFD's rule)
//   nvidia.com/gpu.count         GPUs on the node
//   nvidia.com/gpu.memory        the first GPU's memory in MiB
//   nvidia.com/gpu.family        architecture from the compute capability (hopper, ampere, …)
//   nvidia.com/cuda.driver.major/minor/rev   the driver version's parts (550.90.07 → 550, 90, 07)
//   nvidia.com/mig.strategy      none | single | mixed
//   nvidia.com/gpu.replicas      time-slicing replicas of nvidia.com/gpu (1 when not shared)
//   nvidia.com/gpu.sharing-strategy  time-slicing | none
//   nvidia.com/gpu.clique        <clusterUuid>.<cliqueId> when the node has one

#include "modules/device_plugin/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <map>
#include <optional>
#include <string>

namespace gns::node_labels {

using Labels = std::map<std::string, std::string>;

// A label value as Kubernetes accepts it: at most 63 of [A-Za-z0-9-_.], starting and ending
// with an alphanumeric; other characters become '-'.
std::string LabelValue(const std::string& text);

// "hopper" for 9.x, "ampere" for 8.0-8.8, "ada-lovelace" for 8.9, …; "undefined" when unknown.
std::string ArchFamily(int cc_major, int cc_minor);

// Labels for what is known: no inventory read yet → no GPU labels; no plugin state → no
// sharing/MIG labels; no clique → no clique label (so the writer's apply drops them).
Labels ComputeLabels(const gpu_inventory::GpuInventory* inventory, const gpu_inventory::NodeClique* clique,
                     const device_plugin::DevicePluginState* plugin);

}  // namespace gns::node_labels
