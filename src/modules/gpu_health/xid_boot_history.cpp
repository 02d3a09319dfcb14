// The boot history of escalating XIDs (see xid_boot_history.hpp).
#include "modules/gpu_health/xid_boot_history.hpp"

#include <algorithm>
#include <utility>

namespace gns::gpu_health {
namespace {

int64_t NewestOf(const XidBootHistory::Entry& e) {
  int64_t newest = 0;
  for (const auto& b : e.boots) newest = std::max(newest, b.last_unix_ms);
  return newest;
}

uint32_t CountWithin(const XidBootHistory::Entry& e, int64_t at_unix_ms, std::chrono::milliseconds window) {
  uint32_t n = 0;
  for (const auto& b : e.boots) n += b.last_unix_ms >= at_unix_ms - window.count() ? 1 : 0;
  return n;
}

}  // namespace

XidBootHistory::Entry* XidBootHistory::Find(std::string_view gpu, uint32_t xid) {
  for (auto& e : entries_) {
    if (e.xid == xid && e.gpu == gpu) return &e;
  }
  return nullptr;
}

const XidBootHistory::Entry* XidBootHistory::Find(std::string_view gpu, uint32_t xid) const {
  for (const auto& e : entries_) {
    if (e.xid == xid && e.gpu == gpu) return &e;
  }
  return nullptr;
}

uint32_t XidBootHistory::Record(std::string_view gpu, uint32_t xid, std::string_view boot_id, int64_t at_unix_ms,
                                std::chrono::milliseconds window) {
  if (boot_id.empty() || boot_id.size() > kMaxBootIdBytes) return 0;
  Entry* e = Find(gpu, xid);
  if (e == nullptr) {
    if (entries_.size() >= kMaxKeys) {
      // Full: the entry seen least recently goes.
      auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                     [](const Entry& a, const Entry& b) { return NewestOf(a) < NewestOf(b); });
      entries_.erase(oldest);
    }
    entries_.push_back(Entry{std::string(gpu), xid, {}});
    e = &entries_.back();
  }
  auto& boots = e->boots;
  auto same = std::find_if(boots.begin(), boots.end(), [&](const Boot& b) { return b.boot_id == boot_id; });
  if (same != boots.end()) {
    same->last_unix_ms = std::max(same->last_unix_ms, at_unix_ms);
  } else {
    if (boots.size() >= kMaxBoots) boots.erase(boots.begin());
    boots.push_back(Boot{std::string(boot_id), at_unix_ms});
  }
  // Nothing older than the longest window any XID may have is worth keeping.
  const int64_t horizon = std::max(at_unix_ms, NewestOf(*e)) - kMaxWindow.count();
  std::erase_if(boots, [&](const Boot& b) { return b.last_unix_ms < horizon; });
  return CountWithin(*e, at_unix_ms, window);
}

uint32_t XidBootHistory::BootsWithin(std::string_view gpu, uint32_t xid, int64_t at_unix_ms,
                                     std::chrono::milliseconds window) const {
  const Entry* e = Find(gpu, xid);
  return e == nullptr ? 0 : CountWithin(*e, at_unix_ms, window);
}

void XidBootHistory::Restore(std::vector<Entry> entries) {
  entries_.clear();
  for (auto& e : entries) {
    if (entries_.size() >= kMaxKeys) break;
    if (e.boots.empty() || Find(e.gpu, e.xid) != nullptr) continue;
    std::erase_if(e.boots, [](const Boot& b) { return b.boot_id.empty() || b.boot_id.size() > kMaxBootIdBytes; });
    if (e.boots.size() > kMaxBoots) e.boots.erase(e.boots.begin(), e.boots.end() - static_cast<std::ptrdiff_t>(kMaxBoots));
    entries_.push_back(std::move(e));
  }
}

}  // namespace gns::gpu_health
