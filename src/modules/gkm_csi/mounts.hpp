#pragma once
// Bind mounts and the mount table, for the CSI node plugin. Blocking (syscalls that can wait on
// the file system): on the pool, never on the loop.
//  - a read-only bind mount takes two calls: mount(MS_BIND) makes it (the read-only flag of that
//    call is ignored by the kernel), then a remount MS_BIND|MS_REMOUNT|MS_RDONLY makes it
//    read-only; a failed remount removes the mount again, so a read-only volume is never left
//    writable. Every bind is nosuid and nodev (a kernel cache has no use for either);
//  - /proc/self/mountinfo (proc(5)) says what is mounted where, with octal escapes for blanks.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gkm_csi {

struct MountEntry {
  std::string root;         // the mounted directory, relative to its file system's root
  std::string mount_point;  // where it is mounted (absolute, as this process sees it)
  std::string options;      // per-mount options: "ro,nosuid,…"
  std::string fs_type;
  std::string source;
  bool ReadOnly() const;
};

// Parses mountinfo text (lines that do not parse are skipped).
std::vector<MountEntry> ParseMountInfo(std::string_view text);
// The mountinfo line's \ooo escapes undone ("\040" → " ").
std::string UnescapeMountField(std::string_view field);

// The mount table of this process (/proc/self/mountinfo unless `path` says otherwise). Throws
// std::runtime_error when it cannot be read.
std::vector<MountEntry> ReadMountTable(const std::string& path = "/proc/self/mountinfo");
// The topmost mount at `target` (the last one listed), if any.
std::optional<MountEntry> MountAt(const std::vector<MountEntry>& table, const std::string& target);

// Bind-mounts `source` (a directory) at `target` (an existing directory), read-only unless
// `read_only` is false; nosuid, nodev. Throws std::system_error naming the call.
void BindMount(const std::string& source, const std::string& target, bool read_only);
// Unmounts every mount stacked at `target` (none: nothing to do). Throws std::system_error.
void UnmountAll(const std::string& target);

}  // namespace gns::gkm_csi
