// Bind mounts and mountinfo: see mounts.hpp.
#include "modules/gkm_csi/mounts.hpp"

#include "loop/atomic_file.hpp"

#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace gns::gkm_csi {

namespace {

std::vector<std::string_view> Split(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

bool IsOctal(char c) { return c >= '0' && c <= '7'; }

}  // namespace

bool MountEntry::ReadOnly() const {
  std::stringstream s(options);
  for (std::string option; std::getline(s, option, ',');) {
    if (option == "ro") return true;
  }
  return false;
}

std::string UnescapeMountField(std::string_view field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && IsOctal(field[i + 1]) && IsOctal(field[i + 2]) &&
        IsOctal(field[i + 3])) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue" (proc(5)):
// id, parent, major:minor, root, mount point, options, optional fields up to "-", type, source,
// super options.
std::vector<MountEntry> ParseMountInfo(std::string_view text) {
  std::vector<MountEntry> out;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    const auto fields = Split(line);
    if (fields.size() < 10) continue;
    std::size_t dash = 6;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash + 2 >= fields.size()) continue;
    MountEntry e;
    e.root = UnescapeMountField(fields[3]);
    e.mount_point = UnescapeMountField(fields[4]);
    e.options = std::string(fields[5]);
    e.fs_type = std::string(fields[dash + 1]);
    e.source = UnescapeMountField(fields[dash + 2]);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<MountEntry> ReadMountTable(const std::string& path) {
  std::string text;
  std::string error;
  if (!ReadWholeFile(path, text, error)) throw std::runtime_error(error);
  return ParseMountInfo(text);
}

std::optional<MountEntry> MountAt(const std::vector<MountEntry>& table, const std::string& target) {
  std::optional<MountEntry> found;
  for (const auto& e : table) {
    if (e.mount_point == target) found = e;
  }
  return found;
}

void BindMount(const std::string& source, const std::string& target, bool read_only) {
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    throw std::system_error(errno, std::generic_category(), "mount --bind " + source + " " + target);
  }
  // The remount must keep the flags the kernel locks on the source's mount (noexec, in a user
  // namespace all of them), or it fails with EPERM.
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV;
  if (read_only) flags |= MS_RDONLY;
  struct statvfs st {};
  if (::statvfs(source.c_str(), &st) == 0) {
    if (st.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
    if (st.f_flag & ST_NOATIME) flags |= MS_NOATIME;
    if (st.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
    if (st.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  }
  if (::mount(nullptr, target.c_str(), nullptr, flags, nullptr) != 0) {
    const int e = errno;
    // Never leave the volume mounted with more rights than asked for.
    if (::umount2(target.c_str(), MNT_DETACH) != 0) {
      throw std::system_error(e, std::generic_category(),
                              "remount " + target + (read_only ? " read-only" : "") +
                                  " (and the bind mount could not be removed again: " + std::strerror(errno) + ")");
    }
    throw std::system_error(e, std::generic_category(), "remount " + target + (read_only ? " read-only" : ""));
  }
}

void UnmountAll(const std::string& target) {
  // A bounded loop: a target holds our one mount; more means someone stacked mounts there.
  for (int i = 0; i < 16; ++i) {
    if (!MountAt(ReadMountTable(), target)) return;
    if (::umount2(target.c_str(), 0) == 0) continue;
    if (errno == EBUSY) {
      // Still in use (a process of the pod is in it): detach it now, the kernel frees it when the
      // last user goes. The kubelet unpublishes after the pod's containers are gone.
      if (::umount2(target.c_str(), MNT_DETACH) == 0) continue;
    }
    if (errno == EINVAL || errno == ENOENT) return;  // not a mount point (any more)
    throw std::system_error(errno, std::generic_category(), "umount " + target);
  }
  throw std::runtime_error("umount " + target + ": still mounted after 16 unmounts");
}

}  // namespace gns::gkm_csi
