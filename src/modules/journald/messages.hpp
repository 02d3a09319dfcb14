#pragma once
// Bus messages of the `journald` module: kernel lines and the lines of the units (and the
// acknowledgement identifier) named in its config, as read from the journal, plus the
// module's own reading state (retained, shown in /debug/state).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::journald {

// What every published line carries. `message` is cut at the configured maxMessageBytes
// (`truncated` says so); it is the raw MESSAGE field and may hold any bytes.
struct JournalLine {
  std::string message;
  bool truncated = false;
  std::string boot_id;          // 32 lowercase hex digits
  uint64_t realtime_usec = 0;   // __REALTIME_TIMESTAMP
  uint64_t monotonic_usec = 0;  // __MONOTONIC_TIMESTAMP (within boot_id)
  int priority = -1;            // PRIORITY (0..7), -1 when absent or garbage
  std::string cursor;
};

// A kernel message (_TRANSPORT=kernel).
struct KernelLine : JournalLine {
  static constexpr std::string_view kTopic = "journald.kernel";
};

// A message of a configured unit (_SYSTEMD_UNIT) or of the acknowledgement identifier
// (SYSLOG_IDENTIFIER, e.g. the GPU reset job's "GPU reset occurred: GPU-…").
struct UnitLine : JournalLine {
  static constexpr std::string_view kTopic = "journald.unit";
  std::string unit;        // _SYSTEMD_UNIT, empty when absent
  std::string identifier;  // SYSLOG_IDENTIFIER, empty when absent
  bool acknowledgement = false;  // identifier is the configured acknowledgement identifier
};

// Retained: where the reader stands.
struct JournalState {
  static constexpr std::string_view kTopic = "journald.state";
  static constexpr bool kRetained = true;
  std::string source;        // "system" or the directory
  std::string boot_id;       // the current boot
  std::string start_mode;    // "cursor", "boot-head", "gap", "new-boot"
  std::string cursor;        // the last entry read
  uint64_t entries = 0;      // entries read since the start
  uint64_t gaps = 0;
  uint64_t bad_entries = 0;
  bool live = false;         // caught up and waiting on the journal's fd
  bool timeout_wait = false; // sd-journal also asked to be woken by a timeout (no inotify there)
  uint64_t fd_wakeups = 0;   // wakes since the start, by cause
  uint64_t timeout_wakeups = 0;
};

inline void to_json(nlohmann::json& j, const JournalState& s) {
  j = nlohmann::json{{"source", s.source},     {"bootId", s.boot_id}, {"startMode", s.start_mode},
                     {"cursor", s.cursor},     {"entries", s.entries}, {"gaps", s.gaps},
                     {"badEntries", s.bad_entries}, {"live", s.live}, {"timeoutWait", s.timeout_wait},
                     {"fdWakeups", s.fd_wakeups}, {"timeoutWakeups", s.timeout_wakeups}};
}

}  // namespace gns::journald
