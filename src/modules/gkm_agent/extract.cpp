// Layer extraction with libarchive (see extract.hpp).
#include "modules/gkm_agent/extract.hpp"

#include "modules/gkm_agent/image.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

namespace gns::gkm {

namespace fs = std::filesystem;

namespace {

struct ReadCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct WriteCloser {
  void operator()(archive* a) const { archive_write_free(a); }
};

std::string ArchiveError(archive* a) {
  const char* s = archive_error_string(a);
  return s ? s : "unknown libarchive error";
}

// "a/b" + "../c" stays inside; "a" + "../../c" does not. `link_dir` is the entry's directory.
bool TargetInside(const std::string& link_dir, const std::string& target) {
  if (target.empty() || target.front() == '/') return false;
  const std::string joined = link_dir.empty() ? target : link_dir + "/" + target;
  int depth = 0;  // "" (the root itself) is inside; going above it is not
  std::size_t i = 0;
  while (i <= joined.size()) {
    const auto slash = joined.find('/', i);
    const std::string part = joined.substr(i, slash == std::string::npos ? std::string::npos : slash - i);
    if (part == "..") {
      if (--depth < 0) return false;
    } else if (!part.empty() && part != ".") {
      ++depth;
    }
    if (slash == std::string::npos) break;
    i = slash + 1;
  }
  return true;
}

}  // namespace

std::string SafeRelativePath(const std::string& path) {
  if (path.empty() || path.front() == '/') return {};
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (i <= path.size()) {
    const auto slash = path.find('/', i);
    const std::string part = path.substr(i, slash == std::string::npos ? std::string::npos : slash - i);
    if (part == "..") {
      if (parts.empty()) return {};
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    if (slash == std::string::npos) break;
    i = slash + 1;
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
  return out;
}

struct Extractor::Disk {
  std::unique_ptr<archive, WriteCloser> out{archive_write_disk_new()};
};

Extractor::Extractor(std::string dest, uint64_t max_bytes)
    : dest_(std::move(dest)), max_bytes_(max_bytes), disk_(std::make_unique<Disk>()) {
  if (::mkdir(dest_.c_str(), 0755) != 0) {
    throw PullError("WriteFailed", "cannot create " + dest_ + ": " + std::strerror(errno));
  }
  // No owners, no setuid bits, never write through a symlink or a `..`; times kept. We do not
  // pass SECURE_NOABSOLUTEPATHS: every path is checked relative (below) and then prefixed
  // with `dest`, which is absolute (a process-wide chdir is no option with a thread pool).
  archive_write_disk_set_options(disk_->out.get(), ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM |
                                                       ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                                       ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_UNLINK);
}

Extractor::~Extractor() = default;

archive* Extractor::NewLayerReader() {
  archive* in = archive_read_new();
  archive_read_support_format_tar(in);
  archive_read_support_filter_gzip(in);
  archive_read_support_filter_zstd(in);
  archive_read_support_filter_none(in);
  return in;
}

void Extractor::Layer(archive* in, const std::string& where) {
  archive* out = disk_->out.get();
  const std::string& dest = dest_;
  const uint64_t max_bytes = max_bytes_;
  ExtractStats& stats = stats_;
  archive_entry* entry = nullptr;
  for (;;) {
    const int rc = archive_read_next_header(in, &entry);
    if (rc == ARCHIVE_EOF) break;
    if (rc < ARCHIVE_WARN) throw PullError("BadArchive", where + ": " + ArchiveError(in));
    const char* raw = archive_entry_pathname(entry);
    const std::string name = raw ? raw : "";
    const std::string entry_where = where + " entry \"" + name + "\"";
    if (name.empty() || name.front() == '/') throw PullError("UnsafeArchive", entry_where + ": absolute path refused");
    for (std::size_t p = 0; p < name.size();) {
      const auto slash = name.find('/', p);
      if (name.compare(p, slash == std::string::npos ? std::string::npos : slash - p, "..") == 0) {
        throw PullError("UnsafeArchive", entry_where + ": \"..\" component refused");
      }
      if (slash == std::string::npos) break;
      p = slash + 1;
    }
    const std::string rel = SafeRelativePath(name);
    if (rel.empty()) continue;  // "." or "./": the root itself
    const auto slash = rel.rfind('/');
    const std::string dir = slash == std::string::npos ? std::string() : rel.substr(0, slash);
    const std::string base = slash == std::string::npos ? rel : rel.substr(slash + 1);
    // OCI whiteouts: ".wh..wh..opq" empties the directory, ".wh.<name>" deletes <name>.
    if (base.rfind(".wh.", 0) == 0) {
      const std::string target_dir = dest + (dir.empty() ? "" : "/" + dir);
      std::error_code ec;
      if (base == ".wh..wh..opq") {
        if (fs::is_directory(fs::symlink_status(target_dir, ec))) {
          for (const auto& child : fs::directory_iterator(target_dir, ec)) fs::remove_all(child.path(), ec);
        }
      } else {
        fs::remove_all(target_dir + "/" + base.substr(4), ec);
      }
      continue;
    }
    const char* hard = archive_entry_hardlink(entry);
    const auto type = archive_entry_filetype(entry);
    if (!hard && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      throw PullError("UnsafeArchive", entry_where + ": only files, directories and links are allowed");
    }
    if (type == AE_IFLNK) {
      const char* target = archive_entry_symlink(entry);
      if (!target || !TargetInside(dir, target)) {
        throw PullError("UnsafeArchive", entry_where + ": symlink to \"" + std::string(target ? target : "") +
                                             "\" points outside the cache root");
      }
    }
    if (hard) {
      const std::string hard_rel = SafeRelativePath(hard);
      if (hard_rel.empty()) {
        throw PullError("UnsafeArchive", entry_where + ": hard link to \"" + std::string(hard) +
                                             "\" points outside the cache root");
      }
      archive_entry_copy_hardlink(entry, (dest + "/" + hard_rel).c_str());
    }
    if (type == AE_IFREG) {
      const auto size = archive_entry_size(entry);
      if (size < 0 || stats.bytes + static_cast<uint64_t>(size) > max_bytes) {
        throw PullError("TooLarge", entry_where + ": the cache would exceed " + std::to_string(max_bytes) + " bytes");
      }
    }
    archive_entry_copy_pathname(entry, (dest + "/" + rel).c_str());
    archive_entry_set_perm(entry, type == AE_IFDIR ? 0755 : (archive_entry_perm(entry) & 0755));
    archive_entry_set_uid(entry, 0);
    archive_entry_set_gid(entry, 0);
    if (archive_write_header(out, entry) < ARCHIVE_WARN) {
      const int err = archive_errno(out);
      throw PullError(err == ENOSPC ? "DiskFull" : "UnsafeArchive", entry_where + ": " + ArchiveError(out));
    }
    if (type == AE_IFREG && archive_entry_size(entry) > 0) {
      const void* buf = nullptr;
      size_t len = 0;
      la_int64_t offset = 0;
      for (;;) {
        const int r = archive_read_data_block(in, &buf, &len, &offset);
        if (r == ARCHIVE_EOF) break;
        if (r < ARCHIVE_WARN) throw PullError("BadArchive", entry_where + ": " + ArchiveError(in));
        stats.bytes += len;
        if (stats.bytes > max_bytes) {
          throw PullError("TooLarge", entry_where + ": the cache would exceed " + std::to_string(max_bytes) + " bytes");
        }
        if (archive_write_data_block(out, buf, len, offset) < ARCHIVE_WARN) {
          const int err = archive_errno(out);
          throw PullError(err == ENOSPC ? "DiskFull" : "WriteFailed", entry_where + ": " + ArchiveError(out));
        }
      }
    }
    if (archive_write_finish_entry(out) < ARCHIVE_WARN) {
      const int err = archive_errno(out);
      throw PullError(err == ENOSPC ? "DiskFull" : "WriteFailed", entry_where + ": " + ArchiveError(out));
    }
    ++stats.entries;
  }
}

ExtractStats Extractor::Finish() {
  archive* out = disk_->out.get();
  if (archive_write_close(out) != ARCHIVE_OK) {
    const int err = archive_errno(out);
    throw PullError(err == ENOSPC ? "DiskFull" : "WriteFailed", "finishing " + dest_ + ": " + ArchiveError(out));
  }
  // One flush for every file written (cheaper than an fsync per file, same guarantee).
  const int fd = ::open(dest_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::syncfs(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw PullError(err == ENOSPC ? "DiskFull" : "WriteFailed", "cannot flush " + dest_ + ": " + std::strerror(err));
  }
  ::close(fd);
  return stats_;
}

ExtractStats ExtractLayers(const std::vector<std::string>& layers, const std::string& dest, uint64_t max_bytes) {
  Extractor extractor(dest, max_bytes);
  for (std::size_t layer_index = 0; layer_index < layers.size(); ++layer_index) {
    const std::string where = "layer " + std::to_string(layer_index);
    std::unique_ptr<archive, ReadCloser> in(Extractor::NewLayerReader());
    if (archive_read_open_filename(in.get(), layers[layer_index].c_str(), 1024 * 1024) != ARCHIVE_OK) {
      throw PullError("BadArchive", where + ": " + ArchiveError(in.get()));
    }
    extractor.Layer(in.get(), where);
  }
  return extractor.Finish();
}

void InstallDirectory(const std::string& staged, const std::string& final_dir) {
  const fs::path target(final_dir);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) throw PullError("WriteFailed", "cannot create " + target.parent_path().string() + ": " + ec.message());
  std::string aside;
  if (fs::exists(fs::symlink_status(target, ec))) {
    std::random_device rd;
    aside = target.parent_path().string() + "/.old-" + target.filename().string() + "-" + std::to_string(rd());
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) {
      throw PullError("WriteFailed", "cannot move " + final_dir + " aside: " + std::strerror(errno));
    }
  }
  if (::rename(staged.c_str(), final_dir.c_str()) != 0) {
    throw PullError("WriteFailed", "cannot rename " + staged + " to " + final_dir + ": " + std::strerror(errno));
  }
  FsyncDir(target.parent_path().string());
  if (!aside.empty()) RemoveTree(aside);
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw PullError("WriteFailed", "cannot open " + dir + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw PullError("WriteFailed", "cannot fsync " + dir + ": " + std::strerror(err));
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw std::runtime_error("cannot remove " + path + ": " + ec.message());
}

}  // namespace gns::gkm
