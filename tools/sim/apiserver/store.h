// The simulator's object store: every group/version/resource, one global resourceVersion
// counter, an event history (for watches, paging and exact-RV lists) and the watchers.
// Thread-safe: one mutex guards everything, so the server threads and in-process test
// controls can both call it. No networking here.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "apiserver.h"
#include "apply.h"
#include "resources.h"
#include "selectors.h"

namespace gns::sim::api {

using ObjPtr = std::shared_ptr<const Json>;

struct StoreOptions {
  std::uint64_t initial_resource_version = 1000;
  std::size_t max_history = 100000;
  std::chrono::milliseconds history_window{std::chrono::minutes(5)};
  std::size_t max_watch_queue = 10000;
  std::set<std::string> resources_without_status;
  std::function<std::chrono::system_clock::time_point()> now = [] {
    return std::chrono::system_clock::now();
  };
  std::uint64_t seed = 0;  // 0: random
};

struct ListParams {
  std::string label_selector;
  std::string field_selector;
  std::int64_t limit = 0;
  std::string continue_token;
  std::optional<std::string> resource_version;
  std::string resource_version_match;
};

struct WatchParams {
  std::string label_selector;
  std::string field_selector;
  std::optional<std::string> resource_version;
  std::string resource_version_match;
  bool bookmarks = false;
  std::optional<bool> send_initial_events;
};

// One served resource, for discovery (/api/v1, /apis, /apis/{group}/{version}).
struct ResourceSummary {
  ResourceKey key;
  std::string kind;
  bool namespaced = false;
  bool has_status = false;
};

struct PatchParams {
  std::string field_manager;
  bool force = false;
};

// One open watch. Its queue is guarded by the store's mutex; `wake` is called (under that
// mutex, so it must only post) whenever something is queued or the watch must stop.
struct Watcher {
  std::uint64_t id = 0;
  ApiPath path;
  LabelSelector labels;
  FieldSelector fields;
  std::string kind;
  std::string api_version;
  std::function<void()> wake;
  WatchInfo info;
  std::deque<std::string> lines;
  bool ended = false;  // an ERROR line is queued: finish the stream after it
  bool cut = false;    // close the connection abruptly
};

struct WatchBatch {
  std::vector<std::string> lines;
  bool ended = false;
  bool cut = false;
};

class Store {
 public:
  explicit Store(StoreOptions options);

  Outcome Get(const ApiPath& path);
  Outcome List(const ApiPath& path, const ListParams& params);
  // keep_status: seeds keep .status; HTTP creates drop it where a status subresource exists.
  Outcome Create(const ApiPath& path, Json object, bool keep_status);
  Outcome Update(const ApiPath& path, Json object);
  Outcome Patch(const ApiPath& path, std::string_view media_type, std::string_view body,
                const PatchParams& params);
  Outcome Delete(const ApiPath& path, const Json& options);
  Outcome DeleteCollection(const ApiPath& path, const ListParams& params);
  // Creates one seed object (see ApiServer::Seed); throws std::runtime_error.
  void Seed(Json object);

  // Registers a watcher with its initial events queued. On failure `error` is set instead
  // (400 for bad parameters; 410 when expired and the mode is kHttpStatus).
  struct WatchStart {
    std::optional<Outcome> error;
    std::shared_ptr<Watcher> watcher;
  };
  WatchStart Watch(const ApiPath& path, const WatchParams& params, std::function<void()> wake);
  WatchBatch Take(Watcher& watcher);
  void QueueBookmark(Watcher& watcher);
  void Unwatch(const Watcher& watcher);
  std::vector<WatchInfo> OpenWatches();

  void Compact();
  void ExpireWatches();
  void CutWatches();
  void SetExpiredWatchMode(ExpiredWatchMode mode);
  std::uint64_t CurrentResourceVersion();
  // The kind table (at each group's served versions) plus every resource holding objects.
  std::vector<ResourceSummary> Resources();
  std::uint64_t CompactedResourceVersion();

 private:
  enum class EventType { kAdded, kModified, kDeleted };
  struct Event {
    std::uint64_t rv;
    ResourceKey key;
    std::string ns;
    std::string name;
    EventType type;
    ObjPtr object;  // the new state; for kDeleted the last state with the deletion RV
    ObjPtr prev;    // the state before (null for kAdded)
    std::chrono::steady_clock::time_point at;
  };
  using ObjectKey = std::pair<std::string, std::string>;  // (namespace, name)
  using Collection = std::map<ObjectKey, ObjPtr>;

  Outcome CreateLocked(const ApiPath& path, Json object, bool keep_status);
  Outcome Commit(const ApiPath& path, const ObjPtr& current, Json next, bool status_write);
  Outcome DeleteLocked(const ApiPath& path, const ObjPtr& current);
  Outcome ApplyLocked(const ApiPath& path, std::string_view body, const PatchParams& params);
  std::optional<Outcome> CheckScope(const ApiPath& path) const;
  std::optional<Outcome> CheckShape(const Json& object) const;
  std::optional<Outcome> CheckApiVersionAndKind(const ApiPath& path, Json& object);
  ObjPtr Find(const ApiPath& path) const;
  // The list-maps a stored CustomResourceDefinition declares for `key` (none: every list atomic).
  ListMapKeys ListMapsFor(const ResourceKey& key) const;
  Collection Snapshot(const ResourceKey& key, std::uint64_t rv) const;
  void Emit(EventType type, const ApiPath& path, const ObjPtr& object, const ObjPtr& prev);
  void Deliver(Watcher& watcher, EventType type, const ObjPtr& object, const ObjPtr& prev,
               std::uint64_t rv);
  void QueueLine(Watcher& watcher, std::string line);
  void QueueExpired(Watcher& watcher, const std::string& requested);
  bool HasStatusSubresource(const ResourceKey& key) const;
  std::string KindFor(const ResourceKey& key) const;
  Json ListItem(const ResourceKey& key, const Json& object) const;
  std::string Now() const;

  StoreOptions options_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  std::uint64_t rv_;
  std::uint64_t compacted_rv_;
  std::map<ResourceKey, Collection> collections_;
  std::map<ResourceKey, std::string> learned_kinds_;
  std::deque<Event> history_;
  std::map<std::uint64_t, std::shared_ptr<Watcher>> watchers_;
  std::uint64_t next_watch_id_ = 1;
  ExpiredWatchMode expired_mode_ = ExpiredWatchMode::kInStreamError;
};

}  // namespace gns::sim::api
