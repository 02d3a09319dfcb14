#pragma once
// A service gpu-inventory offers (Services::Find<GpuMaintenance>()) for a GPU reset: what a
// reset must know about one GPU and the one setting it changes, read through NVML the way
// `nvidia-smi` would as a separate client (its own nvmlInit_v2 … nvmlShutdown around the calls;
// NVML counts references, so the inventory's own session is not disturbed, and no handle is kept
// afterwards). Works for a GPU released from the inventory's session too. Calls block, so they
// run on the blocking pool; completions run on the loop.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

struct GpuProcess {
  uint32_t pid = 0;
  uint64_t used_memory_bytes = 0;
};

struct GpuMaintenanceRead {
  std::string error;  // "" when the GPU was read; otherwise why not (NVML missing, no such GPU, …)
  // nullopt where the driver does not support the query.
  std::optional<bool> persistence;
  std::optional<std::vector<GpuProcess>> compute_processes;
  std::optional<bool> retired_pages_pending;
  std::optional<bool> remap_pending;
  std::optional<bool> remap_failure;
  bool Ok() const { return error.empty(); }
};

class GpuMaintenance {
 public:
  virtual ~GpuMaintenance() = default;
  // Loop thread; `done` on the loop.
  virtual void Inspect(const std::string& uuid, std::function<void(GpuMaintenanceRead)> done) = 0;
  // nvmlDeviceSetPersistenceMode; done("") or done(why).
  virtual void SetPersistence(const std::string& uuid, bool enabled, std::function<void(std::string)> done) = 0;
};

}  // namespace gns::gpu_inventory
