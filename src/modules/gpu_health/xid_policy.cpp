// XidPolicy: site overrides first (ignore, critical, thresholds), then the catalog; then the
// per-(GPU, XID) rate limit. See xid_policy.hpp for the contract.
#include "modules/gpu_health/xid_policy.hpp"

#include <algorithm>
#include <utility>

namespace gns::gpu_health {
namespace {

// The action to recommend when the site makes an XID fatal that the catalog does not: keep
// the catalog's if it already acts on the device, otherwise resetting the GPU is the least
// disruptive fix that takes it out of service.
RecommendedAction DeviceAction(RecommendedAction catalog_action) {
  return ActsOnDevice(catalog_action) ? catalog_action : RecommendedAction::kComponentReset;
}

// Order of severity for the "escalation is never suppressed" rule.
int Rank(Verdict v) {
  switch (v) {
    case Verdict::kIgnored: return 0;
    case Verdict::kBelowThreshold: return 1;
    case Verdict::kNonFatal: return 2;
    case Verdict::kFatal: return 3;
    case Verdict::kDuplicate: return 0;
  }
  return 0;
}

}  // namespace

std::string_view VerdictName(Verdict verdict) noexcept {
  switch (verdict) {
    case Verdict::kIgnored: return "ignored";
    case Verdict::kBelowThreshold: return "below-threshold";
    case Verdict::kNonFatal: return "non-fatal";
    case Verdict::kFatal: return "fatal";
    case Verdict::kDuplicate: return "duplicate";
  }
  return "unknown";
}

XidPolicy::XidPolicy(const XidCatalog& catalog, SiteOverrides overrides)
    : catalog_(catalog.Patched(overrides.defaults, overrides.xids)), overrides_(std::move(overrides)) {}

const XidThreshold* XidPolicy::ThresholdOf(uint32_t xid) const noexcept {
  if (auto t = overrides_.thresholds.find(xid); t != overrides_.thresholds.end()) return &t->second;
  const XidInfo* info = catalog_.Find(xid);
  return info != nullptr && info->threshold ? &*info->threshold : nullptr;
}

XidPolicy::Standing XidPolicy::StandingOf(uint32_t xid) const noexcept {
  if (overrides_.ignore.contains(xid)) return {};
  const XidLookup info = catalog_.Lookup(xid);
  if (auto c = overrides_.critical.find(xid); c != overrides_.critical.end()) {
    return {true, c->second.value_or(DeviceAction(info.action))};
  }
  if (ThresholdOf(xid) != nullptr) return {};
  return {info.fatal, info.action};
}

std::size_t XidPolicy::TrackedTimestamps() const noexcept {
  std::size_t n = 0;
  for (const auto& [key, state] : states_) n += state.size;
  return n;
}

XidPolicy::State& XidPolicy::StateFor(std::string_view gpu_id, uint32_t xid, Timestamp at) {
  if (auto it = states_.find(KeyView{gpu_id, xid}); it != states_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return it->second;
  }
  if (states_.size() >= kMaxTrackedKeys) {
    // Full: forget the (GPU, XID) used least recently.
    const Key* oldest = lru_.front();
    lru_.pop_front();
    states_.erase(states_.find(KeyView{oldest->gpu, oldest->xid}));
    ++evictions_;
  }
  State fresh;
  fresh.latest = at;
  if (const XidThreshold* t = ThresholdOf(xid)) fresh.ring.assign(t->count, Timestamp{});
  auto it = states_.emplace(Key{std::string(gpu_id), xid}, std::move(fresh)).first;
  it->second.lru = lru_.insert(lru_.end(), &it->first);
  return it->second;
}

uint32_t XidPolicy::CountWithin(State& s, Timestamp at, std::chrono::milliseconds window) {
  // Occurrences older than the window fall out from the front; timestamps enter in
  // non-decreasing order (see the clamp in Decide), so the ring stays sorted.
  const Timestamp cutoff = at - std::chrono::duration_cast<Timestamp>(window);
  while (s.size > 0 && s.ring[s.head] <= cutoff) {
    s.head = (s.head + 1) % s.ring.size();
    --s.size;
  }
  const std::size_t cap = s.ring.size();
  if (s.size == cap) {  // full: overwrite the oldest
    s.ring[s.head] = at;
    s.head = (s.head + 1) % cap;
  } else {
    s.ring[(s.head + s.size) % cap] = at;
    ++s.size;
  }
  return static_cast<uint32_t>(s.size);
}

bool XidPolicy::MatchOtherSource(State& s, XidSource source, Timestamp at) const {
  const auto window = std::chrono::duration_cast<Timestamp>(overrides_.cross_source_window);
  const auto mine = static_cast<std::size_t>(source);
  const auto other = 1 - mine;
  auto& theirs = s.unmatched[other];
  auto& their_count = s.unmatched_count[other];
  // Reports of the other source too old to match anything from now on go first.
  std::size_t drop = 0;
  while (drop < their_count && theirs[drop] + window < at) ++drop;
  const bool matched = drop < their_count && theirs[drop] <= at + window;
  const std::size_t consumed = drop + (matched ? 1 : 0);
  std::move(theirs.begin() + static_cast<std::ptrdiff_t>(consumed), theirs.begin() + their_count, theirs.begin());
  their_count = static_cast<uint8_t>(their_count - consumed);
  if (matched) return true;
  auto& ours = s.unmatched[mine];
  auto& our_count = s.unmatched_count[mine];
  if (our_count == kMaxUnmatched) {  // the other source is silent: forget the oldest
    std::move(ours.begin() + 1, ours.end(), ours.begin());
    --our_count;
  }
  ours[our_count++] = at;
  return false;
}

XidDecision XidPolicy::Decide(std::string_view gpu_id, uint32_t xid, Timestamp at, XidSource source,
                              std::optional<RecommendedAction> line_action) {
  XidDecision d;
  const XidLookup info = catalog_.Lookup(xid);
  d.known_xid = info.known;
  d.mnemonic = info.mnemonic;
  if (overrides_.ignore.contains(xid)) {
    d.verdict = Verdict::kIgnored;
    d.action = RecommendedAction::kNone;
    return d;  // no state: an ignored flood costs nothing
  }

  State& s = StateFor(gpu_id, xid, at);
  if (MatchOtherSource(s, source, at)) {
    d.verdict = Verdict::kDuplicate;
    return d;
  }
  at = std::max(at, s.latest);
  s.latest = at;

  if (auto c = overrides_.critical.find(xid); c != overrides_.critical.end()) {
    d.verdict = Verdict::kFatal;
    d.action = c->second.value_or(DeviceAction(info.action));
  } else if (const XidThreshold* t = ThresholdOf(xid)) {
    d.threshold = t->count;
    d.count_in_window = CountWithin(s, at, t->window);
    if (d.count_in_window >= d.threshold) {
      d.verdict = Verdict::kFatal;
      d.action = DeviceAction(info.action);
    } else {
      d.verdict = Verdict::kBelowThreshold;
      d.action = RecommendedAction::kNone;
    }
  } else if (line_action) {
    d.verdict = *line_action == RecommendedAction::kNone ? Verdict::kNonFatal : Verdict::kFatal;
    d.action = *line_action;
  } else if (info.fatal) {
    d.verdict = Verdict::kFatal;
    d.action = info.action;
  } else {
    d.verdict = Verdict::kNonFatal;
    d.action = info.action;
  }

  // Rate limit: the first occurrence, an escalation, or the first one after a whole window
  // is emitted; everything else is counted and reported with the next emission.
  const bool first = !s.emitted;
  // A different action on the same verdict is news too (a 154 moving from reset to reboot).
  const bool escalation = !first && (Rank(d.verdict) > Rank(s.last_emitted) ||
                                     (d.verdict == s.last_emitted && d.action != s.last_action));
  const bool window_passed = !first && at - s.last_emit >= overrides_.dedup_window;
  if (first || escalation || window_passed) {
    d.emit = true;
    d.suppressed_before = s.suppressed;
    s.suppressed = 0;
    s.last_emit = at;
    s.last_emitted = d.verdict;
    s.last_action = d.action;
    s.emitted = true;
  } else {
    ++s.suppressed;
  }
  return d;
}

void XidPolicy::ForgetGpu(std::string_view gpu_id) { Forget(gpu_id, std::nullopt); }

void XidPolicy::ForgetXid(std::string_view gpu_id, uint32_t xid) { Forget(gpu_id, xid); }

void XidPolicy::Forget(std::string_view gpu_id, std::optional<uint32_t> xid) {
  // Rare (a reset, an operator, a clearing XID): a walk over at most kMaxTrackedKeys states.
  for (auto it = states_.begin(); it != states_.end();) {
    // The GPU and its GPU instances ("<id>/gi<N>", as the judge keys them).
    const std::string_view key = it->first.gpu;
    const bool gpu = key == gpu_id || (key.starts_with(gpu_id) && key.substr(gpu_id.size()).starts_with("/gi"));
    if (gpu && (!xid || it->first.xid == *xid)) {
      lru_.erase(it->second.lru);
      it = states_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace gns::gpu_health
