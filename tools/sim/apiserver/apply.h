// Server-side apply, simplified (documented in README.md), and YAML-to-JSON conversion for
// apply bodies, YAML create bodies and seed files.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "resources.h"

namespace gns::sim::api {

// Parses YAML (or JSON, a YAML subset) into JSON. Plain scalars become null/bool/int/float
// when they look like one (YAML 1.2 core schema); quoted scalars stay strings. Returns false
// with *error set on a syntax error. Multi-document input yields several values.
bool YamlToJson(std::string_view text, std::vector<Json>* documents, std::string* error);

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
};

struct ApplyResult {
  Json object;  // the merged object (with metadata.managedFields updated)
  std::vector<std::pair<std::string, std::string>> conflicts;  // (manager, ".spec.x")
};

// Merges `applied` into `current`:
// - fields are leaf paths; maps are recursed, lists and scalars are atomic leaves;
// - a leaf owned by another apply manager with a different value is a conflict unless
//   force (then that manager loses it);
// - leaves this manager applied last time but omits now are removed (unless another apply
//   manager also owns them);
// - ownership lives in metadata.managedFields (operation Apply, fieldsType FieldsV1).
ApplyResult ApplyMerge(const ApplyRequest& request);

}  // namespace gns::sim::api
