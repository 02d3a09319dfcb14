// Allocate and GetPreferredAllocation decisions.
#include "modules/device_plugin/allocation.hpp"

#include <algorithm>
#include <tuple>

namespace gns::device_plugin {

std::string AllocateContainer(const AllocationSettings& settings, const DeviceLookup& lookup,
                              const std::vector<std::string>& ids, ContainerAllocation& out,
                              const RequestRules& rules) {
  if (ids.empty()) return "no device IDs in the container request";
  std::vector<std::string> unknown, unhealthy;
  std::vector<std::pair<std::string, DeviceFacts>> devices;  // physical id → facts, deduplicated
  std::set<std::string> seen;
  bool any_replica = false;
  for (const auto& id : ids) {
    if (!seen.insert(id).second) continue;
    auto facts = lookup(id);
    if (!facts) {
      unknown.push_back(id);
      continue;
    }
    any_replica = any_replica || facts->replica;
    if (!facts->healthy) {
      unhealthy.push_back(id);
      continue;
    }
    if (facts->physical_id.empty()) facts->physical_id = id;
    const bool known = std::any_of(devices.begin(), devices.end(),
                                   [&](const auto& d) { return d.first == facts->physical_id; });
    if (!known) devices.emplace_back(facts->physical_id, *facts);
  }
  if (rules.fail_requests_greater_than_one && any_replica && ids.size() > 1) {
    return "request for '" + rules.resource + ": " + std::to_string(ids.size()) +
           "' too large: maximum request size for shared resources is 1";
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (ids.size() > rules.healthy_devices) {
    std::string error = "request for " + std::to_string(ids.size()) + " devices of " + rules.resource +
                        " exceeds the " + std::to_string(rules.healthy_devices) + " healthy devices";
    if (!unhealthy.empty()) error += "; unhealthy device IDs: " + join(unhealthy);
    if (!unknown.empty()) error += "; unknown device IDs: " + join(unknown);
    return error;
  }
  if (!unknown.empty() || !unhealthy.empty()) {
    std::string error;
    if (!unknown.empty()) error += "unknown device IDs: " + join(unknown);
    if (!unhealthy.empty()) error += (error.empty() ? "" : "; ") + std::string("unhealthy device IDs: ") + join(unhealthy);
    return error;
  }

  std::vector<std::string> cdi_names;
  for (const auto& [id, facts] : devices) cdi_names.push_back(settings.cdi_kind + "=" + id);
  if (settings.strategies.envvar) {
    std::string visible;
    for (const auto& [id, facts] : devices) visible += (visible.empty() ? "" : ",") + id;
    out.envs[kVisibleDevicesEnv] = visible;
  }
  if (settings.strategies.volume_mounts) {
    // The runtime hook reads the IDs from the mount points; the variable points at them.
    out.envs[kVisibleDevicesEnv] = kVolumeMountsRoot;
    for (const auto& [id, facts] : devices)
      out.mounts.push_back({std::string(kVolumeMountsRoot) + "/" + id, kVolumeMountsHostPath, true});
  }
  if (settings.strategies.cdi_annotations) {
    std::string value;
    for (const auto& name : cdi_names) value += (value.empty() ? "" : ",") + name;
    out.annotations[std::string(kCdiAnnotationPrefix) + rules.annotation_key] = value;
  }
  if (settings.strategies.cdi_cri) out.cdi_devices = cdi_names;
  if (settings.pass_device_specs) {
    std::string cap_errors;
    for (const auto& [id, facts] : devices)
      if (!facts.cap_error.empty()) cap_errors += (cap_errors.empty() ? "" : "; ") + id + ": " + facts.cap_error;
    if (!cap_errors.empty()) return "cannot pass the MIG capability device nodes: " + cap_errors;
    std::set<uint32_t> minors;  // MIG devices and replicas of one GPU share its node
    std::set<std::string> caps;
    for (const auto& [id, facts] : devices) {
      if (minors.insert(facts.minor).second) {
        const std::string node = "/dev/nvidia" + std::to_string(facts.minor);
        out.devices.push_back({node, node, "rw"});
      }
      for (const auto& cap : facts.cap_nodes)
        if (caps.insert(cap).second) out.devices.push_back({cap, cap, "rw"});
    }
    for (const auto& control : settings.control_devices) out.devices.push_back({control, control, "rw"});
  }
  return {};
}

namespace {

// Why `size` devices cannot be picked from `available` with `must` of them fixed; empty if they can.
std::string SizeProblem(int size, std::size_t available, std::size_t must) {
  if (size < 0 || static_cast<std::size_t>(size) > available) {
    return "cannot pick " + std::to_string(size) + " devices from " + std::to_string(available) + " available";
  }
  if (must > static_cast<std::size_t>(size)) {
    return "allocation size " + std::to_string(size) + " is smaller than the " + std::to_string(must) +
           " must-include devices";
  }
  return {};
}

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
  result.error = SizeProblem(size, pool.size(), chosen.size());
  if (!result.error.empty()) return result;

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

Preferred PreferredSpread(const std::vector<std::string>& advertised, const std::vector<std::string>& available,
                          const std::vector<std::string>& must_include, int size,
                          const std::function<std::string(const std::string& id)>& group_of) {
  Preferred result;
  std::set<std::string> pool(available.begin(), available.end());
  // A group's load: its devices in use (advertised, not available: allocated to running
  // containers, or unhealthy) plus those this request takes.
  std::map<std::string, int> load;
  std::map<std::string, int> picked;  // taken by this request
  for (const auto& id : advertised)
    if (pool.count(id) == 0) ++load[group_of(id)];
  std::vector<std::string> chosen;
  auto take = [&](const std::string& id) {
    chosen.push_back(id);
    const std::string group = group_of(id);
    ++load[group];
    ++picked[group];
  };
  for (const auto& id : must_include) {
    if (pool.count(id) == 0) {
      result.error = "must-include device " + id + " is not among the available devices";
      return result;
    }
    if (std::find(chosen.begin(), chosen.end(), id) != chosen.end()) continue;
    take(id);
  }
  result.error = SizeProblem(size, pool.size(), chosen.size());
  if (!result.error.empty()) return result;
  while (chosen.size() < static_cast<std::size_t>(size)) {
    // The least loaded group, then the one this request has taken least from, then the
    // smallest ID (the pool is sorted), so the answer is deterministic.
    const std::string* best = nullptr;
    std::pair<int, int> best_key;
    for (const auto& id : pool) {
      if (std::find(chosen.begin(), chosen.end(), id) != chosen.end()) continue;
      const std::string group = group_of(id);
      const std::pair<int, int> key{load[group], picked[group]};
      if (best == nullptr || key < best_key) {
        best = &id;
        best_key = key;
      }
    }
    take(*best);
  }
  std::sort(chosen.begin(), chosen.end());
  result.ids = std::move(chosen);
  return result;
}

}  // namespace gns::device_plugin
