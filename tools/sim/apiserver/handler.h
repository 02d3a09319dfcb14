// Maps one HTTP request (method, target, content type, body) onto the store, without any
// networking types: the Beast server and the in-process ApiServer::Call() share it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "resources.h"
#include "store.h"

namespace gns::sim::api {

struct Route {
  enum class Kind { kResource, kNonResource, kAdmin };
  Kind kind = Kind::kNonResource;
  std::string verb;  // get, list, watch, create, update, patch, delete, deletecollection, ...
  bool watch = false;
  ApiPath path;
  std::optional<Outcome> error;  // the request is already answered (bad parameter, 404, 405)
};

Route Classify(std::string_view method, const Target& target);

// Non-watch resource requests.
Outcome HandleResource(Store& store, const Route& route, const Target& target,
                       std::string_view content_type, std::string_view body);
// /version, /healthz, /livez, /readyz and legacy discovery (/api, /api/v1, /apis,
// /apis/{group}/{version}) so kubectl works against the simulator.
Outcome HandleNonResource(Store& store, std::string_view method, const Target& target);

// Query parameters of a watch; nullopt with *error set on a bad value.
std::optional<WatchParams> ParseWatchParams(const Target& target, Outcome* error);
// The watch's timeoutSeconds (nullopt when absent); *error on a bad value.
std::optional<long> ParseTimeoutSeconds(const Target& target, Outcome* error);

// Bodies nested deeper than this are refused before parsing (recursive printers, compares).
inline constexpr int kMaxBodyDepth = 1000;
bool NestingTooDeep(std::string_view body, int limit);

}  // namespace gns::sim::api
