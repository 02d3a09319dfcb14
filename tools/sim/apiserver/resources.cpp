// URL parsing, the kind table and Status objects (see resources.h).
#include "resources.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <ctime>
#include <vector>

namespace gns::sim::api {
namespace {

std::optional<std::string> PercentDecode(std::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return std::nullopt;
      int value = 0;
      auto [ptr, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, value, 16);
      if (ec != std::errc() || ptr != in.data() + i + 3) return std::nullopt;
      out.push_back(static_cast<char>(value));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) parts.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

// Plural resource names as the real server serves them. Scope matters: the store refuses a
// namespaced URL for a cluster-scoped kind in this table and the other way round.
constexpr std::array kKinds = {
    KindInfo{"", "pods", "Pod", true},
    KindInfo{"", "nodes", "Node", false},
    KindInfo{"", "namespaces", "Namespace", false},
    KindInfo{"", "services", "Service", true},
    KindInfo{"", "endpoints", "Endpoints", true},
    KindInfo{"", "configmaps", "ConfigMap", true},
    KindInfo{"", "secrets", "Secret", true},
    KindInfo{"", "events", "Event", true},
    KindInfo{"", "serviceaccounts", "ServiceAccount", true},
    KindInfo{"", "persistentvolumes", "PersistentVolume", false},
    KindInfo{"", "persistentvolumeclaims", "PersistentVolumeClaim", true},
    KindInfo{"coordination.k8s.io", "leases", "Lease", true},
    KindInfo{"resource.k8s.io", "resourceslices", "ResourceSlice", false},
    KindInfo{"resource.k8s.io", "resourceclaims", "ResourceClaim", true},
    KindInfo{"resource.k8s.io", "resourceclaimtemplates", "ResourceClaimTemplate", true},
    KindInfo{"resource.k8s.io", "deviceclasses", "DeviceClass", false},
    KindInfo{"resource.k8s.io", "devicetaintrules", "DeviceTaintRule", false},
    KindInfo{"apps", "deployments", "Deployment", true},
    KindInfo{"apps", "daemonsets", "DaemonSet", true},
    KindInfo{"apps", "replicasets", "ReplicaSet", true},
    KindInfo{"apps", "statefulsets", "StatefulSet", true},
    KindInfo{"events.k8s.io", "events", "Event", true},
    KindInfo{"storage.k8s.io", "csidrivers", "CSIDriver", false},
    KindInfo{"storage.k8s.io", "csinodes", "CSINode", false},
    KindInfo{"node.k8s.io", "runtimeclasses", "RuntimeClass", false},
    KindInfo{"apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition",
             false},
};

constexpr std::array<std::string_view, 16> kBuiltinGroups = {
    "",
    "apps",
    "batch",
    "policy",
    "coordination.k8s.io",
    "resource.k8s.io",
    "events.k8s.io",
    "storage.k8s.io",
    "node.k8s.io",
    "apiextensions.k8s.io",
    "rbac.authorization.k8s.io",
    "scheduling.k8s.io",
    "discovery.k8s.io",
    "networking.k8s.io",
    "certificates.k8s.io",
    "admissionregistration.k8s.io",
};

bool IsVowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

}  // namespace

std::string ResourceKey::CollectionPath(bool namespaced, std::string_view ns) const {
  std::string out = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (namespaced) out += "/namespaces/" + std::string(ns);
  out += "/" + resource;
  return out;
}

std::optional<std::string> Target::Param(std::string_view key) const {
  auto it = query.find(key);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

std::optional<Target> ParseTarget(std::string_view raw) {
  Target target;
  std::size_t q = raw.find('?');
  std::string_view path = raw.substr(0, q);
  auto decoded = PercentDecode(path, false);
  if (!decoded || decoded->empty() || decoded->front() != '/') return std::nullopt;
  target.path = std::move(*decoded);
  if (q == std::string_view::npos) return target;
  std::string_view query = raw.substr(q + 1);
  while (!query.empty()) {
    std::size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    std::size_t eq = pair.find('=');
    auto key = PercentDecode(pair.substr(0, eq), true);
    auto value = PercentDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
    if (!key || !value) return std::nullopt;
    target.query[*key] = *value;
  }
  return target;
}

std::optional<ApiPath> ParseApiPath(std::string_view path) {
  auto parts = SplitPath(path);
  ApiPath out;
  std::size_t i = 0;
  if (parts.size() >= 2 && parts[0] == "api") {
    out.key.version = std::string(parts[1]);
    i = 2;
  } else if (parts.size() >= 3 && parts[0] == "apis") {
    out.key.group = std::string(parts[1]);
    out.key.version = std::string(parts[2]);
    i = 3;
  } else {
    return std::nullopt;
  }
  std::size_t rest = parts.size() - i;
  if (rest == 0) return std::nullopt;
  // namespaces/{ns} alone (and its status/finalize subresources) is the Namespace object.
  bool is_namespace_object =
      parts[i] == "namespaces" &&
      (rest == 1 || rest == 2 || (rest == 3 && (parts[i + 2] == "status" || parts[i + 2] == "finalize")));
  if (parts[i] == "namespaces" && !is_namespace_object) {
    out.namespaced = true;
    out.ns = std::string(parts[i + 1]);
    i += 2;
    rest -= 2;
  }
  if (rest == 0 || rest > 3) return std::nullopt;
  out.key.resource = std::string(parts[i]);
  if (rest >= 2) out.name = std::string(parts[i + 1]);
  if (rest == 3) out.subresource = std::string(parts[i + 2]);
  return out;
}

std::optional<bool> ParseBool(std::string_view text) {
  if (text == "1" || text == "t" || text == "T" || text == "TRUE" || text == "true" ||
      text == "True")
    return true;
  if (text == "0" || text == "f" || text == "F" || text == "FALSE" || text == "false" ||
      text == "False")
    return false;
  return std::nullopt;
}

std::optional<std::uint64_t> ParseUint(std::string_view text) {
  std::uint64_t value = 0;
  if (text.empty()) return std::nullopt;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

std::span<const KindInfo> AllKinds() { return kKinds; }

std::vector<std::string_view> ServedVersions(std::string_view group) {
  if (group == "resource.k8s.io") return {"v1", "v1beta2", "v1beta1"};
  return {"v1"};
}

const KindInfo* FindKindByResource(std::string_view group, std::string_view resource) {
  for (const auto& info : kKinds) {
    if (info.group == group && info.resource == resource) return &info;
  }
  return nullptr;
}

const KindInfo* FindKindByKind(std::string_view group, std::string_view kind) {
  for (const auto& info : kKinds) {
    if (info.group == group && info.kind == kind) return &info;
  }
  return nullptr;
}

bool IsBuiltinGroup(std::string_view group) {
  return std::find(kBuiltinGroups.begin(), kBuiltinGroups.end(), group) != kBuiltinGroups.end();
}

std::string GuessPlural(std::string_view kind) {
  std::string lower;
  for (char c : kind) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.empty()) return lower;
  auto ends = [&](std::string_view suffix) {
    return lower.size() >= suffix.size() && lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends("s") || ends("x") || ends("z") || ends("ch") || ends("sh")) return lower + "es";
  if (ends("y") && lower.size() >= 2 && !IsVowel(lower[lower.size() - 2])) {
    return lower.substr(0, lower.size() - 1) + "ies";
  }
  return lower + "s";
}

std::string GuessKind(std::string_view resource) {
  std::string singular(resource);
  auto ends = [&](std::string_view suffix) {
    return singular.size() >= suffix.size() &&
           singular.compare(singular.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends("ies")) {
    singular = singular.substr(0, singular.size() - 3) + "y";
  } else if (ends("sses") || ends("xes") || ends("ches") || ends("shes")) {
    singular = singular.substr(0, singular.size() - 2);
  } else if (ends("s")) {
    singular.pop_back();
  }
  if (!singular.empty()) {
    singular[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(singular[0])));
  }
  return singular;
}

std::string_view KindTableMarkdown() {
  static const std::string table = [] {
    std::string out = "| apiVersion group | kind | resource | scope |\n|---|---|---|---|\n";
    for (const auto& info : kKinds) {
      out += "| `" + std::string(info.group.empty() ? "(core) v1" : info.group) + "` | " +
             std::string(info.kind) + " | " + std::string(info.resource) + " | " +
             (info.namespaced ? "namespaced" : "cluster") + " |\n";
    }
    return out;
  }();
  return table;
}

Json MakeStatus(int code, std::string_view reason, std::string_view message, Json details) {
  Json status = {{"kind", "Status"},
                 {"apiVersion", "v1"},
                 {"metadata", Json::object()},
                 {"status", "Failure"},
                 {"message", message},
                 {"reason", reason},
                 {"code", code}};
  if (!details.is_null()) status["details"] = std::move(details);
  return status;
}

Outcome Fail(int code, std::string_view reason, std::string message, Json details) {
  return Outcome{code, MakeStatus(code, reason, message, std::move(details)), {}, {}};
}

Outcome BadRequest(std::string message) { return Fail(400, "BadRequest", std::move(message)); }

namespace {
Json Details(const ResourceKey& key, std::string_view name) {
  Json details = {{"name", name}, {"kind", key.resource}};
  if (!key.group.empty()) details["group"] = key.group;
  return details;
}
}  // namespace

Outcome NotFound(const ResourceKey& key, std::string_view name) {
  return Fail(404, "NotFound", key.Qualified() + " \"" + std::string(name) + "\" not found",
              Details(key, name));
}

Outcome NotFoundPath() {
  return Fail(404, "NotFound", "the server could not find the requested resource",
              Json{{"causes", Json::array({Json{{"reason", "UnexpectedServerResponse"},
                                                {"message", "404 page not found"}}})}});
}

Outcome AlreadyExists(const ResourceKey& key, std::string_view name) {
  return Fail(409, "AlreadyExists",
              key.Qualified() + " \"" + std::string(name) + "\" already exists", Details(key, name));
}

Outcome Conflict(const ResourceKey& key, std::string_view name, std::string_view detail) {
  return Fail(409, "Conflict",
              "Operation cannot be fulfilled on " + key.Qualified() + " \"" + std::string(name) +
                  "\": " + std::string(detail),
              Details(key, name));
}

Outcome Invalid(std::string_view kind, const ResourceKey& key, std::string_view name,
                std::string_view field, std::string_view detail) {
  std::string qualified_kind(kind);
  if (!key.group.empty()) qualified_kind += "." + key.group;
  std::string_view cause_reason = detail.starts_with("Required value")  ? "FieldValueRequired"
                                  : detail.starts_with("Forbidden")     ? "FieldValueForbidden"
                                                                        : "FieldValueInvalid";
  Json details = {{"name", name},
                  {"kind", kind},
                  {"causes", Json::array({Json{{"reason", cause_reason},
                                               {"message", detail},
                                               {"field", field}}})}};
  if (!key.group.empty()) details["group"] = key.group;
  return Fail(422, "Invalid",
              qualified_kind + " \"" + std::string(name) + "\" is invalid: " + std::string(field) +
                  ": " + std::string(detail),
              std::move(details));
}

Outcome MethodNotAllowed() {
  return Fail(405, "MethodNotAllowed",
              "the server does not allow this method on the requested resource");
}

Outcome UnsupportedMediaType(std::string_view accepted) {
  return Fail(415, "UnsupportedMediaType",
              "the body of the request was in an unknown format - accepted media types include: " +
                  std::string(accepted));
}

std::string_view ReasonForCode(int code) {
  switch (code) {
    case 400: return "BadRequest";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "NotFound";
    case 405: return "MethodNotAllowed";
    case 409: return "Conflict";
    case 410: return "Expired";
    case 413: return "RequestEntityTooLarge";
    case 415: return "UnsupportedMediaType";
    case 422: return "Invalid";
    case 429: return "TooManyRequests";
    case 500: return "InternalError";
    case 503: return "ServiceUnavailable";
    case 504: return "Timeout";
    default: return "Unknown";
  }
}

namespace {
constexpr std::string_view kB64Std =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr std::string_view kB64Url =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string B64Encode(std::string_view data, std::string_view alphabet, bool pad) {
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < data.size(); i += 3) {
    auto n = (static_cast<unsigned char>(data[i]) << 16) |
             (static_cast<unsigned char>(data[i + 1]) << 8) | static_cast<unsigned char>(data[i + 2]);
    out.push_back(alphabet[(n >> 18) & 63]);
    out.push_back(alphabet[(n >> 12) & 63]);
    out.push_back(alphabet[(n >> 6) & 63]);
    out.push_back(alphabet[n & 63]);
  }
  std::size_t left = data.size() - i;
  if (left > 0) {
    unsigned n = static_cast<unsigned char>(data[i]) << 16;
    if (left == 2) n |= static_cast<unsigned char>(data[i + 1]) << 8;
    out.push_back(alphabet[(n >> 18) & 63]);
    out.push_back(alphabet[(n >> 12) & 63]);
    if (left == 2) out.push_back(alphabet[(n >> 6) & 63]);
    if (pad) out.append(left == 1 ? "==" : "=");
  }
  return out;
}
}  // namespace

std::string Base64UrlEncode(std::string_view data) { return B64Encode(data, kB64Url, false); }
std::string Base64Encode(std::string_view data) { return B64Encode(data, kB64Std, true); }

std::optional<std::string> Base64UrlDecode(std::string_view text) {
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    auto pos = kB64Url.find(c);
    if (pos == std::string_view::npos) return std::nullopt;
    buffer = (buffer << 6) | static_cast<unsigned>(pos);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

std::string FormatTime(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string RandomUuid(std::mt19937_64& rng) {
  std::array<unsigned char, 16> bytes{};
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    std::uint64_t r = rng();
    for (std::size_t j = 0; j < 8; ++j) bytes[i + j] = static_cast<unsigned char>(r >> (8 * j));
  }
  bytes[6] = static_cast<unsigned char>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<unsigned char>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15]);
  }
  return out;
}

std::string RandomSuffix(std::mt19937_64& rng) {
  // The alphabet of apiserver's SimpleNameGenerator (no vowels, no confusable digits).
  static constexpr std::string_view kAlphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::string out;
  for (int i = 0; i < 5; ++i) out.push_back(kAlphabet[rng() % kAlphabet.size()]);
  return out;
}

std::string LowerMediaType(std::string_view content_type) {
  std::string_view media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && std::isspace(static_cast<unsigned char>(media.front()))) media.remove_prefix(1);
  while (!media.empty() && std::isspace(static_cast<unsigned char>(media.back()))) media.remove_suffix(1);
  std::string out;
  for (char c : media) out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

std::string MetaString(const Json& obj, std::string_view field) {
  if (!obj.is_object()) return {};
  auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return {};
  auto it = meta->find(field);
  if (it == meta->end() || !it->is_string()) return {};
  return it->get<std::string>();
}

}  // namespace gns::sim::api
