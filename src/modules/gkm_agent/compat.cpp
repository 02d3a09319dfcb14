// Triton kernel-cache metadata and the per-GPU verdict (see compat.hpp).
#include "modules/gkm_agent/compat.hpp"

#include "modules/gkm_agent/image.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace gns::gkm {

namespace fs = std::filesystem;

namespace {

constexpr uintmax_t kMaxMetadataBytes = 1024 * 1024;

std::string Join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

}  // namespace

std::vector<TritonKernel> ScanTritonCache(const std::string& root) {
  std::vector<TritonKernel> kernels;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
  if (ec) throw PullError("NoCacheMetadata", "cannot read " + root + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw PullError("NoCacheMetadata", "cannot read " + root + ": " + ec.message());
    const auto& entry = *it;
    // symlink_status: links are not followed (extraction kept them inside, but why read twice).
    if (!fs::is_regular_file(entry.symlink_status()) || entry.path().extension() != ".json") continue;
    if (entry.file_size(ec) > kMaxMetadataBytes || ec) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    const auto j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    const auto hash = j.find("hash");
    const auto target = j.find("target");
    if (hash == j.end() || !hash->is_string() || target == j.end() || !target->is_object()) continue;
    TritonKernel k;
    k.file = fs::relative(entry.path(), root, ec).string();
    if (const auto b = target->find("backend"); b != target->end() && b->is_string()) k.backend = b->get<std::string>();
    if (const auto a = target->find("arch"); a != target->end()) {
      if (a->is_string()) k.arch = a->get<std::string>();
      if (a->is_number_integer()) k.arch = std::to_string(a->get<int64_t>());
    }
    if (const auto w = target->find("warp_size"); w != target->end() && w->is_number_integer()) k.warp_size = w->get<int>();
    if (const auto p = j.find("ptx_version"); p != j.end() && p->is_number_integer()) k.ptx_version = p->get<int>();
    if (k.backend.empty() || k.arch.empty()) continue;
    kernels.push_back(std::move(k));
  }
  if (kernels.empty()) {
    throw PullError("NoCacheMetadata", "no Triton kernel metadata (*.json with \"hash\" and \"target\") in the image");
  }
  std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.file < b.file; });
  return kernels;
}

int CudaVersionForPtx(int ptx) {
  // PTX ISA → first CUDA release that loads it (NVIDIA's PTX ISA release notes).
  if (ptx == 60) return 9000;  // 6.x: CUDA 9.0–10.2
  if (ptx == 61) return 9010;
  if (ptx == 62) return 9020;
  if (ptx == 63) return 10000;
  if (ptx == 64) return 10010;
  if (ptx == 65) return 10020;
  if (ptx >= 70 && ptx <= 78) return 11000 + (ptx - 70) * 10;                    // 7.x: CUDA 11.x
  if (ptx >= 80 && ptx <= 85) return 12000 + (ptx - 80) * 10;                    // 8.0–8.5: CUDA 12.0–12.5
  if (ptx == 86) return 12070;
  if (ptx == 87) return 12080;
  if (ptx == 88) return 12090;
  if (ptx >= 90 && ptx <= 99) return 13000 + (ptx - 90) * 10;
  return 0;
}

std::string CudaVersionText(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

std::vector<GpuVerdict> CheckCompatibility(const std::vector<TritonKernel>& kernels, const std::vector<GpuFacts>& gpus,
                                           int cuda_driver_version) {
  std::vector<GpuVerdict> out;
  std::set<std::string> backends, cuda_archs;
  for (const auto& k : kernels) {
    backends.insert(k.backend);
    if (k.backend == "cuda") cuda_archs.insert("sm_" + k.arch);
  }
  for (const auto& gpu : gpus) {
    GpuVerdict v;
    v.index = gpu.index;
    if (gpu.cc_major <= 0) {
      v.reason = "UnknownGpu";
      v.message = "NVML did not report the compute capability of GPU " + std::to_string(gpu.index);
      out.push_back(std::move(v));
      continue;
    }
    const std::string arch = std::to_string(gpu.cc_major * 10 + gpu.cc_minor);
    const std::string sm = "sm_" + arch;
    if (!backends.count("cuda")) {
      v.reason = "BackendMismatch";
      v.message = "kernels built for backend " + Join(backends) + ", GPU " + std::to_string(gpu.index) + " (" +
                  gpu.name + ") is cuda";
      out.push_back(std::move(v));
      continue;
    }
    int needed_cuda = 0;  // the least CUDA version among the kernels for this arch
    bool arch_match = false;
    for (const auto& k : kernels) {
      if (k.backend != "cuda" || k.arch != arch || (k.warp_size != 0 && k.warp_size != 32)) continue;
      arch_match = true;
      const int need = k.ptx_version ? CudaVersionForPtx(*k.ptx_version) : 0;
      if (cuda_driver_version == 0 || need <= cuda_driver_version) {
        v.compatible = true;
        break;
      }
      if (needed_cuda == 0 || need < needed_cuda) needed_cuda = need;
    }
    if (!v.compatible) {
      if (!arch_match) {
        v.reason = "ArchitectureMismatch";
        v.message = "kernels built for " + Join(cuda_archs) + ", GPU " + std::to_string(gpu.index) + " (" + gpu.name +
                    ") is " + sm + " (compute capability " + std::to_string(gpu.cc_major) + "." +
                    std::to_string(gpu.cc_minor) + ")";
      } else {
        v.reason = "DriverTooOld";
        v.message = "kernels for " + sm + " need CUDA " + CudaVersionText(needed_cuda) + ", the driver supports CUDA " +
                    CudaVersionText(cuda_driver_version);
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

CacheReason IncompatibleReason(const std::vector<GpuVerdict>& verdicts) {
  std::map<std::string, std::size_t> gpus_by_reason;
  std::string messages;
  for (const auto& v : verdicts) {
    if (v.compatible) continue;
    ++gpus_by_reason[v.reason];
    messages += (messages.empty() ? "" : "; ") + v.message;
  }
  if (gpus_by_reason.empty()) return {"NoGpus", "no GPU on this node"};
  auto most = gpus_by_reason.begin();
  for (auto it = gpus_by_reason.begin(); it != gpus_by_reason.end(); ++it) {
    if (it->second > most->second) most = it;  // strictly more: a tie keeps the first by name
  }
  return {most->first, "no GPU on this node can use the cache: " + messages};
}

}  // namespace gns::gkm
