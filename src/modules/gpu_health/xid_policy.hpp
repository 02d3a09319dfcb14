// Decides what one XID occurrence on one GPU means, given the catalog and the site overrides:
// ignore it, count it below a threshold, report it as non-fatal, or declare the device
// Unhealthy with a recommended action. It also rate-limits: a flood of identical (GPU, XID)
// occurrences yields the first decision, then at most one per dedup window (carrying how
// many were swallowed), plus an immediate one when the verdict escalates.
//
// One occurrence is often reported twice: by NVML's event and by the kernel log line. A report
// from one source within overrides.cross_source_window of an unmatched report of the same
// (GPU, XID) from the other source is that occurrence again: kDuplicate, not counted.
//
// Pure: time comes in with each call (no clock reads), nothing is logged or published; not
// thread-safe (one owner, the module's loop). Memory is bounded: at most kMaxTrackedKeys
// (GPU, XID) states, each holding at most the threshold's `count` timestamps, whatever the
// input rate.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "modules/gpu_health/xid_catalog.hpp"

namespace gns::gpu_health {

// Microseconds since any fixed epoch (journald's __REALTIME_TIMESTAMP or
// __MONOTONIC_TIMESTAMP both fit); only differences matter. A timestamp older than one already
// seen for the same (GPU, XID) is treated as equal to it, so a clock step back cannot reopen
// a window.
using Timestamp = std::chrono::microseconds;

enum class Verdict : uint8_t {
  kIgnored,         // listed in the site's ignore list: no state, no event
  kBelowThreshold,  // counted; not (yet) enough occurrences within the window
  kNonFatal,        // reported; the device stays healthy (application error, informational)
  kFatal,           // the device must be marked Unhealthy; `action` says what fixes it
  kDuplicate,       // the other source's report of an occurrence already decided: no state change
};

// Where a report comes from. Timestamps of both must share an epoch (the module uses Unix
// time: journald's __REALTIME_TIMESTAMP, NVML's observation time).
enum class XidSource : uint8_t { kKernel = 0, kNvml = 1 };

[[nodiscard]] std::string_view VerdictName(Verdict verdict) noexcept;

struct XidDecision {
  Verdict verdict = Verdict::kIgnored;
  RecommendedAction action = RecommendedAction::kNone;
  bool known_xid = true;        // false: not in the catalog (CONTACT_SUPPORT, fatal)
  std::string_view mnemonic;    // from the catalog; valid while the policy lives
  uint32_t threshold = 0;       // the XID's threshold count, 0 when it has none
  uint32_t count_in_window = 0; // occurrences inside the threshold window, this one included
  bool emit = false;            // publish an event for this occurrence
  uint64_t suppressed_before = 0;  // identical occurrences swallowed since the last emission
};

class XidPolicy {
 public:
  static constexpr std::size_t kMaxTrackedKeys = 1024;
  static constexpr std::size_t kMaxUnmatched = 4;

  // The catalog is used with the overrides' `defaults` and `xids` laid over it.
  XidPolicy(const XidCatalog& catalog, SiteOverrides overrides);
  // lru_ points into states_: a copy would point into the original.
  XidPolicy(const XidPolicy&) = delete;
  XidPolicy& operator=(const XidPolicy&) = delete;
  XidPolicy(XidPolicy&&) = default;
  XidPolicy& operator=(XidPolicy&&) = default;

  // `gpu_id` is whatever the caller keys devices by (UUID, or PCI address until the UUID is
  // known); it is copied only when a new (GPU, XID) state is created. `line_action`: what the
  // report itself says the device needs (XID 154 names the driver's recovery action), which
  // takes the catalog's place: kNone reports without acting, anything else is fatal with that
  // action. A site override of the XID (ignore, critical, threshold) still wins.
  XidDecision Decide(std::string_view gpu_id, uint32_t xid, Timestamp at, XidSource source = XidSource::kKernel,
                     std::optional<RecommendedAction> line_action = std::nullopt);

  // Drops every state of one GPU and of its GPU instances ("<gpu_id>/gi<N>"), after a
  // successful reset: counts start again.
  void ForgetGpu(std::string_view gpu_id);
  // Drops the state of one XID on one GPU and its GPU instances (its threshold counts, its
  // rate limit): an XID that clears it was seen (the catalog's `clears`).
  void ForgetXid(std::string_view gpu_id, uint32_t xid);

  // What an occurrence of `xid` would be without counting: fatal with its action when the site
  // makes it critical or the catalog fatal (after the site's `xids`), else not fatal (ignored,
  // thresholded or non-fatal). For occurrences read too late to act on (the lookback).
  struct Standing {
    bool fatal = false;
    RecommendedAction action = RecommendedAction::kNone;
  };
  [[nodiscard]] Standing StandingOf(uint32_t xid) const noexcept;

  // The catalog after the site's `defaults` and `xids` (what the policy decides with).

  [[nodiscard]] const XidCatalog& catalog() const noexcept { return catalog_; }
  [[nodiscard]] const SiteOverrides& overrides() const noexcept { return overrides_; }
  // Introspection for tests and metrics.
  [[nodiscard]] std::size_t TrackedKeys() const noexcept { return states_.size(); }
  [[nodiscard]] std::size_t TrackedTimestamps() const noexcept;
  [[nodiscard]] uint64_t Evictions() const noexcept { return evictions_; }

 private:
  struct Key {
    std::string gpu;
    uint32_t xid;
  };
  struct KeyView {
    std::string_view gpu;
    uint32_t xid;
  };
  // Hashed, not ordered: Decide runs for every Xid line, and an ordered map compares whole
  // UUIDs ("GPU-" + 36 characters) at every level. Transparent, so lookups by KeyView do not
  // allocate.
  struct KeyHash {
    using is_transparent = void;
    template <class K>
    std::size_t operator()(const K& k) const noexcept {
      return std::hash<std::string_view>{}(std::string_view(k.gpu)) ^
             (static_cast<std::size_t>(k.xid) * 0x9E3779B97F4A7C15ull);
    }
  };
  struct KeyEqual {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      return a.xid == b.xid && std::string_view(a.gpu) == std::string_view(b.gpu);
    }
  };
  struct State {
    Timestamp latest{};
    Timestamp last_emit{};
    Verdict last_emitted = Verdict::kIgnored;
    RecommendedAction last_action = RecommendedAction::kNone;  // of the last emission
    bool emitted = false;
    uint64_t suppressed = 0;
    // Ring of the most recent occurrence times, capacity = the threshold count.
    std::vector<Timestamp> ring;
    std::size_t head = 0;  // oldest entry
    std::size_t size = 0;
    // Reports of each source not yet matched by the other's, oldest first (kMaxUnmatched each).
    std::array<std::array<Timestamp, kMaxUnmatched>, 2> unmatched{};
    std::array<uint8_t, 2> unmatched_count{};
    // This state's place in lru_ (front = least recently used).
    std::list<const Key*>::iterator lru;
  };

  State& StateFor(std::string_view gpu_id, uint32_t xid, Timestamp at);
  // The site's `thresholds` entry, else the catalog entry's `threshold`; nullptr when none.
  const XidThreshold* ThresholdOf(uint32_t xid) const noexcept;
  void Forget(std::string_view gpu_id, std::optional<uint32_t> xid);
  // True when `at` from `source` matches (and consumes) an unmatched report of the other
  // source; otherwise records it as unmatched.
  bool MatchOtherSource(State& s, XidSource source, Timestamp at) const;
  static uint32_t CountWithin(State& s, Timestamp at, std::chrono::milliseconds window);

  XidCatalog catalog_;
  SiteOverrides overrides_;
  std::unordered_map<Key, State, KeyHash, KeyEqual> states_;
  // Keys in order of last use, so eviction at the cap is O(1) even under a flood of distinct
  // keys. Map keys do not move (not even on rehash), so pointers to them stay valid until
  // erased.
  std::list<const Key*> lru_;
  uint64_t evictions_ = 0;
};

}  // namespace gns::gpu_health
