#pragma once
// The Kubernetes API client every cluster-facing module uses (offered by the `kube` module as a
// service: `context.GetServices().Find<KubeClient>()`). HTTP/1.1 over TLS (Beast + OpenSSL,
// kept out of this header), keep-alive connections, a deadline on every request, a client-side
// token bucket, bearer tokens re-read from their file every minute and on a 401, or client
// certificates. Completion callbacks run on the loop; every verb can also be awaited from a
// coroutine on the loop (`Result r = co_await client.Get(path, deadline);`). Objects are
// nlohmann JSON; a resourceVersion is an opaque string compared for equality only.

#include "loop/backoff.hpp"
#include "loop/clock.hpp"
#include "loop/gate.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "modules/kube/api/json_reader.hpp"

#include <utility>  // before awaitable.hpp: Boost 1.74's uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace gns::kube {

// The outcome of one request. http_status is 0 when no HTTP answer arrived (connect, TLS,
// deadline, decode); `error` is empty on success and otherwise says what went wrong (for API
// errors: the Status message).
struct Result {
  int http_status = 0;
  nlohmann::json object;
  std::string error;
  // How long the server asked us to wait (`Retry-After` in seconds, or the Status's
  // details.retryAfterSeconds); 0 when it did not say.
  std::chrono::milliseconds retry_after{0};
  bool Ok() const { return http_status >= 200 && http_status < 300 && error.empty(); }
};

// The one judge of "worth another try": no answer at all (connect, TLS, deadline: status 0),
// throttled (429), or a server-side failure (500, 502, 503, 504). Everything else (4xx, 501,
// ...) is the caller's to handle: the same request would get the same answer.
bool IsTransient(int http_status);
inline bool IsTransient(const Result& result) { return !result.Ok() && IsTransient(result.http_status); }

// How the client retries on its own, and how anyone retrying an API call should wait.
struct RetryPolicy {
  // Attempts per request, the first included (1: never retry). The client retries by itself
  // (a) a request that never reached the server (connect refused, TLS failed), any verb;
  // (b) a 429, or a 5xx that carries Retry-After, any verb (the server did not act on it);
  // (c) a GET that got no answer or a 5xx. Anything else goes back to the caller at once.
  int max_attempts = 5;
  BackoffPolicy backoff{std::chrono::milliseconds(200), std::chrono::milliseconds(5000), 2.0, 0.5};
  // A Retry-After longer than this is cut to this (a misbehaving server cannot park us).
  std::chrono::milliseconds max_retry_after{std::chrono::seconds(30)};
};

// The wait before the next attempt: the server's Retry-After when it gave one (capped at
// `max_retry_after`), otherwise the backoff's next delay.
std::chrono::milliseconds RetryDelay(std::chrono::milliseconds retry_after, Backoff& backoff,
                                     std::chrono::milliseconds max_retry_after);

// Parses a Retry-After header value: delta-seconds only (an HTTP-date, which the API server
// never sends, or garbage gives 0).
std::chrono::milliseconds ParseRetryAfter(std::string_view value);

enum class PatchType { kMerge, kJson, kApply };

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 500;  // page size; 0 = everything in one response
};

struct Preconditions {
  std::string uid;
  std::string resource_version;
};

struct WatchOptions {
  std::string resource_version;
  std::string label_selector;
  std::string field_selector;
  bool bookmarks = true;
  int64_t timeout_seconds = 0;  // 0: the server's own limit
  // No byte for this long means the connection is dead: the watch ends with an error.
  std::chrono::milliseconds idle_timeout{300000};
};

// How a watch stream ended.
struct WatchEnd {
  int http_status = 0;   // 200 once the stream opened; the status of a refused watch; 0: none
  bool clean = false;    // the server ended the stream properly (last chunk)
  bool decode_error = false;  // the stream could not be framed (line too long, bad content type)
  std::string error;
  nlohmann::json status;  // the Status body of a refused watch, if any
  std::chrono::milliseconds retry_after{0};  // a refused watch's Retry-After (0: none)
  std::size_t lines = 0;  // lines delivered before the end (set by the client)
};

struct WatchCallbacks {
  // One complete line of the stream (one JSON object as text, newline stripped).
  std::function<void(std::string_view line)> on_line;
  // Exactly once, unless the handle was stopped first.
  std::function<void(const WatchEnd&)> on_end;
};

// Stops its watch when stopped or destroyed; no callback runs after that.
class WatchHandle {
 public:
  virtual ~WatchHandle() = default;
  virtual void Stop() = 0;
};

// Where and how to reach the API server (from a kubeconfig or the in-cluster environment).
struct ClientConfig {
  std::string server;  // https://host:port
  std::string ca_pem;  // trusted CA certificates (PEM); required: verification is never off
  std::string token;   // a static bearer token (kubeconfig `token`)
  std::string token_file;  // re-read every token_refresh and after a 401
  std::string client_cert_pem;
  std::string client_key_pem;
  double qps = 20.0;
  int burst = 40;
  std::chrono::milliseconds request_timeout{30000};
  std::chrono::milliseconds token_refresh{60000};
  std::size_t max_response_bytes = 64 * 1024 * 1024;
  std::size_t max_watch_line_bytes = 16 * 1024 * 1024;
  std::size_t max_idle_connections = 4;
  RetryPolicy retry;
  std::string user_agent = "gpu-node-supervisor";
};

// The in-cluster service-account files (overridable so tests can point them at a temp dir).
struct InClusterPaths {
  std::string token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string ns = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

// Reads KUBERNETES_SERVICE_HOST/PORT and the service-account files; throws std::runtime_error
// naming what is missing.
ClientConfig InClusterConfig(const InClusterPaths& paths = {});
// Reads a kubeconfig (current context, or `context` if given): server, CA file or data, token,
// tokenFile, client certificate/key as files or data. Throws std::runtime_error.
ClientConfig LoadKubeconfig(const std::string& path, const std::string& context = {});

// How long an awaited call may take in all, its wait in the rate limiter, its pages and its
// retries included. Past it the call resumes with http_status 0 and an error starting with
// kDeadlineExceeded (IsTransient: worth another try); the request itself is not recalled (a
// write may still reach the server) and its late answer is dropped. Zero: no bound beyond the
// client's own (request_timeout per attempt, RetryPolicy). Implicit from a duration, so
// `co_await client.Get(path, std::chrono::seconds(5))` reads as it means.
struct Deadline {
  Deadline() = default;
  Deadline(std::chrono::milliseconds within) : within(within) {}  // NOLINT(google-explicit-constructor)
  std::chrono::milliseconds within{0};
};
inline constexpr std::string_view kDeadlineExceeded = "deadline exceeded";

// Builds API paths: core ("" group, "v1") or grouped, namespaced or cluster-scoped.
struct ResourcePath {
  std::string group;  // "" for core
  std::string version = "v1";
  std::string resource;  // plural: "nodes", "leases"
  std::string ns;        // empty: cluster-scoped (or all namespaces)

  // /api/v1/nodes, /apis/coordination.k8s.io/v1/namespaces/ns/leases
  std::string Collection() const;
  // Collection() + "/" + name (+ "/" + subresource); every segment from outside (namespace,
  // name, subresource) is PathEscape'd.
  std::string Object(std::string_view name, std::string_view subresource = {}) const;

  static ResourcePath Core(std::string resource, std::string ns = {});
  static ResourcePath Grouped(std::string group, std::string version, std::string resource, std::string ns = {});
};

// Percent-encodes a query parameter value.
std::string QueryEscape(std::string_view value);
// Percent-encodes one path segment: everything but RFC 3986 unreserved characters, so "/", "?",
// "#", "%" and ".." cannot change which object a request names ("." and ".." as a whole
// segment are encoded too).
std::string PathEscape(std::string_view segment);
// Whether `name` is a valid Kubernetes object name (a DNS-1123 subdomain: at most 253 of
// [a-z0-9.-], starting and ending with [a-z0-9]). Names from the API or a spec that are not are
// refused before they reach a request path.
bool IsValidObjectName(std::string_view name);

// Small typed views of what modules read.
struct ObjectMeta {
  std::string name;
  std::string ns;
  std::string uid;
  std::string resource_version;
  // nullopt when `object` has no metadata.name (a malformed object).
  static std::optional<ObjectMeta> From(const nlohmann::json& object);
  // "ns/name", or "name" for cluster-scoped objects (the informer cache key).
  std::string Key() const { return ns.empty() ? name : ns + "/" + name; }
};

class KubeClient {
 public:
  using Callback = std::function<void(Result)>;

  struct Deps {
    Loop& loop;
    const Clock& clock;
    MetricsRegistry& metrics;
    std::shared_ptr<spdlog::logger> log;
  };

  // Throws std::runtime_error for an unusable config (bad URL, bad PEM).
  KubeClient(Deps deps, ClientConfig config);
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  void Get(const std::string& path, Callback cb);
  // Follows continue tokens; the result object is {"metadata":{"resourceVersion"},"items":[...]}.
  void List(const std::string& path, const ListOptions& options, Callback cb);
  // The same for a cache (an informer's relist): each page decoded by ParseListPage
  // (json_reader.hpp) through `item_projection`, items `cached` says the caller holds as they are
  // coming back as their identity alone. `item_projection` is copied (an informer may go while
  // its relist is in flight); `cached` is asked on the loop while pages arrive.
  void List(const std::string& path, const ListOptions& options, const Projection::Node& item_projection,
            CachedFn cached, Callback cb);
  void Create(const std::string& collection_path, const nlohmann::json& object, Callback cb);
  void Update(const std::string& path, const nlohmann::json& object, Callback cb);
  // kApply needs a field manager (the module's name); `force` takes over conflicting fields.
  void Patch(const std::string& path, PatchType type, const nlohmann::json& body, const std::string& field_manager,
             Callback cb, bool force = false);
  void Delete(const std::string& path, const Preconditions& preconditions, Callback cb);
  void UpdateStatus(const std::string& path, const nlohmann::json& object, Callback cb);
  void PatchStatus(const std::string& path, PatchType type, const nlohmann::json& body,
                   const std::string& field_manager, Callback cb, bool force = false);
  // A streaming GET of `collection_path?watch=1&...`; lines arrive on the loop.
  std::unique_ptr<WatchHandle> Watch(const std::string& collection_path, const WatchOptions& options,
                                     WatchCallbacks callbacks);

  // A raw request (method, target with query, body, content type), for what the verbs above
  // do not cover. `verb` labels the metrics.
  void Request(std::string_view verb, std::string_view method, std::string target, std::string body,
               std::string content_type, Callback cb);

  // The same calls, awaited: each resumes its coroutine on the loop with the Result the
  // callback would have had, or with a kDeadlineExceeded error once `deadline` passed; once
  // `ticket`'s gate is closed it resumes nothing (the coroutine is dropped, loop/awaitables.hpp).
  // Each copies what it needs before it returns; inside a coroutine body, still pass named
  // values, not braced temporaries, in the co_await expression (the g++ 12 pitfall, there).
  [[nodiscard]] boost::asio::awaitable<Result> Get(const std::string& path, Deadline deadline = {},
                                                   Gate::Ticket ticket = {});
  [[nodiscard]] boost::asio::awaitable<Result> List(const std::string& path, const ListOptions& options,
                                                    Deadline deadline = {}, Gate::Ticket ticket = {});
  [[nodiscard]] boost::asio::awaitable<Result> List(const std::string& path, const ListOptions& options,
                                                    const Projection::Node& item_projection, CachedFn cached,
                                                    Deadline deadline = {}, Gate::Ticket ticket = {});
  [[nodiscard]] boost::asio::awaitable<Result> Create(const std::string& collection_path, const nlohmann::json& object,
                                                      Deadline deadline = {}, Gate::Ticket ticket = {});
  [[nodiscard]] boost::asio::awaitable<Result> Update(const std::string& path, const nlohmann::json& object,
                                                      Deadline deadline = {}, Gate::Ticket ticket = {});
  // `force` comes last: `Patch(path, PatchType::kApply, body, manager, deadline, ticket, true)`.
  [[nodiscard]] boost::asio::awaitable<Result> Patch(const std::string& path, PatchType type, const nlohmann::json& body,
                                                     const std::string& field_manager, Deadline deadline = {},
                                                     Gate::Ticket ticket = {}, bool force = false);
  [[nodiscard]] boost::asio::awaitable<Result> Delete(const std::string& path, const Preconditions& preconditions,
                                                      Deadline deadline = {}, Gate::Ticket ticket = {});
  [[nodiscard]] boost::asio::awaitable<Result> UpdateStatus(const std::string& path, const nlohmann::json& object,
                                                            Deadline deadline = {}, Gate::Ticket ticket = {});
  [[nodiscard]] boost::asio::awaitable<Result> PatchStatus(const std::string& path, PatchType type,
                                                           const nlohmann::json& body,
                                                           const std::string& field_manager, Deadline deadline = {},
                                                           Gate::Ticket ticket = {}, bool force = false);
  [[nodiscard]] boost::asio::awaitable<Result> Request(std::string_view verb, std::string_view method,
                                                       std::string target, std::string body, std::string content_type,
                                                       Deadline deadline = {}, Gate::Ticket ticket = {});

  // Who a request says it comes from (its User-Agent): the config's user_agent
  // ("gpu-node-supervisor") for the process itself, "<user_agent>/<module>" for a module's
  // view, "<user_agent>/<a>+<b>" for an informer shared by modules a and b (in name order).
  // The API server's audit log names the module, and the API simulator records its calls by
  // module (GET /_sim/stats "callsByAgent"), from which deploy/'s RBAC is checked. This is the
  // one place that spells the string.
  std::string ModuleAgent(std::string_view holders) const;
  // A view of this client (the same connections, token bucket and metrics) whose requests
  // carry ModuleAgent(module). Shutting a view down shuts the client down; dropping one does not.
  std::shared_ptr<KubeClient> ForModule(std::string_view module) const;
  // The same, with an agent its owner may change (an informer when its holders change): read
  // as each request is sent.
  std::shared_ptr<KubeClient> WithAgent(std::shared_ptr<const std::string> agent) const;
  // The agent this client's requests carry now.
  std::string Agent() const;

  // Closes every connection and watch; pending and later requests complete with an error.
  void Shutdown();
  // Re-reads the token file now (also done on a timer and after a 401).
  void ReloadToken();

  struct Stats {
    uint64_t requests = 0;  // attempts (each retry counts)
    uint64_t connections_opened = 0;
    uint64_t token_reloads = 0;
    uint64_t retries = 0;  // attempts after the first (RetryPolicy)
    std::chrono::milliseconds last_retry_delay{0};  // the wait before the latest retry
  };
  Stats GetStats() const;
  const Clock& GetClock() const;
  const RetryPolicy& Retry() const;

  class Impl;

 private:
  // A view (ForModule, WithAgent): shares `impl`, never shuts it down.
  KubeClient(std::shared_ptr<Impl> impl, std::shared_ptr<const std::string> agent);
  void List(const std::string& path, const ListOptions& options,
            std::shared_ptr<const Projection::Node> item_projection, CachedFn cached, Callback cb);
  // Starts `start(callback)` and resumes with its Result or, past `deadline`, with an error.
  boost::asio::awaitable<Result> Awaited(std::function<void(Callback)> start, Deadline deadline, Gate::Ticket ticket);
  boost::asio::io_context& Io() const;

  std::shared_ptr<Impl> impl_;
  std::shared_ptr<const std::string> agent_;  // null: the config's user_agent
  bool owner_ = true;                         // false for a view
};

}  // namespace gns::kube
