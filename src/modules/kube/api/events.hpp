#pragma once
// Kubernetes Events (events.k8s.io/v1) with aggregation and a rate limit, and a helper that
// sets Node conditions.
//
// EventRecorder: an event identical to an earlier one (same regarding object, type, reason,
// action and note) within the series window is not created again: the first Event gets a
// `series` (count, lastObservedTime) merge-patched instead. Creates and series updates share
// one token bucket (qps/burst); a new event that finds the bucket empty is dropped and
// counted, a series update that does is deferred to the next occurrence (the count is kept).
//
// NodeConditions: reads the Node, replaces (or adds) the condition of one type in
// status.conditions, keeping lastTransitionTime when the status did not change, and writes the
// whole list back with a merge patch on nodes/<name>/status carrying the resourceVersion read
// (a 409 means someone else wrote: read again, up to 3 times) and `fieldManager=<manager>`.
// A merge patch, not apply: with apply the conditions list is merged by type only on servers
// that know its list-map schema, and the read-modify-write keeps other owners' conditions
// intact on any server.

#include "loop/clock.hpp"
#include "loop/rate_limited_log.hpp"
#include "modules/kube/api/client.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace gns::kube {

struct ObjectReference {
  std::string api_version = "v1";
  std::string kind = "Node";
  std::string ns;  // empty: cluster-scoped (the event goes to "default")
  std::string name;
  std::string uid;
};

struct EventRecorderConfig {
  double qps = 1.0;
  int burst = 25;
  std::string reporting_controller = "gpu-node-supervisor";
  std::string reporting_instance;  // the node or pod name
  std::chrono::milliseconds series_window{std::chrono::minutes(6)};
};

class EventRecorder {
 public:
  struct Stats {
    uint64_t created = 0;
    uint64_t series_updates = 0;
    uint64_t dropped = 0;
    uint64_t failed = 0;
  };

  EventRecorder(std::shared_ptr<KubeClient> client, const Clock& clock, MetricsRegistry& metrics,
                std::shared_ptr<spdlog::logger> log, EventRecorderConfig config);
  ~EventRecorder();

  // type: "Normal" or "Warning".
  void Record(const ObjectReference& regarding, std::string_view type, std::string_view reason,
              std::string_view action, std::string_view note);
  const Stats& GetStats() const { return stats_; }

 private:
  struct Series {
    std::string ns;
    std::string name;  // empty while the create is in flight
    int64_t count = 1;
    Clock::SteadyTime first;
    bool in_flight = false;
    bool dirty = false;
    bool failed = false;
  };
  bool TakeToken();
  void SendSeries(const std::string& key);
  void Count(const char* result);

  std::shared_ptr<KubeClient> client_;
  const Clock& clock_;
  MetricsRegistry& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  RateLimitedLog warn_;  // an API outage fails every event: one line a minute says so
  EventRecorderConfig config_;
  double tokens_;
  Clock::SteadyTime last_refill_;
  std::map<std::string, Series> series_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  uint64_t next_suffix_ = 0;
  Stats stats_;
};

struct NodeCondition {
  std::string type;
  std::string status;  // "True", "False", "Unknown"
  std::string reason;
  std::string message;
};

class NodeConditions {
 public:
  NodeConditions(std::shared_ptr<KubeClient> client, const Clock& clock, std::string field_manager);
  ~NodeConditions();
  // `done` (optional) gets the final result; a condition already as asked writes nothing.
  void Set(const std::string& node_name, const NodeCondition& condition, std::function<void(Result)> done = {});

 private:
  void Attempt(const std::string& node_name, const NodeCondition& condition, std::function<void(Result)> done,
               int attempts_left);

  std::shared_ptr<KubeClient> client_;
  const Clock& clock_;
  std::string field_manager_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace gns::kube
