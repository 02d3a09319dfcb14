// XID occurrences counted per (GPU, XID): what gpu_node_supervisor_xid_errors_total shows and
// what the checkpoint keeps, so that a restart neither loses nor repeats a count. Label values
// come from the input, so the number of keys is capped: past kMaxKeys, occurrences count under
// ("other", 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gns::gpu_health {

struct XidCount {
  std::string gpu;  // UUID, or PCI address while the UUID was unknown; "other" past the cap
  uint32_t xid = 0;  // 0 with "other"
  uint64_t count = 0;
  bool operator==(const XidCount&) const = default;
};

class XidCounts {
 public:
  static constexpr std::size_t kMaxKeys = 256;

  // What Add counted: the key (views into the counts, valid until the next Restore) and the
  // new total. Nothing is allocated for a key already counted: Add runs for every Xid line.
  struct Counted {
    std::string_view gpu;
    uint32_t xid;
    uint64_t count;
  };
  // Counts one occurrence.
  Counted Add(std::string_view gpu, uint32_t xid) {
    auto it = counts_.find(Key{gpu, xid});
    if (it == counts_.end()) {
      if (counts_.size() >= kMaxKeys) {
        it = counts_.try_emplace(std::make_pair(std::string("other"), 0u), 0).first;
      } else {
        it = counts_.try_emplace(std::make_pair(std::string(gpu), xid), 0).first;
      }
    }
    ++it->second;
    return Counted{it->first.first, it->first.second, it->second};
  }
  // Replaces the counts (the checkpoint's, at start).
  void Restore(const std::vector<XidCount>& counts) {
    counts_.clear();
    for (const auto& c : counts) counts_[std::make_pair(c.gpu, c.xid)] = c.count;
  }
  [[nodiscard]] std::vector<XidCount> All() const {
    std::vector<XidCount> out;
    out.reserve(counts_.size());
    for (const auto& [key, count] : counts_) out.push_back(XidCount{key.first, key.second, count});
    return out;
  }
  [[nodiscard]] uint64_t Get(std::string_view gpu, uint32_t xid) const {
    const auto it = counts_.find(Key{gpu, xid});
    return it == counts_.end() ? 0 : it->second;
  }
  [[nodiscard]] std::size_t size() const { return counts_.size(); }

 private:
  struct Key {
    std::string_view gpu;
    uint32_t xid;
  };
  struct Less {
    using is_transparent = void;
    static std::pair<std::string_view, uint32_t> View(const std::pair<std::string, uint32_t>& k) { return {k.first, k.second}; }
    static std::pair<std::string_view, uint32_t> View(const Key& k) { return {k.gpu, k.xid}; }
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      return View(a) < View(b);
    }
  };
  std::map<std::pair<std::string, uint32_t>, uint64_t, Less> counts_;
};

}  // namespace gns::gpu_health
