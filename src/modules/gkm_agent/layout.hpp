#pragma once
// Where gkm-agent keeps things, named so that no two caches can ever share one:
//  - on disk (cacheRoot, and the CSI driver's usageRoot): `cluster/<name>` for a
//    ClusterGKMCache, `namespaced/<namespace>/<name>` for a GKMCache. The first component
//    says the scope, so a namespace (any DNS label, "cluster" included) can never reach a
//    cluster cache's directory, whatever the names;
//  - the status objects: one (Cluster)GKMCacheNode per (node, cache), named
//    `<length of cache>.<cache>.<node>`: the length says where the cache name ends, so two
//    different (cache, node) pairs never give one name, whatever dots and dashes they hold;
//  - the old layout (`<namespace>/<name>`, `cluster-scoped/<name>`: a namespace named
//    `cluster-scoped` was a cluster cache's directory) is migrated at start, crash-safe,
//    without losing a cache an object still claims unambiguously.
// Blocking functions run on the pool.

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gkm {

inline constexpr std::string_view kClusterDir = "cluster";
inline constexpr std::string_view kNamespacedDir = "namespaced";
// The old layout's directory of cluster caches (seed 002: "a fixed string like cluster-scoped").
inline constexpr std::string_view kOldClusterDir = "cluster-scoped";
// Present once cacheRoot holds the new layout (written after the old one was set aside).
inline constexpr std::string_view kLayoutMarker = ".layout";
// The old layout's entries, set aside (".migrate.tmp" while they are being moved there).
inline constexpr std::string_view kMigrateDir = ".migrate";

// "cluster/<name>" or "namespaced/<ns>/<name>": a cache's directory under cacheRoot and
// usageRoot, and its key inside the module.
std::string CacheRelPath(bool cluster, const std::string& ns, const std::string& name);

// The (Cluster)GKMCacheNode name of `cache` on `node`: "<len(cache)>.<cache>.<node>"; empty when
// it would be longer than an object name may be (253).
std::string StatusObjectName(const std::string& cache, const std::string& node);

// What cacheRoot should hold: GKMCaches as "<ns>/<name>", ClusterGKMCaches as "<name>".
struct WantedCaches {
  std::set<std::string> namespaced;
  std::set<std::string> cluster;
};

struct LayoutReport {
  std::vector<std::string> moved;    // "<old> -> <new>"
  std::vector<std::string> removed;  // what went, and why
};

// Brings an old-layout cacheRoot to the new layout. Without the marker, every entry of
// cacheRoot not starting with '.' is the old layout: it is renamed into ".migrate.tmp", which
// is then renamed to ".migrate" (one step: after it, cacheRoot holds nothing of the old
// layout), and the marker written. While ".migrate" exists, each `<scope>/<name>` in it that
// an object claims goes to its new place (`cluster-scoped/<name>` only when exactly one of
// the ClusterGKMCache and the GKMCache `cluster-scoped/<name>` exists: with both, whose bytes
// these are is not known, and they are dropped to be pulled again); then ".migrate" is
// removed. Interrupted at any point, the next call finishes the job. Throws on I/O errors.
LayoutReport MigrateLayout(const std::string& root, const WantedCaches& wanted);

// Removes from a new-layout cacheRoot the caches nobody wants and what interrupted pulls left
// (".pull-*"); empty namespace directories go too. Unknown entries are left alone.
std::vector<std::string> SweepLayout(const std::string& root, const WantedCaches& wanted);

}  // namespace gns::gkm
