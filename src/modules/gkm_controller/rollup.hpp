#pragma once
// The cluster view of one kernel cache (seed 002's operator): the per-node status objects the
// gkm-agents write (GKMCacheNode / ClusterGKMCacheNode, one per (node, cache)) rolled up into
// the status of the GKMCache / ClusterGKMCache: nodes total / ready / failed, the failed nodes
// by reason (`failedNodeConditions`, keyed by the agents' cache-level reason such as
// ArchitectureMismatch), and one overall condition. Pure: no I/O, no clock.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace gns::gkm_controller {

// One node's report of one cache: status.caches.<cache> of its status object.
struct NodeReport {
  std::string node;
  std::string state;   // Pending, Pulling, Ready, Incompatible, Failed (anything else: not counted as either)
  std::string reason;  // the cache-level reason (ArchitectureMismatch, DeadlineExceeded, …)
  bool operator==(const NodeReport&) const = default;
};

// The node report inside a per-node status object: spec.nodeName, and the state and reason of
// status.caches.<spec.cacheName>; Pending while the object has no entry for its cache yet. An
// object without spec.nodeName gives an empty node (not counted).
NodeReport ReportOf(const nlohmann::json& status_object);

// The fields of the cache's status this controller owns, without timestamps:
//   {totalNodes, readyNodes, failedNodes, failedNodeConditions: {<reason>: [nodes…]},
//    conditions: [{type: Error, status, reason, message}]}
// Ready counts as ready; Failed and Incompatible count as failed, under their reason (their
// state when they give none); Pending and Pulling count only in the total. The condition is
// the seed's: Error True / NodeFailuresPresent while a node failed, else False / NoNodeFailures.
nlohmann::json RollUp(const std::vector<NodeReport>& nodes);

// The same fields as `status` holds them now (timestamps dropped): equal to RollUp(...) when
// nothing needs writing.
nlohmann::json OwnedFields(const nlohmann::json& status);

// The status to apply: `rollup` with lastUpdated = now, and the condition's lastTransitionTime
// kept from `current` while its status did not change (else now).
nlohmann::json StatusToApply(const nlohmann::json& rollup, const nlohmann::json& current, const std::string& now);

}  // namespace gns::gkm_controller
