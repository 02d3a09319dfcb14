// Per-claim CDI spec files of a DRA driver: names and file I/O.
#include "dra_plugin/claim_specs.hpp"

#include "dra_plugin/plugin_paths.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>

namespace gns::dra {

namespace {

constexpr std::string_view kFileSuffix = ".json";

bool IsAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string InvalidUid(std::string_view claim_uid) {
  return "invalid claim UID for a CDI spec name: \"" + std::string(claim_uid) + "\"";
}

// Temp file (named as WriteFileAtomically names it, so the start's sweep knows it), rename; no
// fsync (see SpecDurability::kVisibleOnly).
FileWriteResult ReplaceVisibly(const std::string& path, const std::string& content) {
  // Random like WriteFileAtomically's: in a container we may be pid 1 on every start.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string tmp = AtomicWriteTempName(path, static_cast<long>(::getpid()), rng() % 1000000);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kCdiSpecFileMode);
  if (fd < 0) return FileWriteResult{false, "create temp file: " + tmp + ": " + std::strerror(errno)};
  std::string error;
  if (::fchmod(fd, kCdiSpecFileMode) != 0) error = "chmod: " + tmp + ": " + std::strerror(errno);
  for (std::size_t done = 0; error.empty() && done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno != EINTR) error = "write: " + tmp + ": " + std::strerror(errno);
    if (n > 0) done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && error.empty()) error = "close: " + tmp + ": " + std::strerror(errno);
  if (error.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    error = "rename: " + path + ": " + std::strerror(errno);
  }
  if (!error.empty()) {
    ::unlink(tmp.c_str());
    return FileWriteResult{false, error};
  }
  return {};
}

}  // namespace

bool IsValidClaimUid(std::string_view uid) {
  if (uid.empty() || uid.size() > 64) return false;
  if (!IsAlnum(uid.front()) || !IsAlnum(uid.back())) return false;
  return std::all_of(uid.begin(), uid.end(), [](char c) { return IsAlnum(c) || c == '-'; });
}

std::string_view MinimumCdiVersion(std::string_view device_name) {
  if (!device_name.empty() && IsLetter(device_name.front())) return "0.3.0";
  return "0.5.0";
}

std::string ClaimSpecNames::Kind() const { return vendor + "/" + cdi_class; }

std::string ClaimSpecNames::FileName(std::string_view claim_uid) const {
  return vendor + "-" + cdi_class + "_" + std::string(claim_uid) + std::string(kFileSuffix);
}

std::string ClaimSpecNames::QualifiedDeviceId(std::string_view device_name) const {
  return Kind() + "=" + std::string(device_name);
}

std::optional<std::string_view> ClaimSpecNames::ClaimUidOf(std::string_view name) const {
  const std::string prefix = vendor + "-" + cdi_class + "_";
  if (name.size() <= prefix.size() + kFileSuffix.size()) return std::nullopt;
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  if (name.substr(name.size() - kFileSuffix.size()) != kFileSuffix) return std::nullopt;
  const std::string_view uid = name.substr(prefix.size(), name.size() - prefix.size() - kFileSuffix.size());
  if (!IsValidClaimUid(uid)) return std::nullopt;
  return uid;
}

FileWriteResult WriteClaimSpec(const std::string& cdi_dir, const ClaimSpecNames& names, std::string_view claim_uid,
                               const std::string& content, SpecDurability durability) {
  if (!IsValidClaimUid(claim_uid)) return FileWriteResult{false, InvalidUid(claim_uid)};
  std::string error;
  // /var/run/cdi is a tmpfs path: it may not exist yet after a reboot. 0755 as the runtimes make it.
  if (!EnsureDirectory(cdi_dir, 0755, error)) return FileWriteResult{false, error};
  const std::string path = JoinPath(cdi_dir, names.FileName(claim_uid));
  if (durability == SpecDurability::kDurable) return WriteFileAtomically(path, content, kCdiSpecFileMode);
  return ReplaceVisibly(path, content);
}

bool ClaimSpecIsCurrent(const std::string& cdi_dir, const ClaimSpecNames& names, std::string_view claim_uid,
                        const std::string& content) {
  if (!IsValidClaimUid(claim_uid)) return false;
  std::string text;
  std::string error;
  if (!ReadWholeFile(JoinPath(cdi_dir, names.FileName(claim_uid)), text, error)) return false;
  return text == content;
}

FileWriteResult DeleteClaimSpec(const std::string& cdi_dir, const ClaimSpecNames& names, std::string_view claim_uid) {
  if (!IsValidClaimUid(claim_uid)) return FileWriteResult{false, InvalidUid(claim_uid)};
  const std::string path = JoinPath(cdi_dir, names.FileName(claim_uid));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return FileWriteResult{false, "unlink: " + path + ": " + std::strerror(errno)};
  }
  return {};
}

TempSweep RemoveInterruptedClaimSpecWrites(const std::string& cdi_dir, const ClaimSpecNames& names) {
  return RemoveInterruptedWrites(cdi_dir, false,
                                 [&names](std::string_view target) { return names.ClaimUidOf(target).has_value(); });
}

CdiListing ListClaimSpecs(const std::string& cdi_dir, const ClaimSpecNames& names) {
  CdiListing listing;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(cdi_dir.c_str()), &::closedir);
  if (!dir) {
    if (errno == ENOENT) return listing;
    listing.ok = false;
    listing.error = "opendir: " + cdi_dir + ": " + std::strerror(errno);
    return listing;
  }
  while (const dirent* entry = ::readdir(dir.get())) {
    // Temp files of an interrupted write end in ".tmp.<pid>.<n>", never ".json": not ours here.
    if (const auto uid = names.ClaimUidOf(entry->d_name)) listing.claim_uids.emplace_back(*uid);
  }
  std::sort(listing.claim_uids.begin(), listing.claim_uids.end());
  return listing;
}

}  // namespace gns::dra
