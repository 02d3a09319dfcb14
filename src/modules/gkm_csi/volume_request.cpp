// Reading a NodePublishVolume and judging it against the agent's verdicts: see volume_request.hpp.
#include "modules/gkm_csi/volume_request.hpp"

namespace gns::gkm_csi {

namespace {

std::string Get(const std::map<std::string, std::string>& m, const char* key) {
  const auto it = m.find(key);
  return it == m.end() ? std::string() : it->second;
}

// A Kubernetes object name (DNS subdomain) or namespace (DNS label): what can be a path component
// of ours. Anything else (a "..", a slash) never reaches a path.
bool ValidName(const std::string& s, std::size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (const char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return s.front() != '.' && s.front() != '-' && s.back() != '-' && s.back() != '.';
}

CsiError Invalid(std::string message) { return CsiError{kInvalidArgument, std::move(message)}; }

}  // namespace

std::string VolumeWish::Describe() const {
  return cluster ? "ClusterGKMCache " + cache_name : "GKMCache " + cache_namespace + "/" + cache_name;
}

ParsedPublish ParsePublish(const PublishRequest& r) {
  ParsedPublish out;
  if (r.volume_id.empty()) {
    out.error = Invalid("volume_id is required");
    return out;
  }
  if (r.target_path.empty() || r.target_path.front() != '/') {
    out.error = Invalid("target_path must be an absolute path, got \"" + r.target_path + "\"");
    return out;
  }
  if (!r.has_capability) {
    out.error = Invalid("volume_capability is required");
    return out;
  }
  if (r.block) {
    out.error = Invalid("volume " + r.volume_id + ": csi.gkm.io serves file system volumes only, not raw block");
    return out;
  }
  VolumeWish w;
  w.cache_name = Get(r.volume_context, kAttrCacheName);
  w.cache_namespace = Get(r.volume_context, kAttrCacheNamespace);
  if (w.cache_name.empty()) {
    out.error = Invalid("volume " + r.volume_id + ": volumeAttributes.cacheName is required (the GKMCache or "
                        "ClusterGKMCache to mount)");
    return out;
  }
  if (!ValidName(w.cache_name, 253)) {
    out.error = Invalid("volume " + r.volume_id + ": cacheName \"" + w.cache_name + "\" is not an object name");
    return out;
  }
  w.cluster = w.cache_namespace.empty();
  if (!w.cluster && (!ValidName(w.cache_namespace, 63) || w.cache_namespace.find('.') != std::string::npos)) {
    out.error = Invalid("volume " + r.volume_id + ": cacheNamespace \"" + w.cache_namespace + "\" is not a namespace");
    return out;
  }
  const std::string ro = Get(r.volume_context, kAttrReadOnly);
  if (ro.empty() || ro == "true") {
    w.read_only = true;
  } else if (ro == "false") {
    w.read_only = false;  // the seed's opt-in to a writable cache
  } else {
    out.error = Invalid("volume " + r.volume_id + ": readOnly must be \"true\" or \"false\", got \"" + ro + "\"");
    return out;
  }
  if (r.readonly_flag) w.read_only = true;  // the pod's volume is read-only: that wins
  w.key = gkm::CacheKey(w.cluster, w.cache_namespace, w.cache_name);
  w.pod_name = Get(r.volume_context, kAttrPodName);
  w.pod_namespace = Get(r.volume_context, kAttrPodNamespace);
  w.pod_uid = Get(r.volume_context, kAttrPodUid);
  out.wish = std::move(w);
  return out;
}

std::optional<CsiError> CheckCache(const VolumeWish& wish, const gkm::CacheStates* states, const std::string& node) {
  if (!states || !states->listed) {
    return CsiError{kUnavailable, wish.Describe() + ": gkm-agent has not listed the caches of node " + node +
                                      " yet; try again"};
  }
  const auto it = states->caches.find(wish.key);
  if (it == states->caches.end()) {
    return CsiError{kNotFound, wish.Describe() + " does not exist (node " + node + " knows no such cache)"};
  }
  const gkm::CacheView& v = it->second;
  if (v.state != "Ready") {
    // A newer image or digest is pulled (or its pull failed) while the copy installed before is
    // still the agent's, checked against this node's GPUs: that copy is what a pod gets, as the
    // pods already running have it (the agent never replaces it under them).
    if (!v.serving_gpus.empty()) return std::nullopt;
    std::string why = wish.Describe() + " is " + v.state + " on node " + node;
    if (!v.reason.empty()) why += " (" + v.reason + (v.message.empty() ? "" : ": " + v.message) + ")";
    why += ": only a Ready cache is mounted";
    return CsiError{kFailedPrecondition, why};
  }
  if (v.compatible_gpus.empty()) {
    return CsiError{kFailedPrecondition,
                    wish.Describe() + ": no GPU of node " + node + " can use it (not mounted)"};
  }
  return std::nullopt;
}

}  // namespace gns::gkm_csi
