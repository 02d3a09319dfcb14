// Bounded, type-checked reads of state files, and moving bad ones aside.
#include "loop/state_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <sys/stat.h>
#include <unistd.h>

namespace gns {

namespace {

const char* TypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

StateFileRead Fail(StateFileRead::Status status, std::string error) {
  StateFileRead result;
  result.status = status;
  result.error = std::move(error);
  return result;
}

}  // namespace

std::string_view ToString(StateFileRead::Status status) {
  switch (status) {
    case StateFileRead::Status::kRead:
      return "read";
    case StateFileRead::Status::kMissing:
      return "missing";
    case StateFileRead::Status::kRejected:
      return "rejected";
    case StateFileRead::Status::kUnreadable:
      return "unreadable";
  }
  return "unknown";
}

StateFileRead ReadStateFile(const std::string& path, std::size_t max_bytes) {
  using Status = StateFileRead::Status;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; O_NOCTTY: a tty
  // planted here must not become ours. The type is checked on what was opened, not on the path
  // (no window between a stat and the open).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Fail(Status::kMissing, {});
    // A symbolic link loop or a path through a non-directory: the file is unusable as it is.
    if (err == ELOOP || err == ENOTDIR || err == ENXIO) {
      return Fail(Status::kRejected, path + ": " + std::strerror(err));
    }
    return Fail(Status::kUnreadable, "open " + path + ": " + std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Fail(Status::kUnreadable, "fstat " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    return Fail(Status::kRejected, path + " is " + TypeName(st.st_mode) + ", expected a regular file");
  }
  const auto too_big = [&](std::string size) {
    return Fail(Status::kRejected, path + " holds " + size + " bytes, more than the " + std::to_string(max_bytes) +
                                       " a state file may hold");
  };
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) return too_big(std::to_string(st.st_size));
  StateFileRead result;
  try {
    // One byte more than the bound: a file that grows while we read is caught too.
    result.content.resize(static_cast<std::size_t>(st.st_size) + 1);
    std::size_t have = 0;
    for (;;) {
      if (have == result.content.size()) {
        if (result.content.size() > max_bytes) return too_big("more than " + std::to_string(max_bytes));
        result.content.resize(std::min(result.content.size() * 2, max_bytes + 1));
      }
      const ssize_t n = ::read(fd, result.content.data() + have, result.content.size() - have);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Fail(Status::kUnreadable, "read " + path + ": " + std::strerror(errno));
      }
      if (n == 0) break;
      have += static_cast<std::size_t>(n);
    }
    if (have > max_bytes) return too_big("more than " + std::to_string(max_bytes));
    result.content.resize(have);
  } catch (const std::bad_alloc&) {
    return Fail(Status::kUnreadable, "read " + path + ": out of memory");
  }
  result.status = Status::kRead;
  return result;
}

void ReadStateFileOnPool(BlockingPool& pool, std::string path, std::size_t max_bytes,
                         std::function<void(StateFileRead)> done) {
  pool.Run([path = std::move(path), max_bytes] { return ReadStateFile(path, max_bytes); },
           [done = std::move(done)](StateFileRead result, std::exception_ptr error) {
             // ReadStateFile does not throw; a throw here is a bug, reported as unreadable.
             if (error) result = Fail(StateFileRead::Status::kUnreadable, "unexpected exception reading the file");
             done(std::move(result));
           });
}

MoveAsideResult MoveStateFileAside(const std::string& path, int64_t unix_seconds) {
  MoveAsideResult result;
  const std::string base = path + ".corrupt-" + std::to_string(unix_seconds);
  // Never over an earlier file moved aside in the same second: that one is evidence too.
  for (int n = 0; n < 1000; ++n) {
    const std::string target = n == 0 ? base : base + "-" + std::to_string(n);
    if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
      result.ok = true;
      result.moved_to = target;
      return result;
    }
    if (errno == EEXIST) continue;
    if (errno == EINVAL || errno == ENOSYS) {
      // A file system without RENAME_NOREPLACE: look, then rename (a race only with ourselves).
      struct stat st {};
      if (::lstat(target.c_str(), &st) == 0) continue;
      if (std::rename(path.c_str(), target.c_str()) == 0) {
        result.ok = true;
        result.moved_to = target;
        return result;
      }
    }
    result.moved_to = target;
    result.error = "rename " + path + " to " + target + ": " + std::strerror(errno);
    return result;
  }
  result.error = "rename " + path + ": every name " + base + "[-n] is taken";
  return result;
}

}  // namespace gns
