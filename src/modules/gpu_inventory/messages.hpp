#pragma once
// Bus messages of the `gpu-inventory` module: what GPUs this node has (retained), the node's
// NVLink clique (retained), XIDs that NVML reported (events), and the request to let go of
// NVML for a GPU reset and to take it back.

#include "loop/pci_address.hpp"

#include <nlohmann/json.hpp>

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_inventory {

// PCI location compared numerically (src/loop/pci_address.hpp): one type for every module.
using gns::PciAddress;

struct FabricInfo {
  std::string cluster_uuid;  // canonical 8-4-4-4-12 lower-case form
  uint32_t clique_id = 0;
  uint32_t state = 0;   // NVML_GPU_FABRIC_STATE_*: 3 = completed
  uint32_t status = 0;  // nvmlReturn_t, meaningful when state is completed
  // Fabric-attached: registration completed with success.
  bool Attached() const { return state == 3 && status == 0; }
  // An all-zero cluster UUID: NVLink through NVSwitches, but no multi-node NVLink (an HGX
  // node on its own). Such a GPU is in no clique, as the upstream DRA driver treats it.
  bool ZeroClusterUuid() const { return cluster_uuid == "00000000-0000-0000-0000-000000000000"; }
  bool operator==(const FabricInfo&) const = default;
};

// One MIG device (a compute instance inside a GPU instance) of a MIG-enabled GPU.
struct MigDeviceInfo {
  uint32_t index = 0;  // nvmlDeviceGetMigDeviceHandleByIndex slot on its parent
  std::string uuid;    // "MIG-…"
  uint32_t gpu_instance = 0;
  uint32_t compute_instance = 0;
  // Profile name as NVIDIA's tools spell it: "<g>g.<mem>gb", or "<c>c.<g>g.<mem>gb" when the
  // compute instance has fewer slices than its GPU instance (go-nvlib's rule; see MigProfileName).
  std::string profile;
  uint64_t memory_bytes = 0;
  uint32_t multiprocessors = 0;
  // The rest of nvmlDeviceAttributes_t, for GFD's per-profile labels: slices of the GPU and
  // compute instance, and the shared engines (copy, NVDEC, NVENC, NVJPG, OFA) the device sees.
  uint32_t gpu_instance_slices = 0;
  uint32_t compute_instance_slices = 0;
  uint32_t copy_engines = 0;
  uint32_t decoders = 0;
  uint32_t encoders = 0;
  uint32_t jpeg_engines = 0;
  uint32_t ofa_engines = 0;
  // The GPU instance's profile id and placement (nvmlGpuInstanceGetInfo: profileId, placement
  // start and size in memory slices): the DRA driver's MIG device name and memorySlice capacity
  // are made of them. placement_known is false while NVML has not said (older drivers).
  bool placement_known = false;
  uint32_t gi_profile_id = 0;
  uint32_t placement_start = 0;
  uint32_t placement_size = 0;
  bool operator==(const MigDeviceInfo&) const = default;
};

// "1g.10gb" from the attributes NVML reports for a MIG device and its parent's total memory:
// the MIG memory as a fraction of the GPU's, rounded up to eighths, times the GPU's memory in
// GiB rounded up, rounded to the nearest GB.
std::string MigProfileName(uint32_t gpu_instance_slices, uint32_t compute_instance_slices, uint64_t memory_size_mib,
                           uint64_t parent_memory_bytes);

// One NVLink of a GPU into an NVSwitch port: the switch (its PCI address) and port an SXid report
// names → the GPU. Read when the NVML session opens (nvmlDeviceGetNvLinkRemotePciInfo_v2, and
// nvmlDeviceGetFieldValues with NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID for the port), not on every
// refresh: the wiring of a baseboard does not change while the driver is loaded.
struct NvSwitchLink {
  uint32_t link = 0;    // the GPU's NVLink
  PciAddress nvswitch;  // the NVSwitch at the far end (function 0)
  uint32_t port = 0;    // the NVSwitch's link (port) number
  bool operator==(const NvSwitchLink&) const = default;
};

struct GpuInfo {
  uint32_t index = 0;
  std::string uuid;        // "GPU-…"
  std::string name;        // "NVIDIA H200"
  std::string pci_bus_id;  // as NVML reports it, e.g. "00000000:3B:00.0"
  PciAddress pci;
  uint32_t minor = 0;      // /dev/nvidia<minor>
  uint64_t memory_total_bytes = 0;
  int numa_node = -1;      // -1: unknown
  std::vector<std::string> nvlink_peers;  // UUIDs of local GPUs on the far end of an active NVLink
  // The GPU's NVLinks into NVSwitch ports, by link; empty without NVSwitches (PCIe GPUs, NVLink
  // bridges) or when NVML cannot name the remote port.
  std::vector<NvSwitchLink> nvswitch_links = {};
  // Set when NVML reports fabric info (any state); nullopt when the GPU has no fabric support.
  // Only Attached() ones count for the clique.
  std::optional<FabricInfo> fabric;
  // NvmlReleaseRequest for this GPU is in force and acknowledged: nothing in the process uses
  // its NVML handles (no events, no reads; the fields above are the last read), so the GPU is
  // not usable — its reset may run. The rest of the inventory stays available.
  bool released = false;
  std::string release_reason = {};
  // CUDA compute capability (9.0 for Hopper); 0.0 when NVML could not say.
  int cc_major = 0;
  int cc_minor = 0;
  // MIG: the current mode (nvmlDeviceGetMigMode) and, when enabled, its MIG devices in slot
  // order. A MIG-enabled GPU with no MIG devices has nothing to hand out.
  bool mig_enabled = false;
  std::vector<MigDeviceInfo> mig_devices = {};
  // nvmlDeviceGetBrand's nvmlBrandType_t (14 NVIDIA, 2 Tesla, …); nullopt when NVML could not say.
  std::optional<uint32_t> brand = {};
  bool operator==(const GpuInfo&) const = default;
};

// The node's GPUs. `available` is false while NVML cannot be used (not loaded, failing, or
// released for a reset): consumers must then treat every device as unavailable. While
// unavailable, `gpus` and `driver_version` are the last known ones (empty if NVML was never
// read), so a consumer can still name the devices it marks unhealthy.
struct GpuInventory {
  static constexpr std::string_view kTopic = "gpu-inventory.devices";
  static constexpr bool kRetained = true;
  bool available = false;
  std::string error;  // why not available
  std::string driver_version;
  // The CUDA version the driver supports, as NVML encodes it (12040 = 12.4); 0 when unknown.
  int cuda_driver_version = 0;
  std::vector<GpuInfo> gpus;

  const GpuInfo* FindByUuid(std::string_view uuid) const;
  // Matches domain, bus and device (a GPU is function 0; kernel lines omit the function).
  const GpuInfo* FindByPci(const PciAddress& pci) const;
  bool operator==(const GpuInventory&) const = default;
};

// "<clusterUuid>.<cliqueId>" when the node's GPUs are fabric-attached and agree; empty
// otherwise, with the reason (never a silent empty string: seed 000 §13). The clique is a
// property of the fabric, not of our NVML session: once read, it is kept while NVML is
// released or failing, and re-read when NVML is back.
struct NodeClique {
  static constexpr std::string_view kTopic = "gpu-inventory.clique";
  static constexpr bool kRetained = true;
  std::string clique_id;
  std::string reason;  // why clique_id is empty
  // True once NVML's fabric info was read: clique_id (or its absence) is a fact about the node.
  // False while gpu-inventory has not read it yet (starting, NVML missing or failing since
  // start): an empty clique_id then means "not known", and consumers must not act on it as
  // "no clique".
  bool known = false;
  bool operator==(const NodeClique&) const = default;
};

// An XID reported by NVML's event API (the kernel log is read by gpu-health).
struct XidObservation {
  static constexpr std::string_view kTopic = "gpu-inventory.xid";
  std::string uuid;
  uint64_t xid = 0;
  uint32_t gpu_instance = 0xFFFFFFFF;      // MIG attribution; 0xFFFFFFFF when none
  uint32_t compute_instance = 0xFFFFFFFF;
  int64_t observed_unix_ms = 0;
};

// Ask gpu-inventory to let go of NVML (release = true) so a GPU reset can run while the
// supervisor stays up; release = false takes it back. With `gpu_uuid` empty, the whole NVML:
// nvmlShutdown, every GPU unavailable (acknowledged by GpuInventory{available=false,
// error="released: <reason>"}). With a GPU's UUID, only that GPU: its events and reads stop, the
// other GPUs keep being served (acknowledged by that GpuInfo's `released`); taking it back
// re-reads it.
struct NvmlReleaseRequest {
  static constexpr std::string_view kTopic = "gpu-inventory.release-request";
  bool release = true;
  std::string reason;
  std::string gpu_uuid = {};  // empty: the whole NVML
};

// A reset of this GPU was accepted: its NvmlReleaseRequest follows within seconds. gpu-inventory
// no longer consumes it: its NVML event waiter is a child process a release kills, so no release
// sits out an nvmlEventSetWait_v2 (event_waiter.hpp); gpu-reset still publishes it for the status.
// `ahead = false` once the reset of that GPU ended, released or not. Retained per GPU, so a
// restarted gpu-inventory still knows.
struct NvmlReleaseAhead {
  static constexpr std::string_view kTopic = "gpu-inventory.release-ahead";
  static constexpr bool kRetained = true;
  std::string gpu_uuid;
  bool ahead = true;
  const std::string& RetainKey() const { return gpu_uuid; }
};

void to_json(nlohmann::json& j, const MigDeviceInfo& m);
void to_json(nlohmann::json& j, const FabricInfo& f);
void to_json(nlohmann::json& j, const NvSwitchLink& l);
void to_json(nlohmann::json& j, const GpuInfo& g);
void to_json(nlohmann::json& j, const GpuInventory& inv);
void to_json(nlohmann::json& j, const NodeClique& c);
void to_json(nlohmann::json& j, const XidObservation& x);
void to_json(nlohmann::json& j, const NvmlReleaseAhead& a);

}  // namespace gns::gpu_inventory
