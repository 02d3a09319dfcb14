// Loading and validating the SXid catalog (see sxid_catalog.hpp) with the XID catalog's reader.
#include "modules/gpu_health/sxid_catalog.hpp"

#include "modules/gpu_health/catalog_yaml.hpp"

#include <limits>
#include <utility>

namespace gns::gpu_health {
namespace {

// A fatal SXid holds a verdict (a GPU's, or the node-level finding): its action must act on the
// device, as a fatal XID's must.
RecommendedAction FatalAction(const catalog_yaml::Reader& r, const YAML::Node& node, const std::string& path) {
  const RecommendedAction action = r.Action(node, path);
  if (!ActsOnDevice(action)) {
    r.Fail(node, path,
           "a fatal SXid needs an action that acts on the device, not " + std::string(ActionName(action)));
  }
  return action;
}

}  // namespace

SxidCatalog SxidCatalog::LoadFile(const std::string& path) {
  return LoadString(catalog_yaml::ReadWholeFile(path), path);
}

SxidCatalog SxidCatalog::LoadString(std::string_view yaml, std::string_view source_name) {
  using catalog_yaml::Index;
  using catalog_yaml::Join;
  const std::string source(source_name);
  const catalog_yaml::Reader r(source);
  const YAML::Node root = catalog_yaml::ParseDocument(yaml, source);
  if (!root.IsMap()) {
    r.Fail(root, "", "expected a mapping with version and sxids, got " + catalog_yaml::Describe(root));
  }
  const auto fields = r.Fields(root, "", {"version", "source", "defaults", "sxids"});
  const auto& version = r.Require(fields, root, "", "version");
  if (r.Uint(version.value, "version", 0, std::numeric_limits<uint32_t>::max(), "version") != 1) {
    r.Fail(version.value, "version", "unsupported version (expected 1)");
  }

  SxidCatalog catalog;
  if (auto it = fields.find("source"); it != fields.end()) catalog.source_ = r.String(it->second.value, "source");
  if (auto it = fields.find("defaults"); it != fields.end()) {
    const YAML::Node node = it->second.value;
    const auto f = r.Fields(node, "defaults", {"action", "node_action"});
    if (auto a = f.find("action"); a != f.end()) {
      catalog.defaults_.action = FatalAction(r, a->second.value, "defaults.action");
      catalog.has_action_ = true;
    }
    if (auto a = f.find("node_action"); a != f.end()) {
      catalog.defaults_.node_action = FatalAction(r, a->second.value, "defaults.node_action");
      catalog.has_node_action_ = true;
    }
  }

  const auto& sxids = r.Require(fields, root, "", "sxids");
  r.RequireSequence(sxids.value, "sxids");
  std::map<uint32_t, int> first_line;
  for (std::size_t i = 0; i < sxids.value.size(); ++i) {
    const YAML::Node item = sxids.value[i];
    const std::string path = Index("sxids", i);
    const auto f = r.Fields(item, path, {"sxid", "mnemonic", "description", "fatal", "action"});
    SxidInfo info;
    const auto& number = r.Require(f, item, path, "sxid");
    info.sxid = r.Uint(number.value, Join(path, "sxid"), 1, kMaxSxid, "SXid");
    if (auto seen = first_line.find(info.sxid); seen != first_line.end()) {
      r.Fail(number.value, Join(path, "sxid"),
             "duplicate SXid " + std::to_string(info.sxid) + " (first defined at line " +
                 std::to_string(seen->second) + ")");
    }
    first_line.emplace(info.sxid, number.value.Mark().line + 1);
    if (auto it = f.find("mnemonic"); it != f.end()) info.mnemonic = r.String(it->second.value, Join(path, "mnemonic"));
    info.description = r.String(r.Require(f, item, path, "description").value, Join(path, "description"));
    if (auto it = f.find("fatal"); it != f.end()) info.fatal = r.Bool(it->second.value, Join(path, "fatal"));
    if (auto it = f.find("action"); it != f.end()) info.action = FatalAction(r, it->second.value, Join(path, "action"));
    catalog.entries_.emplace(info.sxid, std::move(info));
  }
  return catalog;
}

const SxidCatalog& SxidCatalog::Builtin() {
  // Parsed once, on first use; sxid_catalog_test loads it too, so a bad built-in catalog fails
  // the build's tests instead of reaching a node.
  static const SxidCatalog builtin = LoadString(BuiltinSxidCatalogYaml(), "built-in sxid-catalog.yaml");
  return builtin;
}

SxidCatalog SxidCatalog::LaidOver(const SxidCatalog& site) const {
  SxidCatalog out = *this;
  if (site.has_action_) {
    out.defaults_.action = site.defaults_.action;
    out.has_action_ = true;
  }
  if (site.has_node_action_) {
    out.defaults_.node_action = site.defaults_.node_action;
    out.has_node_action_ = true;
  }
  for (const auto& [sxid, info] : site.entries_) out.entries_[sxid] = info;
  return out;
}

const SxidInfo* SxidCatalog::Find(uint32_t sxid) const noexcept {
  const auto it = entries_.find(sxid);
  return it == entries_.end() ? nullptr : &it->second;
}

SxidJudgement SxidCatalog::Judge(uint32_t sxid, bool line_fatal) const noexcept {
  SxidJudgement out;
  out.fatal = line_fatal;
  out.action = defaults_.action;
  out.node_action = defaults_.node_action;
  if (const SxidInfo* info = Find(sxid)) {
    if (info->fatal) {
      out.overridden = *info->fatal != line_fatal;
      out.fatal = *info->fatal;
    }
    if (info->action) out.action = out.node_action = *info->action;  // the entry's, wherever it lands
    out.mnemonic = info->mnemonic;
    out.description = info->description;
  }
  if (!out.fatal) {
    out.action = RecommendedAction::kNone;
    out.node_action = RecommendedAction::kNone;
  }
  return out;
}

}  // namespace gns::gpu_health
