#pragma once
// Which of the node's GPUs go to Kubernetes through DRA (the `dra-gpu` module, gpu.nvidia.com)
// and which through the device plugin: a GPU is served by one of them, never both (issue #28).
// The two modules' sections write their selections here while the site config is parsed
// (SiteConfig::gpu_split), each checking the other's, so `validate-config` refuses an overlap
// whichever section comes first; at run time the device plugin leaves out every GPU the DRA
// selection matches. Header-only: two small value types.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace gns {

// `all`, or a list of GPUs named by UUID ("GPU-…") or by index ("0", "1", …).
struct GpuSelection {
  bool all = false;
  std::vector<std::string> ids;

  bool Empty() const { return !all && ids.empty(); }
  bool Matches(const std::string& uuid, uint32_t index) const {
    if (all) return true;
    return std::any_of(ids.begin(), ids.end(),
                       [&](const std::string& id) { return id == uuid || id == std::to_string(index); });
  }
  std::string Describe() const {
    if (all) return "all";
    std::string out = "[";
    for (const auto& id : ids) out += (out.size() > 1 ? ", " : "") + id;
    return out + "]";
  }
};

struct GpuSplit {
  // modules.dra-gpu.gpus, set when that module will run.
  bool dra_set = false;
  GpuSelection dra;
  std::string dra_where;  // "modules.dra-gpu.gpus"
  // modules.device-plugin.gpus, set when that module will run with the key written (absent:
  // every GPU the DRA selection leaves).
  bool plugin_set = false;
  GpuSelection plugin;
  std::string plugin_where;

  // Empty when the two can be served side by side; otherwise what overlaps, naming both keys.
  // Only what can be told without the node's inventory: `all` against anything, or the same
  // UUID or index in both lists (a UUID in one and the index of the same GPU in the other is
  // caught at run time: the device plugin leaves the GPU to DRA and says so).
  std::string Overlap() const {
    if (!dra_set || !plugin_set || dra.Empty() || plugin.Empty()) return {};
    std::vector<std::string> both;
    if (dra.all || plugin.all) {
      // `all` on one side: the overlap is everything the other side selects.
      both.push_back("every GPU of " + (dra.all ? plugin_where : dra_where));
    } else {
      for (const auto& id : dra.ids) {
        if (std::find(plugin.ids.begin(), plugin.ids.end(), id) != plugin.ids.end()) both.push_back(id);
      }
    }
    if (both.empty()) return {};
    std::string list;
    for (const auto& id : both) list += (list.empty() ? "" : ", ") + id;
    return "a GPU is served by the device plugin or by DRA, never both: " + dra_where + " (" + dra.Describe() +
           ") and " + plugin_where + " (" + plugin.Describe() + ") both select " + list;
  }
};

}  // namespace gns
