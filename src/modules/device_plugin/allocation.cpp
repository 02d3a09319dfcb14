// Allocate and GetPreferredAllocation decisions.
#include "modules/device_plugin/allocation.hpp"

#include <algorithm>
#include <tuple>

namespace gns::device_plugin {

std::string AllocateContainer(const AllocationSettings& settings, const DeviceLookup& lookup,
                              const std::vector<std::string>& ids, ContainerAllocation& out) {
  std::vector<std::string> unknown, unhealthy;
  std::vector<std::pair<std::string, DeviceFacts>> devices;
  std::set<std::string> seen;
  for (const auto& id : ids) {
    if (!seen.insert(id).second) continue;
    const auto facts = lookup(id);
    if (!facts) unknown.push_back(id);
    else if (!facts->healthy) unhealthy.push_back(id);
    else devices.emplace_back(id, *facts);
  }
  if (ids.empty()) return "no device IDs in the container request";
  if (!unknown.empty() || !unhealthy.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s;
    };
    std::string error;
    if (!unknown.empty()) error += "unknown device IDs: " + join(unknown);
    if (!unhealthy.empty()) error += (error.empty() ? "" : "; ") + std::string("unhealthy device IDs: ") + join(unhealthy);
    return error;
  }

  if (settings.strategy == DeviceListStrategy::kEnvVar) {
    std::string visible;
    for (const auto& [id, facts] : devices) visible += (visible.empty() ? "" : ",") + id;
    out.envs["NVIDIA_VISIBLE_DEVICES"] = visible;
  } else {
    for (const auto& [id, facts] : devices) out.cdi_devices.push_back(settings.cdi_kind + "=" + id);
  }
  if (settings.pass_device_specs) {
    for (const auto& [id, facts] : devices) {
      const std::string node = "/dev/nvidia" + std::to_string(facts.minor);
      out.devices.push_back({node, node, "rw"});
    }
    for (const auto& control : settings.control_devices) out.devices.push_back({control, control, "rw"});
  }
  return {};
}

namespace {

// Locality of a set: higher is better, compared lexicographically.
using Score = std::tuple<int, int, long>;

Score ScoreSet(const std::vector<const TopologyDevice*>& set) {
  int same_numa = 0, nvlinked = 0;
  long pci_distance = 0;
  for (std::size_t i = 0; i < set.size(); ++i) {
    for (std::size_t j = i + 1; j < set.size(); ++j) {
      const auto& a = *set[i];
      const auto& b = *set[j];
      if (a.numa_node >= 0 && a.numa_node == b.numa_node) ++same_numa;
      if (a.nvlink_peers.count(b.id) || b.nvlink_peers.count(a.id)) ++nvlinked;
      // Devices under another PCI domain are far apart; within one, bus numbers that are
      // close share a root port or switch more often than not.
      pci_distance += a.pci.domain != b.pci.domain ? 1000 : std::labs(static_cast<long>(a.pci.bus) - b.pci.bus);
    }
  }
  return {same_numa, nvlinked, -pci_distance};
}

}  // namespace

Preferred PreferredAllocation(const std::vector<TopologyDevice>& topology, const std::vector<std::string>& available,
                              const std::vector<std::string>& must_include, int size) {
  Preferred result;
  std::map<std::string, const TopologyDevice*> by_id;
  for (const auto& d : topology) by_id[d.id] = &d;

  std::vector<const TopologyDevice*> pool;
  for (const auto& id : available) {
    const auto it = by_id.find(id);
    if (it != by_id.end() && std::find(pool.begin(), pool.end(), it->second) == pool.end()) pool.push_back(it->second);
  }
  std::sort(pool.begin(), pool.end(), [](const auto* a, const auto* b) { return a->id < b->id; });

  std::vector<const TopologyDevice*> chosen;
  for (const auto& id : must_include) {
    const auto it = by_id.find(id);
    if (it == by_id.end() || std::find(pool.begin(), pool.end(), it->second) == pool.end()) {
      result.error = "must-include device " + id + " is not among the available devices";
      return result;
    }
    if (std::find(chosen.begin(), chosen.end(), it->second) == chosen.end()) chosen.push_back(it->second);
  }
  if (size < 0 || static_cast<std::size_t>(size) > pool.size()) {
    result.error = "cannot pick " + std::to_string(size) + " devices from " + std::to_string(pool.size()) + " available";
    return result;
  }
  if (chosen.size() > static_cast<std::size_t>(size)) {
    result.error = "allocation size " + std::to_string(size) + " is smaller than the " +
                   std::to_string(chosen.size()) + " must-include devices";
    return result;
  }

  std::vector<const TopologyDevice*> rest;
  for (const auto* d : pool)
    if (std::find(chosen.begin(), chosen.end(), d) == chosen.end()) rest.push_back(d);

  // Greedy growth from every possible first pick (or from the must-include set), keeping the
  // best-scoring result: O(n³) for n GPUs, trivial at node sizes (8, or 4 per GB200 tray).
  auto grow = [&](std::vector<const TopologyDevice*> set) {
    while (set.size() < static_cast<std::size_t>(size)) {
      const TopologyDevice* best = nullptr;
      Score best_score{};
      for (const auto* candidate : rest) {
        if (std::find(set.begin(), set.end(), candidate) != set.end()) continue;
        set.push_back(candidate);
        const Score s = ScoreSet(set);
        set.pop_back();
        if (best == nullptr || s > best_score) {  // `rest` is sorted: ties keep the smaller ID
          best = candidate;
          best_score = s;
        }
      }
      set.push_back(best);
    }
    return set;
  };
  auto sorted_ids = [](const std::vector<const TopologyDevice*>& set) {
    std::vector<std::string> ids;
    for (const auto* d : set) ids.push_back(d->id);
    std::sort(ids.begin(), ids.end());
    return ids;
  };

  std::vector<std::string> best_ids;
  Score best_score{};
  bool have_best = false;
  auto consider = [&](std::vector<const TopologyDevice*> set) {
    const Score s = ScoreSet(set);
    auto ids = sorted_ids(set);
    if (!have_best || s > best_score || (s == best_score && ids < best_ids)) {
      best_score = s;
      best_ids = std::move(ids);
      have_best = true;
    }
  };
  if (!chosen.empty() || size == 0) {
    consider(grow(chosen));
  } else {
    for (const auto* seed : rest) consider(grow({seed}));
  }
  result.ids = std::move(best_ids);
  return result;
}

}  // namespace gns::device_plugin
