// Event recording with aggregation and a rate limit, and Node condition updates (events.hpp).
#include "modules/kube/api/events.hpp"

#include "modules/kube/api/leader_election.hpp"

#include <cstdio>

namespace gns::kube {

EventRecorder::EventRecorder(std::shared_ptr<KubeClient> client, const Clock& clock, MetricsRegistry& metrics,
                             std::shared_ptr<spdlog::logger> log, EventRecorderConfig config)
    : client_(std::move(client)),
      clock_(clock),
      metrics_(metrics),
      log_(std::move(log)),
      warn_(clock),
      config_(std::move(config)),
      tokens_(config_.burst),
      last_refill_(clock.Now()) {}

EventRecorder::~EventRecorder() { *alive_ = false; }

bool EventRecorder::TakeToken() {
  const auto now = clock_.Now();
  tokens_ = std::min<double>(config_.burst,
                             tokens_ + std::chrono::duration<double>(now - last_refill_).count() * config_.qps);
  last_refill_ = now;
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

void EventRecorder::Count(const char* result) {
  metrics_.Counter("gpu_node_supervisor_kube_events_total", "Events recorded, by outcome", {{"result", result}}).Inc();
}

void EventRecorder::Record(const ObjectReference& regarding, std::string_view type, std::string_view reason,
                           std::string_view action, std::string_view note) {
  const auto now = clock_.Now();
  std::string key = regarding.kind + "/" + regarding.ns + "/" + regarding.name + "/" + regarding.uid + "|" +
                    std::string(type) + "|" + std::string(reason) + "|" + std::string(action) + "|" +
                    std::string(note);
  // Forget series past their window (bounded memory).
  for (auto it = series_.begin(); it != series_.end();) {
    it = now - it->second.first > config_.series_window && !it->second.in_flight ? series_.erase(it) : std::next(it);
  }
  if (auto it = series_.find(key); it != series_.end() && !it->second.failed) {
    ++it->second.count;
    it->second.dirty = true;
    SendSeries(key);
    return;
  }
  if (!TakeToken()) {
    ++stats_.dropped;
    Count("dropped");
    return;
  }
  const std::string ns = regarding.ns.empty() ? "default" : regarding.ns;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".%llx%04llx",
                static_cast<unsigned long long>(clock_.WallNow().time_since_epoch().count() & 0xffffffffffULL),
                static_cast<unsigned long long>(next_suffix_++ & 0xffff));
  const std::string name = regarding.name + suffix;
  nlohmann::json ref = {{"apiVersion", regarding.api_version}, {"kind", regarding.kind}, {"name", regarding.name}};
  if (!regarding.ns.empty()) ref["namespace"] = regarding.ns;
  if (!regarding.uid.empty()) ref["uid"] = regarding.uid;
  nlohmann::json event = {{"apiVersion", "events.k8s.io/v1"},
                          {"kind", "Event"},
                          {"metadata", {{"name", name}, {"namespace", ns}}},
                          {"eventTime", FormatMicroTime(clock_.WallNow())},
                          {"reportingController", config_.reporting_controller},
                          {"reportingInstance", config_.reporting_instance},
                          {"action", action},
                          {"reason", reason},
                          {"regarding", ref},
                          {"note", note},
                          {"type", type}};
  auto& series = series_[key];
  series = Series{ns, "", 1, now, true, false, false};
  client_->Create(ResourcePath::Grouped("events.k8s.io", "v1", "events", ns).Collection(), event,
                  [this, alive = std::weak_ptr<bool>(alive_), key, name](Result r) {
                    const auto a = alive.lock();
                    if (!a || !*a) return;
                    auto it = series_.find(key);
                    if (it == series_.end()) return;
                    it->second.in_flight = false;
                    if (!r.Ok()) {
                      ++stats_.failed;
                      Count("failed");
                      warn_.Warn(*log_, "event_not_recorded", "event " + name + ": " + r.error);
                      series_.erase(it);
                      return;
                    }
                    ++stats_.created;
                    Count("created");
                    it->second.name = name;
                    if (it->second.dirty) SendSeries(key);
                  });
}

void EventRecorder::SendSeries(const std::string& key) {
  auto it = series_.find(key);
  if (it == series_.end() || it->second.in_flight || it->second.name.empty() || !it->second.dirty) return;
  if (!TakeToken()) return;  // stays dirty: the next occurrence carries the whole count
  auto& series = it->second;
  series.in_flight = true;
  series.dirty = false;
  const nlohmann::json patch = {
      {"series", {{"count", series.count}, {"lastObservedTime", FormatMicroTime(clock_.WallNow())}}}};
  client_->Patch(ResourcePath::Grouped("events.k8s.io", "v1", "events", series.ns).Object(series.name),
                 PatchType::kMerge, patch, "", [this, alive = std::weak_ptr<bool>(alive_), key](Result r) {
                   const auto a = alive.lock();
                   if (!a || !*a) return;
                   auto it = series_.find(key);
                   if (it == series_.end()) return;
                   it->second.in_flight = false;
                   if (!r.Ok()) {
                     ++stats_.failed;
                     Count("failed");
                     // The event is gone (expired on the server): the next occurrence makes a new one.
                     it->second.failed = true;
                     return;
                   }
                   ++stats_.series_updates;
                   Count("series");
                   if (it->second.dirty) SendSeries(key);
                 });
}

NodeConditions::NodeConditions(std::shared_ptr<KubeClient> client, const Clock& clock, std::string field_manager)
    : client_(std::move(client)), clock_(clock), field_manager_(std::move(field_manager)) {}

NodeConditions::~NodeConditions() { *alive_ = false; }

void NodeConditions::Set(const std::string& node_name, const NodeCondition& condition,
                         std::function<void(Result)> done) {
  Attempt(node_name, condition, std::move(done), 3);
}

void NodeConditions::Attempt(const std::string& node_name, const NodeCondition& condition,
                             std::function<void(Result)> done, int attempts_left) {
  const auto path = ResourcePath::Core("nodes").Object(node_name);
  client_->Get(path, [this, alive = std::weak_ptr<bool>(alive_), path, node_name, condition, done = std::move(done),
                      attempts_left](Result r) mutable {
    const auto a = alive.lock();
    if (!a || !*a) return;
    auto finish = [&done](Result result) {
      if (done) done(std::move(result));
    };
    if (!r.Ok()) return finish(std::move(r));
    const auto meta = ObjectMeta::From(r.object);
    if (!meta) return finish(Result{r.http_status, nullptr, "node without metadata"});
    nlohmann::json conditions = nlohmann::json::array();
    if (r.object.contains("status") && r.object["status"].is_object()) {
      const auto it = r.object["status"].find("conditions");
      if (it != r.object["status"].end() && it->is_array()) conditions = *it;
    }
    const auto now = FormatMicroTime(clock_.WallNow()).substr(0, 19) + "Z";  // conditions use seconds
    nlohmann::json* existing = nullptr;
    for (auto& c : conditions) {
      if (c.is_object() && c.value("type", "") == condition.type) existing = &c;
    }
    if (existing && existing->value("status", "") == condition.status &&
        existing->value("reason", "") == condition.reason && existing->value("message", "") == condition.message) {
      return finish(Result{200, r.object, {}});  // already so: no write
    }
    nlohmann::json updated = {{"type", condition.type},       {"status", condition.status},
                              {"reason", condition.reason},   {"message", condition.message},
                              {"lastHeartbeatTime", now},     {"lastTransitionTime", now}};
    if (existing) {
      if (existing->value("status", "") == condition.status && existing->contains("lastTransitionTime")) {
        updated["lastTransitionTime"] = (*existing)["lastTransitionTime"];
      }
      *existing = updated;
    } else {
      conditions.push_back(updated);
    }
    const nlohmann::json patch = {{"metadata", {{"resourceVersion", meta->resource_version}}},
                                  {"status", {{"conditions", conditions}}}};
    client_->PatchStatus(path, PatchType::kMerge, patch, field_manager_,
                         [this, alive, node_name, condition, done = std::move(done), attempts_left](Result w) mutable {
                           const auto a2 = alive.lock();
                           if (!a2 || !*a2) return;
                           if (w.http_status == 409 && attempts_left > 1) {
                             Attempt(node_name, condition, std::move(done), attempts_left - 1);
                             return;
                           }
                           if (done) done(std::move(w));
                         });
  });
}

}  // namespace gns::kube
