#pragma once
// NVML's ECC and clock events as gpu-inventory publishes them (NvmlHealthEvent): the event
// waiter child registers nvmlEventTypeSingleBitEccError, DoubleBitEccError and Clock where the
// GPU supports them, and each event says that a reading of gpu-health's polled checks changed.
// gpu-health reads and judges that group at once; the poll stays the backstop. A header of its
// own (not messages.hpp, which most modules include) so that only the two modules see it.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::gpu_inventory {

// An ECC or clock event reported by NVML's event API on a GPU that supports it.
struct NvmlHealthEvent {
  static constexpr std::string_view kTopic = "gpu-inventory.health-event";
  enum class Kind { kSingleBitEcc, kDoubleBitEcc, kClock };
  std::string uuid;
  Kind kind = Kind::kDoubleBitEcc;
  uint64_t data = 0;  // nvmlEventData_t.eventData as NVML gave it
  int64_t observed_unix_ms = 0;
};

// "singleBitEcc", "doubleBitEcc", "clock": the names of the event waiter's lines, the metrics
// and /debug/state.
[[nodiscard]] constexpr std::string_view HealthEventKindName(NvmlHealthEvent::Kind kind) noexcept {
  switch (kind) {
    case NvmlHealthEvent::Kind::kSingleBitEcc: return "singleBitEcc";
    case NvmlHealthEvent::Kind::kDoubleBitEcc: return "doubleBitEcc";
    case NvmlHealthEvent::Kind::kClock: return "clock";
  }
  return "unknown";
}

inline void to_json(nlohmann::json& j, const NvmlHealthEvent& e) {
  j = nlohmann::json{{"uuid", e.uuid}, {"kind", HealthEventKindName(e.kind)}, {"data", e.data},
                     {"observedUnixMs", e.observed_unix_ms}};
}

}  // namespace gns::gpu_inventory
