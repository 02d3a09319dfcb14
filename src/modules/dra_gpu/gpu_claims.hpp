#pragma once
// The pure parts of the `gpu.nvidia.com` DRA driver (module dra-gpu): its names, the
// ResourceSlice devices for this node's whole GPUs, the opaque `GpuConfig`, the decision for one
// claim (which of our GPUs it was allocated, with which config), its claim record's own members,
// and the per-claim CDI spec (built by the device plugin's CDI builder, so a container gets the
// same device nodes, driver files and hooks either way). No I/O except the spec file functions.

#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_specs.hpp"
#include "dra_plugin/slice.hpp"
#include "loop/atomic_file.hpp"
#include "loop/gpu_split.hpp"
#include "modules/device_plugin/api/cdi.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra_gpu {

// ResourceSlice.spec.driver, PluginInfo.name and the opaque-config driver.
inline constexpr std::string_view kDriverName = "gpu.nvidia.com";
// <stateDir>/dra-gpu: this driver's checkpoint and claim log.
inline constexpr std::string_view kStateFolder = "dra-gpu";
// Per-claim CDI specs: kind k8s.gpu.nvidia.com/claim, files k8s.gpu.nvidia.com-claim_<uid>.json.
inline constexpr std::string_view kCdiVendor = "k8s.gpu.nvidia.com";
inline constexpr std::string_view kConfigApiVersion = "resource.nvidia.com/v1beta1";
inline constexpr std::string_view kGpuConfigKind = "GpuConfig";
inline constexpr std::string_view kMigDeviceConfigKind = "MigDeviceConfig";

const dra::ClaimSpecNames& GpuSpecNames();

// "gpu-<minor>": upstream's name for a whole GPU (its minor, not its index).
std::string GpuDeviceName(uint32_t minor);
std::optional<uint32_t> MinorOfDeviceName(std::string_view device);

// The GPUs of the inventory this driver serves: selected by `selection`, not MIG-enabled (MIG
// devices are not served yet), sorted by minor.
std::vector<gpu_inventory::GpuInfo> ServedGpus(const gpu_inventory::GpuInventory& inventory,
                                               const GpuSelection& selection);

// The slice's devices for the served GPUs (attributes and capacity: README.md), with the
// DeviceTaints `taints` holds for a GPU's UUID (gpu_health_view.hpp, TaintsFor).
nlohmann::json GpuSliceDevices(const gpu_inventory::GpuInventory& inventory, const std::vector<gpu_inventory::GpuInfo>& gpus,
                               dra::ResourceApiVersion version,
                               const std::map<std::string, nlohmann::json>& taints = {});

// "80Gi", "81559Mi", or plain bytes: a resource.Quantity in BinarySI as the API prints one.
std::string BinaryQuantity(uint64_t bytes);

// The opaque GpuConfig's sharing. Only what this build applies is accepted at prepare (see
// PlanGpuClaim); parsing checks the whole schema.
struct GpuSharing {
  std::string strategy;  // "" (no sharing section), "TimeSlicing", "MPS"
  std::string interval;  // TimeSlicing: "Default", "Short", "Medium", "Long" ("" = Default)
  bool operator==(const GpuSharing&) const = default;
};
struct GpuConfigParse {
  std::optional<GpuSharing> sharing;  // set when valid
  std::string error;                  // JSON path and why
};
// Decodes opaque.parameters of kind GpuConfig; `where` is its JSON path.
GpuConfigParse ParseGpuConfig(const nlohmann::json& parameters, const std::string& where);

// One GPU of a claim, as the record keeps it (driver_data "gpus").
struct ClaimGpu {
  std::string request;
  std::string device;  // gpu-<minor>
  std::string uuid;
  uint32_t minor = 0;
  bool operator==(const ClaimGpu&) const = default;
};

struct GpuClaimPlan {
  std::string error;       // non-empty: refused
  bool permanent = true;   // for an error: false when the kubelet's retry may succeed
  std::string namespace_name;
  std::string name;
  std::vector<ClaimGpu> gpus;  // in allocation order
  GpuSharing sharing;
};
// The decision for a claim object read from the API: its results for this driver on this node's
// pool, each a GPU in `served` (by device name), none held by another prepared claim in `state`,
// the configs of this driver decoded and applied per request (claim configs over class configs).
GpuClaimPlan PlanGpuClaim(const nlohmann::json& claim, std::string_view expected_uid, const std::string& node_name,
                          const std::vector<gpu_inventory::GpuInfo>& served, const dra::Checkpoint& state);

// The record for a plan (not yet stamped: the core sets state and times).
dra::PreparedClaim RecordFor(std::string_view claim_uid, const std::string& node_name, const GpuClaimPlan& plan);
// The GPUs a record names (empty when its "gpus" member is missing or malformed).
std::vector<ClaimGpu> GpusOf(const dra::PreparedClaim& entry);

// The claim's spec: one CDI device "<uid>-gpu-<minor>" per GPU with its device nodes, and the
// device plugin's spec-wide edits (control nodes, driver files, firmware, hooks).
nlohmann::json BuildGpuClaimSpec(std::string_view claim_uid, const std::vector<ClaimGpu>& gpus,
                                 const device_plugin::CdiSettings& settings, const device_plugin::CdiHostFacts& facts);
std::string GpuClaimSpecContent(std::string_view claim_uid, const std::vector<ClaimGpu>& gpus,
                                const device_plugin::CdiSettings& settings, const device_plugin::CdiHostFacts& facts);
std::string QualifiedGpuDeviceId(std::string_view claim_uid, std::string_view device);

}  // namespace gns::dra_gpu
