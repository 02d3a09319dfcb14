#pragma once
// A dlopen'd libnvidia-ml with its entry points resolved (nvml_abi.hpp). Immutable once open, so
// any thread may call through it; dlclose runs when the last owner lets go. NVML calls block:
// only the blocking pool and the XID waiter call through this, never the loop.

#include "modules/gpu_inventory/api/nvml_abi.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace gns::gpu_inventory {

class NvmlLibrary {
 public:
  // Loads `path` (a soname, searched like the dynamic linker does, or a file path) with
  // RTLD_LAZY | RTLD_GLOBAL as go-nvml does. nullptr and `error` (naming the library and
  // dlerror()) when it cannot be loaded or lacks a required symbol.
  static std::shared_ptr<const NvmlLibrary> Open(const std::string& path, std::string& error);

  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const nvml::Api& Api() const { return api_; }
  const std::string& Path() const { return path_; }
  // "GPU is lost (15)": nvmlErrorString plus the code.
  std::string Describe(nvml::Return code) const;

 private:
  NvmlLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}

  void* handle_;
  std::string path_;
  nvml::Api api_;
};

// An nvmlDeviceGetFieldValues answer as an unsigned number, whatever value type the driver chose;
// nullopt for a negative value or an unknown type.
std::optional<uint32_t> FieldValueAsUnsigned(const nvml::FieldValue& field);
// A cumulative 64-bit counter (NVLink throughput in KiB): every width kept; negative or
// non-integral types are no value.
std::optional<uint64_t> FieldValueAsCounter(const nvml::FieldValue& field);

}  // namespace gns::gpu_inventory
