// Atomic file replacement.
#include "loop/atomic_file.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <memory>
#include <fstream>
#include <random>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace gns {

namespace {

FileWriteResult Fail(const char* what, const std::string& path, int err) {
  return FileWriteResult{false, std::string(what) + ": " + path + ": " + std::strerror(err)};
}

constexpr std::string_view kTempInfix = ".tmp.";

std::string DirectoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

FileWriteResult WriteFileAtomically(const std::string& path, std::string_view content, mode_t mode) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string tmp = AtomicWriteTempName(path, static_cast<long>(getpid()), rng() % 1000000);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Fail("create temp file", tmp, errno);
  // open() applies the umask; set the exact mode we promise.
  if (::fchmod(fd, mode) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Fail("chmod", tmp, err);
  }
  const char* data = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Fail("write", tmp, err);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Fail("fsync", tmp, err);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Fail("close", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Fail("rename", path, err);
  }
  const std::string dir = DirectoryOf(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Fail("open directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) return Fail("fsync directory", dir, err);
  return {};
}

std::string AtomicWriteTempName(const std::string& path, long pid, unsigned long n) {
  return path + std::string(kTempInfix) + std::to_string(pid) + "." + std::to_string(n);
}

std::optional<AtomicWriteTemp> ParseAtomicWriteTemp(std::string_view file_name) {
  // "<target>.tmp.<pid>.<n>": the last two dot-separated fields are decimal numbers.
  const auto last_dot = file_name.rfind('.');
  if (last_dot == std::string_view::npos || last_dot + 1 == file_name.size()) return std::nullopt;
  const auto counter = file_name.substr(last_dot + 1);
  const auto head = file_name.substr(0, last_dot);
  const auto pid_dot = head.rfind('.');
  if (pid_dot == std::string_view::npos || pid_dot + 1 == head.size()) return std::nullopt;
  const auto pid_text = head.substr(pid_dot + 1);
  const auto rest = head.substr(0, pid_dot);  // "<target>.tmp"
  constexpr std::string_view kTmp = ".tmp";
  if (rest.size() <= kTmp.size() || rest.substr(rest.size() - kTmp.size()) != kTmp) return std::nullopt;
  auto all_digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 19 && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (!all_digits(counter) || !all_digits(pid_text)) return std::nullopt;
  AtomicWriteTemp temp;
  std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), temp.pid);
  temp.target = rest.substr(0, rest.size() - kTmp.size());
  return temp;
}

namespace {

void SweepDirectory(const std::string& dir, bool recursive, const std::function<bool(std::string_view)>& ours,
                    long own_pid, TempSweep& out) {
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), &::closedir);
  if (!handle) {
    if (errno != ENOENT) out.errors.push_back(std::string("opendir: ") + dir + ": " + std::strerror(errno));
    return;
  }
  std::vector<std::string> subdirs;
  while (const dirent* entry = ::readdir(handle.get())) {
    const std::string_view name(entry->d_name);
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + std::string(name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile
    if (S_ISDIR(st.st_mode)) {
      if (recursive) subdirs.push_back(path);
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    const auto temp = ParseAtomicWriteTemp(name);
    if (!temp || temp->pid == own_pid || !ours(temp->target)) continue;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      out.errors.push_back(std::string("unlink: ") + path + ": " + std::strerror(errno));
      continue;
    }
    out.removed.push_back(path);
  }
  handle.reset();
  for (const auto& sub : subdirs) SweepDirectory(sub, recursive, ours, own_pid, out);
}

}  // namespace

TempSweep RemoveInterruptedWrites(const std::string& dir, bool recursive,
                                  const std::function<bool(std::string_view target)>& ours) {
  TempSweep out;
  SweepDirectory(dir, recursive, ours, static_cast<long>(getpid()), out);
  return out;
}

bool EnsureDirectory(const std::string& path, mode_t mode, std::string& error) {
  if (path.empty()) {
    error = "mkdir: empty path";
    return false;
  }
  // Walk the components from the root so every missing parent gets `mode` too.
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (prefix.empty()) continue;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        error = "mkdir: " + prefix + ": exists and is not a directory";
        return false;
      }
      continue;
    }
    if (errno != ENOENT) {
      error = "stat: " + prefix + ": " + std::strerror(errno);
      return false;
    }
    if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) {
      error = "mkdir: " + prefix + ": " + std::strerror(errno);
      return false;
    }
    // mkdir applies the umask; set the mode we promise on what we created.
    if (::chmod(prefix.c_str(), mode) != 0) {
      error = "chmod: " + prefix + ": " + std::strerror(errno);
      return false;
    }
  }
  return true;
}

bool ReadWholeFile(const std::string& path, std::string& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    error = "cannot read " + path;
    return false;
  }
  out = buffer.str();
  return true;
}

}  // namespace gns
