// Request routing for the simulated API server (see handler.h).
#include "handler.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>

#include "apply.h"

namespace gns::sim::api {
namespace {

std::string Lower(std::string_view text) {
  std::string out;
  for (char c : text) out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

// Create and update bodies: JSON (also when no Content-Type is sent, as upstream) or YAML.
std::optional<Outcome> ParseObjectBody(std::string_view content_type, std::string_view body, Json* out) {
  const std::string media = LowerMediaType(content_type);
  if (NestingTooDeep(body, kMaxBodyDepth)) return BadRequest("the request body is nested too deeply");
  if (media.empty() || media == "application/json") {
    *out = Json::parse(body, nullptr, false);
    if (out->is_discarded()) {
      return BadRequest("the body of the request could not be decoded: invalid JSON");
    }
    return std::nullopt;
  }
  if (media == "application/yaml") {
    std::vector<Json> documents;
    std::string error;
    if (!YamlToJson(body, &documents, &error)) return BadRequest("error decoding YAML: " + error);
    if (documents.size() != 1) return BadRequest("error decoding YAML: expected exactly one object");
    *out = std::move(documents[0]);
    return std::nullopt;
  }
  return UnsupportedMediaType("application/json, application/yaml");
}

std::optional<Outcome> ParseListParams(const Target& target, ListParams* params) {
  params->label_selector = target.Param("labelSelector").value_or("");
  params->field_selector = target.Param("fieldSelector").value_or("");
  params->continue_token = target.Param("continue").value_or("");
  params->resource_version = target.Param("resourceVersion");
  params->resource_version_match = target.Param("resourceVersionMatch").value_or("");
  if (auto limit = target.Param("limit"); limit && !limit->empty()) {
    std::string_view text = *limit;
    bool negative = !text.empty() && text.front() == '-';
    auto value = ParseUint(negative ? text.substr(1) : text);
    if (!value) return BadRequest("limit: Invalid value: \"" + *limit + "\": must be an integer");
    params->limit = negative ? 0 : static_cast<std::int64_t>(std::min<std::uint64_t>(*value, std::numeric_limits<std::int64_t>::max()));
  }
  return std::nullopt;
}

}  // namespace

bool NestingTooDeep(std::string_view body, int limit) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

Route Classify(std::string_view method, const Target& target) {
  Route route;
  if (target.path == "/_sim" || target.path.rfind("/_sim/", 0) == 0) {
    route.kind = Route::Kind::kAdmin;
    route.verb = "admin";
    return route;
  }
  auto path = ParseApiPath(target.path);
  if (!path) {
    route.kind = Route::Kind::kNonResource;
    route.verb = Lower(method);
    return route;
  }
  route.kind = Route::Kind::kResource;
  route.path = std::move(*path);
  const bool collection = route.path.name.empty();
  if (method == "GET") {
    if (auto watch = target.Param("watch")) {
      auto value = ParseBool(*watch);
      if (!value) {
        route.error = BadRequest("watch: Invalid value: \"" + *watch + "\": not a boolean");
      } else {
        route.watch = *value;
      }
    }
    route.verb = route.watch ? "watch" : collection ? "list" : "get";
  } else if (method == "POST") {
    route.verb = "create";
    // pods/{name}/eviction (policy/v1 Eviction) is the one subresource created with POST.
    const bool eviction = route.path.key.group.empty() && route.path.key.resource == "pods" &&
                          route.path.subresource == "eviction";
    if (!collection && !eviction) route.error = MethodNotAllowed();
  } else if (method == "PUT") {
    route.verb = "update";
    if (collection) route.error = MethodNotAllowed();
  } else if (method == "PATCH") {
    route.verb = "patch";
    if (collection) route.error = MethodNotAllowed();
  } else if (method == "DELETE") {
    route.verb = collection ? "deletecollection" : "delete";
  } else {
    route.verb = Lower(method);
    route.error = MethodNotAllowed();
  }
  if (!route.error && target.Has("dryRun")) {
    route.error = BadRequest("dryRun is not supported by the simulator");
  }
  return route;
}

Outcome HandleResource(Store& store, const Route& route, const Target& target,
                       std::string_view content_type, std::string_view body) {
  if (route.error) return *route.error;
  const ApiPath& path = route.path;
  if (route.verb == "get") return store.Get(path);
  if (route.verb == "list" || route.verb == "deletecollection") {
    ListParams params;
    if (auto error = ParseListParams(target, &params)) return *error;
    return route.verb == "list" ? store.List(path, params) : store.DeleteCollection(path, params);
  }
  if (route.verb == "create" && path.subresource == "eviction") {
    // The Eviction API without PodDisruptionBudgets (a 429 comes from the failNext fault): the
    // pod is deleted at once (graceful deletion is not simulated).
    Json eviction;
    if (auto error = ParseObjectBody(content_type, body, &eviction)) return *error;
    if (!eviction.is_object() || eviction.value("kind", "") != "Eviction") {
      return BadRequest("the body of an eviction must be a policy/v1 Eviction");
    }
    ApiPath pod = path;
    pod.subresource.clear();
    Outcome deleted = store.Delete(pod, eviction.value("deleteOptions", Json::object()));
    if (!deleted.ok()) return deleted;
    Json success = {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", Json::object()}, {"status", "Success"},
                    {"code", 201}};
    return Outcome{201, std::move(success), {}, {}};
  }
  if (route.verb == "create" || route.verb == "update") {
    Json object;
    if (auto error = ParseObjectBody(content_type, body, &object)) return *error;
    return route.verb == "create" ? store.Create(path, std::move(object), false)
                                  : store.Update(path, std::move(object));
  }
  if (route.verb == "patch") {
    if (NestingTooDeep(body, kMaxBodyDepth)) return BadRequest("the patch is nested too deeply");
    PatchParams params;
    params.field_manager = target.Param("fieldManager").value_or("");
    if (auto force = target.Param("force")) {
      auto value = ParseBool(*force);
      if (!value) return BadRequest("force: Invalid value: \"" + *force + "\": not a boolean");
      params.force = *value;
    }
    return store.Patch(path, content_type, body, params);
  }
  if (route.verb == "delete") {
    Json options;
    if (!body.empty()) {
      if (NestingTooDeep(body, kMaxBodyDepth)) return BadRequest("the request body is nested too deeply");
      options = Json::parse(body, nullptr, false);
      if (options.is_discarded() || !options.is_object()) {
        return BadRequest("the body of the request could not be decoded as DeleteOptions");
      }
    }
    return store.Delete(path, options);
  }
  return MethodNotAllowed();
}

namespace {

Json ResourceList(const std::vector<ResourceSummary>& resources, const std::string& group,
                  const std::string& version) {
  Json list = Json::array();
  for (const auto& r : resources) {
    if (r.key.group != group || r.key.version != version) continue;
    list.push_back(Json{{"name", r.key.resource},
                        {"singularName", Lower(r.kind)},
                        {"namespaced", r.namespaced},
                        {"kind", r.kind},
                        {"verbs", Json::array({"create", "delete", "deletecollection", "get", "list",
                                               "patch", "update", "watch"})}});
    if (r.has_status) {
      list.push_back(Json{{"name", r.key.resource + "/status"},
                          {"singularName", ""},
                          {"namespaced", r.namespaced},
                          {"kind", r.kind},
                          {"verbs", Json::array({"get", "patch", "update"})}});
    }
  }
  if (list.empty()) return nullptr;
  return Json{{"kind", "APIResourceList"},
              {"apiVersion", "v1"},
              {"groupVersion", group.empty() ? version : group + "/" + version},
              {"resources", std::move(list)}};
}

Json GroupList(const std::vector<ResourceSummary>& resources) {
  std::map<std::string, std::vector<std::string>> versions;
  for (const auto& r : resources) {
    if (r.key.group.empty()) continue;
    auto& list = versions[r.key.group];
    if (std::find(list.begin(), list.end(), r.key.version) == list.end()) list.push_back(r.key.version);
  }
  Json groups = Json::array();
  for (const auto& [group, list] : versions) {
    Json entries = Json::array();
    for (const auto& v : list) entries.push_back(Json{{"groupVersion", group + "/" + v}, {"version", v}});
    // Prefer v1 when served, else the first version seen.
    std::string preferred = std::find(list.begin(), list.end(), "v1") != list.end() ? "v1" : list.front();
    groups.push_back(Json{{"name", group},
                          {"versions", std::move(entries)},
                          {"preferredVersion", Json{{"groupVersion", group + "/" + preferred}, {"version", preferred}}}});
  }
  return Json{{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", std::move(groups)}};
}

}  // namespace

Outcome HandleNonResource(Store& store, std::string_view method, const Target& target) {
  if (method != "GET") return NotFoundPath();
  std::string path = target.path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path == "/healthz" || path == "/livez" || path == "/readyz") {
    Outcome ok;
    ok.text = "ok";
    return ok;
  }
  if (path == "/version") {
    return Outcome{200,
                   Json{{"major", "1"},
                        {"minor", "34"},
                        {"gitVersion", "v1.34.0-gns-sim"},
                        {"platform", "linux/amd64"}},
                   {},
                   {}};
  }
  if (path == "/api") {
    return Outcome{200, Json{{"kind", "APIVersions"}, {"versions", Json::array({"v1"})}}, {}, {}};
  }
  if (path == "/apis") return Outcome{200, GroupList(store.Resources()), {}, {}};
  Json list;
  if (path == "/api/v1") {
    list = ResourceList(store.Resources(), "", "v1");
  } else if (path.rfind("/apis/", 0) == 0) {
    std::string rest = path.substr(6);
    std::size_t slash = rest.find('/');
    if (slash != std::string::npos && rest.find('/', slash + 1) == std::string::npos) {
      list = ResourceList(store.Resources(), rest.substr(0, slash), rest.substr(slash + 1));
    }
  }
  if (!list.is_null()) return Outcome{200, std::move(list), {}, {}};
  return NotFoundPath();
}

std::optional<WatchParams> ParseWatchParams(const Target& target, Outcome* error) {
  WatchParams params;
  params.label_selector = target.Param("labelSelector").value_or("");
  params.field_selector = target.Param("fieldSelector").value_or("");
  params.resource_version = target.Param("resourceVersion");
  params.resource_version_match = target.Param("resourceVersionMatch").value_or("");
  if (auto bookmarks = target.Param("allowWatchBookmarks")) {
    auto value = ParseBool(*bookmarks);
    if (!value) {
      *error = BadRequest("allowWatchBookmarks: Invalid value: \"" + *bookmarks + "\": not a boolean");
      return std::nullopt;
    }
    params.bookmarks = *value;
  }
  if (auto initial = target.Param("sendInitialEvents")) {
    auto value = ParseBool(*initial);
    if (!value) {
      *error = BadRequest("sendInitialEvents: Invalid value: \"" + *initial + "\": not a boolean");
      return std::nullopt;
    }
    params.send_initial_events = *value;
  }
  return params;
}

std::optional<long> ParseTimeoutSeconds(const Target& target, Outcome* error) {
  auto text = target.Param("timeoutSeconds");
  if (!text || text->empty()) return std::nullopt;
  auto value = ParseUint(*text);
  if (!value) {
    *error = BadRequest("timeoutSeconds: Invalid value: \"" + *text + "\": must be an integer");
    return std::nullopt;
  }
  return static_cast<long>(std::min<std::uint64_t>(*value, 1u << 30));
}

}  // namespace gns::sim::api
