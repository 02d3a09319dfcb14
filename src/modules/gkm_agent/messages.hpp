#pragma once
// Bus messages of the `gkm-agent` module: the kernel caches this node holds and the agent's
// verdict on each (retained). The agent is the one judge of "Ready and usable by a GPU here";
// the CSI node plugin (gkm-csi) follows it and mounts only what it says is Ready.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gkm {

// "cluster/<name>" for a ClusterGKMCache, "namespaced/<namespace>/<name>" for a GKMCache: the
// cache's directory under cacheRoot and usageRoot, and its key everywhere (layout.hpp says why
// the first component names the scope).
inline std::string CacheKey(bool cluster, const std::string& ns, const std::string& name) {
  return cluster ? "cluster/" + name : "namespaced/" + ns + "/" + name;
}

struct CacheView {
  bool cluster = false;
  std::string ns;  // empty for a ClusterGKMCache
  std::string name;
  std::string state;  // Pending, Pulling, Ready, Incompatible, Failed
  std::string reason;
  std::string message;
  std::string digest;
  uint64_t size_bytes = 0;
  std::string directory;   // <cacheRoot>/<key>: the files (present while Ready)
  std::string usage_dir;   // <usageRoot>/<key>: usage.json, and the lock (api/usage.hpp)
  std::vector<uint32_t> compatible_gpus;  // indices of the GPUs that can use it
  // The copy installed in `directory` that this agent checked (its kernels against this node's
  // GPUs) and still vouches for, whatever `state` says: while a newer image or digest is pulled
  // (Pending, Pulling) or after its pull failed (Failed: a registry outage does not take a good
  // copy away), new volumes get this copy until the new one is installed Ready. `serving_gpus`
  // empty: nothing to serve (never installed, incompatible, removed, an install that failed
  // half-way). `serving_digest` is "" when the file system keeps no user xattr to say it.
  std::string serving_digest;
  std::vector<uint32_t> serving_gpus;
  bool operator==(const CacheView&) const = default;
};

struct CacheStates {
  static constexpr std::string_view kTopic = "gkm.caches";
  static constexpr bool kRetained = true;
  std::string cache_root;
  std::string usage_root;
  // Both watches have listed and the start's sweep is done: a cache missing from `caches` does
  // not exist (before, it may just not be known yet).
  bool listed = false;
  std::map<std::string, CacheView> caches;  // by CacheKey
  bool operator==(const CacheStates&) const = default;
};

inline void to_json(nlohmann::json& j, const CacheView& v) {
  j = nlohmann::json{{"state", v.state}, {"digest", v.digest}, {"directory", v.directory},
                     {"compatibleGpus", v.compatible_gpus}};
  if (!v.reason.empty()) j["reason"] = v.reason;
}

inline void to_json(nlohmann::json& j, const CacheStates& s) {
  j = nlohmann::json{{"listed", s.listed}, {"caches", s.caches}};
}

}  // namespace gns::gkm
