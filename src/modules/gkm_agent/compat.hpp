#pragma once
// Kernel-cache compatibility per GPU, from the cache's own metadata. A Triton cache directory
// holds, per compiled kernel, a JSON file with "hash", "target" {"backend", "arch",
// "warp_size"} and "ptx_version" beside the binaries (.cubin, .ptx, …). A GPU can use the
// cache when at least one kernel was built for its backend (cuda) and its architecture
// (compute capability major*10+minor), with a PTX ISA its driver's CUDA version can load.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gns::gkm {

struct TritonKernel {
  std::string file;     // relative to the cache root
  std::string backend;  // "cuda", "hip"
  std::string arch;     // "90" for cuda (sm_90), "gfx942" for hip
  int warp_size = 0;
  std::optional<int> ptx_version;  // 84 = PTX ISA 8.4
};

// Scans an extracted cache (files of at most 1 MiB named *.json). Throws PullError
// ("NoCacheMetadata") when no kernel metadata is found; a metadata file that is not valid
// JSON is skipped (Triton also writes other JSON files, e.g. __grp__*.json groups).
std::vector<TritonKernel> ScanTritonCache(const std::string& root);

struct GpuFacts {
  uint32_t index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
};

struct GpuVerdict {
  uint32_t index = 0;
  bool compatible = false;
  std::string reason;   // "BackendMismatch", "ArchitectureMismatch", "DriverTooOld", "UnknownGpu"
  std::string message;  // what the kernels want and what this GPU has
};

// The CUDA version (major*1000 + minor*10, NVML's encoding) that first loads PTX ISA
// `ptx_version` (84 → 12040); 0 for an unknown ISA.
int CudaVersionForPtx(int ptx_version);
std::string CudaVersionText(int cuda_version);  // 12040 → "12.4"

// One verdict per GPU, in the order given. `cuda_driver_version` 0 = unknown (PTX unchecked).
std::vector<GpuVerdict> CheckCompatibility(const std::vector<TritonKernel>& kernels, const std::vector<GpuFacts>& gpus,
                                           int cuda_driver_version);

// The cache-level reason of a cache no GPU here can use, from its GPUs' verdicts: the reason
// most GPUs have (`ArchitectureMismatch`, …; a tie goes to the first by name), which is what
// the cluster roll-up keys its failed nodes by; the message says it for each GPU. "NoGpus" for
// a node without GPUs.
struct CacheReason {
  std::string reason;
  std::string message;
};
CacheReason IncompatibleReason(const std::vector<GpuVerdict>& verdicts);

}  // namespace gns::gkm
