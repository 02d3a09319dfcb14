#pragma once
// GpuMaintenance through NVML (maintenance.hpp): each call dlopens the library (a reference to
// the one already loaded), initialises NVML, finds the GPU by UUID, makes its calls and shuts
// NVML down again, on the blocking pool.

#include "loop/blocking_pool.hpp"
#include "modules/gpu_inventory/api/maintenance.hpp"

#include <memory>
#include <mutex>
#include <string>

namespace gns::gpu_inventory {

class NvmlLibrary;

// Blocking: the reads of one GPU.
GpuMaintenanceRead InspectGpu(const NvmlLibrary& library, const std::string& uuid);
// Blocking: "" or why not.
std::string SetGpuPersistence(const NvmlLibrary& library, const std::string& uuid, bool enabled);

class NvmlMaintenance final : public GpuMaintenance {
 public:
  NvmlMaintenance(BlockingPool& pool, std::string library)
      : pool_(pool), library_(std::make_shared<LoadedLibrary>()) {
    library_->path = std::move(library);
  }

  void Inspect(const std::string& uuid, std::function<void(GpuMaintenanceRead)> done) override;
  void SetPersistence(const std::string& uuid, bool enabled, std::function<void(std::string)> done) override;

 private:
  // The library, dlopen'd at the first call and kept while the service lives (no dlopen per
  // call). Shared with the pool tasks.
  struct LoadedLibrary {
    std::mutex mutex;
    std::string path;
    std::shared_ptr<const NvmlLibrary> library;
    std::shared_ptr<const NvmlLibrary> Get(std::string& error);
  };
  BlockingPool& pool_;
  std::shared_ptr<LoadedLibrary> library_;
};

}  // namespace gns::gpu_inventory
