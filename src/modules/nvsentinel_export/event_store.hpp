#pragma once
// The on-disk queue of the nvsentinel-export module: one file per event under
// <stateDir>/nvsentinel-export/queue/, named by its sequence number ("00000000000000000042.event").
//
// Why one file per event rather than an append-only log: events are rare (gpu-health rate-limits
// XID floods before they reach the bus, and the queue is bounded), so the cost of a file per
// event is small, and each file is written with the one crash-safe write every file of ours uses
// (temp file, fsync, rename, fsync of the directory: loop/atomic_file.hpp). A kill -9 at any
// instant leaves whole events or a temp file, never a torn record; removing a delivered event is
// one unlink; dropping the oldest when full is one unlink; a damaged file spoils one event, not
// the log behind it. Order is the sequence number in the name.
//
// Each file: a header line "GNSQ1 <id> <payload bytes> <fnv1a-64 of the payload, hex>\n", then
// the payload (a serialized datamodels.HealthEvent). The checksum catches a file changed or cut
// after it was written (disk, operator); such a file is moved aside ("<name>.corrupt-<unix s>")
// with a precise reason, and the rest of the queue is served.
//
// Blocking (file I/O and fsync): run everything here on the BlockingPool.

#include "loop/atomic_file.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::nvsentinel_export {

struct StoredEvent {
  uint64_t seq = 0;
  std::string id;       // the HealthEvent's id (stable: a receiver dedupes a resend on it)
  std::string payload;  // serialized datamodels.HealthEvent
  bool operator==(const StoredEvent&) const = default;
};

// One file's bytes, and back. Decode: nullopt with `error` saying what is wrong.
std::string EncodeStoredEvent(const StoredEvent& event);
std::optional<StoredEvent> DecodeStoredEvent(uint64_t seq, std::string_view bytes, std::string& error);
std::string StoredEventFileName(uint64_t seq);
// The sequence number of a queue file's name; nullopt for any other name.
std::optional<uint64_t> ParseStoredEventFileName(std::string_view name);

uint64_t Fnv1a64(std::string_view bytes, uint64_t seed = 0xcbf29ce484222325ull);

class EventStore {
 public:
  explicit EventStore(std::string dir) : dir_(std::move(dir)) {}
  const std::string& Dir() const { return dir_; }

  struct Loaded {
    std::vector<StoredEvent> events;  // by sequence number
    // "<path>: <why>; moved to <path>" for each damaged file (or why it could not be moved).
    std::vector<std::string> damaged;
    std::string error;  // the directory could not be made or read: nothing loaded
  };
  // Makes the directory, removes temp files of interrupted writes, reads every event.
  Loaded Load(int64_t now_unix_seconds) const;
  // Writes the events (each crash-safe); stops at the first failure.
  FileWriteResult Append(const std::vector<StoredEvent>& events) const;
  // Removes the events' files (delivered or dropped), then fsyncs the directory once. A file
  // already gone is fine.
  FileWriteResult Remove(const std::vector<uint64_t>& seqs) const;

 private:
  std::string dir_;
};

}  // namespace gns::nvsentinel_export
