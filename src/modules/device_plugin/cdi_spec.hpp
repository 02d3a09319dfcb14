#pragma once
// Our own CDI spec for the devices the plugin advertises (kind nvidia.com/gpu by default), so
// `deviceListStrategy: cdi-cri` / `cdi-annotations` work with no other tool on the node:
//   - one CDI device per GPU and per MIG device, under the configured ID (UUID or index), plus
//     `all`; a GPU's device nodes are /dev/nvidia<minor>, a MIG device's add its GPU and compute
//     instance capability nodes (/dev/nvidia-caps/nvidia-cap<N>, N from
//     /proc/driver/nvidia-caps/mig-minors);
//   - spec-wide edits: the control nodes that exist (/dev/nvidiactl, nvidia-uvm, nvidia-uvm-tools,
//     nvidia-modeset) and read-only mounts of the driver's user-space files, found through the
//     linker cache (<driverRoot>/etc/ld.so.cache) and <driverRoot>/usr/bin.
// Building and discovery are separate: discovery reads the host (blocking, on the pool),
// building is pure and unit-tested; validation follows the CDI rules in WIRE-FACTS §6.

#include "modules/device_plugin/resource_plan.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gns::device_plugin {

struct CdiHostFacts {
  std::vector<std::string> control_nodes;  // container paths that exist on the host, e.g. /dev/nvidiactl
  // (GPU minor, GPU instance) → cap minor of ".../gi<N>/access"; (minor, gi, ci) → ".../ci<M>/access".
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> gi_caps;
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> ci_caps;
  std::vector<std::string> driver_files;  // paths in the driver root (host paths with driverRoot "/")
  std::vector<std::string> warnings;
};

struct CdiSettings {
  std::string kind = "nvidia.com/gpu";
  std::string driver_root = "/";  // where the driver's files are on the host
};

// The linker cache's libraries whose soname starts with one of `prefixes` (e.g. "libcuda.so"),
// for this machine's word size and architecture; paths as the cache stores them, one per soname
// (the first the cache lists, as the dynamic linker picks). `error` is set
// for a file that is not a glibc ld.so.cache (new format, "glibc-ld.so.cache1.1").
std::vector<std::string> LibrariesFromLdCache(const std::string& cache_bytes, const std::vector<std::string>& prefixes,
                                              std::string& error);

// /proc/driver/nvidia-caps/mig-minors ("gpu0/gi1/access 12", "gpu0/gi1/ci0/access 13", …).
void ParseMigMinors(const std::string& text, CdiHostFacts& facts);

// Reads the host: control nodes and MIG minors under `host_root`, the driver's files under
// `host_root` + `driver_root`. Blocking.
CdiHostFacts DiscoverCdiHostFacts(const std::string& host_root, const std::string& driver_root);

// The spec, from the physical devices of the plan (each once).
nlohmann::json BuildCdiSpec(const CdiSettings& settings, const std::vector<PhysicalDevice>& devices,
                            const CdiHostFacts& facts);

// Checks a spec against the CDI rules (WIRE-FACTS §6): known cdiVersion at least what the content
// needs, kind and device names well formed and unique, at least one device, absolute paths.
// Returns the first problem, empty when valid.
std::string ValidateCdiSpec(const nlohmann::json& spec);

// The spec's file name in the CDI directory: "<vendor>-<class>.json" (the producer API's rule).
std::string CdiSpecFileName(const std::string& kind);

}  // namespace gns::device_plugin
