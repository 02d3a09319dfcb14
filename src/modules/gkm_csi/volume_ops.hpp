#pragma once
// The blocking halves of NodePublishVolume and NodeUnpublishVolume, and what a start finds again
// after a crash. Run on the pool; each returns its error as a value.
//
// Order, so that a kill -9 at any instant leaves a state the next start reads correctly:
//  - publish: (under the cache-use lock, gkm_agent/api/usage.hpp) the usage record is written,
//    then the target created and mounted; a failed mount takes the record out again. So every
//    mount of ours has a record; a record without its mount is a publish that did not finish.
//  - unpublish: unmount, remove the target, then (under the lock) take the record out.
//  - recovery: every record whose target is a mount point in /proc/self/mountinfo is a published
//    volume again; the others are dropped from their usage.json.

#include "modules/gkm_agent/api/usage.hpp"
#include "modules/gkm_csi/volume_request.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gns::gkm_csi {

struct PublishJob {
  std::string source;     // the cache's directory
  std::string usage_dir;  // the cache's usage directory
  std::string target;
  bool read_only = true;
  gkm::UsageRecord record;
};
std::optional<CsiError> PublishVolume(const PublishJob& job);

struct UnpublishJob {
  std::string target;
  std::string usage_dir;  // empty: no record of ours to take out
  std::string volume_id;
};
std::optional<CsiError> UnpublishVolume(const UnpublishJob& job);

// NodeGetVolumeStats of a published volume, measured as the kubelet measures an emptyDir
// (MetricsDu): used = what the tree under the target takes on disk (st_blocks, hard links
// once, not crossing into other mounts), and its inodes; total / available = the file system's
// (statvfs of the target: the cache's file system, shared with other caches).
struct VolumeStats {
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
  int64_t available_bytes = 0;
  int64_t used_inodes = 0;
  int64_t total_inodes = 0;
  int64_t free_inodes = 0;
};
// NOT_FOUND when the target is gone, INTERNAL when it cannot be read.
std::optional<CsiError> MeasureVolume(const std::string& target, VolumeStats& out);

struct RecoveredVolume {
  std::string key;  // the cache (gkm::CacheKey), from where its usage.json lies
  gkm::UsageRecord record;
};
struct Recovery {
  std::vector<RecoveredVolume> volumes;
  std::vector<std::string> dropped;  // "volume <id> at <target>: not mounted"
  std::vector<std::string> errors;
};
Recovery RecoverVolumes(const std::string& usage_root, const std::string& mountinfo = "/proc/self/mountinfo");

}  // namespace gns::gkm_csi
