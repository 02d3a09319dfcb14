#pragma once
// usage.json: which pods use a cache, kept by the CSI node plugin (gkm-csi) in
// <usageRoot>/<cache key>/usage.json and read by the agent (seed 002: "the CSI Driver will record
// pod data in a file ... for GKM Agent to pull usage data from"). The seed's shape: pod name →
// [{podName, podNamespace, volumeId, volumeSize, targetPath, startTime}]; we add podUid and
// readOnly. Written atomically (temp, fsync, rename, fsync of the directory).
//
// The lock: both sides take an exclusive flock(2) on the cache's usage directory around what must
// not interleave: the plugin records a volume and mounts it under the lock, the agent checks for
// records and removes (or replaces) the cache's directory under the lock. So a cache is never
// removed between a publish's check and its mount, whichever thread or process runs either side.
// Blocking, all of it: on the pool.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gkm {

struct UsageRecord {
  std::string pod_name;
  std::string pod_namespace;
  std::string pod_uid;
  std::string volume_id;
  std::string target_path;
  std::string start_time;  // RFC 3339, UTC
  uint64_t volume_size = 0;
  bool read_only = true;
  bool operator==(const UsageRecord&) const = default;
};

struct UsageRead {
  bool ok = true;       // false: the file exists but is not a usage file (error says why)
  std::string error;
  std::vector<UsageRecord> records;
};

// Parses usage.json text; entries without a volumeId are skipped (not ours to act on).
UsageRead ParseUsage(std::string_view text);
// The seed's shape: an object keyed by pod name (the volume id when the pod is not known).
std::string SerializeUsage(const std::vector<UsageRecord>& records);

// <usage_dir>/usage.json: a missing file is no records; bounded, regular files only.
UsageRead ReadUsageFile(const std::string& usage_dir);
// Replaces <usage_dir>/usage.json atomically; throws std::runtime_error on failure.
void WriteUsageFile(const std::string& usage_dir, const std::vector<UsageRecord>& records);

// The cache keys ("cluster/<name>", "namespaced/<ns>/<name>") under `usage_root` whose
// usage.json names a volume, or cannot be read (then assumed in use: fail safe).
std::vector<std::string> CacheKeysInUse(const std::string& usage_root);

// An exclusive flock on `usage_dir` (created, with its parents, when missing) for the object's
// life. Throws std::system_error.
class CacheUseLock {
 public:
  explicit CacheUseLock(const std::string& usage_dir);
  ~CacheUseLock();
  CacheUseLock(const CacheUseLock&) = delete;
  CacheUseLock& operator=(const CacheUseLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace gns::gkm
