#pragma once
// What the kube module publishes on the bus: informer changes (one topic for every informer,
// told apart by informer_key), each informer's sync state, and the leader-election state.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace gns::kube {

// The module's name as ModuleStates lists it: what a module that waits for kube looks for.
inline constexpr std::string_view kModuleName = "kube";

// One change seen by an informer, after its cache was updated. `object` is shared with the
// cache (immutable): subscribers may keep the pointer. For kDeleted it is the last state known.
struct ResourceEvent {
  static constexpr std::string_view kTopic = "kube.resource-event";
  enum class Type { kAdded, kModified, kDeleted };
  std::string informer_key;
  Type type = Type::kAdded;
  std::shared_ptr<const nlohmann::json> object;
};

// Retained per informer: synced once the first list is in the cache (it stays true through
// relists; the cache keeps serving the last state while a relist runs). Published after each
// list only, never on an error: a relist's changes arrive as ResourceEvents, so a consumer
// that re-reads everything on this message does so once per list, not once per fault.
struct InformerSynced {
  static constexpr std::string_view kTopic = "kube.informer-synced";
  static constexpr bool kRetained = true;
  std::string informer_key;
  bool synced = false;
  std::string resource_version;
  uint64_t errors = 0;
  std::string RetainKey() const { return informer_key; }
};

inline void to_json(nlohmann::json& j, const InformerSynced& s) {
  j = {{"synced", s.synced}, {"resourceVersion", s.resource_version}, {"errors", s.errors}};
}

// Retained per lease: whether this process leads.
struct LeaderStatus {
  static constexpr std::string_view kTopic = "kube.leader";
  static constexpr bool kRetained = true;
  std::string lease;  // "namespace/name"
  std::string identity;
  bool leading = false;
  std::string holder;  // the last holder seen ("" unknown)
  bool identity_shared = false;  // another process renews the lease under our identity
  std::string RetainKey() const { return lease; }
};

inline void to_json(nlohmann::json& j, const LeaderStatus& s) {
  j = {{"identity", s.identity}, {"leading", s.leading}, {"holder", s.holder}, {"identityShared", s.identity_shared}};
}

}  // namespace gns::kube
