// A fake kube-apiserver for tests and `make run`: HTTPS + bearer tokens, an in-memory store
// for any group/version/resource, list/watch with the real resourceVersion rules, patches,
// finalizers, a status subresource, and fault injection. See README.md in this folder.
//
// Kept light on purpose (no Asio/Beast/OpenSSL headers): tests include it everywhere.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace gns::sim {

struct ApiServerOptions {
  std::string listen_address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: the kernel picks one; Port() reports it
  std::string token;       // empty: a random one
  // Where ca.crt, token, namespace, kubeconfig (and client.crt/client.key) are written;
  // empty: nothing is written. The token file is rewritten on every rotation.
  std::filesystem::path state_dir;
  std::chrono::milliseconds bookmark_interval{1000};
  std::chrono::milliseconds idle_timeout{60000};      // waiting for (the rest of) a request
  std::chrono::milliseconds write_timeout{30000};     // one response write / one watch chunk
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::seconds max_watch_timeout{1800};       // watches without timeoutSeconds end here
  std::size_t body_limit = 3 * 1024 * 1024;           // larger request bodies get 413
  // The event history (watch resume, paging, exact lists): events older than the window, or
  // beyond the count, are compacted away, as etcd does after ~5 minutes.
  std::chrono::milliseconds history_window{std::chrono::minutes(5)};
  std::size_t max_history = 100000;
  std::size_t max_watch_queue = 10000;  // a watcher this far behind is cut, as a slow client
  // Resources ("resource" or "resource.group") that have NO status subresource: writes to
  // the main resource may change their .status. Every other resource has one.
  std::set<std::string> resources_without_status;
  bool client_cert_auth = true;  // also accept client certificates signed by the CA
  bool log_requests = false;     // one line per request on stderr (for `make run`)
  std::uint64_t initial_resource_version = 1000;
};

// How a watch from an expired resourceVersion is answered.
enum class ExpiredWatchMode {
  kInStreamError,  // HTTP 200, then {"type":"ERROR","object":<Status 410 Expired>}
  kHttpStatus,     // HTTP 410 with a Status body
};

struct WatchInfo {
  std::uint64_t id = 0;
  std::string path;  // the collection URL path, e.g. /api/v1/namespaces/default/pods
  std::string resource_version;  // as requested ("" when not given)
  std::string label_selector;
  std::string field_selector;
  bool bookmarks = false;
  std::uint64_t lines_sent = 0;
};

// The answer of an in-process Call().
struct SimResponse {
  int status = 0;
  std::string body;  // JSON text (a Status object on errors)
  nlohmann::json Json() const;
};

// Verb names used by RequestCounts(): get, list, watch, create, update, patch, delete,
// deletecollection, and the lower-case HTTP method for anything else. Admin requests to
// /_sim/... are not counted; Call() is not counted.
class ApiServer {
 public:
  // Runs on its own thread (and io_context) once started.
  explicit ApiServer(ApiServerOptions options = {});
  // Runs on `ioc`, which the caller runs (one thread, or several: connections use strands).
  // The io_context must outlive the server or be destroyed after it.
  ApiServer(boost::asio::io_context& ioc, ApiServerOptions options = {});
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds, writes the state dir and starts accepting. Throws std::system_error or
  // std::runtime_error (bind failure, unwritable state dir).
  void Start();
  // Closes the listener and every connection. On its own thread: also waits for them.
  void Stop();

  std::uint16_t Port() const;
  std::string BaseUrl() const;  // https://127.0.0.1:<port>
  std::string CaPem() const;
  std::string ClientCertPem() const;  // signed by the CA; empty without client_cert_auth
  std::string ClientKeyPem() const;

  // --- tokens
  std::string Token() const;
  std::string RotateToken();      // a new random token; the old one stops working at once
  void SetToken(std::string token);
  void RejectTokenUntilRotated();  // every API request gets 401 until RotateToken/SetToken

  // --- the store, in-process (same rules as HTTP; no auth, faults or counters)
  SimResponse Call(std::string_view method, std::string_view target, std::string_view body = {},
                   std::string_view content_type = "application/json");
  // Creates seed objects (status kept). Each object may carry "_resource" (a plural such as
  // "nodes" or a collection path such as "/apis/x.io/v1/namespaces/ns/foos"); otherwise the
  // kind table maps kind to resource. Throws std::runtime_error on a bad object.
  void Seed(const nlohmann::json& objects);  // an array, a single object, or a kind: List
  void SeedFile(const std::filesystem::path& file);  // YAML (multi-document) or JSON
  std::string ResourceVersion() const;  // the current global resourceVersion

  // --- faults
  void Compact();             // every resourceVersion up to now becomes expired
  void ExpireWatches();       // Compact(), then an in-stream ERROR 410 on every open watch
  void SetExpiredWatchMode(ExpiredWatchMode mode);
  void CutWatches();          // close every open watch connection abruptly (no last chunk)
  void SplitNextWatchEvent();  // the next watch line goes out as two chunks, two TCP writes
  void MalformedNextWatchLine();  // a broken JSON line precedes the next watch line
  void SetResponseDelay(std::chrono::milliseconds delay);  // every API request; 0 to clear
  // The next `count` API requests (watches included) whose path contains `path_contains` are
  // answered with `code` (500, 503, 429, 410, ...) and a Status body. `retry_after_seconds` > 0
  // adds `Retry-After` and `details.retryAfterSeconds`; -1: 1 s for 429 and 503, none otherwise.
  void FailNextRequests(int code, int count = 1, std::string path_contains = {}, int retry_after_seconds = -1);
  // The listener closes and every connection is cut; after `downtime` the same port accepts
  // again (connects meanwhile are refused), as an API server that restarts.
  void RestartListener(std::chrono::milliseconds downtime);

  // --- observability
  std::map<std::string, std::uint64_t> RequestCounts() const;
  std::uint64_t RequestCount(std::string_view verb) const;
  std::uint64_t TotalRequests() const;
  // HTTP status codes of the API answers (watches not counted): {200: n, 409: m, ...}.
  std::map<int, std::uint64_t> ResponseCounts() const;
  void ResetRequestCounts();  // the request and the response counts
  std::vector<WatchInfo> OpenWatches() const;

  class Impl;

 private:
  std::unique_ptr<boost::asio::io_context> own_ioc_;
  std::shared_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace gns::sim
