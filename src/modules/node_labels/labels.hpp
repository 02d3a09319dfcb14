#pragma once
// The GPU node labels (the part of NVIDIA's GPU Feature Discovery every scheduler needs), from
// the GPU inventory, the node's clique and what the device plugin advertises (pure). Names,
// values and when each appears follow GFD (k8s-device-plugin internal/lm: resource.go,
// mig-strategy.go, nvml.go); see the module's README for the table.
//   nvidia.com/gpu.product/.count/.memory/.family/.compute.major/.compute.minor/.replicas/
//     .sharing-strategy      the node's GPU model (the first GPU's), or under mig.strategy
//                            single the MIG profile every GPU is cut into
//   nvidia.com/cuda.driver.*, cuda.driver-version.*, cuda.runtime.*, cuda.runtime-version.*
//   nvidia.com/mig.strategy  single | mixed (absent under none, as GFD)
//   nvidia.com/mig-<profile>.product/.count/.replicas/.sharing-strategy/.memory/
//     .multiprocessors/.slices.gi/.slices.ci/.engines.{copy,decoder,encoder,jpeg,ofa}
//                            per MIG profile under mig.strategy mixed
//   nvidia.com/gpu.clique    <clusterUuid>.<cliqueId> when the node has one

#include "modules/device_plugin/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gns::node_labels {

using Labels = std::map<std::string, std::string>;

// A label value as Kubernetes accepts it: at most 63 of [A-Za-z0-9-_.], starting and ending
// with an alphanumeric; other characters become '-'.
std::string LabelValue(const std::string& text);

// GFD's product value: each part loses the characters outside [A-Za-z0-9-_. ], its runs of
// spaces become one '-', and the parts are joined with '-' ("NVIDIA H100 80GB HBM3", "MIG",
// "1g.10gb" → "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"); then made a valid label value.
std::string ProductName(const std::vector<std::string>& parts);

// "hopper" for 9.x, "ampere" for 8.0-8.8, "ada-lovelace" for 8.9, …; "undefined" when unknown.
std::string ArchFamily(int cc_major, int cc_minor);

// Labels for what is known: no inventory read yet → no GPU labels; no plugin state → no
// sharing/MIG labels; no clique → no clique label (so the writer's apply drops them).
Labels ComputeLabels(const gpu_inventory::GpuInventory* inventory, const gpu_inventory::NodeClique* clique,
                     const device_plugin::DevicePluginState* plugin);

}  // namespace gns::node_labels
