// Publish, unpublish and recovery on the pool: see volume_ops.hpp.
#include "modules/gkm_csi/volume_ops.hpp"

#include "modules/gkm_csi/mounts.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <set>
#include <utility>

namespace gns::gkm_csi {

namespace fs = std::filesystem;

namespace {

std::vector<gkm::UsageRecord> Without(std::vector<gkm::UsageRecord> records, const std::string& volume_id) {
  std::erase_if(records, [&](const gkm::UsageRecord& r) { return r.volume_id == volume_id; });
  return records;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::optional<CsiError> PublishVolume(const PublishJob& job) {
  const std::string& id = job.record.volume_id;
  try {
    gkm::CacheUseLock lock(job.usage_dir);
    // The agent removes a deleted cache under this lock: past this check it stays until our
    // record is gone.
    if (!IsDirectory(job.source)) {
      return CsiError{kFailedPrecondition, "volume " + id + ": the cache's directory " + job.source +
                                               " is gone (the cache was deleted meanwhile)"};
    }
    if (const auto existing = MountAt(ReadMountTable(), job.target)) {
      return CsiError{kAlreadyExists, "volume " + id + ": " + job.target + " is already a mount point (" +
                                          existing->source + ", not a volume of ours)"};
    }
    const auto usage = gkm::ReadUsageFile(job.usage_dir);
    if (!usage.ok) return CsiError{kInternal, "volume " + id + ": " + usage.error};
    auto records = Without(usage.records, id);
    records.push_back(job.record);
    gkm::WriteUsageFile(job.usage_dir, records);
    bool created = false;
    try {
      if (::mkdir(job.target.c_str(), 0750) == 0) {
        created = true;
      } else if (errno != EEXIST || !IsDirectory(job.target)) {
        throw std::system_error(errno, std::generic_category(), "mkdir " + job.target);
      }
      BindMount(job.source, job.target, job.read_only);
    } catch (const std::exception& e) {
      // Not mounted: the record goes again, and the target if we made it.
      if (created) ::rmdir(job.target.c_str());
      try {
        gkm::WriteUsageFile(job.usage_dir, Without(records, id));
      } catch (const std::exception&) {
        // Left for the next start's recovery (a record whose target is no mount point goes).
      }
      return CsiError{kInternal, "volume " + id + ": " + e.what()};
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return CsiError{kInternal, "volume " + id + ": " + e.what()};
  }
}

std::optional<CsiError> UnpublishVolume(const UnpublishJob& job) {
  try {
    UnmountAll(job.target);
    if (::rmdir(job.target.c_str()) != 0 && errno != ENOENT) {
      // Not ours to empty: a directory with files and no mount is something else's.
      return CsiError{kInternal, "volume " + job.volume_id + ": remove " + job.target + ": " + std::strerror(errno)};
    }
    if (!job.usage_dir.empty()) {
      gkm::CacheUseLock lock(job.usage_dir);
      const auto usage = gkm::ReadUsageFile(job.usage_dir);
      if (!usage.ok) return CsiError{kInternal, "volume " + job.volume_id + ": " + usage.error};
      auto records = Without(usage.records, job.volume_id);
      if (records.size() != usage.records.size()) gkm::WriteUsageFile(job.usage_dir, records);
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return CsiError{kInternal, "volume " + job.volume_id + ": " + e.what()};
  }
}

Recovery RecoverVolumes(const std::string& usage_root, const std::string& mountinfo) {
  Recovery out;
  // <usage_root>/cluster/<name>/usage.json and <usage_root>/namespaced/<ns>/<name>/usage.json.
  std::vector<std::pair<std::string, std::string>> dirs;  // key, directory
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(usage_root) / "cluster", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory()) dirs.emplace_back("cluster/" + it->path().filename().string(), it->path().string());
  }
  ec.clear();
  for (fs::directory_iterator ns(fs::path(usage_root) / "namespaced", ec), end; !ec && ns != end; ns.increment(ec)) {
    if (!ns->is_directory()) continue;
    std::error_code inner;
    for (fs::directory_iterator it(ns->path(), inner), e2; !inner && it != e2; it.increment(inner)) {
      if (it->is_directory()) {
        dirs.emplace_back("namespaced/" + ns->path().filename().string() + "/" + it->path().filename().string(),
                          it->path().string());
      }
    }
  }
  if (dirs.empty()) return out;
  std::vector<MountEntry> table;
  try {
    table = ReadMountTable(mountinfo);
  } catch (const std::exception& e) {
    // Without the mount table nothing can be told apart: keep every record as it is.
    out.errors.push_back(e.what());
    return out;
  }
  for (const auto& [key, dir] : dirs) {
    try {
      gkm::CacheUseLock lock(dir);
      const auto usage = gkm::ReadUsageFile(dir);
      if (!usage.ok) {
        out.errors.push_back(usage.error);
        continue;
      }
      std::vector<gkm::UsageRecord> kept;
      for (const auto& r : usage.records) {
        if (!r.target_path.empty() && MountAt(table, r.target_path)) {
          kept.push_back(r);
          out.volumes.push_back(RecoveredVolume{key, r});
        } else {
          out.dropped.push_back("volume " + r.volume_id + " at " + r.target_path + ": not mounted");
        }
      }
      if (kept.size() != usage.records.size()) gkm::WriteUsageFile(dir, kept);
    } catch (const std::exception& e) {
      out.errors.push_back(dir + ": " + e.what());
    }
  }
  return out;
}

std::optional<CsiError> MeasureVolume(const std::string& target, VolumeStats& out) {
  struct stat top {};
  if (::lstat(target.c_str(), &top) != 0) {
    if (errno == ENOENT) return CsiError{kNotFound, "volume path " + target + " does not exist"};
    return CsiError{kInternal, "cannot stat " + target + ": " + std::strerror(errno)};
  }
  struct statvfs fs_stats {};
  if (::statvfs(target.c_str(), &fs_stats) != 0) {
    return CsiError{kInternal, "cannot statvfs " + target + ": " + std::strerror(errno)};
  }
  out = VolumeStats{};
  out.total_bytes = static_cast<int64_t>(fs_stats.f_blocks) * static_cast<int64_t>(fs_stats.f_frsize);
  out.available_bytes = static_cast<int64_t>(fs_stats.f_bavail) * static_cast<int64_t>(fs_stats.f_frsize);
  out.total_inodes = static_cast<int64_t>(fs_stats.f_files);
  out.free_inodes = static_cast<int64_t>(fs_stats.f_ffree);
  std::set<std::pair<dev_t, ino_t>> seen;  // a hard-linked file counts once, as du counts it
  auto count = [&](const struct stat& st) {
    if (!seen.insert({st.st_dev, st.st_ino}).second) return;
    out.used_bytes += static_cast<int64_t>(st.st_blocks) * 512;
    ++out.used_inodes;
  };
  count(top);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(target, fs::directory_options::none, ec), end; !ec && it != end;
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) continue;  // gone meanwhile
    if (st.st_dev != top.st_dev) {
      it.disable_recursion_pending();  // another mount under the volume is not the volume's
      continue;
    }
    count(st);
  }
  if (ec) return CsiError{kInternal, "cannot walk " + target + ": " + ec.message()};
  return std::nullopt;
}

}  // namespace gns::gkm_csi
