#pragma once
// Crash-safe file replacement for every file the supervisor owns on the node (checkpoints,
// CDI specs, cursors, nodes_config.cfg): write a temp file in the same directory, fsync it,
// rename it over the target, fsync the directory. A reader sees the old or the new content,
// never a mix, whatever instant the process dies at. Blocking: run it on the BlockingPool.

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

namespace gns {

struct FileWriteResult {
  bool ok = true;
  std::string error;  // "what failed: path: strerror"
  explicit operator bool() const { return ok; }
};

FileWriteResult WriteFileAtomically(const std::string& path, std::string_view content, mode_t mode = 0600);

// The temp file WriteFileAtomically writes first: "<path>.tmp.<pid>.<n>" (n decimal).
std::string AtomicWriteTempName(const std::string& path, long pid, unsigned long n);
// When `file_name` (no directory) has that shape, the name of the file it was written for and
// the writer's pid; nullopt otherwise.
struct AtomicWriteTemp {
  std::string_view target;  // "<name>"
  long pid = 0;
};
std::optional<AtomicWriteTemp> ParseAtomicWriteTemp(std::string_view file_name);

// Removes the temp files that writes interrupted by a crash left under `dir` (and, when
// `recursive`, its subdirectories; symbolic links are not followed): regular files of the shape
// above whose target `ours` accepts, written by another process than this one (a write of ours
// may be in flight). A missing `dir` is nothing to do. Blocking: call it at start, before the
// writers run.
struct TempSweep {
  std::vector<std::string> removed;  // paths
  std::vector<std::string> errors;   // "what: path: strerror"
};
TempSweep RemoveInterruptedWrites(const std::string& dir, bool recursive,
                                  const std::function<bool(std::string_view target)>& ours);

// Creates `path` and its missing parents with exactly `mode` (chmod after mkdir: the umask does
// not narrow or widen it). Directories that already exist keep their mode (the kubelet owns
// plugins_registry; an operator may have tightened ours). False with `error` ("mkdir: <path>:
// <strerror>") on failure or when a component is not a directory.
bool EnsureDirectory(const std::string& path, mode_t mode, std::string& error);

// Reads a whole file; false (with `error`) if it cannot be read. For files from elsewhere (the
// host's /proc and /sys); state files of ours go through ReadStateFile (state_file.hpp).
bool ReadWholeFile(const std::string& path, std::string& out, std::string& error);

}  // namespace gns
