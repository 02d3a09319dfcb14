// gkm-agent's on-disk layout and status object names: see layout.hpp.
#include "modules/gkm_agent/layout.hpp"

#include "loop/atomic_file.hpp"
#include "modules/gkm_agent/extract.hpp"
#include "modules/gkm_agent/messages.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

namespace gns::gkm {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxObjectName = 253;

bool Hidden(const std::string& name) { return !name.empty() && name.front() == '.'; }

// The entries of `dir` (names), or none when it cannot be read.
std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path().filename().string());
  }
  return out;
}

bool IsDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(fs::symlink_status(p, ec));
}

bool Exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

void Rename(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + from.string() + " to " + to.string() + ": " + std::strerror(errno));
  }
}

}  // namespace

std::string CacheRelPath(bool cluster, const std::string& ns, const std::string& name) {
  return CacheKey(cluster, ns, name);  // messages.hpp: the same string for the CSI side
}

std::string StatusObjectName(const std::string& cache, const std::string& node) {
  std::string name = std::to_string(cache.size()) + "." + cache + "." + node;
  return name.size() <= kMaxObjectName ? name : std::string();
}

LayoutReport MigrateLayout(const std::string& root, const WantedCaches& wanted) {
  LayoutReport report;
  const fs::path r(root);
  const fs::path staging = r / std::string(kMigrateDir);
  if (!Exists(r / std::string(kLayoutMarker))) {
    if (!Exists(staging)) {
      // Set the old layout aside, then commit that with one rename.
      const fs::path tmp = r / (std::string(kMigrateDir) + ".tmp");
      std::error_code ec;
      fs::create_directories(tmp, ec);
      if (ec) throw std::runtime_error("cannot create " + tmp.string() + ": " + ec.message());
      for (const auto& name : Names(r)) {
        if (!Hidden(name)) Rename(r / name, tmp / name);
      }
      FsyncDir(tmp.string());
      Rename(tmp, staging);
      FsyncDir(r.string());
    }
    const auto written = WriteFileAtomically((r / std::string(kLayoutMarker)).string(), "2\n", 0644);
    if (!written) throw std::runtime_error(written.error);
  }
  if (!Exists(staging)) return report;
  std::set<std::string> synced_dirs;
  std::map<std::string, std::string> why;  // why an entry stays behind (default: nobody claims it)
  for (const auto& scope : Names(staging)) {
    if (!IsDir(staging / scope)) continue;
    for (const auto& name : Names(staging / scope)) {
      const std::string old_key = scope + "/" + name;
      std::string target;
      if (scope == kOldClusterDir) {
        const bool cluster = wanted.cluster.count(name) > 0;
        const bool namespaced = wanted.namespaced.count(old_key) > 0;
        if (cluster && namespaced) {
          why[old_key] = "claimed by both the ClusterGKMCache " + name + " and the GKMCache " + old_key +
                         ": whose it is is not known; both are pulled again";
          continue;
        }
        if (cluster || namespaced) target = CacheRelPath(cluster, scope, name);
      } else if (wanted.namespaced.count(old_key) > 0) {
        target = CacheRelPath(false, scope, name);
      }
      if (target.empty() || Exists(r / target)) continue;  // nobody's (or already there): dropped below
      const fs::path to = r / target;
      std::error_code ec;
      fs::create_directories(to.parent_path(), ec);
      if (ec) throw std::runtime_error("cannot create " + to.parent_path().string() + ": " + ec.message());
      Rename(staging / scope / name, to);
      report.moved.push_back(old_key + " -> " + target);
      synced_dirs.insert(to.parent_path().string());
      synced_dirs.insert((staging / scope).string());
    }
  }
  // The moves are on disk before what is left of the old layout goes.
  for (const auto& dir : synced_dirs) FsyncDir(dir);
  for (const auto& scope : Names(staging)) {
    for (const auto& name : IsDir(staging / scope) ? Names(staging / scope) : std::vector<std::string>{}) {
      const auto reason = why.find(scope + "/" + name);
      report.removed.push_back(scope + "/" + name + " (old layout, " +
                               (reason != why.end() ? reason->second : std::string("no object claims it")) + ")");
    }
  }
  RemoveTree(staging.string());
  return report;
}

std::vector<std::string> SweepLayout(const std::string& root, const WantedCaches& wanted) {
  std::vector<std::string> removed;
  const fs::path r(root);
  for (const auto& name : Names(r)) {
    if (name.rfind(".pull-", 0) == 0) {
      RemoveTree((r / name).string());
      removed.push_back(name);
    }
  }
  const fs::path cluster = r / std::string(kClusterDir);
  for (const auto& name : Names(cluster)) {
    if (wanted.cluster.count(name)) continue;
    RemoveTree((cluster / name).string());
    removed.push_back(CacheRelPath(true, "", name));
  }
  const fs::path namespaced = r / std::string(kNamespacedDir);
  for (const auto& ns : Names(namespaced)) {
    for (const auto& name : Names(namespaced / ns)) {
      if (wanted.namespaced.count(ns + "/" + name)) continue;
      RemoveTree((namespaced / ns / name).string());
      removed.push_back(CacheRelPath(false, ns, name));
    }
    std::error_code ec;
    fs::remove(namespaced / ns, ec);  // only when empty
  }
  return removed;
}

}  // namespace gns::gkm
