#pragma once
// Layer extraction with libarchive (tar, optionally gzip/zstd-compressed: detected from the
// bytes), run on the blocking pool. Every entry is checked before it is written: relative
// paths only, no `..` component, only files, directories and links, symlinks and hard links
// whose targets stay inside the root, OCI whiteouts applied inside the root, a size limit.
// The result lands in a staging directory beside its final place (same filesystem) and is
// moved there with one rename, so the cache root never holds a half-written cache.

#include <cstdint>
#include <string>
#include <vector>

namespace gns::gkm {

struct ExtractStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;  // regular-file bytes written
};

// Extracts `layers` in order into `dest`, which must not exist yet (created 0755). Throws
// PullError: UnsafeArchive (what entry, why), BadArchive, TooLarge (over `max_bytes`),
// DiskFull, WriteFailed. Flushes the filesystem (syncfs) before returning.
ExtractStats ExtractLayers(const std::vector<std::string>& layers, const std::string& dest, uint64_t max_bytes);

// Puts `staged` at `final_dir` with rename(2): an existing `final_dir` is first renamed
// aside and removed afterwards. fsyncs the parent directory. Both must be on one filesystem.
void InstallDirectory(const std::string& staged, const std::string& final_dir);

// Removes a directory tree; missing is fine. Throws std::runtime_error on failure.
void RemoveTree(const std::string& path);

// Lexically normalises an archive path: strips "./" and leading "/"-free "." parts; returns
// empty when the path is absolute, empty or climbs out with "..".
std::string SafeRelativePath(const std::string& path);

}  // namespace gns::gkm
