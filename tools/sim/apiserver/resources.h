// URL shapes, the kind table, Status objects and small helpers of the simulated API server.
// No networking here, so the store and the router stay cheap to compile and to test.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gns::sim::api {

using Json = nlohmann::json;

struct ResourceKey {
  std::string group;  // "" for the core group (/api/v1)
  std::string version;
  std::string resource;  // plural, lower case
  auto operator<=>(const ResourceKey&) const = default;
  std::string GroupVersion() const { return group.empty() ? version : group + "/" + version; }
  // "pods", "resourceslices.resource.k8s.io": how the real server names a resource in messages.
  std::string Qualified() const { return group.empty() ? resource : resource + "." + group; }
  std::string CollectionPath(bool namespaced, std::string_view ns) const;
};

// A parsed resource URL: /api/v1/[namespaces/{ns}/]{resource}[/{name}[/status]] or
// /apis/{group}/{version}/[namespaces/{ns}/]{resource}[/{name}[/status]].
struct ApiPath {
  ResourceKey key;
  bool namespaced = false;  // the URL carried namespaces/{ns}/
  std::string ns;
  std::string name;         // empty: the collection
  std::string subresource;  // "" or "status"
};

// A request target split into a decoded path and decoded query parameters.
struct Target {
  std::string path;
  std::map<std::string, std::string, std::less<>> query;  // the last value of a repeated key wins
  std::optional<std::string> Param(std::string_view key) const;
  bool Has(std::string_view key) const { return query.contains(key); }
};

// nullopt: bad percent-encoding.
std::optional<Target> ParseTarget(std::string_view raw);
// nullopt: not a resource URL (the caller answers 404).
std::optional<ApiPath> ParseApiPath(std::string_view path);

// strconv.ParseBool: 1 t T TRUE true True / 0 f F FALSE false False.
std::optional<bool> ParseBool(std::string_view text);
std::optional<std::uint64_t> ParseUint(std::string_view text);

// --- the kind table
struct KindInfo {
  std::string_view group;
  std::string_view resource;
  std::string_view kind;
  bool namespaced;
};
std::span<const KindInfo> AllKinds();
// The versions discovery announces for a table group ("" -> v1; resource.k8s.io -> v1,
// v1beta2, v1beta1). Any version works on the wire; objects are stored per version.
std::vector<std::string_view> ServedVersions(std::string_view group);
const KindInfo* FindKindByResource(std::string_view group, std::string_view resource);
const KindInfo* FindKindByKind(std::string_view group, std::string_view kind);
// Groups served by the real kube-apiserver itself (not CRDs): their list items carry no
// apiVersion/kind, and strategic merge patch is accepted for them.
bool IsBuiltinGroup(std::string_view group);
std::string GuessPlural(std::string_view kind);      // Foo -> foos, Policy -> policies
std::string GuessKind(std::string_view resource);    // foos -> Foo
std::string_view KindTableMarkdown();                 // for --help and README

// --- Status objects
struct Outcome {
  int code = 200;
  Json body;                       // an object, or a Status on errors
  std::string text;                // non-empty: a text/plain body instead of `body`
  std::string retry_after;         // non-empty: a Retry-After header
  bool ok() const { return code < 400; }
};
Json MakeStatus(int code, std::string_view reason, std::string_view message,
                Json details = nullptr);
Outcome Fail(int code, std::string_view reason, std::string message, Json details = nullptr);
Outcome BadRequest(std::string message);
Outcome NotFound(const ResourceKey& key, std::string_view name);
Outcome NotFoundPath();  // "the server could not find the requested resource"
Outcome AlreadyExists(const ResourceKey& key, std::string_view name);
Outcome Conflict(const ResourceKey& key, std::string_view name, std::string_view detail);
Outcome Invalid(std::string_view kind, const ResourceKey& key, std::string_view name,
                std::string_view field, std::string_view detail);
Outcome MethodNotAllowed();
Outcome UnsupportedMediaType(std::string_view accepted);
std::string_view ReasonForCode(int code);  // generic reasons for injected failures

// --- helpers
std::string Base64UrlEncode(std::string_view data);  // RawURLEncoding, as Go continue tokens
std::optional<std::string> Base64UrlDecode(std::string_view text);
std::string Base64Encode(std::string_view data);  // standard, padded (kubeconfig *-data)
std::string FormatTime(std::chrono::system_clock::time_point t);  // 2025-01-01T00:00:00Z
std::string RandomUuid(std::mt19937_64& rng);
std::string RandomSuffix(std::mt19937_64& rng);  // generateName: 5 chars, as upstream
std::string LowerMediaType(std::string_view content_type);  // "Application/JSON; x" -> "application/json"
// obj.metadata.<field> as a string; "" when absent or not a string.
std::string MetaString(const Json& obj, std::string_view field);

}  // namespace gns::sim::api
