#pragma once
// The worker side of gpu-inventory: one initialised NVML (nvmlInit_v2 … nvmlShutdown) for
// reading the GPUs. Everything here blocks and runs on the blocking pool; NVML handles never
// leave it. The loop only holds the session to hand it back to the pool for Read() and Close(),
// one call at a time, and gets plain values (ReadResult) back. NVML's events are waited for in
// a child process (event_waiter.hpp), so no wait ever holds this session: closing it is one
// nvmlShutdown.

#include "modules/gpu_inventory/api/health_sample.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_inventory/nvml_library.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

// What the event waiter's registrations on a GPU follow: the event types the GPU supports and its
// MIG mode. Read with the inventory and by the waiter as it registers; where the two differ, the
// waiter's registrations are out of date (GpusWithNewEventBasis, event_waiter.hpp).
struct GpuEventBasis {
  std::optional<uint64_t> supported_events;  // nvmlDeviceGetSupportedEventTypes; nullopt: the call failed
  std::optional<uint32_t> mig_current;       // nvmlDeviceGetMigMode; nullopt: no MIG here, or it failed
  std::optional<uint32_t> mig_pending;
  bool operator==(const GpuEventBasis&) const = default;
};

// One read of every GPU, as plain values.
struct ReadResult {
  bool ok = false;
  std::string error;         // why not ok
  GpuInventory inventory;    // available = true when ok
  NodeClique clique;
  std::vector<std::string> warnings;          // non-fatal problems, for the log
  std::vector<std::string> failed_functions;  // NVML calls that failed, for nvml_errors_total
  std::map<std::string, GpuEventBasis> event_basis;  // UUID → what its event registrations follow
};

// GPUs released for their reset: NVML index (as last read) → UUID. Not touched at all at that
// index (no handle, no read, no events); a GPU found elsewhere with that UUID (the indices moved)
// is skipped too. They are absent from the read.
using ExcludedGpus = std::map<uint32_t, std::string>;

struct SessionOptions {
  std::string library;    // soname or path to dlopen
  std::string host_root;  // where the host's /sys is (NUMA fallback)
  ExcludedGpus excluded;
};

// Reads every GPU but the excluded ones through an initialised NVML. `switch_ports`: also which
// NVSwitch port each NVLink ends in (GpuInfo::nvswitch_links; one more NVML call per GPU with
// NVSwitch links). Blocking; thread-safe (NVML is).
ReadResult ReadInventory(const NvmlLibrary& library, const std::string& host_root,
                         const ExcludedGpus& excluded = {}, bool switch_ports = true);

// Reads `groups` (HealthGroup bits) of every GPU but the excluded ones through an initialised
// NVML, all GPUs in one pass, and counts the NVIDIA GPUs on the host's PCI bus. A reading NVML
// cannot give (NOT_SUPPORTED, FUNCTION_NOT_FOUND, a symbol this driver lacks) stays empty;
// other errors name the function in the GPU's failed_functions; GPU_IS_LOST marks the GPU lost
// and ends its reading. `known` (the inventory last read) names a GPU that NVML cannot name any
// more (lost before its UUID was read). ok = false only when the GPUs cannot be counted.
// Blocking; thread-safe (NVML is).
HealthSample ReadHealth(const NvmlLibrary& library, uint32_t groups, const std::string& host_root,
                        const ExcludedGpus& excluded = {}, const std::vector<GpuInfo>& known = {});

// NVIDIA GPUs (vendor 0x10de, class display VGA 0x0300xx or 3D controller 0x0302xx) under
// <host_root>/sys/bus/pci/devices: their PCI addresses as sysfs names them ("0000:3b:00.0"),
// sorted; nullopt when that folder cannot be read.
std::optional<std::vector<std::string>> ListPciGpus(const std::string& host_root);
// How many ListPciGpus finds.
std::optional<uint32_t> CountPciGpus(const std::string& host_root);

class NvmlSession {
 public:
  struct Opened {
    std::shared_ptr<NvmlSession> session;  // null when opening failed (read.error says why)
    ReadResult read;
  };
  struct Closed {
    std::vector<std::string> warnings;
    std::vector<std::string> failed_functions;
  };

  // dlopen, nvmlInit_v2, read every GPU (with its NVSwitch ports). Blocking.
  static Opened Open(const SessionOptions& options);

  // Close() if Close was not called.
  ~NvmlSession();
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;

  // Re-reads every GPU (refresh), but not the NVSwitch ports: those of the open. Blocking.
  ReadResult Read() const;
  // One health pass (ReadHealth) over this session's GPUs. Blocking.
  HealthSample ReadHealth(uint32_t groups, const std::vector<GpuInfo>& known = {}) const {
    return gpu_inventory::ReadHealth(*library_, groups, options_.host_root, options_.excluded, known);
  }
  // nvmlShutdown. Blocking; idempotent (a second call gets an empty Closed).
  Closed Close();
  // The GPUs this session leaves alone (its event waiter must too).
  const ExcludedGpus& Excluded() const { return options_.excluded; }

 private:
  NvmlSession(std::shared_ptr<const NvmlLibrary> library, SessionOptions options)
      : library_(std::move(library)), options_(std::move(options)) {}

  std::shared_ptr<const NvmlLibrary> library_;
  SessionOptions options_;
  bool initialized_ = false;
  // GpuInfo::nvswitch_links as read at Open, by UUID (immutable after Open).
  std::map<std::string, std::vector<NvSwitchLink>> switch_links_;
};

}  // namespace gns::gpu_inventory
