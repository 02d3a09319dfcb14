#pragma once
// Our own CDI spec for the devices the plugin advertises (kind nvidia.com/gpu by default), so
// `deviceListStrategy: cdi-cri` / `cdi-annotations` work with no other tool on the node:
//   - one CDI device per GPU and per MIG device, under the configured ID (UUID or index), plus
//     `all`; a GPU's device nodes are /dev/nvidia<minor>, a MIG device's add its GPU and compute
//     instance capability nodes (/dev/nvidia-caps/nvidia-cap<N>, N from
//     /proc/driver/nvidia-caps/mig-minors);
//   - spec-wide edits: the control nodes that exist (/dev/nvidiactl, nvidia-uvm, nvidia-uvm-tools,
//     nvidia-modeset) and read-only mounts of the driver's user-space files, found through the
//     linker cache (<driverRoot>/etc/ld.so.cache) and <driverRoot>/usr/bin, and of the GSP
//     firmware of the driver's version (/lib/firmware/nvidia/<version>/gsp*.bin);
//   - when the container toolkit's hook binary is on the host, the two createContainer hooks
//     its own specs carry for these libraries: create-symlinks (libcuda.so -> libcuda.so.1, …)
//     and update-ldcache (the library folders into the container's linker cache).
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
  // The driver's version as the toolkit infers it (libcuda.so.<version> behind the cache's
  // libcuda.so.1, else libnvidia-ml's, else the kernel module's); empty when unknown.
  std::string driver_version;
  std::vector<std::string> firmware_files;  // GSP firmware, paths in the driver root
  // The hook binary as the runtime runs it (a host path); empty: no hooks.
  std::string hook_path;
  // create-symlinks' "<target>::<link>" pairs, container paths.
  std::vector<std::string> symlinks;
  std::vector<std::string> warnings;
};

struct CdiSettings {
  std::string kind = "nvidia.com/gpu";
  std::string driver_root = "/";  // where the driver's files are on the host
  // The container toolkit's hook binary on the host (the runtime runs it, outside the container):
  // "auto" takes the first of kCdiHookCandidates present and executable under the host root; an
  // absolute path is used only when present there; empty turns the hooks off.
  std::string hook_path = "auto";
};

// Where "auto" looks: the toolkit package's binary, the GPU operator's install, and the older
// nvidia-ctk whose `hook` subcommand runs the same hooks.
inline constexpr const char* kCdiHookCandidates[] = {"/usr/bin/nvidia-cdi-hook",
                                                     "/usr/local/nvidia/toolkit/nvidia-cdi-hook", "/usr/bin/nvidia-ctk"};

// The linker cache's libraries whose soname starts with one of `prefixes` (e.g. "libcuda.so"),
// for this machine's word size and architecture; paths as the cache stores them, one per soname
// (the first the cache lists, as the dynamic linker picks). `error` is set
// for a file that is not a glibc ld.so.cache (new format, "glibc-ld.so.cache1.1").
std::vector<std::string> LibrariesFromLdCache(const std::string& cache_bytes, const std::vector<std::string>& prefixes,
                                              std::string& error);

// /proc/driver/nvidia-caps/mig-minors ("gpu0/gi1/access 12", "gpu0/gi1/ci0/access 13", …).
void ParseMigMinors(const std::string& text, CdiHostFacts& facts);
// "<hostRoot>/proc/driver/nvidia-caps/mig-minors".
std::string MigMinorsPath(const std::string& host_root);
// The MIG capability nodes a container needs to open MIG `device` (its GPU instance's and its
// compute instance's /dev/nvidia-caps/nvidia-cap<N>), from the parsed mig-minors in `facts`;
// empty with `error` naming the missing entry when one is not there.
std::vector<std::string> MigCapNodes(const PhysicalDevice& device, const CdiHostFacts& facts, std::string& error);

// The "<target>::<link>" pairs of the toolkit's create-symlinks hook for these library paths
// (sonames as the cache lists them), `root` being where they are on this machine: libcuda.so ->
// libcuda.so.1 and libnvidia-opticalflow.so -> libnvidia-opticalflow.so.1 always (programs
// dlopen them by those names), another library's "lib<x>.so" when the host has that symlink
// beside it.
std::vector<std::string> DriverSymlinks(const std::string& root, const std::vector<std::string>& libraries);

// The GSP firmware files of `version`: <dir>/nvidia/<version>/gsp*.bin in the kernel's firmware
// search order (`custom_path` from /sys/module/firmware_class/parameters/path when set,
// /lib/firmware/updates/<release>, /lib/firmware/updates, /lib/firmware/<release>,
// /lib/firmware), looked up under `root`; paths relative to it, each once.
std::vector<std::string> FirmwareFiles(const std::string& root, const std::string& version, const std::string& release,
                                       const std::string& custom_path);

// Reads the host: control nodes, MIG minors and the hook binary under `host_root`, the driver's
// files under `host_root` + the driver root. Blocking.
CdiHostFacts DiscoverCdiHostFacts(const std::string& host_root, const CdiSettings& settings);

// The spec, from the physical devices of the plan (each once).
nlohmann::json BuildCdiSpec(const CdiSettings& settings, const std::vector<PhysicalDevice>& devices,
                            const CdiHostFacts& facts);

// Checks a spec against the CDI rules (WIRE-FACTS §6): known cdiVersion at least what the content
// needs, kind and device names well formed and unique, at least one device, absolute paths,
// hooks with a known hookName, an absolute path and a positive timeout if any.
// Returns the first problem, empty when valid.
std::string ValidateCdiSpec(const nlohmann::json& spec);

// The spec's file name in the CDI directory: "<vendor>-<class>.json" (the producer API's rule).
std::string CdiSpecFileName(const std::string& kind);

}  // namespace gns::device_plugin
