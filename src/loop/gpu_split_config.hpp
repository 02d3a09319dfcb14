#pragma once
// Reading a `gpus:` key (loop/gpu_split.hpp) from a module's section, for the two modules that
// split the node's GPUs: `all`, or a list of UUIDs ("GPU-…") and indices. Header-only.

#include "loop/config.hpp"
#include "loop/gpu_split.hpp"
#include "loop/site.hpp"

#include <set>
#include <string>
#include <string_view>

namespace gns {

inline GpuSelection ParseGpuSelection(ConfigMap& section, std::string_view key, GpuSelection fallback) {
  const ConfigValue* raw = section.Raw(key);
  if (raw == nullptr) return fallback;
  const std::string path = section.Path() + "." + std::string(key);
  GpuSelection out;
  if (raw->kind == ConfigValue::Kind::kScalar) {
    if (ExpandEnv(raw->scalar, raw->where, path) != "all") section.Fail(key, "expected `all` or a list of GPU UUIDs and indices");
    out.all = true;
    return out;
  }
  if (raw->kind != ConfigValue::Kind::kSequence) section.Fail(key, "expected `all` or a list of GPU UUIDs and indices");
  std::set<std::string> seen;
  for (const auto& item : raw->items) {
    if (item.kind != ConfigValue::Kind::kScalar) section.Fail(key, "expected GPU UUIDs (GPU-…) or indices");
    const std::string id = ExpandEnv(item.scalar, item.where, path);
    const bool index = !id.empty() && id.size() <= 4 && id.find_first_not_of("0123456789") == std::string::npos;
    if (!index && id.rfind("GPU-", 0) != 0) {
      section.Fail(key, "\"" + id + "\" is neither a GPU UUID (GPU-…) nor an index");
    }
    if (!seen.insert(id).second) section.Fail(key, "\"" + id + "\" is listed twice");
    out.ids.push_back(id);
  }
  return out;
}

// Records one module's selection in the site's split when the module will run, and fails the
// key when it overlaps the other's (whichever section is read second names the overlap).
inline void RecordGpuSelection(ConfigMap& section, std::string_view key, const SiteConfig& site, bool dra,
                               const GpuSelection& selection, bool written) {
  if (!section.ModuleEnabled() || !site.gpu_split) return;
  GpuSplit& split = *site.gpu_split;
  const std::string where = section.Path() + "." + std::string(key);
  if (dra) {
    split.dra_set = true;
    split.dra = selection;
    split.dra_where = where;
  } else if (written) {
    split.plugin_set = true;
    split.plugin = selection;
    split.plugin_where = where;
  }
  if (const auto overlap = split.Overlap(); !overlap.empty()) section.Fail(key, overlap);
}

}  // namespace gns
