// Per-claim CDI specs for the IMEX channel.
#include "modules/dra_compute_domain/cdi_spec.hpp"

#include "modules/dra_compute_domain/driver_paths.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace gns::dra {

namespace {

constexpr std::string_view kFileSuffix = ".json";

std::string FilePrefix() { return std::string(kCdiVendor) + "-" + std::string(kCdiClass) + "_"; }

bool IsAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

bool IsValidClaimUid(std::string_view uid) {
  if (uid.empty() || uid.size() > 64) return false;
  if (!IsAlnum(uid.front()) || !IsAlnum(uid.back())) return false;
  return std::all_of(uid.begin(), uid.end(), [](char c) { return IsAlnum(c) || c == '-'; });
}

std::string CdiSpecFileName(std::string_view claim_uid) {
  return FilePrefix() + std::string(claim_uid) + std::string(kFileSuffix);
}

std::string CdiDeviceName(std::string_view claim_uid) {
  return std::string(claim_uid) + "-" + std::string(kChannelDeviceName);
}

std::string CdiQualifiedDeviceId(std::string_view claim_uid) {
  return std::string(kCdiKind) + "=" + CdiDeviceName(claim_uid);
}

std::string_view MinimumCdiVersion(std::string_view device_name) {
  if (!device_name.empty() && IsLetter(device_name.front())) return "0.3.0";
  return "0.5.0";
}

nlohmann::json BuildChannelCdiSpec(std::string_view claim_uid, uint32_t channel_major) {
  const std::string device_name = CdiDeviceName(claim_uid);
  nlohmann::json node{{"path", kChannelPath},
                      {"type", "c"},
                      {"major", channel_major},
                      {"minor", kChannelMinor},
                      {"fileMode", kChannelFileMode}};
  nlohmann::json device{{"name", device_name},
                        {"containerEdits", {{"deviceNodes", nlohmann::json::array({std::move(node)})}}}};
  return nlohmann::json{{"cdiVersion", MinimumCdiVersion(device_name)},
                        {"kind", kCdiKind},
                        {"devices", nlohmann::json::array({std::move(device)})}};
}

FileWriteResult WriteChannelCdiSpec(const std::string& cdi_dir, std::string_view claim_uid, uint32_t channel_major) {
  if (!IsValidClaimUid(claim_uid)) {
    return FileWriteResult{false, "invalid claim UID for a CDI spec name: \"" + std::string(claim_uid) + "\""};
  }
  std::string error;
  // /var/run/cdi is a tmpfs path: it may not exist yet after a reboot. 0755 as the runtimes make it.
  if (!EnsureDirectory(cdi_dir, 0755, error)) return FileWriteResult{false, error};
  const std::string content = BuildChannelCdiSpec(claim_uid, channel_major).dump(2) + "\n";
  return WriteFileAtomically(JoinPath(cdi_dir, CdiSpecFileName(claim_uid)), content, kCdiSpecFileMode);
}

FileWriteResult DeleteCdiSpec(const std::string& cdi_dir, std::string_view claim_uid) {
  if (!IsValidClaimUid(claim_uid)) {
    return FileWriteResult{false, "invalid claim UID for a CDI spec name: \"" + std::string(claim_uid) + "\""};
  }
  const std::string path = JoinPath(cdi_dir, CdiSpecFileName(claim_uid));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return FileWriteResult{false, "unlink: " + path + ": " + std::strerror(errno)};
  }
  return {};
}

std::optional<std::string_view> ClaimUidOfCdiSpecFile(std::string_view name) {
  const std::string prefix = FilePrefix();
  if (name.size() <= prefix.size() + kFileSuffix.size()) return std::nullopt;
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  if (name.substr(name.size() - kFileSuffix.size()) != kFileSuffix) return std::nullopt;
  const std::string_view uid = name.substr(prefix.size(), name.size() - prefix.size() - kFileSuffix.size());
  if (!IsValidClaimUid(uid)) return std::nullopt;
  return uid;
}

TempSweep RemoveInterruptedCdiSpecWrites(const std::string& cdi_dir) {
  return RemoveInterruptedWrites(cdi_dir, false,
                                 [](std::string_view target) { return ClaimUidOfCdiSpecFile(target).has_value(); });
}

CdiListing ListCdiSpecClaimUids(const std::string& cdi_dir) {
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
    if (const auto uid = ClaimUidOfCdiSpecFile(entry->d_name)) listing.claim_uids.emplace_back(*uid);
  }
  std::sort(listing.claim_uids.begin(), listing.claim_uids.end());
  return listing;
}

}  // namespace gns::dra
