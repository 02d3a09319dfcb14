// The roll-up of one cache's per-node reports (rollup.hpp).
#include "modules/gkm_controller/rollup.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace gns::gkm_controller {

using nlohmann::json;

namespace {

constexpr const char* kConditionType = "Error";

std::string Text(const json& j, const char* key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const json* Field(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

NodeReport ReportOf(const json& object) {
  NodeReport r;
  const json* spec = Field(object, "spec");
  r.node = spec ? Text(*spec, "nodeName") : std::string();
  const std::string cache = spec ? Text(*spec, "cacheName") : std::string();
  const json* status = Field(object, "status");
  const json* caches = status ? Field(*status, "caches") : nullptr;
  const json* entry = caches && !cache.empty() ? Field(*caches, cache.c_str()) : nullptr;
  if (entry && entry->is_object()) {
    r.state = Text(*entry, "state");
    r.reason = Text(*entry, "reason");
  }
  if (r.state.empty()) r.state = "Pending";
  return r;
}

json RollUp(const std::vector<NodeReport>& nodes) {
  std::set<std::string> all, ready;
  std::map<std::string, std::set<std::string>> failed;  // reason → nodes
  std::set<std::string> failed_nodes;
  for (const auto& n : nodes) {
    if (n.node.empty()) continue;
    all.insert(n.node);
    if (n.state == "Ready") {
      ready.insert(n.node);
    } else if (n.state == "Failed" || n.state == "Incompatible") {
      failed[n.reason.empty() ? n.state : n.reason].insert(n.node);
      failed_nodes.insert(n.node);
    }
  }
  json by_reason = json::object();
  for (const auto& [reason, names] : failed) by_reason[reason] = json(std::vector<std::string>(names.begin(), names.end()));
  const auto total = all.size();
  json condition = {{"type", kConditionType}};
  if (!failed_nodes.empty()) {
    condition["status"] = "True";
    condition["reason"] = "NodeFailuresPresent";
    condition["message"] = std::to_string(failed_nodes.size()) + " of " + std::to_string(total) +
                           " nodes reported errors. See failedNodeConditions.";
  } else {
    condition["status"] = "False";
    condition["reason"] = "NoNodeFailures";
    condition["message"] = std::to_string(ready.size()) + " of " + std::to_string(total) + " nodes ready, none failed.";
  }
  return {{"totalNodes", total},
          {"readyNodes", ready.size()},
          {"failedNodes", failed_nodes.size()},
          {"failedNodeConditions", by_reason},
          {"conditions", json::array({condition})}};
}

json OwnedFields(const json& status) {
  json out = json::object();
  for (const char* key : {"totalNodes", "readyNodes", "failedNodes", "failedNodeConditions"}) {
    if (const json* f = Field(status, key)) out[key] = *f;
  }
  if (const json* conditions = Field(status, "conditions"); conditions && conditions->is_array()) {
    for (const auto& c : *conditions) {
      if (Text(c, "type") != kConditionType) continue;
      json mine = json::object();
      for (const char* key : {"type", "status", "reason", "message"}) {
        if (const json* f = Field(c, key)) mine[key] = *f;
      }
      out["conditions"] = json::array({mine});
    }
  }
  return out;
}

json StatusToApply(const json& rollup, const json& current, const std::string& now) {
  json status = rollup;
  status["lastUpdated"] = now;
  auto& condition = status["conditions"][0];
  std::string since = now;
  if (const json* conditions = Field(current, "conditions"); conditions && conditions->is_array()) {
    for (const auto& c : *conditions) {
      if (Text(c, "type") == kConditionType && Text(c, "status") == condition.value("status", "") &&
          !Text(c, "lastTransitionTime").empty()) {
        since = Text(c, "lastTransitionTime");
      }
    }
  }
  condition["lastTransitionTime"] = since;
  return status;
}

}  // namespace gns::gkm_controller
