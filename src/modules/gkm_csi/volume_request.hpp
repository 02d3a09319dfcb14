#pragma once
// What a NodePublishVolume asks for, read from the request (pure, tested alone), and whether the
// agent's verdict on the cache lets it be mounted. The answers are the gRPC codes the CSI spec
// gives them: INVALID_ARGUMENT for a request that can never work, NOT_FOUND for a cache this
// node does not know, FAILED_PRECONDITION for one that is not (or not yet) mountable here,
// UNAVAILABLE before the agent has listed its caches.

#include "modules/gkm_agent/messages.hpp"

#include <map>
#include <optional>
#include <string>

namespace gns::gkm_csi {

// The volumeAttributes of the pod's csi volume (seed 002's pod spec) and the pod keys the kubelet
// adds with podInfoOnMount: true.
inline constexpr const char* kAttrCacheName = "cacheName";
inline constexpr const char* kAttrCacheNamespace = "cacheNamespace";
inline constexpr const char* kAttrReadOnly = "readOnly";
inline constexpr const char* kAttrPodName = "csi.storage.k8s.io/pod.name";
inline constexpr const char* kAttrPodNamespace = "csi.storage.k8s.io/pod.namespace";
inline constexpr const char* kAttrPodUid = "csi.storage.k8s.io/pod.uid";
inline constexpr const char* kAttrEphemeral = "csi.storage.k8s.io/ephemeral";

// An error for the kubelet: a gRPC status code (grpc::StatusCode's value) and what, which, why.
struct CsiError {
  int code = 0;
  std::string message;
};
// grpc::StatusCode values, so that this part needs no gRPC header.
inline constexpr int kInvalidArgument = 3;
inline constexpr int kNotFound = 5;
inline constexpr int kAlreadyExists = 6;
inline constexpr int kFailedPrecondition = 9;
inline constexpr int kAborted = 10;
inline constexpr int kInternal = 13;
inline constexpr int kUnavailable = 14;

struct PublishRequest {
  std::string volume_id;
  std::string target_path;
  bool has_capability = false;
  bool block = false;             // a raw block volume was asked for
  bool readonly_flag = false;     // the request's `readonly` (the pod's volume readOnly)
  std::map<std::string, std::string> volume_context;
};

struct VolumeWish {
  bool cluster = false;  // no cacheNamespace: a ClusterGKMCache
  std::string cache_namespace;
  std::string cache_name;
  std::string key;  // gkm::CacheKey
  bool read_only = true;
  std::string pod_name;
  std::string pod_namespace;
  std::string pod_uid;
  // "GKMCache ml/kernel-x" / "ClusterGKMCache kernel-x": how messages name the cache.
  std::string Describe() const;
};

// The request checked and read, or INVALID_ARGUMENT with the reason.
struct ParsedPublish {
  std::optional<VolumeWish> wish;
  CsiError error;
};
ParsedPublish ParsePublish(const PublishRequest& request);

// Whether the agent's view lets `wish` be mounted on `node`: nullopt when it does.
std::optional<CsiError> CheckCache(const VolumeWish& wish, const gkm::CacheStates* states, const std::string& node);

}  // namespace gns::gkm_csi
