#pragma once
// Layer extraction with libarchive (tar, optionally gzip/zstd-compressed: detected from the
// bytes), run on the blocking pool. Every entry is checked before it is written: relative
// paths only, no `..` component, only files, directories and links, symlinks and hard links
// whose targets stay inside the root, OCI whiteouts applied inside the root, a size limit.
// The result lands in a staging directory beside its final place (same filesystem) and is
// moved there with one rename, so the cache root never holds a half-written cache.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct archive;

namespace gns::gkm {

struct ExtractStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;  // regular-file bytes written
};

// One extraction into a new directory: layers applied in order, each from a libarchive reader
// the caller opened (from a file, or from a pull as it streams), then flushed. One thread.
class Extractor {
 public:
  // Creates `dest` (0755; it must not exist). Throws PullError("WriteFailed").
  Extractor(std::string dest, uint64_t max_bytes);
  ~Extractor();
  Extractor(const Extractor&) = delete;
  Extractor& operator=(const Extractor&) = delete;

  // A reader that takes what layers are: tar, plain or gzip/zstd-compressed. The caller opens
  // it and frees it (archive_read_free).
  static archive* NewLayerReader();
  // Applies every entry of `in` (checked as above); `where` names the layer in errors. Throws
  // PullError: UnsafeArchive, BadArchive, TooLarge, DiskFull, WriteFailed.
  void Layer(archive* in, const std::string& where);
  // Closes the tree and flushes the filesystem (syncfs). Throws PullError.
  ExtractStats Finish();

 private:
  struct Disk;
  std::string dest_;
  uint64_t max_bytes_;
  ExtractStats stats_;
  std::unique_ptr<Disk> disk_;
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

// fsync(2) of a directory (what renames into or out of it did). Throws PullError (WriteFailed).
void FsyncDir(const std::string& dir);

// Lexically normalises an archive path: strips "./" and leading "/"-free "." parts; returns
// empty when the path is absolute, empty or climbs out with "..".
std::string SafeRelativePath(const std::string& path);

}  // namespace gns::gkm
