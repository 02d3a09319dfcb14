// Loading NVML.
#include "modules/gpu_inventory/nvml_library.hpp"

#include <dlfcn.h>

namespace gns::gpu_inventory {

std::shared_ptr<const NvmlLibrary> NvmlLibrary::Open(const std::string& path, std::string& error) {
  dlerror();  // clear a stale message (dlerror state is per thread)
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    error = "cannot load NVML library " + path + ": " + (why != nullptr ? why : "unknown dlopen error");
    return nullptr;
  }
  std::shared_ptr<NvmlLibrary> library(new NvmlLibrary(handle, path));
  const auto missing = nvml::ResolveApi(library->api_, [handle](const char* name) { return dlsym(handle, name); });
  if (!missing.empty()) {
    error = "NVML library " + path + " lacks required symbols:";
    for (const auto name : missing) error += " " + std::string(name);
    return nullptr;  // the destructor dlcloses it
  }
  return library;
}

NvmlLibrary::~NvmlLibrary() {
  // Nothing useful to do if dlclose fails: the mapping simply stays.
  if (handle_ != nullptr) dlclose(handle_);
}

std::string NvmlLibrary::Describe(nvml::Return code) const {
  const char* text = api_.nvmlErrorString != nullptr ? api_.nvmlErrorString(code) : nullptr;
  return std::string(text != nullptr ? text : "NVML error") + " (" + std::to_string(code) + ")";
}

std::optional<uint32_t> FieldValueAsUnsigned(const nvml::FieldValue& field) {
  switch (field.valueType) {
    case nvml::kValueTypeUnsignedInt: return field.value.uiVal;
    case nvml::kValueTypeUnsignedLong: return static_cast<uint32_t>(field.value.ulVal);
    case nvml::kValueTypeUnsignedLongLong: return static_cast<uint32_t>(field.value.ullVal);
    case nvml::kValueTypeUnsignedShort: return field.value.usVal;
    case nvml::kValueTypeSignedInt:
      if (field.value.siVal >= 0) return static_cast<uint32_t>(field.value.siVal);
      return std::nullopt;
    case nvml::kValueTypeSignedLongLong:
      if (field.value.sllVal >= 0) return static_cast<uint32_t>(field.value.sllVal);
      return std::nullopt;
    case nvml::kValueTypeDouble:
      if (field.value.dVal >= 0) return static_cast<uint32_t>(field.value.dVal);
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::optional<uint64_t> FieldValueAsCounter(const nvml::FieldValue& field) {
  switch (field.valueType) {
    case nvml::kValueTypeUnsignedInt: return field.value.uiVal;
    case nvml::kValueTypeUnsignedLong: return field.value.ulVal;
    case nvml::kValueTypeUnsignedLongLong: return field.value.ullVal;
    case nvml::kValueTypeUnsignedShort: return field.value.usVal;
    case nvml::kValueTypeSignedInt:
      if (field.value.siVal >= 0) return static_cast<uint64_t>(field.value.siVal);
      return std::nullopt;
    case nvml::kValueTypeSignedLongLong:
      if (field.value.sllVal >= 0) return static_cast<uint64_t>(field.value.sllVal);
      return std::nullopt;
    default: return std::nullopt;
  }
}

}  // namespace gns::gpu_inventory
