// Server-side apply, simplified (documented in README.md), and YAML-to-JSON conversion for
// apply bodies, YAML create bodies and seed files.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "resources.h"

namespace gns::sim::api {

// Parses YAML (or JSON, a YAML subset) into JSON. Plain scalars become null/bool/int/float
// when they look like one (YAML 1.2 core schema); quoted scalars stay strings. Returns false
// with *error set on a syntax error. Multi-document input yields several values.
bool YamlToJson(std::string_view text, std::vector<Json>* documents, std::string* error);

// The list-maps of a kind (x-kubernetes-list-type: map): a list's path of field names from the
// object's root (list items not counted: {"status", "nodes"}) → its x-kubernetes-list-map-keys.
using ListMapKeys = std::map<std::vector<std::string>, std::vector<std::string>>;
// The list-maps a CRD version's openAPIV3Schema declares.
ListMapKeys ListMapsFromSchema(const Json& open_api_v3_schema);

// Which part of the object an apply may touch.
enum class ApplyScope {
  kMainWithStatusSubresource,  // everything but .status
  kMainWithoutStatusSubresource,
  kStatus,  // only .status
};

struct ApplyRequest {
  const Json* current = nullptr;  // null: the object does not exist yet
  const Json* applied = nullptr;  // the applied configuration (an object)
  std::string manager;
  bool force = false;
  ApplyScope scope = ApplyScope::kMainWithStatusSubresource;
  std::string api_version;  // for managedFields entries
  std::string now;          // RFC 3339, for managedFields entries
  const ListMapKeys* list_maps = nullptr;  // null or none: every list is atomic
};

struct ApplyResult {
  Json object;  // the merged object (with metadata.managedFields updated)
  std::vector<std::pair<std::string, std::string>> conflicts;  // (manager, ".spec.x")
  std::string invalid;  // a list-map item without its key or twice: 422 ("where: why")
};

// Merges `applied` into `current`:
// - fields are leaf paths; maps are recursed, scalars and lists are atomic leaves, except
//   list-maps (`list_maps`): each item is owned by key, its fields recursed like a map; items
//   of other managers stay untouched, new ones are appended;
// - a leaf owned by another apply manager with a different value is a conflict unless
//   force (then that manager loses it);
// - leaves this manager applied last time but omits now are removed (unless another apply
//   manager also owns them); a list-map item it omits now goes with its fields unless another
//   apply manager owns something in it;
// - ownership lives in metadata.managedFields (operation Apply, fieldsType FieldsV1).
ApplyResult ApplyMerge(const ApplyRequest& request);

}  // namespace gns::sim::api
