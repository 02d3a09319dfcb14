#pragma once
// Reading the files the supervisor keeps in its state directory (checkpoints, cursors, records)
// without trusting them. Every such file may have been replaced by anything: a symbolic link to
// /dev/zero, a FIFO, a directory, a 100 MB file. One reader for all of them:
//  - opened O_NONBLOCK (a FIFO never blocks the open or the read), type checked after the open
//    with fstat (a symbolic link to a regular file is fine, to anything else is not);
//  - bounded: more than `max_bytes` is refused without reading it all;
//  - blocking only on a regular file's bytes: call ReadStateFile on the BlockingPool
//    (ReadStateFileOnPool), never on the loop;
//  - a file that is refused or does not parse is moved aside under a unique name
//    ("<path>.corrupt-<unix seconds>[-n]") for the operator, never overwritten, never deleted.

#include "loop/blocking_pool.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace gns {

struct StateFileRead {
  enum class Status {
    kRead,        // `content` holds the whole file
    kMissing,     // no such file: a fresh node
    kRejected,    // not a regular file, or larger than the bound: never usable, move it aside
    kUnreadable,  // exists but cannot be read (permissions, I/O): not the file's fault, keep it
  };
  Status status = Status::kMissing;
  std::string content;
  std::string error;  // why, naming the path, for kRejected and kUnreadable
};
std::string_view ToString(StateFileRead::Status status);

// Default bound for a state file: far above what any of ours holds, far below a stall.
inline constexpr std::size_t kMaxStateFileBytes = 16u << 20;

// Blocking; never throws (an allocation failure is kUnreadable).
StateFileRead ReadStateFile(const std::string& path, std::size_t max_bytes = kMaxStateFileBytes);

// ReadStateFile on the pool, `done` on the loop.
void ReadStateFileOnPool(BlockingPool& pool, std::string path, std::size_t max_bytes,
                         std::function<void(StateFileRead)> done);

struct MoveAsideResult {
  bool ok = false;
  std::string moved_to;  // "<path>.corrupt-<unix_seconds>", "-<n>" added when that name is taken
  std::string error;
};
// Renames `path` out of the way without replacing any existing file. Never throws.
MoveAsideResult MoveStateFileAside(const std::string& path, int64_t unix_seconds);

}  // namespace gns
