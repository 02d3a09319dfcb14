// In which boots each (GPU, XID) asked for a reset or a reboot: the memory behind the catalog's
// `escalation` (gpud's reboot threshold). A GPU that needs resetting again after reboots is
// broken hardware, and a new boot (or a reset that succeeded) must not make us forget that, so
// this history outlives both: the judge never clears it, and the module keeps it in the
// checkpoint whatever boot the checkpoint belongs to.
//
// Pure: times come in with each call (the occurrence's Unix time), no I/O. Bounded: at most
// kMaxKeys (GPU, XID) entries (the one seen least recently goes first), each with at most
// kMaxBoots boots, none older than kMaxWindow before the newest occurrence of its entry.
#pragma once

#include "modules/gpu_health/xid_catalog.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

class XidBootHistory {
 public:
  static constexpr std::size_t kMaxKeys = 256;
  static constexpr std::size_t kMaxBoots = kMaxEscalationBoots + 1;
  static constexpr std::size_t kMaxBootIdBytes = 64;

  struct Boot {
    std::string boot_id;
    int64_t last_unix_ms = 0;  // the latest occurrence in that boot
    bool operator==(const Boot&) const = default;
  };
  struct Entry {
    std::string gpu;  // the GPU's UUID (PCI policy id while unknown)
    uint32_t xid = 0;
    std::vector<Boot> boots;  // oldest first
    bool operator==(const Entry&) const = default;
  };

  // One occurrence in `boot_id` at `at_unix_ms`. Returns how many distinct boots, this one
  // included, had the XID on the GPU within `window` before `at_unix_ms`. An empty or oversized
  // boot ID is not recorded (boots cannot be told apart): 0.
  uint32_t Record(std::string_view gpu, uint32_t xid, std::string_view boot_id, int64_t at_unix_ms,
                  std::chrono::milliseconds window);
  // The boots within `window` before `at_unix_ms`, without recording anything.
  [[nodiscard]] uint32_t BootsWithin(std::string_view gpu, uint32_t xid, int64_t at_unix_ms,
                                     std::chrono::milliseconds window) const;

  // For the checkpoint: everything, and back (entries beyond the bounds are dropped).
  [[nodiscard]] const std::vector<Entry>& All() const noexcept { return entries_; }
  void Restore(std::vector<Entry> entries);
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  Entry* Find(std::string_view gpu, uint32_t xid);
  const Entry* Find(std::string_view gpu, uint32_t xid) const;

  // Few entries (GPUs × escalating XIDs seen in a week): a vector walked only on fatal XIDs.
  std::vector<Entry> entries_;
};

}  // namespace gns::gpu_health
