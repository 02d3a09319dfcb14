#pragma once
// Bus messages of the `journald` module: kernel lines and the lines of the units (and the
// acknowledgement identifier) named in its config, as read from the journal, plus the
// module's own reading state (retained, shown in /debug/state).
//
// Two streams, each read by its own journal handle:
//  - the health stream: kernel lines and reset acknowledgements. Nothing of it may be lost or
//    doubled, so its position belongs to its consumer (gpu-health), which persists it in the
//    same write as the verdicts the lines produced. The consumer asks for the stream with a
//    HealthStreamRequest naming the position to read after; journald reads the health stream
//    only while a request of its current reader instance is in force, and stamps each line
//    with the request's generation so that lines of an earlier request, still queued on the
//    bus, can be told apart and dropped.
//  - the units stream: the configured units' lines, from journald's own cursor file.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::journald {

// SYSLOG_IDENTIFIER of GPU reset acknowledgements: what journald reads them by and what the
// gpu-reset module writes them with (one default for both configs).
inline constexpr std::string_view kDefaultAckIdentifier = "gpu-reset";

// A place in the journal: the entry last read (cursor) with its boot and times. Empty cursor:
// nothing read yet.
struct JournalPosition {
  std::string boot_id;  // 32 lowercase hex digits
  std::string cursor;
  uint64_t monotonic_usec = 0;
  uint64_t realtime_usec = 0;
  bool operator==(const JournalPosition&) const = default;
};

inline void to_json(nlohmann::json& j, const JournalPosition& p) {
  j = nlohmann::json{{"bootId", p.boot_id}, {"cursor", p.cursor}, {"monotonicUsec", p.monotonic_usec},
                     {"realtimeUsec", p.realtime_usec}};
}

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
  // The HealthStreamRequest generation the line was read for; 0 on the units stream.
  uint64_t generation = 0;
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

// The consumer's request for the health stream (retained: a journald that starts later, or
// again, finds it). `reader` names the journald instance it is for (JournalState::reader): a
// request for an earlier instance is ignored, so that a journald restarted alone waits for its
// consumer to say where it stands now instead of replaying from an old request.
struct HealthStreamRequest {
  static constexpr std::string_view kTopic = "journald.health-stream-request";
  static constexpr bool kRetained = true;
  std::string consumer;     // who asks ("gpu-health"), for logs and state
  std::string reader;       // the JournalState::reader this request is for
  bool active = false;      // false: the consumer stopped; journald stops reading the stream
  uint64_t generation = 0;  // non-zero, new for every request; stamped on the lines read for it
  JournalPosition after;    // read after this entry; empty cursor: the current boot from its head
};

inline void to_json(nlohmann::json& j, const HealthStreamRequest& r) {
  j = nlohmann::json{{"consumer", r.consumer}, {"reader", r.reader}, {"active", r.active},
                     {"generation", r.generation}, {"after", r.after}};
}

// Where one stream's reader stands.
struct StreamState {
  bool open = false;         // reading (the health stream waits for its consumer's request)
  std::string start_mode;    // "cursor", "boot-head", "gap", "new-boot"
  std::string cursor;        // the last entry read
  uint64_t entries = 0;      // entries read since the start
  uint64_t gaps = 0;
  bool live = false;         // caught up and waiting on the journal's fd
  bool timeout_wait = false; // sd-journal also asked to be woken by a timeout (no inotify there)
  uint64_t fd_wakeups = 0;   // wakes since the start, by cause
  uint64_t timeout_wakeups = 0;
  // Health stream: the request in force.
  std::string consumer;
  uint64_t generation = 0;
};

inline void to_json(nlohmann::json& j, const StreamState& s) {
  j = nlohmann::json{{"open", s.open},     {"startMode", s.start_mode}, {"cursor", s.cursor},
                     {"entries", s.entries}, {"gaps", s.gaps},           {"live", s.live},
                     {"timeoutWait", s.timeout_wait}, {"fdWakeups", s.fd_wakeups},
                     {"timeoutWakeups", s.timeout_wakeups}};
  if (!s.consumer.empty()) {
    j["consumer"] = s.consumer;
    j["generation"] = s.generation;
  }
}

// Retained: where the readers stand.
struct JournalState {
  static constexpr std::string_view kTopic = "journald.state";
  static constexpr bool kRetained = true;
  std::string source;        // "system" or the directory
  std::string boot_id;       // the current boot
  std::string reader;        // this journald instance (random, new at every start)
  uint64_t bad_entries = 0;
  StreamState health;        // kernel lines and reset acknowledgements
  StreamState units;         // the configured units (not open when there are none)
};

inline void to_json(nlohmann::json& j, const JournalState& s) {
  j = nlohmann::json{{"source", s.source}, {"bootId", s.boot_id},  {"reader", s.reader},
                     {"badEntries", s.bad_entries}, {"health", s.health}, {"units", s.units}};
}

}  // namespace gns::journald
