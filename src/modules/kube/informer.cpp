// Shared informers: list + watch + relist, the cache, and the registry that shares them.
#include "modules/kube/informer.hpp"

#include "modules/kube/json_reader.hpp"

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
      timer_(std::make_unique<InformerTimer>(io)),
      // Set on every event: looked up once (series stay put until the destructor removes them).
      objects_gauge_(&metrics_.Gauge(kObjects, "Objects in the informer cache", {{"informer", key_}})) {}

Informer::~Informer() {
  Stop();
  for (const char* name : {kObjects, kRelists, kRestarts, kDecodeErrors, kErrors}) {
    metrics_.Remove(name, {{"informer", key_}});
  }
}

void Informer::Start() {
  if (running_) return;
  running_ = true;
  List();
}

void Informer::Stop() {
  running_ = false;
  *alive_ = false;
  alive_ = std::make_shared<bool>(true);
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

void Informer::Retry(const std::string& why, void (Informer::*what)(), std::chrono::milliseconds retry_after) {
  if (!running_) return;
  const auto delay = RetryDelay(retry_after, backoff_, client_->Retry().max_retry_after);
  stats_.last_delay = delay;
  log_->info("informer {}: {}; retrying in {} ms", key_, why, delay.count());
  timer_->timer_.expires_after(delay);
  timer_->timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_), what](const boost::system::error_code& ec) {
    const auto a = alive.lock();
    if (ec || !a || !*a || !running_) return;
    (this->*what)();
  });
}

void Informer::List() {
  if (!running_) return;
  ListOptions options{spec_.label_selector, spec_.field_selector, options_.page_size};
  // Pages decode through the projection, and what the cache holds as it is is not built again.
  // The watch is stopped while listing, so the cache cannot change before Replace.
  client_->List(spec_.path, options, projection_.Root(), Cached(), [this, alive = std::weak_ptr<bool>(alive_)](Result r) {
    const auto a = alive.lock();
    if (!a || !*a || !running_) return;
    if (!r.Ok()) {
      CountError(kErrors, "list failed: " + r.error);
      Retry("list failed", &Informer::List, r.retry_after);
      return;
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
      Retry("bad list", &Informer::List);
      return;
    }
    if (stats_.lists > 0) {
      ++stats_.relists;
      metrics_.Counter(kRelists, "Informer relists (after 410 or an undecodable event)", {{"informer", key_}}).Inc();
    }
    ++stats_.lists;
    Replace(r.object["items"], *rv);
    backoff_.Reset();
    StartWatch();
  });
}

void Informer::StartWatch() {
  if (!running_) return;
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
  WatchCallbacks callbacks;
  std::weak_ptr<bool> alive = alive_;
  callbacks.on_line = [this, alive](std::string_view line) {
    const auto a = alive.lock();
    if (!a || !*a || !running_) return;
    if (!HandleLine(line) && running_) {
      // An event we could not read may have been a change we now miss: only a relist
      // brings the cache back in line with the server.
      if (watch_) watch_->Stop();
      Retry("undecodable watch event", &Informer::List);
    }
  };
  callbacks.on_end = [this, alive](const WatchEnd& end) {
    const auto a = alive.lock();
    if (!a || !*a || !running_) return;
    OnWatchEnd(end);
  };
  watch_ = client_->Watch(spec_.path, options, std::move(callbacks));
}

void Informer::OnWatchEnd(const WatchEnd& end) {
  ++stats_.watch_restarts;
  metrics_.Counter(kRestarts, "Watches that ended and were resumed or relisted", {{"informer", key_}}).Inc();
  if (end.http_status == 410) {
    Relist("watch refused with 410 Gone");
    return;
  }
  if (end.decode_error) {
    CountError(kDecodeErrors, "watch stream: " + end.error);
    Retry("undecodable watch stream", &Informer::List);
    return;
  }
  if (end.http_status != 200 || !end.error.empty()) CountError(kErrors, "watch ended: " + end.error);
  const bool healthy = end.http_status == 200 &&
                       (end.lines > 0 || client_->GetClock().Now() - watch_started_ >= options_.healthy_watch);
  if (healthy) {
    // It worked until now (ended by timeoutSeconds, cut, idle): this is not a failure in a
    // row, so no wait (as client-go's reflector); a reconnect that then fails backs off from
    // the start.
    backoff_.Reset();
    ++stats_.immediate_rewatches;
    StartWatch();
    return;
  }
  Retry("watch ended", &Informer::StartWatch, end.retry_after);
}

void Informer::Relist(const std::string& why) {
  if (watch_) watch_->Stop();
  log_->info("informer {}: {}; relisting", key_, why);
  List();
}

bool Informer::HandleLine(std::string_view line) {
  std::string why;
  auto doc = ParseJson(line, projection_.Event(), &why);
  if (doc.is_discarded() || !doc.is_object()) {
    CountError(kDecodeErrors, "malformed watch line (" + std::to_string(line.size()) + " bytes): " +
                                  (doc.is_discarded() ? why : std::string("not a JSON object")));
    return false;
  }
  const auto type_it = doc.find("type");
  const auto object_it = doc.find("object");
  if (type_it == doc.end() || !type_it->is_string() || object_it == doc.end() || !object_it->is_object()) {
    CountError(kDecodeErrors, "watch event without type or object");
    return false;
  }
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type == "BOOKMARK") {
    const auto* rv = RvOf(*object_it);
    if (!rv || rv->empty()) {
      CountError(kDecodeErrors, "bookmark without a resourceVersion");
      return false;
    }
    resource_version_ = *rv;
    return true;
  }
  if (type == "ERROR") {
    // Read the Status leniently: json::value throws on a field of another type.
    const auto code_it = object_it->find("code");
    const auto message_it = object_it->find("message");
    if (code_it != object_it->end() && code_it->is_number_integer() && code_it->get<int64_t>() == 410) {
      Relist("watch expired (410 in the stream)");
      return true;
    }
    CountError(kErrors, "watch ERROR event: " + (message_it != object_it->end() && message_it->is_string()
                                                      ? message_it->get<std::string>()
                                                      : std::string("(no message)")));
    if (watch_) watch_->Stop();
    Retry("watch error event", &Informer::StartWatch);
    return true;
  }
  const bool deleted = type == "DELETED";
  if (!deleted && type != "ADDED" && type != "MODIFIED") {
    CountError(kDecodeErrors, "unknown watch event type \"" + type + "\"");
    return false;
  }
  auto meta = ObjectMeta::From(*object_it);
  if (!meta || meta->resource_version.empty()) {
    CountError(kDecodeErrors, "watch object without name or resourceVersion");
    return false;
  }
  resource_version_ = meta->resource_version;
  auto object = std::make_shared<const nlohmann::json>(std::move(*object_it));
  if (deleted) {
    Remove(meta->Key(), std::move(object));
  } else {
    Upsert(std::move(object), meta->Key());
  }
  return true;
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
  return [this, alive = std::weak_ptr<bool>(alive_)](std::string_view key, std::string_view resource_version) {
    const auto a = alive.lock();
    if (!a || !*a) return false;
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

InformerRegistry::~InformerRegistry() { StopAll(); }

std::shared_ptr<Informer> InformerRegistry::Acquire(const InformerSpec& spec) {
  const auto key = spec.Key();
  for (auto it = informers_.begin(); it != informers_.end();) {
    it = it->second.expired() ? informers_.erase(it) : std::next(it);
  }
  if (auto existing = informers_[key].lock()) return existing;
  auto informer = std::make_shared<Informer>(spec, client_, bus_, io_, metrics_, log_, options_);
  informers_[key] = informer;
  if (!stopped_) informer->Start();
  return informer;
}

std::size_t InformerRegistry::Active() const {
  std::size_t n = 0;
  for (const auto& [key, weak] : informers_) n += weak.expired() ? 0 : 1;
  return n;
}

void InformerRegistry::StopAll() {
  stopped_ = true;
  for (auto& [key, weak] : informers_) {
    if (auto informer = weak.lock()) informer->Stop();
  }
}

}  // namespace gns::kube
