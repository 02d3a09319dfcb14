// gpu-health's checkpoint, <stateDir>/gpu-health/devices.json: the verdicts of this boot, the
// position of the last health-stream line handled (journald's kernel lines and reset
// acknowledgements) and the XID counts as of that line — one file, one atomic write, so that
// after a restart or kill -9 the lines after the position are handled exactly once: none was
// acted on before (its effects would be in the file), none is lost (journald serves the
// stream from this position).
//
// Version 2 (with the optional fatal check conditions); version 1 files (verdicts only) are read, their position taken as unknown.
// CheckpointWriter keeps one write in flight, always of the newest state, and says which
// state each finished write covered, so that effects which leave the process can wait for it.
#pragma once

#include "loop/atomic_file.hpp"
#include "loop/blocking_pool.hpp"
#include "loop/gate.hpp"
#include "modules/gpu_health/check_book.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_health/xid_boot_history.hpp"
#include "modules/gpu_health/xid_counts.hpp"
#include "modules/journald/messages.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

struct HealthCheckpoint {
  static constexpr int kVersion = 2;
  static constexpr std::size_t kMaxBytes = 1 << 20;
  static constexpr std::size_t kMaxDevices = 1024;
  static constexpr std::size_t kMaxCounts = 1024;

  std::string boot_id;  // 32 lowercase hex digits, or empty when the boot was unknown
  std::vector<DeviceHealth> devices;
  journald::JournalPosition journal;  // the last health-stream line handled; empty cursor: none
  std::vector<XidCount> xid_counts;
  // Fatal conditions of the polled checks (latched like fatal XIDs), by GPU UUID. Optional in
  // the file ("checkConditions"): files written before the checks read as none, and a build
  // without the checks ignores the key, so the version stays 2.
  std::vector<std::pair<std::string, HeldCondition>> conditions;
  // What holds each Unhealthy verdict (VerdictBook::HeldBy), by DeviceHealth::RetainKey; in
  // the file as the device's optional "heldBy" (absent: the verdict's XID alone).
  std::map<std::string, std::vector<uint32_t>> held_by;
  // The boot history of escalating XIDs (optional "xidBoots"). Unlike everything above it is
  // not this boot's: the module keeps it whatever boot the file belongs to.
  std::vector<XidBootHistory::Entry> xid_boots;
  // The last events that left (or are about to leave: the outbox this write covers), newest
  // last (optional "eventLog"; HealthEventLog). Kept whatever boot the file belongs to.
  std::vector<HealthEvent> event_log;
  static constexpr std::size_t kMaxEventLog = 1024;

  [[nodiscard]] std::string Serialize() const;
  // nullopt (with `error`: what and where) for anything malformed, too large or of an unknown
  // version.
  static std::optional<HealthCheckpoint> Parse(std::string_view text, std::string& error);
};

// "6f1c…-…" or "6f1c…" (any case, surrounding white space) → 32 lowercase hex digits; empty if
// it is not a boot ID.
[[nodiscard]] std::string NormalizeBootId(std::string_view text);

// Writes the checkpoint on the pool: directory 0700, file 0600, temp + fsync + rename + fsync
// of the directory. One write at a time; Dirty() while one is in flight writes again after it,
// with the state as it is then. Loop thread only.
class CheckpointWriter {
 public:
  struct Snapshot {
    std::string content;
    uint64_t covers = 0;  // the owner's change counter at the time of the snapshot
  };
  using Take = std::function<Snapshot()>;
  // After each write: what it covered, and whether it landed (error says why not).
  using Written = std::function<void(uint64_t covers, bool ok, const std::string& error)>;

  CheckpointWriter(BlockingPool& pool, std::string path, Take take, Written written);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void Dirty();
  // Nothing in flight and nothing left to write.
  [[nodiscard]] bool Idle() const { return !writing_ && !dirty_; }
  const std::string& Path() const { return path_; }

 private:
  void Write();

  BlockingPool& pool_;
  std::string path_;
  Take take_;
  Written written_;
  bool dirty_ = false;
  bool writing_ = false;
  Gate lifetime_;
};

}  // namespace gns::gpu_health
