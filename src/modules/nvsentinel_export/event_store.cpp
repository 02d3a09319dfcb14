// The on-disk queue of the nvsentinel-export module: see event_store.hpp.
#include "modules/nvsentinel_export/event_store.hpp"

#include "loop/state_file.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

namespace gns::nvsentinel_export {

namespace {

constexpr std::string_view kMagic = "GNSQ1";
constexpr std::string_view kSuffix = ".event";
// Far above one event (a few hundred bytes); a bigger file is not one of ours.
constexpr std::size_t kMaxFileBytes = 1u << 20;

std::string Hex64(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<std::size_t>(i)] = kDigits[v & 0xf];
  return out;
}

bool ParseU64(std::string_view text, uint64_t& out, int base = 10) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return ec == std::errc() && end == text.data() + text.size();
}

bool FsyncDir(const std::string& dir, std::string& error) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    error = "open: " + dir + ": " + std::strerror(errno);
    return false;
  }
  const bool ok = ::fsync(fd) == 0;
  if (!ok) error = "fsync: " + dir + ": " + std::strerror(errno);
  ::close(fd);
  return ok;
}

}  // namespace

uint64_t Fnv1a64(std::string_view bytes, uint64_t seed) {
  uint64_t h = seed;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string StoredEventFileName(uint64_t seq) {
  std::string digits = std::to_string(seq);
  return std::string(20 - std::min<std::size_t>(20, digits.size()), '0') + digits + std::string(kSuffix);
}

std::optional<uint64_t> ParseStoredEventFileName(std::string_view name) {
  if (name.size() != 20 + kSuffix.size() || name.substr(20) != kSuffix) return std::nullopt;
  uint64_t seq = 0;
  if (!ParseU64(name.substr(0, 20), seq)) return std::nullopt;
  return seq;
}

std::string EncodeStoredEvent(const StoredEvent& event) {
  std::string out;
  out.reserve(event.payload.size() + 96);
  out.append(kMagic).append(" ").append(event.id).append(" ").append(std::to_string(event.payload.size()));
  out.append(" ").append(Hex64(Fnv1a64(event.payload))).append("\n").append(event.payload);
  return out;
}

std::optional<StoredEvent> DecodeStoredEvent(uint64_t seq, std::string_view bytes, std::string& error) {
  const auto eol = bytes.find('\n');
  if (eol == std::string_view::npos || eol > 256) {
    error = bytes.empty() ? "empty file" : "no header line";
    return std::nullopt;
  }
  std::string_view header = bytes.substr(0, eol);
  std::vector<std::string_view> words;
  while (!header.empty()) {
    const auto sp = header.find(' ');
    words.push_back(header.substr(0, sp));
    header = sp == std::string_view::npos ? std::string_view() : header.substr(sp + 1);
  }
  if (words.size() != 4 || words[0] != kMagic) {
    error = "header is not \"" + std::string(kMagic) + " <id> <length> <checksum>\"";
    return std::nullopt;
  }
  uint64_t length = 0;
  uint64_t checksum = 0;
  if (words[1].empty() || !ParseU64(words[2], length) || words[3].size() != 16 || !ParseU64(words[3], checksum, 16)) {
    error = "header fields do not parse";
    return std::nullopt;
  }
  const std::string_view payload = bytes.substr(eol + 1);
  if (payload.size() != length) {
    error = "payload is " + std::to_string(payload.size()) + " bytes, header says " + std::to_string(length);
    return std::nullopt;
  }
  if (Fnv1a64(payload) != checksum) {
    error = "checksum mismatch (header " + std::string(words[3]) + ", payload " + Hex64(Fnv1a64(payload)) + ")";
    return std::nullopt;
  }
  return StoredEvent{seq, std::string(words[1]), std::string(payload)};
}

EventStore::Loaded EventStore::Load(int64_t now_unix_seconds) const {
  Loaded loaded;
  if (!EnsureDirectory(dir_, 0700, loaded.error)) return loaded;
  RemoveInterruptedWrites(dir_, /*recursive=*/false,
                          [](std::string_view target) { return ParseStoredEventFileName(target).has_value(); });
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) {
    loaded.error = "opendir: " + dir_ + ": " + std::strerror(errno);
    return loaded;
  }
  std::vector<uint64_t> seqs;
  while (const dirent* entry = ::readdir(d)) {
    if (auto seq = ParseStoredEventFileName(entry->d_name)) seqs.push_back(*seq);
  }
  ::closedir(d);
  std::sort(seqs.begin(), seqs.end());
  for (const uint64_t seq : seqs) {
    const std::string path = dir_ + "/" + StoredEventFileName(seq);
    const StateFileRead read = ReadStateFile(path, kMaxFileBytes);
    std::string why;
    if (read.status == StateFileRead::Status::kMissing) continue;
    if (read.status == StateFileRead::Status::kUnreadable) {
      // Not the file's fault (permissions, I/O): kept for a later start, reported.
      loaded.damaged.push_back(read.error + "; left in place");
      continue;
    }
    if (read.status == StateFileRead::Status::kRejected) {
      why = read.error;
    } else if (auto event = DecodeStoredEvent(seq, read.content, why)) {
      loaded.events.push_back(std::move(*event));
      continue;
    }
    const MoveAsideResult moved = MoveStateFileAside(path, now_unix_seconds);
    loaded.damaged.push_back(path + ": " + why +
                             (moved.ok ? "; moved to " + moved.moved_to : "; could not move it aside: " + moved.error));
  }
  return loaded;
}

FileWriteResult EventStore::Append(const std::vector<StoredEvent>& events) const {
  if (events.empty()) return {};
  // The directory may have gone since Load (an operator cleaning up): made again.
  if (std::string error; !EnsureDirectory(dir_, 0700, error)) return FileWriteResult{false, error};
  for (const auto& event : events) {
    FileWriteResult written = WriteFileAtomically(dir_ + "/" + StoredEventFileName(event.seq), EncodeStoredEvent(event));
    if (!written) return written;
  }
  return {};
}

FileWriteResult EventStore::Remove(const std::vector<uint64_t>& seqs) const {
  if (seqs.empty()) return {};
  for (const uint64_t seq : seqs) {
    const std::string path = dir_ + "/" + StoredEventFileName(seq);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return FileWriteResult{false, "unlink: " + path + ": " + std::strerror(errno)};
    }
  }
  FileWriteResult result;
  if (!FsyncDir(dir_, result.error)) result.ok = false;
  return result;
}

}  // namespace gns::nvsentinel_export
