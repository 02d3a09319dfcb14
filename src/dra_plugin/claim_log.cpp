// The claim log: record format, replay and the append-only file.
#include "dra_plugin/claim_log.hpp"

#include "loop/state_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gns::dra {

namespace {

// The log between two compactions: a few records per prepare; far above any real one.
constexpr std::size_t kMaxClaimLogBytes = 64u << 20;

using nlohmann::json;

constexpr unsigned char kMagic[4] = {0xFF, 0x43, 0x4C, 0x01};
constexpr std::string_view kMagicText{"\xFF\x43\x4C\x01", sizeof kMagic};

void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t GetLe(std::string_view in, std::size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  return value;
}

bool MagicAt(std::string_view bytes, std::size_t at) {
  return std::memcmp(bytes.data() + at, kMagic, sizeof kMagic) == 0;
}

bool ZeroMagicAt(std::string_view bytes, std::size_t at) {
  return bytes[at] == 0 && bytes[at + 1] == 0 && bytes[at + 2] == 0 && bytes[at + 3] == 0;
}

// A record at `at` whose header and checksum hold, decoded; `why` says what failed otherwise.
struct Probe {
  bool valid = false;
  std::size_t size = 0;  // header + payload
  ClaimLogRecord record;
  std::string why;
};

Probe ProbeRecord(std::string_view bytes, std::size_t at) {
  Probe probe;
  if (!MagicAt(bytes, at)) {
    probe.why = "no record header";
    return probe;
  }
  const uint64_t length = GetLe(bytes, at + 4, 4);
  const uint64_t seq = GetLe(bytes, at + 8, 8);
  if (length == 0 || length > kClaimLogMaxPayload || at + kClaimLogHeaderSize + length > bytes.size()) {
    probe.why = "record header with length " + std::to_string(length) + " beyond the file";
    return probe;
  }
  const uint64_t crc = GetLe(bytes, at + 16, 4);
  std::string covered(bytes.substr(at + 8, 8));
  covered.append(bytes.substr(at + kClaimLogHeaderSize, length));
  if (Crc32(covered) != crc) {
    probe.why = "record (seq " + std::to_string(seq) + "?) fails its checksum";
    return probe;
  }
  const std::string_view payload = bytes.substr(at + kClaimLogHeaderSize, length);
  const json doc = json::parse(payload.begin(), payload.end(), nullptr, false);
  try {
    if (doc.is_discarded() || !doc.is_object()) throw std::runtime_error("payload is not a JSON object");
    const auto op = doc.at("op").get<std::string>();
    probe.record.seq = seq;
    if (op == "prepared") {
      const json& claim = doc.at("claim");
      if (!claim.is_object() || !claim.contains("uid") || !claim["uid"].is_string()) {
        throw std::runtime_error("claim.uid: missing");
      }
      probe.record.op = ClaimLogRecord::Op::kPrepared;
      probe.record.claim = ClaimFromJson(claim["uid"].get<std::string>(), claim, "claim");
    } else if (op == "unprepared") {
      probe.record.op = ClaimLogRecord::Op::kUnprepared;
      probe.record.claim.uid = doc.at("uid").get<std::string>();
      if (probe.record.claim.uid.empty()) throw std::runtime_error("uid: empty");
    } else {
      throw std::runtime_error("unknown op \"" + op + "\"");
    }
  } catch (const std::exception& e) {
    // The checksum holds, so we wrote it: a newer build's record or a bug. Not applied.
    probe.why = "record seq " + std::to_string(seq) + " has a valid checksum but an unusable payload: " + e.what();
    probe.size = kClaimLogHeaderSize + length;
    return probe;
  }
  probe.valid = true;
  probe.size = kClaimLogHeaderSize + length;
  return probe;
}

std::string Seqs(uint64_t from, uint64_t to) {
  return from == to ? "record seq " + std::to_string(from)
                    : "records seq " + std::to_string(from) + ".." + std::to_string(to);
}

}  // namespace

std::string EncodeClaimLogRecord(const ClaimLogRecord& record) {
  json payload;
  if (record.op == ClaimLogRecord::Op::kPrepared) {
    json claim;
    to_json(claim, record.claim);
    payload = json{{"op", "prepared"}, {"claim", std::move(claim)}};
  } else {
    payload = json{{"op", "unprepared"}, {"uid", record.claim.uid}};
  }
  const std::string body = payload.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string covered;
  PutLe(covered, record.seq, 8);
  covered += body;
  std::string out(reinterpret_cast<const char*>(kMagic), sizeof kMagic);
  PutLe(out, body.size(), 4);
  PutLe(out, record.seq, 8);
  PutLe(out, Crc32(covered), 4);
  out += body;
  return out;
}

ClaimLogReplay ParseClaimLog(std::string_view bytes, std::optional<uint64_t> base) {
  ClaimLogReplay replay;
  replay.last_seq = base.value_or(0);
  replay.max_seq = replay.last_seq;
  bool started = base.has_value();
  std::size_t pos = 0;
  std::size_t bad_start = std::string::npos;  // start of the unreadable span being scanned over
  std::string bad_why;
  while (pos + kClaimLogHeaderSize <= bytes.size()) {
    if (bad_start == std::string::npos && ZeroMagicAt(bytes, pos)) break;  // the clean end
    Probe probe = ProbeRecord(bytes, pos);
    if (!probe.valid) {
      if (bad_start == std::string::npos) {
        bad_start = pos;
        bad_why = probe.why;
      }
      // A checksummed but unusable record is skipped whole; anything else up to the next record
      // header (a record can only start there). Probing every byte instead read the whole
      // preallocated megabyte of a log with a torn last append, one allocation per byte: seconds
      // at every start after a kill -9 caught an append.
      if (probe.size > 0) {
        pos += probe.size;
      } else {
        const std::size_t next = bytes.find(kMagicText, pos + 1);
        pos = next == std::string_view::npos ? bytes.size() : next;
      }
      continue;
    }
    const uint64_t seq = probe.record.seq;
    replay.max_seq = std::max(replay.max_seq, seq);
    if (!started) {
      started = true;
      replay.last_seq = seq - 1;
    }
    if (seq <= replay.last_seq) break;  // an older generation: the chain ended before it
    if (bad_start != std::string::npos || seq != replay.last_seq + 1) {
      std::string what = bad_start != std::string::npos
                             ? "bytes " + std::to_string(bad_start) + ".." + std::to_string(pos) +
                                   " are unreadable (" + bad_why + ")"
                             : "a gap before byte " + std::to_string(pos);
      what += seq == replay.last_seq + 1
                  ? "; no record is missing (seq " + std::to_string(seq) + " follows " +
                        std::to_string(replay.last_seq) + ")"
                  : "; " + Seqs(replay.last_seq + 1, seq - 1) + (seq - 1 == replay.last_seq + 1 ? " is" : " are") +
                        " lost";
      replay.corruption.push_back(std::move(what) + "; the records after it were applied");
      bad_start = std::string::npos;
    }
    replay.records.push_back(std::move(probe.record));
    replay.last_seq = seq;
    pos += probe.size;
    replay.end_offset = pos;
  }
  if (bad_start != std::string::npos) {
    replay.torn_tail = "the last append (from byte " + std::to_string(bad_start) + ", after seq " +
                       std::to_string(replay.last_seq) + ") was cut: " + bad_why +
                       "; it was never acknowledged, nothing is lost";
  } else if (pos + kClaimLogHeaderSize > bytes.size() && pos < bytes.size() && !ZeroMagicAt(bytes, pos)) {
    // Fewer bytes than a header left and they are not the end marker: a cut write at the file's end.
    bool zeros = true;
    for (std::size_t i = pos; i < bytes.size(); ++i) zeros = zeros && bytes[i] == 0;
    if (!zeros) {
      replay.torn_tail = "the last append (from byte " + std::to_string(pos) + ", after seq " +
                         std::to_string(replay.last_seq) + ") was cut short; it was never acknowledged";
    }
  }
  return replay;
}

void ApplyClaimLog(Checkpoint& checkpoint, const std::vector<ClaimLogRecord>& records) {
  for (const auto& record : records) {
    if (record.op == ClaimLogRecord::Op::kPrepared) {
      checkpoint.claims[record.claim.uid] = record.claim;
    } else {
      checkpoint.claims.erase(record.claim.uid);
    }
    checkpoint.log_seq = record.seq;
  }
}

ClaimStateLoad LoadClaimState(const std::string& checkpoint_path, const std::string& log_path) {
  ClaimStateLoad load;
  load.checkpoint = LoadCheckpoint(checkpoint_path);
  const bool trusted = load.checkpoint.status == CheckpointStatus::kLoaded;
  if (trusted) load.state = load.checkpoint.checkpoint;
  std::string bytes;
  // Regular file, bounded (loop/state_file.hpp); appends between compactions stay far below.
  auto read = ReadStateFile(log_path, kMaxClaimLogBytes);
  if (read.status == StateFileRead::Status::kRead) {
    load.log_found = true;
    bytes = std::move(read.content);
  } else if (read.status == StateFileRead::Status::kRejected) {
    // Not a regular file or far too large: damage, moved aside like a log damaged inside.
    load.log_found = true;
    load.log.corruption.push_back(read.error);
    return load;
  } else if (read.status == StateFileRead::Status::kUnreadable) {
    load.log_error = read.error;
  }
  if (!load.log_error.empty()) return load;
  load.log = ParseClaimLog(bytes, trusted ? std::optional<uint64_t>(load.state.log_seq) : std::nullopt);
  ApplyClaimLog(load.state, load.log.records);
  return load;
}

ClaimLog::ClaimLog(std::string path) : path_(std::move(path)) {}

ClaimLog::~ClaimLog() {
  if (fd_ >= 0) ::close(fd_);
}

FileWriteResult ClaimLog::Reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  offset_ = 0;
  const auto slash = path_.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    std::string error;
    if (!EnsureDirectory(path_.substr(0, slash), 0700, error)) return FileWriteResult{false, error};
  }
  if (auto written = WriteFileAtomically(path_, std::string(kClaimLogCapacity, '\0'), 0600); !written) return written;
  fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) return FileWriteResult{false, "open: " + path_ + ": " + std::strerror(errno)};
  return {};
}

FileWriteResult ClaimLog::Append(std::string_view encoded) {
  if (fd_ < 0) return FileWriteResult{false, "the claim log " + path_ + " is not open"};
  std::string data(encoded);
  data.append(4, '\0');  // the end marker
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset_ + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileWriteResult{false, "write: " + path_ + ": " + std::strerror(errno)};
    }
    done += static_cast<std::size_t>(n);
  }
  // Data only: the blocks were allocated and written when the file was made (Reset), so no
  // metadata has to reach the disk unless the log outgrew its pre-zeroed size.
  if (::fdatasync(fd_) != 0) return FileWriteResult{false, "fdatasync: " + path_ + ": " + std::strerror(errno)};
  offset_ += encoded.size();
  return {};
}

}  // namespace gns::dra
