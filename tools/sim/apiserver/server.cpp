// The HTTPS side of the simulated API server: TLS, keep-alive connections, chunked watch
// streams, auth, fault injection and the /_sim admin endpoint. One coroutine per connection,
// each on its own strand; the store (store.cpp) does the Kubernetes semantics.
#include <sys/socket.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>  // before Asio: awaitable.hpp uses std::exchange without it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>

#include "apiserver.h"
#include "apply.h"
#include "handler.h"
#include "resources.h"
#include "store.h"
#include "tls.h"

namespace gns::sim {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using asio::awaitable;
using SslStream = beast::ssl_stream<beast::tcp_stream>;
using Json = nlohmann::json;

auto Await(beast::error_code& ec) { return asio::redirect_error(asio::use_awaitable, ec); }

std::string Dump(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Wakes a streaming watch (posted cancel of its timer) and notices a peer that went away.
struct WatchWait {
  explicit WatchWait(const asio::any_io_executor& executor) : timer(executor) {}
  asio::steady_timer timer;
  bool peer_gone = false;
  bool active = true;
};

struct Conn {
  Conn(tcp::socket socket, ssl::context& ctx)
      : executor(socket.get_executor()), stream(std::move(socket), ctx) {}
  // Runs on `executor`: closes the socket, which fails every pending operation.
  void Abort() {
    aborted = true;
    beast::get_lowest_layer(stream).close();
    if (watch) watch->timer.cancel();
  }
  asio::any_io_executor executor;
  SslStream stream;
  bool aborted = false;
  bool cert_authenticated = false;
  std::shared_ptr<WatchWait> watch;
};

bool PeerCertificateOk(SSL* ssl_handle) {
  X509* cert = SSL_get1_peer_certificate(ssl_handle);
  bool ok = cert != nullptr && SSL_get_verify_result(ssl_handle) == X509_V_OK;
  X509_free(cert);
  return ok;
}

// temp file, fsync, rename, fsync of the directory: readers never see a torn file.
void WriteFileAtomic(const std::filesystem::path& path, std::string_view data, mode_t mode) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + tmp.string());
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw std::system_error(err, std::generic_category(), "write " + tmp.string());
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    throw std::system_error(errno, std::generic_category(), "fsync " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
  int dir = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: the rename is already visible to readers
    ::close(dir);
  }
}

bool IsPublicPath(const std::string& path) {
  // Anonymous requests may read these on a default kube-apiserver.
  return path == "/healthz" || path == "/livez" || path == "/readyz" || path == "/version";
}

}  // namespace

nlohmann::json SimResponse::Json() const { return nlohmann::json::parse(body, nullptr, false); }

class ApiServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& ioc, ApiServerOptions options)
      : ioc_(ioc),
        options_(std::move(options)),
        tls_(api::GenerateTlsMaterial(ExtraSans(options_.listen_address))),
        ssl_ctx_(ssl::context::tls_server),
        acceptor_(asio::make_strand(ioc)),
        store_(api::StoreOptions{options_.initial_resource_version, options_.max_history,
                                 options_.history_window, options_.max_watch_queue,
                                 options_.resources_without_status,
                                 [] { return std::chrono::system_clock::now(); }, 0}),
        rng_((std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) {
    token_ = options_.token.empty() ? RandomToken() : options_.token;
    ssl_ctx_.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                         ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    ssl_ctx_.use_certificate_chain(asio::buffer(tls_.server_cert_pem));
    ssl_ctx_.use_private_key(asio::buffer(tls_.server_key_pem), ssl::context::pem);
    if (options_.client_cert_auth) {
      // verify_peer without fail_if_no_peer_cert: a client certificate is optional, but one
      // that does not chain to our CA fails the handshake.
      ssl_ctx_.add_certificate_authority(asio::buffer(tls_.ca_cert_pem));
      ssl_ctx_.set_verify_mode(ssl::verify_peer);
    }
  }

  static std::vector<std::string> ExtraSans(const std::string& address) {
    if (address.empty() || address == "127.0.0.1" || address == "0.0.0.0" || address == "::" ||
        address == "::1" || address == "localhost") {
      return {};
    }
    return {address};
  }

  void Start() {
    Listen(options_.port);
    WriteStateDir();
    asio::co_spawn(acceptor_.get_executor(), AcceptLoop(shared_from_this(), 0), asio::detached);
  }

  void Listen(std::uint16_t port) {
    tcp::endpoint endpoint(asio::ip::make_address(options_.listen_address), port);
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen(asio::socket_base::max_listen_connections);
    port_ = acceptor_.local_endpoint().port();
    std::lock_guard lock(mu_);
    accepting_ = true;
  }

  // As an API server that restarts: the listener closes and every connection (watches
  // included) is cut; after `downtime` the same port accepts again (connects meanwhile are
  // refused).
  void RestartListener(std::chrono::milliseconds downtime) {
    asio::post(acceptor_.get_executor(), [self = shared_from_this(), downtime] {
      if (self->stopping_) return;
      std::uint64_t generation = 0;
      {
        std::lock_guard lock(self->mu_);
        generation = ++self->listen_generation_;
      }
      beast::error_code ec;
      self->acceptor_.close(ec);
      self->AbortConnections();
      self->ArmRelisten(generation, downtime);
    });
  }

  // On the acceptor's strand. A later restart (or Stop) supersedes this one.
  void ArmRelisten(std::uint64_t generation, std::chrono::milliseconds after) {
    restart_timer_.expires_after(after);
    restart_timer_.async_wait([self = shared_from_this(), generation](const beast::error_code& ec) {
      if (!ec) self->Relisten(generation);
    });
  }

  void Relisten(std::uint64_t generation) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || generation != listen_generation_) return;
    }
    try {
      Listen(port_);
    } catch (const std::exception& e) {
      // The port may still be held for a moment: try again shortly.
      std::fprintf(stderr, "gns-sim-apiserver: listening again on %u: %s\n", unsigned(port_), e.what());
      beast::error_code ec;
      acceptor_.close(ec);
      ArmRelisten(generation, std::chrono::milliseconds(50));
      return;
    }
    asio::co_spawn(acceptor_.get_executor(), AcceptLoop(shared_from_this(), generation), asio::detached);
  }

  void AbortConnections() {
    std::vector<std::shared_ptr<Conn>> conns;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, weak] : conns_) {
        if (auto conn = weak.lock()) conns.push_back(std::move(conn));
      }
    }
    for (auto& conn : conns) asio::post(conn->executor, [conn] { conn->Abort(); });
  }

  void Stop() {
    if (stopping_.exchange(true)) return;
    asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->acceptor_.close(ec);  // the accept loop ends with operation_aborted
      self->restart_timer_.cancel();
      self->AbortConnections();
    });
  }

  // After Stop(): true once every connection and the accept loop are gone.
  bool WaitIdle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return idle_cv_.wait_for(lock, timeout, [&] { return conns_.empty() && !accepting_; });
  }

  // ---- controls (any thread)
  std::string Token() const {
    std::lock_guard lock(mu_);
    return token_;
  }
  std::string RotateToken() {
    std::string token;
    {
      std::lock_guard lock(mu_);
      token_ = RandomTokenLocked();
      reject_token_ = false;
      token = token_;
    }
    WriteToken(token);
    return token;
  }
  void SetToken(std::string token) {
    {
      std::lock_guard lock(mu_);
      token_ = token;
      reject_token_ = false;
    }
    WriteToken(token);
  }
  void RejectTokenUntilRotated() {
    std::lock_guard lock(mu_);
    reject_token_ = true;
  }
  void SplitNextWatchEvent() {
    std::lock_guard lock(mu_);
    split_next_ = true;
  }
  void MalformedNextWatchLine() {
    std::lock_guard lock(mu_);
    malformed_next_ = true;
  }
  void SetResponseDelay(std::chrono::milliseconds delay) {
    std::lock_guard lock(mu_);
    delay_ = delay;
  }
  void FailNextRequests(int code, int count, std::string path_contains, int retry_after_seconds) {
    if (code < 100 || code > 599) throw std::invalid_argument("FailNextRequests: code must be 100..599");
    if (retry_after_seconds < -1) throw std::invalid_argument("FailNextRequests: retryAfterSeconds must be >= 0");
    if (count <= 0) return;
    if (retry_after_seconds == -1) retry_after_seconds = code == 429 || code == 503 ? 1 : 0;
    std::lock_guard lock(mu_);
    fail_rules_.push_back(FailRule{code, count, std::move(path_contains), retry_after_seconds});
  }
  std::map<std::string, std::uint64_t> RequestCounts() const {
    std::lock_guard lock(mu_);
    return counts_;
  }
  std::map<int, std::uint64_t> ResponseCounts() const {
    std::lock_guard lock(mu_);
    return codes_;
  }
  void ResetRequestCounts() {
    std::lock_guard lock(mu_);
    counts_.clear();
    codes_.clear();
  }

  SimResponse Call(std::string_view method, std::string_view raw_target, std::string_view body,
                   std::string_view content_type) {
    api::Outcome outcome = Dispatch(method, raw_target, body, content_type);
    return SimResponse{outcome.code, outcome.text.empty() ? Dump(outcome.body) : outcome.text};
  }

  void Seed(const Json& objects) {
    if (objects.is_array()) {
      for (const auto& item : objects) Seed(item);
    } else if (objects.is_object() && objects.contains("kind") && objects["kind"] == "List" &&
               objects.contains("items")) {
      Seed(objects["items"]);
    } else if (objects.is_object()) {
      store_.Seed(objects);
    } else if (!objects.is_null()) {
      throw std::runtime_error("seed: expected an object or a list of objects");
    }
  }

  void SeedFile(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("seed: cannot read " + file.string());
    std::stringstream text;
    text << in.rdbuf();
    std::vector<Json> documents;
    std::string error;
    if (!api::YamlToJson(text.str(), &documents, &error)) {
      throw std::runtime_error("seed: " + file.string() + ": " + error);
    }
    for (const auto& document : documents) Seed(document);
  }

  api::Store& store() { return store_; }
  std::uint16_t port() const { return port_; }
  const api::TlsMaterial& tls() const { return tls_; }
  const ApiServerOptions& options() const { return options_; }

 private:
  struct FailRule {
    int code;
    int count;
    std::string path_contains;
    int retry_after_seconds;  // 0: no Retry-After
  };
  enum class Auth { kOk, kAnonymous, kRejected };

  std::string RandomTokenLocked() {
    std::string bytes;
    for (int i = 0; i < 4; ++i) {
      std::uint64_t r = rng_();
      bytes.append(reinterpret_cast<const char*>(&r), sizeof(r));
    }
    return "gns-sim." + api::Base64UrlEncode(bytes);
  }
  std::string RandomToken() {
    std::lock_guard lock(mu_);
    return RandomTokenLocked();
  }

  // The same routing as HTTP, for Call() (no auth, faults, counters or watches).
  api::Outcome Dispatch(std::string_view method, std::string_view raw_target, std::string_view body,
                        std::string_view content_type) {
    auto target = api::ParseTarget(raw_target);
    if (!target) return api::BadRequest("malformed request target");
    api::Route route = api::Classify(method, *target);
    try {
      switch (route.kind) {
        case api::Route::Kind::kAdmin:
          return HandleAdmin(method, *target, body);
        case api::Route::Kind::kNonResource:
          return api::HandleNonResource(store_, method, *target);
        case api::Route::Kind::kResource:
          if (route.watch && !route.error) return api::BadRequest("watch is not supported in-process");
          return api::HandleResource(store_, route, *target, content_type, body);
      }
    } catch (const std::exception& e) {
      // A bug, not a client error; answer rather than take the server down.
      return api::Fail(500, "InternalError", std::string("Internal error occurred: ") + e.what());
    }
    return api::NotFoundPath();
  }

  api::Outcome HandleAdmin(std::string_view method, const api::Target& target, std::string_view body) {
    if (target.path == "/_sim/faults" && method == "POST") {
      Json request = body.empty() ? Json::object() : Json::parse(body, nullptr, false);
      if (!request.is_object()) return api::BadRequest("faults: expected a JSON object");
      static const std::set<std::string> kKnown = {
          "compact", "expireWatches", "cutWatches", "splitNextWatchEvent", "malformedNextWatchLine",
          "rejectTokenUntilRotated", "rotateToken", "token", "delayMs", "failNext", "expiredWatchMode",
          "restartListener"};
      for (const auto& [key, value] : request.items()) {
        if (!kKnown.contains(key)) return api::BadRequest("faults: unknown key \"" + key + "\"");
      }
      try {
        if (request.value("compact", false)) store_.Compact();
        if (request.value("expireWatches", false)) store_.ExpireWatches();
        if (request.value("cutWatches", false)) store_.CutWatches();
        if (request.value("splitNextWatchEvent", false)) SplitNextWatchEvent();
        if (request.value("malformedNextWatchLine", false)) MalformedNextWatchLine();
        if (request.value("rejectTokenUntilRotated", false)) RejectTokenUntilRotated();
        if (request.value("rotateToken", false)) RotateToken();
        if (request.contains("token")) SetToken(request["token"].get<std::string>());
        if (request.contains("delayMs")) SetResponseDelay(std::chrono::milliseconds(request["delayMs"].get<std::int64_t>()));
        if (request.contains("failNext")) {
          const Json& fail = request["failNext"];
          FailNextRequests(fail.at("code").get<int>(), fail.value("count", 1), fail.value("pathContains", ""),
                           fail.value("retryAfterSeconds", -1));
        }
        if (request.contains("restartListener")) {
          const auto downtime = request["restartListener"].value("downtimeMs", std::int64_t{0});
          if (downtime < 0) return api::BadRequest("faults: restartListener.downtimeMs must be >= 0");
          RestartListener(std::chrono::milliseconds(downtime));
        }
        if (request.contains("expiredWatchMode")) {
          std::string mode = request["expiredWatchMode"].get<std::string>();
          if (mode == "InStream") {
            store_.SetExpiredWatchMode(ExpiredWatchMode::kInStreamError);
          } else if (mode == "HttpStatus") {
            store_.SetExpiredWatchMode(ExpiredWatchMode::kHttpStatus);
          } else {
            return api::BadRequest("faults: expiredWatchMode must be InStream or HttpStatus");
          }
        }
      } catch (const Json::exception& e) {
        return api::BadRequest(std::string("faults: ") + e.what());
      } catch (const std::invalid_argument& e) {
        return api::BadRequest(std::string("faults: ") + e.what());
      }
      return api::Outcome{200,
                          Json{{"token", Token()},
                               {"resourceVersion", std::to_string(store_.CurrentResourceVersion())}},
                          {},
                          {}};
    }
    if (target.path == "/_sim/stats" && method == "GET") return api::Outcome{200, Stats(), {}, {}};
    if (target.path == "/_sim/reset-counters" && method == "POST") {
      ResetRequestCounts();
      return api::Outcome{200, Json::object(), {}, {}};
    }
    if (target.path == "/_sim/seed" && method == "POST") {
      std::vector<Json> documents;
      std::string error;
      if (!api::YamlToJson(body, &documents, &error)) return api::BadRequest("seed: " + error);
      try {
        for (const auto& document : documents) Seed(document);
      } catch (const std::exception& e) {
        return api::BadRequest(e.what());
      }
      return api::Outcome{200, Json{{"resourceVersion", std::to_string(store_.CurrentResourceVersion())}}, {}, {}};
    }
    return api::NotFoundPath();
  }

  Json Stats() {
    Json watches = Json::array();
    for (const auto& w : store_.OpenWatches()) {
      watches.push_back(Json{{"id", w.id},
                             {"path", w.path},
                             {"resourceVersion", w.resource_version},
                             {"labelSelector", w.label_selector},
                             {"fieldSelector", w.field_selector},
                             {"bookmarks", w.bookmarks},
                             {"linesSent", w.lines_sent}});
    }
    std::uint64_t total = 0;
    Json counts = Json::object();
    Json codes = Json::object();
    std::size_t connections = 0;
    Json calls = Json::array();
    Json calls_by_agent = Json::object();
    {
      std::lock_guard lock(mu_);
      auto to_json = [](const std::set<ApiCall>& set) {
        Json out = Json::array();
        for (const auto& [verb, group, resource, subresource] : set) {
          out.push_back(Json{{"verb", verb}, {"group", group}, {"resource", resource}, {"subresource", subresource}});
        }
        return out;
      };
      calls = to_json(calls_);
      for (const auto& [agent, set] : calls_by_agent_) calls_by_agent[agent] = to_json(set);
      for (const auto& [verb, count] : counts_) {
        counts[verb] = count;
        total += count;
      }
      for (const auto& [code, count] : codes_) codes[std::to_string(code)] = count;
      connections = conns_.size();
    }
    return Json{{"requests", counts},
                {"totalRequests", total},
                {"responses", codes},
                {"openWatches", watches},
                {"connections", connections},
                {"calls", calls},
                {"callsByAgent", calls_by_agent},
                {"resourceVersion", std::to_string(store_.CurrentResourceVersion())},
                {"compactedResourceVersion", std::to_string(store_.CompactedResourceVersion())}};
  }

  void WriteStateDir() {
    const auto& dir = options_.state_dir;
    if (dir.empty()) return;
    std::filesystem::create_directories(dir);
    const auto abs = std::filesystem::absolute(dir);
    WriteFileAtomic(abs / "ca.crt", tls_.ca_cert_pem, 0644);
    WriteFileAtomic(abs / "namespace", "default", 0644);
    WriteToken(Token());
    std::string host = options_.listen_address;
    if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
    if (host == "::") host = "::1";
    std::string server = "https://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                         std::to_string(port_);
    // JSON strings are valid YAML scalars: quoting paths this way survives spaces.
    auto quote = [](const std::filesystem::path& p) { return Json(p.string()).dump(); };
    std::string kubeconfig =
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: gns-sim\n"
        "  cluster:\n"
        "    server: " + Json(server).dump() + "\n"
        "    certificate-authority: " + quote(abs / "ca.crt") + "\n"
        "users:\n"
        "- name: gns-sim\n"
        "  user:\n"
        "    tokenFile: " + quote(abs / "token") + "\n";
    if (options_.client_cert_auth) {
      WriteFileAtomic(abs / "client.crt", tls_.client_cert_pem, 0644);
      WriteFileAtomic(abs / "client.key", tls_.client_key_pem, 0600);
      kubeconfig +=
          "- name: gns-sim-cert\n"
          "  user:\n"
          "    client-certificate: " + quote(abs / "client.crt") + "\n"
          "    client-key: " + quote(abs / "client.key") + "\n";
    }
    kubeconfig +=
        "contexts:\n"
        "- name: gns-sim\n"
        "  context:\n"
        "    cluster: gns-sim\n"
        "    user: gns-sim\n"
        "    namespace: default\n";
    if (options_.client_cert_auth) {
      kubeconfig +=
          "- name: gns-sim-cert\n"
          "  context:\n"
          "    cluster: gns-sim\n"
          "    user: gns-sim-cert\n"
          "    namespace: default\n";
    }
    kubeconfig += "current-context: gns-sim\n";
    WriteFileAtomic(abs / "kubeconfig", kubeconfig, 0600);
  }

  void WriteToken(const std::string& token) {
    if (options_.state_dir.empty()) return;
    std::filesystem::create_directories(options_.state_dir);
    WriteFileAtomic(std::filesystem::absolute(options_.state_dir) / "token", token, 0600);
  }

  // ---- connections

  awaitable<void> AcceptLoop(std::shared_ptr<Impl> self, std::uint64_t generation) {
    struct Done {
      Impl* impl;
      std::uint64_t generation;
      ~Done() {
        std::lock_guard lock(impl->mu_);
        // A loop ended by RestartListener leaves `accepting_` to the one that follows it.
        if (generation == impl->listen_generation_) impl->accepting_ = false;
        impl->idle_cv_.notify_all();
      }
    } done{this, generation};
    for (;;) {
      beast::error_code ec;
      tcp::socket socket(asio::make_strand(ioc_));
      co_await acceptor_.async_accept(socket, Await(ec));
      if (stopping_ || !acceptor_.is_open() || ec == asio::error::operation_aborted) co_return;
      if (ec) {
        // EMFILE and friends: back off instead of spinning on the error.
        asio::steady_timer backoff(acceptor_.get_executor());
        backoff.expires_after(std::chrono::milliseconds(50));
        co_await backoff.async_wait(Await(ec));
        continue;
      }
      auto executor = socket.get_executor();
      asio::co_spawn(executor, Session(self, std::move(socket)), asio::detached);
    }
  }

  awaitable<void> Session(std::shared_ptr<Impl> self, tcp::socket socket) {
    beast::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);  // watch chunks go out as they are written
    auto conn = std::make_shared<Conn>(std::move(socket), ssl_ctx_);
    std::uint64_t id = 0;
    {
      std::lock_guard lock(mu_);
      if (stopping_) co_return;
      id = ++next_conn_id_;
      conns_[id] = conn;
    }
    struct Unregister {
      Impl* impl;
      std::uint64_t id;
      ~Unregister() {
        std::lock_guard lock(impl->mu_);
        impl->conns_.erase(id);
        impl->idle_cv_.notify_all();
      }
    } unregister{self.get(), id};
    try {
      co_await Serve(conn);
    } catch (const std::exception&) {
      // Only bugs throw here (handlers answer errors as values): drop this connection only.
    }
    beast::get_lowest_layer(conn->stream).close();
  }

  awaitable<void> Serve(std::shared_ptr<Conn> conn) {
    beast::error_code ec;
    auto& lowest = beast::get_lowest_layer(conn->stream);
    lowest.expires_after(options_.handshake_timeout);
    co_await conn->stream.async_handshake(ssl::stream_base::server, Await(ec));
    if (ec) co_return;
    if (options_.client_cert_auth) conn->cert_authenticated = PeerCertificateOk(conn->stream.native_handle());

    beast::flat_buffer buffer;
    for (;;) {
      if (conn->aborted || stopping_) co_return;
      http::request_parser<http::string_body> parser;
      parser.body_limit(options_.body_limit);
      parser.header_limit(64 * 1024);
      lowest.expires_after(options_.idle_timeout);
      co_await http::async_read(conn->stream, buffer, parser, Await(ec));
      if (conn->aborted) co_return;
      if (ec == http::error::body_limit) {
        api::Outcome too_large = api::Fail(413, "RequestEntityTooLarge",
                                           "the server has rejected the request because it is too large");
        co_await WriteOutcome(*conn, parser.get().version(), false, too_large);
        break;
      }
      if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
          ec == beast::error::timeout || ec == asio::ssl::error::stream_truncated ||
          ec == asio::error::eof || ec == asio::error::connection_reset) {
        break;  // the peer went away or idled out: nothing to answer
      }
      if (ec) {
        if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
          int code = ec == http::error::header_limit ? 431 : 400;
          api::Outcome bad = api::Fail(code, code == 431 ? "RequestHeaderFieldsTooLarge" : "BadRequest",
                                       "malformed HTTP request: " + ec.message());
          co_await WriteOutcome(*conn, 11, false, bad);
        }
        break;
      }
      http::request<http::string_body> request = parser.release();
      bool keep_alive = co_await HandleRequest(conn, request);
      if (!keep_alive || conn->aborted) break;
    }
    if (conn->aborted) co_return;
    // Polite TLS close; a peer that already left answers eof/stream_truncated (expected).
    lowest.expires_after(std::chrono::seconds(2));
    co_await conn->stream.async_shutdown(Await(ec));
  }

  Auth Authenticate(const http::request<http::string_body>& request, const Conn& conn, bool admin) {
    if (conn.cert_authenticated) return Auth::kOk;
    auto it = request.find(http::field::authorization);
    if (it == request.end()) return Auth::kAnonymous;
    std::string_view value(it->value().data(), it->value().size());
    if (value.size() < 7 || !beast::iequals(beast::string_view(value.data(), 7), "Bearer ")) return Auth::kRejected;
    value.remove_prefix(7);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    std::lock_guard lock(mu_);
    if (reject_token_ && !admin) return Auth::kRejected;
    return value == token_ ? Auth::kOk : Auth::kRejected;
  }

  std::optional<api::Outcome> TakeFailure(const std::string& path) {
    std::lock_guard lock(mu_);
    for (auto it = fail_rules_.begin(); it != fail_rules_.end(); ++it) {
      if (!it->path_contains.empty() && path.find(it->path_contains) == std::string::npos) continue;
      const int code = it->code;
      const int retry_after = it->retry_after_seconds;
      if (--it->count <= 0) fail_rules_.erase(it);
      std::string message = code == 429 ? "Too many requests, please try again later."
                            : code == 410 ? "too old resource version (injected by the simulator)"
                            : code == 503 ? "the server is currently unable to handle the request (injected)"
                                          : "Internal error occurred: injected by the simulator";
      api::Outcome outcome = api::Fail(code, api::ReasonForCode(code), message);
      if (retry_after > 0) {
        outcome.retry_after = std::to_string(retry_after);
        outcome.body["details"] = Json{{"retryAfterSeconds", retry_after}};
      }
      return outcome;
    }
    return std::nullopt;
  }

  // (verb, group, resource, subresource)
  using ApiCall = std::tuple<std::string, std::string, std::string, std::string>;

  // One call as an authorizer sees it, in `calls_` and under each agent the User-Agent names:
  // "gpu-node-supervisor/a+b" (an informer shared by modules a and b) counts for
  // "gpu-node-supervisor/a" and "gpu-node-supervisor/b"; an agent without "/" for itself.
  void RecordCall(const std::string& user_agent, const ApiCall& call) {
    std::lock_guard lock(mu_);
    calls_.insert(call);
    const auto slash = user_agent.find('/');
    if (slash == std::string::npos) {
      calls_by_agent_[user_agent].insert(call);
      return;
    }
    const std::string prefix = user_agent.substr(0, slash + 1);
    std::string_view holders = std::string_view(user_agent).substr(slash + 1);
    while (true) {
      const auto plus = holders.find('+');
      calls_by_agent_[prefix + std::string(holders.substr(0, plus))].insert(call);
      if (plus == std::string_view::npos) break;
      holders.remove_prefix(plus + 1);
    }
  }

  void Count(const std::string& verb) {
    std::lock_guard lock(mu_);
    ++counts_[verb];
  }
  void CountCode(int code) {
    std::lock_guard lock(mu_);
    ++codes_[code];
  }

  std::string AuditId() {
    std::lock_guard lock(mu_);
    return api::RandomUuid(rng_);
  }

  awaitable<bool> HandleRequest(std::shared_ptr<Conn> conn, const http::request<http::string_body>& request) {
    const bool keep_alive = request.keep_alive();
    const unsigned version = request.version();
    std::string_view method(request.method_string().data(), request.method_string().size());
    auto target = api::ParseTarget(std::string_view(request.target().data(), request.target().size()));
    if (!target) co_return co_await WriteOutcome(*conn, version, keep_alive, api::BadRequest("malformed request target"));
    api::Route route = api::Classify(method, *target);
    const std::string what = std::string(method) + " " + std::string(request.target().data(), request.target().size());
    std::string_view body = request.body();
    auto content_type_field = request[http::field::content_type];
    std::string content_type(content_type_field.data(), content_type_field.size());

    if (route.kind == api::Route::Kind::kAdmin) {
      if (Authenticate(request, *conn, true) != Auth::kOk) {
        co_return co_await WriteOutcome(*conn, version, keep_alive, api::Fail(401, "Unauthorized", "Unauthorized"), what);
      }
      api::Outcome outcome = Dispatch(method, std::string_view(request.target().data(), request.target().size()),
                                      body, content_type);
      co_return co_await WriteOutcome(*conn, version, keep_alive, outcome, what);
    }

    Count(route.verb);
    std::chrono::milliseconds delay;
    {
      std::lock_guard lock(mu_);
      delay = delay_;
    }
    if (delay.count() > 0) {
      beast::error_code ec;
      asio::steady_timer timer(conn->executor);
      timer.expires_after(delay);
      co_await timer.async_wait(Await(ec));
      if (conn->aborted) co_return false;
    }
    Auth auth = Authenticate(request, *conn, false);
    if (auth == Auth::kRejected ||
        (auth == Auth::kAnonymous && !(route.kind == api::Route::Kind::kNonResource && IsPublicPath(target->path)))) {
      CountCode(401);
      co_return co_await WriteOutcome(*conn, version, keep_alive, api::Fail(401, "Unauthorized", "Unauthorized"), what);
    }
    const auto agent_field = request[http::field::user_agent];
    const std::string agent(agent_field.data(), agent_field.size());
    if (route.kind == api::Route::Kind::kResource && !route.error) {
      RecordCall(agent, {route.verb, route.path.key.group, route.path.key.resource, route.path.subresource});
    }
    if (auto failure = TakeFailure(target->path)) {
      CountCode(failure->code);
      co_return co_await WriteOutcome(*conn, version, keep_alive, *failure, what);
    }
    if (route.kind == api::Route::Kind::kResource && route.watch && !route.error) {
      co_return co_await ServeWatch(conn, version, keep_alive, route, *target, what);
    }
    api::Outcome outcome = Dispatch(method, std::string_view(request.target().data(), request.target().size()),
                                    body, content_type);
    CountCode(outcome.code);
    if (route.kind == api::Route::Kind::kResource && route.verb == "patch" && outcome.code == 201) {
      // A server-side apply that created the object: kube-apiserver authorizes `create` too.
      RecordCall(agent, {"create", route.path.key.group, route.path.key.resource, route.path.subresource});
    }
    co_return co_await WriteOutcome(*conn, version, keep_alive, outcome, what);
  }

  void Log(std::string_view what, int code, std::string_view note = {}) {
    if (!options_.log_requests || what.empty()) return;
    std::lock_guard lock(log_mu_);
    std::fprintf(stderr, "gns-sim-apiserver: %.*s -> %d%s%.*s\n", static_cast<int>(what.size()), what.data(), code,
                 note.empty() ? "" : " ", static_cast<int>(note.size()), note.data());
  }

  awaitable<bool> WriteOutcome(Conn& conn, unsigned version, bool keep_alive, const api::Outcome& outcome,
                               std::string_view what = {}) {
    Log(what, outcome.code);
    http::response<http::string_body> response{static_cast<http::status>(outcome.code), version};
    response.set(http::field::content_type,
                 outcome.text.empty() ? "application/json" : "text/plain; charset=utf-8");
    response.set(http::field::cache_control, "no-cache, private");
    response.set("Audit-Id", AuditId());
    if (!outcome.retry_after.empty()) response.set(http::field::retry_after, outcome.retry_after);
    response.keep_alive(keep_alive);
    response.body() = outcome.text.empty() ? Dump(outcome.body) : outcome.text;
    response.prepare_payload();
    beast::error_code ec;
    beast::get_lowest_layer(conn.stream).expires_after(options_.write_timeout);
    co_await http::async_write(conn.stream, response, Await(ec));
    co_return !ec && keep_alive;
  }

  // ---- watches

  // Notices a peer that closed its end while the stream is idle (the server never reads
  // during a watch): readable + EOF, or a TLS alert record (close_notify), means gone.
  static void WatchPeer(std::shared_ptr<Conn> conn, std::shared_ptr<WatchWait> wait) {
    auto& socket = beast::get_lowest_layer(conn->stream).socket();
    socket.async_wait(tcp::socket::wait_read, [conn, wait](beast::error_code ec) {
      if (ec || !wait->active) return;
      auto& sock = beast::get_lowest_layer(conn->stream).socket();
      unsigned char byte = 0;
      ssize_t n = ::recv(sock.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        WatchPeer(conn, wait);  // spurious wakeup
        return;
      }
      if (n <= 0 || byte == 0x15) {
        wait->peer_gone = true;
        wait->timer.cancel();
      }
      // Anything else is application data (a pipelined request): the next write will tell.
    });
  }

  awaitable<bool> WriteChunk(Conn& conn, std::string_view data) {
    beast::error_code ec;
    beast::get_lowest_layer(conn.stream).expires_after(options_.write_timeout);
    co_await asio::async_write(conn.stream, http::make_chunk(asio::const_buffer(data.data(), data.size())),
                               Await(ec));
    co_return !ec;
  }

  awaitable<bool> WriteWatchLine(Conn& conn, const std::string& line) {
    bool split = false;
    bool malformed = false;
    {
      std::lock_guard lock(mu_);
      split = std::exchange(split_next_, false);
      malformed = std::exchange(malformed_next_, false);
    }
    if (malformed) {
      static constexpr std::string_view kBroken = "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":\n";
      if (!co_await WriteChunk(conn, kBroken)) co_return false;
    }
    if (!split || line.size() < 2) co_return co_await WriteChunk(conn, line);
    std::string_view view(line);
    std::size_t half = line.size() / 2;
    if (!co_await WriteChunk(conn, view.substr(0, half))) co_return false;
    // A pause between the halves so they leave in separate TCP segments (Nagle is off).
    beast::error_code ec;
    asio::steady_timer pause(conn.executor);
    pause.expires_after(std::chrono::milliseconds(20));
    co_await pause.async_wait(Await(ec));
    co_return co_await WriteChunk(conn, view.substr(half));
  }

  awaitable<bool> ServeWatch(std::shared_ptr<Conn> conn, unsigned version, bool keep_alive,
                             const api::Route& route, const api::Target& target, std::string_view what) {
    api::Outcome error;
    auto params = api::ParseWatchParams(target, &error);
    if (!params) co_return co_await WriteOutcome(*conn, version, keep_alive, error, what);
    error.code = 0;
    auto timeout_seconds = api::ParseTimeoutSeconds(target, &error);
    if (error.code >= 400) co_return co_await WriteOutcome(*conn, version, keep_alive, error, what);

    auto wait = std::make_shared<WatchWait>(conn->executor);
    auto executor = conn->executor;
    auto start = store_.Watch(route.path, *params, [wait, executor] {
      asio::post(executor, [wait] { wait->timer.cancel(); });
    });
    if (start.error) co_return co_await WriteOutcome(*conn, version, keep_alive, *start.error, what);
    std::shared_ptr<api::Watcher> watcher = start.watcher;
    struct Unwatch {
      api::Store& store;
      const api::Watcher& watcher;
      WatchWait& wait;
      ~Unwatch() {
        wait.active = false;
        store.Unwatch(watcher);
      }
    } unwatch{store_, *watcher, *wait};
    conn->watch = wait;

    http::response<http::empty_body> response{http::status::ok, version};
    response.set(http::field::content_type, "application/json");
    response.set(http::field::cache_control, "no-cache, private");
    response.set("Audit-Id", AuditId());
    response.keep_alive(keep_alive);
    response.chunked(true);
    http::response_serializer<http::empty_body> serializer{response};
    beast::error_code ec;
    auto& lowest = beast::get_lowest_layer(conn->stream);
    lowest.expires_after(options_.write_timeout);
    co_await http::async_write_header(conn->stream, serializer, Await(ec));
    // From here on a failed watch leaves the connection mid-body: close it.
    auto fail = [&conn, &what, this] {
      Log(what, 200, "(watch closed abruptly)");
      conn->Abort();
      return false;
    };
    if (ec) co_return fail();
    Log(what, 200, "(watch started)");
    WatchPeer(conn, wait);

    using Clock = std::chrono::steady_clock;
    auto now = Clock::now();
    // timeoutSeconds=0 (or none) means the server's own limit, as upstream.
    auto deadline = now + (timeout_seconds && *timeout_seconds > 0
                               ? std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(*timeout_seconds))
                               : std::chrono::duration_cast<Clock::duration>(options_.max_watch_timeout));
    auto next_bookmark = now + options_.bookmark_interval;
    for (;;) {
      api::WatchBatch batch = store_.Take(*watcher);
      if (batch.cut || conn->aborted || stopping_) {
        // Abrupt: no last chunk, no TLS close_notify; the client sees a truncated stream.
        co_return fail();
      }
      for (const auto& line : batch.lines) {
        if (!co_await WriteWatchLine(*conn, line)) co_return fail();
      }
      if (batch.ended) break;
      if (wait->peer_gone) co_return fail();
      now = Clock::now();
      if (now >= deadline) break;
      if (params->bookmarks && now >= next_bookmark) {
        store_.QueueBookmark(*watcher);
        next_bookmark = now + options_.bookmark_interval;
        continue;
      }
      // Wait only after an empty Take(): a wake posted since then cancels this wait, since
      // both run on this connection's strand and nothing yields in between.
      if (!batch.lines.empty()) continue;
      wait->timer.expires_at(params->bookmarks ? std::min(deadline, next_bookmark) : deadline);
      co_await wait->timer.async_wait(Await(ec));
    }
    // The server ended the watch (timeout or an ERROR event): a clean end of the stream.
    Log(what, 200, "(watch ended)");
    wait->active = false;
    conn->watch.reset();
    lowest.socket().cancel(ec);  // stop WatchPeer before the connection reads again
    lowest.expires_after(options_.write_timeout);
    co_await asio::async_write(conn->stream, http::make_chunk_last(), Await(ec));
    if (ec) co_return fail();
    co_return keep_alive;
  }

  asio::io_context& ioc_;
  ApiServerOptions options_;
  api::TlsMaterial tls_;
  ssl::context ssl_ctx_;
  tcp::acceptor acceptor_;
  asio::steady_timer restart_timer_{acceptor_.get_executor()};  // RestartListener's downtime
  api::Store store_;
  std::atomic<std::uint16_t> port_{0};
  std::atomic<bool> stopping_{false};

  std::mutex log_mu_;
  mutable std::mutex mu_;  // everything below
  std::condition_variable idle_cv_;
  bool accepting_ = false;
  std::uint64_t listen_generation_ = 0;
  std::map<std::uint64_t, std::weak_ptr<Conn>> conns_;
  std::uint64_t next_conn_id_ = 0;
  std::string token_;
  bool reject_token_ = false;
  std::chrono::milliseconds delay_{0};
  std::deque<FailRule> fail_rules_;
  bool split_next_ = false;
  bool malformed_next_ = false;
  std::map<std::string, std::uint64_t> counts_;
  std::map<int, std::uint64_t> codes_;  // response codes of API requests (not watches)
  // Every distinct (verb, group, resource, subresource) an authenticated client asked for, as
  // an authorizer sees the request: what RBAC must grant (GET /_sim/stats "calls").
  std::set<ApiCall> calls_;
  // The same by User-Agent (RecordCall splits a shared informer's "a+b").
  std::map<std::string, std::set<ApiCall>> calls_by_agent_;
  std::mt19937_64 rng_;
};

// ---- ApiServer

ApiServer::ApiServer(ApiServerOptions options)
    : own_ioc_(std::make_unique<asio::io_context>(1)),
      impl_(std::make_shared<Impl>(*own_ioc_, std::move(options))) {}

ApiServer::ApiServer(asio::io_context& ioc, ApiServerOptions options)
    : impl_(std::make_shared<Impl>(ioc, std::move(options))) {}

ApiServer::~ApiServer() {
  Stop();
  impl_.reset();
  own_ioc_.reset();
}

void ApiServer::Start() {
  impl_->Start();
  if (own_ioc_ && !thread_.joinable()) {
    thread_ = std::thread([ioc = own_ioc_.get()] { ioc->run(); });
  }
}

void ApiServer::Stop() {
  if (!impl_) return;
  impl_->Stop();
  if (thread_.joinable()) {
    // Connections end quickly once their sockets are closed; a stuck one is not worth
    // hanging a test for, so the loop is stopped after a grace period.
    if (!impl_->WaitIdle(std::chrono::seconds(5))) own_ioc_->stop();
    thread_.join();
  }
}

std::uint16_t ApiServer::Port() const { return impl_->port(); }
std::string ApiServer::BaseUrl() const { return "https://127.0.0.1:" + std::to_string(Port()); }
std::string ApiServer::CaPem() const { return impl_->tls().ca_cert_pem; }
std::string ApiServer::ClientCertPem() const {
  return impl_->options().client_cert_auth ? impl_->tls().client_cert_pem : std::string();
}
std::string ApiServer::ClientKeyPem() const {
  return impl_->options().client_cert_auth ? impl_->tls().client_key_pem : std::string();
}
std::string ApiServer::Token() const { return impl_->Token(); }
std::string ApiServer::RotateToken() { return impl_->RotateToken(); }
void ApiServer::SetToken(std::string token) { impl_->SetToken(std::move(token)); }
void ApiServer::RejectTokenUntilRotated() { impl_->RejectTokenUntilRotated(); }
SimResponse ApiServer::Call(std::string_view method, std::string_view target, std::string_view body,
                            std::string_view content_type) {
  return impl_->Call(method, target, body, content_type);
}
void ApiServer::Seed(const nlohmann::json& objects) { impl_->Seed(objects); }
void ApiServer::SeedFile(const std::filesystem::path& file) { impl_->SeedFile(file); }
std::string ApiServer::ResourceVersion() const {
  return std::to_string(impl_->store().CurrentResourceVersion());
}
void ApiServer::Compact() { impl_->store().Compact(); }
void ApiServer::ExpireWatches() { impl_->store().ExpireWatches(); }
void ApiServer::SetExpiredWatchMode(ExpiredWatchMode mode) { impl_->store().SetExpiredWatchMode(mode); }
void ApiServer::CutWatches() { impl_->store().CutWatches(); }
void ApiServer::SplitNextWatchEvent() { impl_->SplitNextWatchEvent(); }
void ApiServer::MalformedNextWatchLine() { impl_->MalformedNextWatchLine(); }
void ApiServer::SetResponseDelay(std::chrono::milliseconds delay) { impl_->SetResponseDelay(delay); }
void ApiServer::FailNextRequests(int code, int count, std::string path_contains, int retry_after_seconds) {
  impl_->FailNextRequests(code, count, std::move(path_contains), retry_after_seconds);
}
void ApiServer::RestartListener(std::chrono::milliseconds downtime) { impl_->RestartListener(downtime); }
std::map<std::string, std::uint64_t> ApiServer::RequestCounts() const { return impl_->RequestCounts(); }
std::uint64_t ApiServer::RequestCount(std::string_view verb) const {
  auto counts = impl_->RequestCounts();
  auto it = counts.find(std::string(verb));
  return it == counts.end() ? 0 : it->second;
}
std::uint64_t ApiServer::TotalRequests() const {
  std::uint64_t total = 0;
  for (const auto& [verb, count] : impl_->RequestCounts()) total += count;
  return total;
}
void ApiServer::ResetRequestCounts() { impl_->ResetRequestCounts(); }
std::map<int, std::uint64_t> ApiServer::ResponseCounts() const { return impl_->ResponseCounts(); }
std::vector<WatchInfo> ApiServer::OpenWatches() const { return impl_->store().OpenWatches(); }

}  // namespace gns::sim
