#pragma once
// Crash-safe file replacement for every file the supervisor owns on the node (checkpoints,
// CDI specs, cursors, nodes_config.cfg): write a temp file in the same directory, fsync it,
// rename it over the target, fsync the directory. A reader sees the old or the new content,
// never a mix, whatever instant the process dies at. Blocking: run it on the BlockingPool.

#include <string>
#include <string_view>
#include <sys/types.h>

namespace gns {

struct FileWriteResult {
  bool ok = true;
  std::string error;  // "what failed: path: strerror"
  explicit operator bool() const { return ok; }
};

FileWriteResult WriteFileAtomically(const std::string& path, std::string_view content, mode_t mode = 0600);

// Reads a whole file; false (with `error`) if it cannot be read.
bool ReadWholeFile(const std::string& path, std::string& out, std::string& error);

}  // namespace gns
