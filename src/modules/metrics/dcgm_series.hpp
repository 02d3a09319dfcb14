#pragma once
// The per-pod GPU series under dcgm-exporter's names and labels (issue 27), rendered from plain
// values: the last usage + health pass of every GPU (gpu-inventory's GpuHealthSampler), the
// inventory (model names, /dev/nvidia minors, MIG profiles), the pod map (pod-resources) and the
// last XID per GPU. Pure: no I/O, no clock; unit-tested on its own.
//
// Compatibility with dcgm-exporter's last release (3.x/4.x, etc/default-counters.csv and its
// transformation/const.go), chosen over Prometheus' naming lint so dashboards and alerts keep
// working: counters keep their names without `_total`, label names keep their case (`UUID`,
// `modelName`, `Hostname` — dcgm-exporter's main branch renamed it `hostname` after the release;
// we follow the release), values keep their units (MHz, C, W, mJ, MiB, %).
//
// Series per device: a GPU without a holder gets one series without pod labels; a GPU (or MIG
// device) held by several containers (time-slicing replicas, several DRA claims) gets one series
// per container, each with the same GPU labels plus `pod`, `namespace`, `container` (and, for a
// DRA claim, `dra_claim_name`, `dra_claim_namespace`, `dra_driver_name`, `dra_pool_name`,
// `dra_device_name`). A MIG device's series carry `GPU_I_ID` and `GPU_I_PROFILE` with the parent
// GPU's `gpu`, `UUID`, `pci_bus_id` and `device`, and only what NVML answers for a MIG handle
// (frame buffer); the whole-GPU series of a MIG-enabled GPU carry the device-level readings.

#include "modules/gpu_inventory/api/health_sample.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/pod_resources/messages.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::metrics {

// The name prefix of every family rendered here (MetricsRegistry::AddForeignFamilies).
inline constexpr std::string_view kDcgmPrefix = "DCGM_FI_";

// One container holding a device, as its series label it.
struct DcgmHolder {
  std::string pod;
  std::string namespace_name;
  std::string container;
  // A DRA claim (empty otherwise).
  std::string dra_claim_name;
  std::string dra_claim_namespace;
  std::string dra_driver_name;
  std::string dra_pool_name;
  std::string dra_device_name;
  bool operator==(const DcgmHolder&) const = default;
};

// The DRA driver whose devices "gpu-<minor>" name whole GPUs (NVIDIA's k8s-dra-driver-gpu and
// our dra-gpu: the GPU's /dev/nvidia<minor>, not its NVML index; WIRE-FACTS §4).
inline constexpr std::string_view kGpuDraDriver = "gpu.nvidia.com";

// Who holds the device `uuid` (a GPU's "GPU-…" or a MIG device's "MIG-…"): device-plugin IDs
// equal to it or one of its time-slicing replicas ("<uuid>::<n>"), and DRA claim devices named
// by it, or by `dra_name` of kGpuDraDriver (dra-gpu's name for the device: "gpu-<minor>" of a
// whole GPU, "gpu-<minor>-mig-…" of a MIG device; "" when unknown). Sorted, without
// duplicates; empty while the map was never listed.
std::vector<DcgmHolder> HoldersOf(const pod_resources::GpuPodMap& pods, std::string_view uuid,
                                  const std::string& dra_name);

struct DcgmInputs {
  std::string hostname;
  // The last pass with kHealthUsage; ok = false or no GPUs: nothing is rendered.
  const gpu_inventory::HealthSample* sample = nullptr;
  const gpu_inventory::GpuInventory* inventory = nullptr;  // may be null: model names unknown
  const pod_resources::GpuPodMap* pods = nullptr;           // may be null: no pod labels
  const std::map<std::string, uint64_t>* last_xid = nullptr;  // GPU UUID → last XID (0: none seen)
};

// Every DCGM_FI_* family with at least one value, as exposition text (# HELP, # TYPE, samples).
std::string RenderDcgmFamilies(const DcgmInputs& inputs);

// How many series RenderDcgmFamilies wrote last for these inputs (for a gauge and the tests).
std::size_t CountSeries(std::string_view text);

}  // namespace gns::metrics
