// GpuMaintenance through NVML: a separate NVML client per call (see nvml_maintenance.hpp).
#include "modules/gpu_inventory/nvml_maintenance.hpp"

#include "modules/gpu_inventory/nvml_library.hpp"

#include <utility>

namespace gns::gpu_inventory {
namespace {

// nvmlInit_v2 … nvmlShutdown around `body(device)` for the GPU with `uuid`; "" or why not.
template <typename Body>
std::string WithGpu(const NvmlLibrary& library, const std::string& uuid, Body&& body) {
  const nvml::Api& api = library.Api();
  nvml::Return rc = api.nvmlInit_v2();
  if (rc != nvml::kSuccess) return "nvmlInit_v2 failed: " + library.Describe(rc);
  std::string error;
  nvml::Device device = nullptr;
  rc = api.nvmlDeviceGetHandleByUUID(uuid.c_str(), &device);
  if (rc != nvml::kSuccess) {
    error = "nvmlDeviceGetHandleByUUID(" + uuid + ") failed: " + library.Describe(rc);
  } else {
    error = body(api, device);
  }
  api.nvmlShutdown();
  return error;
}

std::optional<bool> EnabledOrNothing(nvml::Return rc, nvml::EnableState state) {
  if (rc != nvml::kSuccess) return std::nullopt;
  return state == nvml::kFeatureEnabled;
}

}  // namespace

GpuMaintenanceRead InspectGpu(const NvmlLibrary& library, const std::string& uuid) {
  GpuMaintenanceRead read;
  read.error = WithGpu(library, uuid, [&](const nvml::Api& api, nvml::Device device) -> std::string {
    if (api.nvmlDeviceGetPersistenceMode != nullptr) {
      nvml::EnableState mode = nvml::kFeatureDisabled;
      const nvml::Return rc = api.nvmlDeviceGetPersistenceMode(device, &mode);  // before `mode` is read
      read.persistence = EnabledOrNothing(rc, mode);
    }
    if (api.nvmlDeviceGetComputeRunningProcesses_v3 != nullptr) {
      // The count can grow between the two calls: retry a few times with the new size.
      std::vector<nvml::ProcessInfo> infos(8);
      for (int attempt = 0; attempt < 4; ++attempt) {
        auto count = static_cast<unsigned int>(infos.size());
        const nvml::Return rc = api.nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos.data());
        if (rc == nvml::kErrorInsufficientSize) {
          infos.resize(count + 8);
          continue;
        }
        if (rc != nvml::kSuccess) {
          return "nvmlDeviceGetComputeRunningProcesses_v3(" + uuid + ") failed: " + library.Describe(rc);
        }
        std::vector<GpuProcess> processes;
        for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
          processes.push_back({infos[i].pid, infos[i].usedGpuMemory});
        }
        read.compute_processes = std::move(processes);
        break;
      }
      if (!read.compute_processes) return "the process list of " + uuid + " kept growing while it was read";
    }
    if (api.nvmlDeviceGetRetiredPagesPendingStatus != nullptr) {
      nvml::EnableState pending = nvml::kFeatureDisabled;
      const nvml::Return rc = api.nvmlDeviceGetRetiredPagesPendingStatus(device, &pending);
      read.retired_pages_pending = EnabledOrNothing(rc, pending);
    }
    if (api.nvmlDeviceGetRemappedRows != nullptr) {
      unsigned int corrected = 0, uncorrected = 0, pending = 0, failure = 0;
      if (api.nvmlDeviceGetRemappedRows(device, &corrected, &uncorrected, &pending, &failure) == nvml::kSuccess) {
        read.remap_pending = pending != 0;
        read.remap_failure = failure != 0;
      }
    }
    return "";
  });
  return read;
}

std::string SetGpuPersistence(const NvmlLibrary& library, const std::string& uuid, bool enabled) {
  return WithGpu(library, uuid, [&](const nvml::Api& api, nvml::Device device) -> std::string {
    if (api.nvmlDeviceSetPersistenceMode == nullptr) return "this driver has no nvmlDeviceSetPersistenceMode";
    const nvml::Return rc =
        api.nvmlDeviceSetPersistenceMode(device, enabled ? nvml::kFeatureEnabled : nvml::kFeatureDisabled);
    if (rc != nvml::kSuccess) return "nvmlDeviceSetPersistenceMode(" + uuid + ") failed: " + library.Describe(rc);
    return "";
  });
}

std::shared_ptr<const NvmlLibrary> NvmlMaintenance::LoadedLibrary::Get(std::string& error) {
  std::lock_guard lock(mutex);
  if (!library) library = NvmlLibrary::Open(path, error);
  return library;
}

void NvmlMaintenance::Inspect(const std::string& uuid, std::function<void(GpuMaintenanceRead)> done) {
  pool_.Run(
      [library = library_, uuid] {
        std::string error;
        const auto lib = library->Get(error);
        GpuMaintenanceRead failed;
        failed.error = error;
        if (!lib) return failed;
        return InspectGpu(*lib, uuid);
      },
      [done = std::move(done)](GpuMaintenanceRead read, std::exception_ptr error) {
        if (error) {
          read = GpuMaintenanceRead{};
          read.error = "NVML inspection threw";
        }
        done(std::move(read));
      });
}

void NvmlMaintenance::SetPersistence(const std::string& uuid, bool enabled, std::function<void(std::string)> done) {
  pool_.Run(
      [library = library_, uuid, enabled] {
        std::string error;
        const auto lib = library->Get(error);
        if (!lib) return error;
        return SetGpuPersistence(*lib, uuid, enabled);
      },
      [done = std::move(done)](std::string result, std::exception_ptr error) {
        done(error ? std::string("setting persistence mode threw") : std::move(result));
      });
}

}  // namespace gns::gpu_inventory
