#pragma once
// The pure parts of the `gpu.nvidia.com` DRA driver (module dra-gpu): its names, the
// ResourceSlice devices for this node's whole GPUs and static MIG devices, the opaque
// `GpuConfig` and `MigDeviceConfig`, the decision for one
// claim (which of our GPUs it was allocated, with which config), its claim record's own members,
// and the per-claim CDI spec (built by the device plugin's CDI builder, so a container gets the
// same device nodes, driver files and hooks either way). No I/O except the spec file functions.

#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_specs.hpp"
#include "dra_plugin/slice.hpp"
#include "loop/atomic_file.hpp"
#include "loop/gpu_split.hpp"
#include "modules/device_plugin/api/cdi.hpp"
#include "modules/dra_gpu/messages.hpp"
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

// GpuDeviceName, MigDeviceName and their parser ParseDeviceName: messages.hpp.

// The GPUs of the inventory this driver serves: selected by `selection`, sorted by minor. A
// MIG-enabled GPU is served as its MIG devices, never whole.
std::vector<gpu_inventory::GpuInfo> ServedGpus(const gpu_inventory::GpuInventory& inventory,
                                               const GpuSelection& selection);

// One device of the slice: a whole GPU (mig == nullptr) or one MIG device of a MIG-enabled GPU.
// Points into the GpuInfo vector it was made from.
struct ServedDevice {
  std::string name;  // gpu-<minor> or MigDeviceName
  const gpu_inventory::GpuInfo* gpu = nullptr;
  const gpu_inventory::MigDeviceInfo* mig = nullptr;
};
// The slice's devices of `gpus`, in order: a GPU without MIG whole; a MIG-enabled GPU's MIG
// devices whose placement NVML reported (upstream's name needs it; one device per name).
std::vector<ServedDevice> ServedDevices(const std::vector<gpu_inventory::GpuInfo>& gpus);

// The slice's devices for the served GPUs (attributes and capacity: README.md), with the
// DeviceTaints `taints` holds for a device name (gpu_health_view.hpp, TaintsFor).
nlohmann::json GpuSliceDevices(const gpu_inventory::GpuInventory& inventory, const std::vector<gpu_inventory::GpuInfo>& gpus,
                               dra::ResourceApiVersion version,
                               const std::map<std::string, nlohmann::json>& taints = {});

// "80Gi", "81559Mi", or plain bytes: a resource.Quantity in BinarySI as the API prints one.
std::string BinaryQuantity(uint64_t bytes);

// The opaque GpuConfig's or MigDeviceConfig's sharing. Only what this build applies is accepted at prepare (see
// PlanGpuClaim); parsing checks the whole schema.
struct GpuSharing {
  std::string strategy;  // "" (no sharing section), "TimeSlicing", "MPS"
  std::string interval;  // GpuConfig's TimeSlicing: "Default", "Short", "Medium", "Long" ("" = Default)
  // MPS (`mpsConfig`, upstream's MpsConfig): the client-side limits, 0 / empty when not set.
  int active_thread_percentage = 0;                          // defaultActiveThreadPercentage, 1-100
  uint64_t pinned_memory_bytes = 0;                          // defaultPinnedDeviceMemoryLimit
  std::map<std::string, uint64_t> pinned_memory_per_device;  // defaultPerDevicePinnedMemoryLimit (index or UUID)
  bool multi_user = false;                                   // multiUser
  bool operator==(const GpuSharing&) const = default;
};
// A resource.Quantity as bytes: digits with an optional fraction and a binary (Ki … Ei) or
// decimal (k, M, G, T, P, E) suffix, or a JSON integer. Sets `error` (why) and returns 0 when it
// is not one.
uint64_t QuantityBytes(const nlohmann::json& value, std::string& error);
struct GpuConfigParse {
  std::optional<GpuSharing> sharing;  // set when valid
  std::string error;                  // JSON path and why
};
// Decodes opaque.parameters of kind GpuConfig; `where` is its JSON path.
GpuConfigParse ParseGpuConfig(const nlohmann::json& parameters, const std::string& where);
// Decodes opaque.parameters of kind MigDeviceConfig (upstream's MigDeviceSharing: strategy and
// mpsConfig; a MIG device has no time-slice interval).
GpuConfigParse ParseMigDeviceConfig(const nlohmann::json& parameters, const std::string& where);

// One GPU of a claim, as the record keeps it (driver_data "gpus").
struct ClaimGpu {
  std::string request;
  std::string device;  // gpu-<minor>, or a MIG device's name
  std::string uuid;    // the GPU's (a MIG device's parent)
  uint32_t minor = 0;
  // A MIG device: its UUID ("MIG-…"), GPU and compute instance; empty mig_uuid for a whole GPU.
  std::string mig_uuid = {};
  uint32_t gpu_instance = 0;
  uint32_t compute_instance = 0;
  bool Mig() const { return !mig_uuid.empty(); }
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

// MPS through DRA, with the control daemon left to the operator as for the device plugin's MPS
// (device_plugin/mps.hpp): the operator runs `nvidia-cuda-mps-control -d` for a device with
// CUDA_VISIBLE_DEVICES=<its UUID>, CUDA_MPS_PIPE_DIRECTORY=<mpsRoot>/gpu.nvidia.com/<device>/pipe
// and /dev/shm on <mpsRoot>/shm. A claim's containers get that pipe directory and the shm
// directory mounted, CUDA_MPS_PIPE_DIRECTORY, and the claim's client-side limits.
struct ClaimMps {
  std::string pipe_dir;  // on the host
  std::string shm_dir;   // on the host
  std::string container_pipe_dir;
  int active_thread_percentage = 0;  // 0: not set
  uint64_t pinned_memory_mib = 0;    // 0: not set
  bool operator==(const ClaimMps&) const = default;
};
// "<root>/gpu.nvidia.com/<device>/pipe": where the operator's control daemon for `device` listens.
std::string GpuMpsPipeDir(const std::string& mps_root, const std::string& device);
// The MPS set-up of a planned claim (its one device): nullopt unless its sharing is MPS.
std::optional<ClaimMps> MpsFor(const GpuClaimPlan& plan, const std::string& mps_root);
// The record's MPS set-up (driver_data "mps"); nullopt when it has none or it is malformed.
std::optional<ClaimMps> MpsOf(const dra::PreparedClaim& entry);
// The decision for a claim object read from the API: its results for this driver on this node's
// pool, each a device of `served` (by device name: a whole GPU or a MIG device), none held by
// another prepared claim in `state`, the configs of this driver decoded and applied per request
// (claim configs over class configs; a GpuConfig on a MIG device or a MigDeviceConfig on a whole
// GPU is refused).
GpuClaimPlan PlanGpuClaim(const nlohmann::json& claim, std::string_view expected_uid, const std::string& node_name,
                          const std::vector<gpu_inventory::GpuInfo>& served, const dra::Checkpoint& state);

// The record for a plan (not yet stamped: the core sets state and times); `mps`: MpsFor(plan).
dra::PreparedClaim RecordFor(std::string_view claim_uid, const std::string& node_name, const GpuClaimPlan& plan,
                             const std::optional<ClaimMps>& mps = std::nullopt);
// The GPUs a record names (empty when its "gpus" member is missing or malformed).
std::vector<ClaimGpu> GpusOf(const dra::PreparedClaim& entry);

// The claim's spec: one CDI device "<uid>-<device>" per device with its device nodes (a MIG
// device's also its /dev/nvidia-caps nodes), and the
// device plugin's spec-wide edits (control nodes, driver files, firmware, hooks).
// With `mps`, the claim's devices also carry the MPS edits (ClaimMps).
nlohmann::json BuildGpuClaimSpec(std::string_view claim_uid, const std::vector<ClaimGpu>& gpus,
                                 const device_plugin::CdiSettings& settings, const device_plugin::CdiHostFacts& facts,
                                 const std::optional<ClaimMps>& mps = std::nullopt);
std::string GpuClaimSpecContent(std::string_view claim_uid, const std::vector<ClaimGpu>& gpus,
                                const device_plugin::CdiSettings& settings, const device_plugin::CdiHostFacts& facts,
                                const std::optional<ClaimMps>& mps = std::nullopt);
std::string QualifiedGpuDeviceId(std::string_view claim_uid, std::string_view device);

}  // namespace gns::dra_gpu
