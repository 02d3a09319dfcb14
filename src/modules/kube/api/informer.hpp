#pragma once
// Shared informers, in the manner of client-go: list, then watch from the list's
// resourceVersion with bookmarks; resume from the last seen resourceVersion when a watch ends;
// on 410 Gone (HTTP or in-stream) re-list and publish the difference, deletions included;
// jittered backoff on errors; a read-idle timeout that reconnects. One informer per
// (resource path, label selector, field selector), however many modules acquire it.
// Changes go on the bus as ResourceEvent (messages.hpp); the cache can be read directly.

#include "loop/backoff.hpp"
#include "loop/bus.hpp"
#include "loop/gate.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/json_reader.hpp"
#include "modules/kube/messages.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace gns::kube {

struct InformerSpec {
  std::string path;  // the collection, e.g. ResourcePath::Core("nodes").Collection()
  std::string label_selector;
  std::string field_selector;
  // What the cache keeps of each object (json_reader.hpp's Projection): dotted paths such as
  // "metadata.labels", "status.addresses"; the identity fields are always kept. Empty: the
  // whole object but metadata.managedFields. Part of the key: consumers that read different
  // fields get different informers.
  std::vector<std::string> fields = {};
  // "<path>?l=<label>&f=<field>" (+ "&p=<fields,...>" when projected): the informer_key of
  // its bus messages.
  std::string Key() const;
};

struct InformerOptions {
  std::chrono::milliseconds idle_timeout{300000};
  BackoffPolicy backoff{std::chrono::milliseconds(500), std::chrono::milliseconds(30000), 2.0, 0.5};
  int64_t page_size = 500;
  // Watches ask the server to end them after a random time in [min, 2*min] (as client-go), so
  // connections spread over API servers; 0 leaves it to the server.
  std::chrono::seconds min_watch_timeout{300};
  Backoff::RandomSource random;  // tests inject it; empty: a real source
  // A watch that delivered a line, or stayed open this long, was healthy: when it ends it is
  // re-opened at once and the backoff starts over. Backoff is for consecutive failures only.
  std::chrono::milliseconds healthy_watch{1000};
  // A list (every page, the client's retries included) that has not finished by then failed:
  // it is retried after the backoff like any failed list. Far above what a list of 100k objects
  // takes; it bounds a list that hangs (a resolver that never answers) rather than a slow one.
  std::chrono::milliseconds list_deadline{600000};
};

class Informer {
 public:
  struct Stats {
    uint64_t lists = 0;       // successful lists (the first one and relists)
    uint64_t relists = 0;     // lists after the first
    uint64_t watch_starts = 0;
    uint64_t watch_restarts = 0;  // resumes after a watch ended
    uint64_t decode_errors = 0;
    uint64_t errors = 0;  // every error of any kind
    uint64_t immediate_rewatches = 0;  // healthy watches re-opened without waiting
    std::chrono::milliseconds last_delay{0};  // the latest wait before a retry
  };

  Informer(const InformerSpec& spec, std::shared_ptr<KubeClient> client, Bus& bus, boost::asio::io_context& io,
           MetricsRegistry& metrics, std::shared_ptr<spdlog::logger> log, InformerOptions options);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void Start();
  void Stop();

  const std::string& Key() const { return key_; }
  const InformerSpec& Spec() const { return spec_; }
  // The modules holding it (InformerRegistry's views), a module once per Acquire: its list and
  // watch requests name them all (KubeClient::ModuleAgent of "<a>+<b>", in name order), read as
  // each request is sent. An empty name is no holder. A module that joins a running informer
  // after its list began makes it list again (the cache publishes only what differs), so that
  // every holder's list and watch are made in its name: which calls a module needs granted
  // never depends on when it joined (the recordings of deploy/recorded-api-calls rest on it).
  void AddHolder(const std::string& holder);
  void RemoveHolder(const std::string& holder);
  // "a+b", or "" when no module holds it.
  std::string Holders() const;
  bool Synced() const { return synced_; }
  const std::string& ResourceVersion() const { return resource_version_; }
  // nullptr when not cached. The key is "namespace/name" or "name" (cluster-scoped).
  std::shared_ptr<const nlohmann::json> Get(const std::string& key) const;
  const std::unordered_map<std::string, std::shared_ptr<const nlohmann::json>>& Items() const { return items_; }
  std::size_t Size() const { return items_.size(); }
  const Stats& GetStats() const { return stats_; }

  // Applies one watch line as if it came from the server (the benchmark drives this).
  // Returns false if the line was not usable (the informer then relists).
  // `client` may be null for an informer driven only by these two (never Start()ed).
  bool HandleLineForTest(std::string_view line) { return HandleLine(line) != LineVerdict::kUnreadable; }
  // Replaces the cache with a list's items and publishes the difference (as a relist does).
  void ReplaceForTest(nlohmann::json items, std::string resource_version) {
    Replace(items, std::move(resource_version));
  }
  // A relist from LIST response pages as the server sends them (JSON text), decoded as List()
  // decodes them (the benchmark drives this).
  void RelistForTest(const std::vector<std::string>& pages, std::string resource_version);

 private:
  // What one line of the watch asks for.
  enum class LineVerdict {
    kApplied,     // an event applied (or a bookmark): the watch goes on
    kUnreadable,  // not usable (counted): the change it carried may be lost, so relist
    kGone,        // an in-stream ERROR 410: the resume version expired, so relist
    kErrorEvent,  // another in-stream ERROR (counted): resume the watch after a backoff
  };
  // How one watch ended: a line's verdict ended it, or the stream did (`end`).
  struct WatchOutcome {
    LineVerdict verdict = LineVerdict::kApplied;  // kApplied: the stream ended (`end`)
    WatchEnd end;
  };

  // The informer's one coroutine, Start to Stop: list, watch, relist.
  boost::asio::awaitable<void> Run(Gate::Ticket ticket);
  // Lists into the cache; false (counted, logged) when the list failed.
  boost::asio::awaitable<bool> ListIntoCache(Gate::Ticket ticket);
  // One watch from resource_version_, lines applied as they come, until it ends.
  boost::asio::awaitable<WatchOutcome> WatchOnce(Gate::Ticket ticket);
  // The backoff's next delay (the server's Retry-After when it gave one), logged with `why`.
  std::chrono::milliseconds RetryDelayFor(const std::string& why, std::chrono::milliseconds retry_after = {});
  boost::asio::awaitable<void> Sleep(std::chrono::milliseconds delay, Gate::Ticket ticket);
  LineVerdict HandleLine(std::string_view line);
  void Replace(nlohmann::json& items, std::string resource_version);
  // For ParseListPage: does the cache hold `key` at `resource_version`? Safe to call after the
  // informer is gone (false).
  CachedFn Cached() const;
  void Upsert(std::shared_ptr<const nlohmann::json> object, const std::string& key);
  void Remove(const std::string& key, std::shared_ptr<const nlohmann::json> last);
  void PublishSynced();
  void CountError(const char* counter, const std::string& why);
  void UpdateAgent();

  InformerSpec spec_;
  std::string key_;
  Projection projection_;
  std::shared_ptr<KubeClient> client_;  // a view of the client given, carrying agent_
  std::shared_ptr<std::string> agent_;
  std::string default_agent_;  // the client's own, while no module holds it
  std::multiset<std::string> holders_;
  std::set<std::string> listed_for_;  // the holders when the current run's latest list began
  bool listed_ = false;               // a list of this run began
  Bus& bus_;
  MetricsRegistry& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  InformerOptions options_;
  Backoff backoff_;
  boost::asio::io_context& io_;
  std::unique_ptr<class InformerTimer> timer_;
  MetricsRegistry::Series* objects_gauge_;
  std::unique_ptr<WatchHandle> watch_;
  // One per run (Start to Stop), closed by Stop: the run's coroutine is never resumed after
  // it, and the CachedFn of a list still in flight answers false.
  std::unique_ptr<Gate> run_gate_;
  bool synced_ = false;
  Clock::SteadyTime watch_started_{};
  std::string resource_version_;
  std::unordered_map<std::string, std::shared_ptr<const nlohmann::json>> items_;
  Stats stats_;
};

// Hands out one informer per spec; an informer stops when its last handle is dropped. A
// module's view of the registry (View: what the kube module offers each module) acquires in
// that module's name: the informer's requests name every module holding it.
class InformerRegistry {
 public:
  InformerRegistry(std::shared_ptr<KubeClient> client, Bus& bus, boost::asio::io_context& io,
                   MetricsRegistry& metrics, std::shared_ptr<spdlog::logger> log, InformerOptions options = {});
  ~InformerRegistry();
  // `root`'s informers, acquired by `holder` (a module's name). Dropping it stops nothing.
  static std::shared_ptr<InformerRegistry> View(std::shared_ptr<InformerRegistry> root, std::string holder);

  // The informer for `spec`, started if new, held by this registry's holder until the handle
  // is dropped. Loop thread only.
  std::shared_ptr<Informer> Acquire(const InformerSpec& spec);
  std::size_t Active() const;
  // Stops every informer (their handles stay valid but go quiet).
  void StopAll();

 private:
  InformerRegistry(std::shared_ptr<InformerRegistry> root, std::string holder);
  std::shared_ptr<Informer> AcquireAs(const InformerSpec& spec, const std::string& holder);

  std::shared_ptr<InformerRegistry> root_;  // set in a view
  std::string holder_;
  std::shared_ptr<KubeClient> client_;
  Bus& bus_;
  boost::asio::io_context& io_;
  MetricsRegistry& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  InformerOptions options_;
  std::map<std::string, std::weak_ptr<Informer>> informers_;
  bool stopped_ = false;
};

}  // namespace gns::kube
