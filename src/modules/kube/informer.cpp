// Shared informers: list + watch + relist, the cache, and the registry that shares them.
#include "modules/kube/api/informer.hpp"

#include "loop/awaitables.hpp"
#include "modules/kube/api/json_reader.hpp"

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as dra_module.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>

#include <random>

namespace gns::kube {

namespace asio = boost::asio;

class InformerTimer {
 public:
  explicit InformerTimer(asio::io_context& io) : timer_(io) {}
  asio::steady_timer timer_;
};

std::string InformerSpec::Key() const {
  std::string key = path + "?l=" + label_selector + "&f=" + field_selector;
  for (std::size_t i = 0; i < fields.size(); ++i) key += (i == 0 ? "&p=" : ",") + fields[i];
  return key;
}

namespace {

constexpr const char* kObjects = "gpu_node_supervisor_kube_informer_objects";
constexpr const char* kRelists = "gpu_node_supervisor_kube_relists_total";
constexpr const char* kRestarts = "gpu_node_supervisor_kube_watch_restarts_total";
constexpr const char* kDecodeErrors = "gpu_node_supervisor_kube_informer_decode_errors_total";
constexpr const char* kErrors = "gpu_node_supervisor_kube_informer_errors_total";

const std::string* RvOf(const nlohmann::json& object) {
  const auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return nullptr;
  const auto rv = meta->find("resourceVersion");
  return rv != meta->end() && rv->is_string() ? rv->get_ptr<const std::string*>() : nullptr;
}

}  // namespace

Informer::Informer(const InformerSpec& spec, std::shared_ptr<KubeClient> client, Bus& bus, asio::io_context& io,
                   MetricsRegistry& metrics, std::shared_ptr<spdlog::logger> log, InformerOptions options)
    : spec_(spec),
      key_(spec.Key()),
      projection_(spec.fields),
      client_(std::move(client)),
      bus_(bus),
      metrics_(metrics),
      log_(std::move(log)),
      options_(std::move(options)),
      backoff_(options_.backoff, options_.random),
      io_(io),
      timer_(std::make_unique<InformerTimer>(io)),
      // Set on every event: looked up once (series stay put until the destructor removes them).
      objects_gauge_(&metrics_.Gauge(kObjects, "Objects in the informer cache", {{"informer", key_}})) {
  if (client_) {
    default_agent_ = client_->Agent();
    agent_ = std::make_shared<std::string>(default_agent_);
    client_ = client_->WithAgent(agent_);
  }
}

void Informer::AddHolder(const std::string& holder) {
  if (holder.empty()) return;
  holders_.insert(holder);
  UpdateAgent();
  if (run_gate_ && listed_ && !listed_for_.contains(holder)) {
    log_->info("informer {}: {} joined after its list; listing again in its name", key_, holder);
    Stop();
    Start();
  }
}

void Informer::RemoveHolder(const std::string& holder) {
  if (const auto it = holders_.find(holder); it != holders_.end()) holders_.erase(it);
  UpdateAgent();
}

std::string Informer::Holders() const {
  std::string out;
  for (auto it = holders_.begin(); it != holders_.end(); it = holders_.upper_bound(*it)) {
    out += (out.empty() ? "" : "+") + *it;
  }
  return out;
}

void Informer::UpdateAgent() {
  if (!agent_) return;
  const auto holders = Holders();
  *agent_ = holders.empty() ? default_agent_ : client_->ModuleAgent(holders);
}

Informer::~Informer() {
  Stop();
  for (const char* name : {kObjects, kRelists, kRestarts, kDecodeErrors, kErrors}) {
    metrics_.Remove(name, {{"informer", key_}});
  }
}

void Informer::Start() {
  if (run_gate_) return;
  run_gate_ = std::make_unique<Gate>();
  // A bug that throws in the run ends it and is rethrown on the loop, as from a callback.
  asio::co_spawn(io_, Run(run_gate_->Watch()), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

void Informer::Stop() {
  listed_ = false;
  // Closed first: nothing below (the watch's stop, the timer's cancel) resumes the run.
  if (run_gate_) run_gate_->Close();
  run_gate_.reset();
  if (watch_) watch_->Stop();
  watch_.reset();
  timer_->timer_.cancel();
}

std::shared_ptr<const nlohmann::json> Informer::Get(const std::string& key) const {
  const auto it = items_.find(key);
  return it == items_.end() ? nullptr : it->second;
}

void Informer::CountError(const char* counter, const std::string& why) {
  ++stats_.errors;
  metrics_.Counter(kErrors, "Informer errors of any kind", {{"informer", key_}}).Inc();
  if (counter == kDecodeErrors) {
    ++stats_.decode_errors;
    metrics_.Counter(kDecodeErrors, "Watch lines or list items that could not be decoded", {{"informer", key_}}).Inc();
  }
  log_->warn("informer {}: {}", key_, why);
}

// list → watch → (resume the watch | relist) until Stop. Every wait takes the run's ticket:
// once Stop closed the gate, the run is dropped where it waits, so no line below runs after it.
asio::awaitable<void> Informer::Run(Gate::Ticket ticket) {
  // co_spawn begins the run one loop turn after Start: an informer stopped (or destroyed) in
  // between must not be touched.
  if (!ticket) co_return;
  for (;;) {
    // The cache becomes the server's state (the first list, or a relist after 410 or a lost
    // event); a failed list is retried after the backoff.
    if (!co_await ListIntoCache(ticket)) continue;
    // Watch from the list's version; resume from the last seen one as long as it is valid.
    for (bool relist = false; !relist;) {
      WatchOutcome outcome = co_await WatchOnce(ticket);
      std::chrono::milliseconds delay{0};
      switch (outcome.verdict) {
        case LineVerdict::kApplied:
          break;  // the stream ended: judged below
        case LineVerdict::kUnreadable:
          // An event we could not read may have been a change we now miss: only a relist
          // brings the cache back in line with the server.
          delay = RetryDelayFor("undecodable watch event");
          relist = true;
          break;
        case LineVerdict::kGone:
          log_->info("informer {}: watch expired (410 in the stream); relisting", key_);
          relist = true;
          break;
        case LineVerdict::kErrorEvent:
          delay = RetryDelayFor("watch error event");
          break;
      }
      if (outcome.verdict == LineVerdict::kApplied) {
        const WatchEnd& end = outcome.end;
        ++stats_.watch_restarts;
        metrics_.Counter(kRestarts, "Watches that ended and were resumed or relisted", {{"informer", key_}}).Inc();
        if (end.http_status == 410) {
          log_->info("informer {}: watch refused with 410 Gone; relisting", key_);
          relist = true;
        } else if (end.decode_error) {
          CountError(kDecodeErrors, "watch stream: " + end.error);
          delay = RetryDelayFor("undecodable watch stream");
          relist = true;
        } else {
          if (end.http_status != 200 || !end.error.empty()) CountError(kErrors, "watch ended: " + end.error);
          const bool healthy = end.http_status == 200 && (end.lines > 0 || client_->GetClock().Now() - watch_started_ >=
                                                                                options_.healthy_watch);
          if (healthy) {
            // It worked until now (ended by timeoutSeconds, cut, idle): this is not a failure in
            // a row, so no wait (as client-go's reflector); a reconnect that then fails backs
            // off from the start.
            backoff_.Reset();
            ++stats_.immediate_rewatches;
          } else {
            delay = RetryDelayFor("watch ended", end.retry_after);
          }
        }
      }
      if (delay.count() > 0) co_await Sleep(delay, ticket);
    }
  }
}

asio::awaitable<bool> Informer::ListIntoCache(Gate::Ticket ticket) {
  // Pages decode through the projection, and what the cache holds as it is is not built again.
  // No watch is open while listing, so the cache cannot change before Replace.
  const ListOptions options{spec_.label_selector, spec_.field_selector, options_.page_size};
  const Deadline deadline(options_.list_deadline);
  listed_ = true;
  listed_for_ = std::set<std::string>(holders_.begin(), holders_.end());
  CachedFn cached = Cached();
  Result r = co_await client_->List(spec_.path, options, projection_.Root(), std::move(cached), deadline, ticket);
  if (!r.Ok()) {
    CountError(kErrors, "list failed: " + r.error);
    const auto delay = RetryDelayFor("list failed", r.retry_after);
    co_await Sleep(delay, ticket);
    co_return false;
  }
  const std::string* rv = nullptr;
  if (const auto meta = r.object.find("metadata"); meta != r.object.end()) {
    const auto it = meta->find("resourceVersion");
    if (it != meta->end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      rv = it->get_ptr<const std::string*>();
    }
  }
  if (!rv) {
    CountError(kDecodeErrors, "list without a resourceVersion");
    const auto delay = RetryDelayFor("bad list");
    co_await Sleep(delay, ticket);
    co_return false;
  }
  if (stats_.lists > 0) {
    ++stats_.relists;
    metrics_.Counter(kRelists, "Informer relists (after 410 or an undecodable event)", {{"informer", key_}}).Inc();
  }
  ++stats_.lists;
  Replace(r.object["items"], *rv);
  backoff_.Reset();
  co_return true;
}

asio::awaitable<Informer::WatchOutcome> Informer::WatchOnce(Gate::Ticket ticket) {
  ++stats_.watch_starts;
  watch_started_ = client_->GetClock().Now();
  WatchOptions options;
  options.resource_version = resource_version_;
  options.label_selector = spec_.label_selector;
  options.field_selector = spec_.field_selector;
  options.bookmarks = true;
  options.idle_timeout = options_.idle_timeout;
  if (options_.min_watch_timeout.count() > 0) {
    thread_local std::mt19937 engine{std::random_device{}()};
    const double r = options_.random ? options_.random() : std::uniform_real_distribution<double>(0, 1)(engine);
    options.timeout_seconds = static_cast<int64_t>(options_.min_watch_timeout.count() * (1.0 + r));
  }
  // The watch's deadlines are the client's: request_timeout to open it, idle_timeout between
  // bytes. Its callbacks run only while watch_ holds it (Stop stops it first), so `this` is
  // safe in them; `ended` resumes this coroutine once, on the loop.
  auto open = [this, options = std::move(options)](auto ended) {
    WatchCallbacks callbacks;
    callbacks.on_line = [this, ended](std::string_view line) mutable {
      const LineVerdict verdict = HandleLine(line);
      if (verdict == LineVerdict::kApplied) return;
      watch_->Stop();  // no more lines, and no on_end: this verdict ends the watch
      ended(WatchOutcome{verdict, {}});
    };
    callbacks.on_end = [ended](const WatchEnd& end) mutable { ended(WatchOutcome{LineVerdict::kApplied, end}); };
    watch_ = client_->Watch(spec_.path, options, std::move(callbacks));
  };
  WatchOutcome outcome = co_await AwaitCallback<WatchOutcome>(std::move(open), std::move(ticket));
  watch_.reset();
  co_return outcome;
}

std::chrono::milliseconds Informer::RetryDelayFor(const std::string& why, std::chrono::milliseconds retry_after) {
  const auto delay = RetryDelay(retry_after, backoff_, client_->Retry().max_retry_after);
  stats_.last_delay = delay;
  log_->info("informer {}: {}; retrying in {} ms", key_, why, delay.count());
  return delay;
}

asio::awaitable<void> Informer::Sleep(std::chrono::milliseconds delay, Gate::Ticket ticket) {
  timer_->timer_.expires_after(delay);
  // Only Stop cancels the timer, and it closes the gate first: the error code says nothing the
  // ticket does not, so it is not read.
  auto wait = [timer = &timer_->timer_](auto resume) {
    timer->async_wait([resume](const boost::system::error_code&) mutable { resume(); });
  };
  co_await AwaitCallback<void>(std::move(wait), std::move(ticket));
}

Informer::LineVerdict Informer::HandleLine(std::string_view line) {
  std::string why;
  auto doc = ParseJson(line, projection_.Event(), &why);
  if (doc.is_discarded() || !doc.is_object()) {
    CountError(kDecodeErrors, "malformed watch line (" + std::to_string(line.size()) + " bytes): " +
                                  (doc.is_discarded() ? why : std::string("not a JSON object")));
    return LineVerdict::kUnreadable;
  }
  const auto type_it = doc.find("type");
  const auto object_it = doc.find("object");
  if (type_it == doc.end() || !type_it->is_string() || object_it == doc.end() || !object_it->is_object()) {
    CountError(kDecodeErrors, "watch event without type or object");
    return LineVerdict::kUnreadable;
  }
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type == "BOOKMARK") {
    const auto* rv = RvOf(*object_it);
    if (!rv || rv->empty()) {
      CountError(kDecodeErrors, "bookmark without a resourceVersion");
      return LineVerdict::kUnreadable;
    }
    resource_version_ = *rv;
    return LineVerdict::kApplied;
  }
  if (type == "ERROR") {
    // Read the Status leniently: json::value throws on a field of another type.
    const auto code_it = object_it->find("code");
    const auto message_it = object_it->find("message");
    if (code_it != object_it->end() && code_it->is_number_integer() && code_it->get<int64_t>() == 410) {
      return LineVerdict::kGone;
    }
    CountError(kErrors, "watch ERROR event: " + (message_it != object_it->end() && message_it->is_string()
                                                      ? message_it->get<std::string>()
                                                      : std::string("(no message)")));
    return LineVerdict::kErrorEvent;
  }
  const bool deleted = type == "DELETED";
  if (!deleted && type != "ADDED" && type != "MODIFIED") {
    CountError(kDecodeErrors, "unknown watch event type \"" + type + "\"");
    return LineVerdict::kUnreadable;
  }
  auto meta = ObjectMeta::From(*object_it);
  if (!meta || meta->resource_version.empty()) {
    CountError(kDecodeErrors, "watch object without name or resourceVersion");
    return LineVerdict::kUnreadable;
  }
  resource_version_ = meta->resource_version;
  auto object = std::make_shared<const nlohmann::json>(std::move(*object_it));
  if (deleted) {
    Remove(meta->Key(), std::move(object));
  } else {
    Upsert(std::move(object), meta->Key());
  }
  return LineVerdict::kApplied;
}

void Informer::Upsert(std::shared_ptr<const nlohmann::json> object, const std::string& key) {
  auto [it, inserted] = items_.try_emplace(key, object);
  if (!inserted) it->second = object;
  objects_gauge_->Set(static_cast<double>(items_.size()));
  bus_.Publish(ResourceEvent{key_, inserted ? ResourceEvent::Type::kAdded : ResourceEvent::Type::kModified,
                             std::move(object)});
}

void Informer::Remove(const std::string& key, std::shared_ptr<const nlohmann::json> last) {
  items_.erase(key);
  objects_gauge_->Set(static_cast<double>(items_.size()));
  bus_.Publish(ResourceEvent{key_, ResourceEvent::Type::kDeleted, std::move(last)});
}

CachedFn Informer::Cached() const {
  // Asked while pages arrive, on the loop; the run's gate says whether `this` is still there
  // (no run, as in RelistForTest: the informer is the caller's, alive).
  Gate::Ticket ticket = run_gate_ ? run_gate_->Watch() : Gate::Ticket{};
  return [this, ticket](std::string_view key, std::string_view resource_version) {
    if (!ticket) return false;
    const auto it = items_.find(std::string(key));
    if (it == items_.end()) return false;
    const auto* rv = RvOf(*it->second);
    return rv && *rv == resource_version;
  };
}

void Informer::RelistForTest(const std::vector<std::string>& pages, std::string resource_version) {
  nlohmann::json items = nlohmann::json::array();
  const auto cached = Cached();
  for (const auto& page : pages) {
    auto list = ParseListPage(page, projection_.Root(), cached);
    for (auto& item : list["items"]) items.push_back(std::move(item));
  }
  Replace(items, std::move(resource_version));
}

void Informer::Replace(nlohmann::json& items, std::string resource_version) {
  std::unordered_map<std::string, std::shared_ptr<const nlohmann::json>> fresh;
  fresh.reserve(items.is_array() ? items.size() : 0);
  std::vector<ResourceEvent> events;
  if (items.is_array()) {
    for (auto& item : items) {
      auto meta = ObjectMeta::From(item);
      if (!meta || meta->resource_version.empty()) {
        CountError(kDecodeErrors, "list item without name or resourceVersion");
        continue;
      }
      auto key = meta->Key();
      const auto old = items_.find(key);
      if (old != items_.end()) {
        const auto* old_rv = RvOf(*old->second);
        if (old_rv && *old_rv == meta->resource_version) {
          fresh.emplace(std::move(key), old->second);  // unchanged: keep the shared object
          continue;
        }
      }
      projection_.Apply(item);
      auto object = std::make_shared<const nlohmann::json>(std::move(item));
      events.push_back(ResourceEvent{
          key_, old == items_.end() ? ResourceEvent::Type::kAdded : ResourceEvent::Type::kModified, object});
      fresh.emplace(std::move(key), std::move(object));
    }
  }
  for (auto& [key, object] : items_) {
    if (!fresh.count(key)) events.push_back(ResourceEvent{key_, ResourceEvent::Type::kDeleted, object});
  }
  items_ = std::move(fresh);
  resource_version_ = std::move(resource_version);
  synced_ = true;
  objects_gauge_->Set(static_cast<double>(items_.size()));
  for (auto& event : events) bus_.Publish(std::move(event));
  PublishSynced();
}

void Informer::PublishSynced() { bus_.Publish(InformerSynced{key_, synced_, resource_version_, stats_.errors}); }

InformerRegistry::InformerRegistry(std::shared_ptr<KubeClient> client, Bus& bus, asio::io_context& io,
                                   MetricsRegistry& metrics, std::shared_ptr<spdlog::logger> log,
                                   InformerOptions options)
    : client_(std::move(client)),
      bus_(bus),
      io_(io),
      metrics_(metrics),
      log_(std::move(log)),
      options_(std::move(options)) {}

InformerRegistry::InformerRegistry(std::shared_ptr<InformerRegistry> root, std::string holder)
    : root_(std::move(root)),
      holder_(std::move(holder)),
      client_(root_->client_),
      bus_(root_->bus_),
      io_(root_->io_),
      metrics_(root_->metrics_),
      log_(root_->log_),
      options_(root_->options_) {}

std::shared_ptr<InformerRegistry> InformerRegistry::View(std::shared_ptr<InformerRegistry> root, std::string holder) {
  if (root->root_) root = root->root_;
  // (The constructor is private: no make_shared.)
  return std::shared_ptr<InformerRegistry>(new InformerRegistry(std::move(root), std::move(holder)));
}

InformerRegistry::~InformerRegistry() {
  if (!root_) StopAll();
}

std::shared_ptr<Informer> InformerRegistry::Acquire(const InformerSpec& spec) {
  return root_ ? root_->AcquireAs(spec, holder_) : AcquireAs(spec, holder_);
}

std::shared_ptr<Informer> InformerRegistry::AcquireAs(const InformerSpec& spec, const std::string& holder) {
  const auto key = spec.Key();
  for (auto it = informers_.begin(); it != informers_.end();) {
    it = it->second.expired() ? informers_.erase(it) : std::next(it);
  }
  auto informer = informers_[key].lock();
  if (!informer) {
    informer = std::make_shared<Informer>(spec, client_, bus_, io_, metrics_, log_, options_);
    informers_[key] = informer;
    // Named before it starts: its first list, sent from the loop later, carries this holder and
    // every other module that acquires it in the same turn (modules start in one turn).
    informer->AddHolder(holder);
    if (!stopped_) informer->Start();
  } else {
    informer->AddHolder(holder);
  }
  // The handle releases the holder when dropped; the informer lives while any handle does.
  struct Hold {
    Hold(std::shared_ptr<Informer> i, std::string h) : informer(std::move(i)), holder(std::move(h)) {}
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { informer->RemoveHolder(holder); }
    std::shared_ptr<Informer> informer;
    std::string holder;
  };
  auto hold = std::make_shared<Hold>(informer, holder);
  return std::shared_ptr<Informer>(hold, hold->informer.get());
}

std::size_t InformerRegistry::Active() const {
  if (root_) return root_->Active();
  std::size_t n = 0;
  for (const auto& [key, weak] : informers_) n += weak.expired() ? 0 : 1;
  return n;
}

void InformerRegistry::StopAll() {
  if (root_) return root_->StopAll();
  stopped_ = true;
  for (auto& [key, weak] : informers_) {
    if (auto informer = weak.lock()) informer->Stop();
  }
}

}  // namespace gns::kube
