// RegistryClient's network side: the module's only translation unit with Beast, Asio SSL and
// coroutines. One coroutine per pull; connections are kept alive per host and shared between
// pulls. Everything but hashing, file writes and extraction runs on the loop thread.
#include "modules/gkm_agent/registry_client.hpp"

#include "loop/awaitables.hpp"
#include "loop/https.hpp"
#include "modules/gkm_agent/streaming_extraction.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <openssl/evp.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <tuple>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <set>

namespace gns::gkm {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kAwait = asio::use_awaitable;
constexpr int kMaxRedirects = 5;

// Why one pull was stopped before its end (its deadline); empty while it may run on.
struct Halt {
  std::string reason;
  std::string message;
};

struct Conn {
  Conn(asio::io_context& io, std::shared_ptr<ssl::context> ctx) : context(std::move(ctx)), stream(io, *context) {}
  std::shared_ptr<ssl::context> context;  // outlives the stream (declared first)
  beast::ssl_stream<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::string host_header;
  const Halt* owner = nullptr;  // the pull using it (none while idle): closed when that pull is halted
};

// "1500 ms", "30 s", "30 min": a limit as an operator wrote it.
std::string LimitText(std::chrono::milliseconds limit) {
  const auto ms = limit.count();
  if (ms % 60000 == 0) return std::to_string(ms / 60000) + " min";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

void CloseConn(Conn& conn) {
  beast::error_code ec;
  // Abrupt close on purpose (as the kube client): no close_notify round trip.
  beast::get_lowest_layer(conn.stream).socket().close(ec);
}

std::string Base64(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string QueryEscape(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// A streaming sha256 and the file it feeds; used only from the pool, one chunk at a time.
struct BlobSink {
  int fd = -1;
  EVP_MD_CTX* md = nullptr;
  ~BlobSink() {
    if (fd >= 0) ::close(fd);
    if (md) EVP_MD_CTX_free(md);
  }
  void Open(const std::string& path) {
    fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) throw PullError("WriteFailed", "cannot create " + path + ": " + std::strerror(errno));
    md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
  }
  void Write(const char* data, std::size_t n, const std::string& path) {
    EVP_DigestUpdate(md, data, n);
    while (n > 0) {
      const ssize_t w = ::write(fd, data, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        throw PullError(errno == ENOSPC ? "DiskFull" : "WriteFailed",
                        "cannot write " + path + ": " + std::strerror(errno));
      }
      data += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  std::string Finish(const std::string& path) {
    std::string digest = FinishSha256Digest(md);
    if (::fsync(fd) != 0) {
      throw PullError(errno == ENOSPC ? "DiskFull" : "WriteFailed", "cannot fsync " + path + ": " + std::strerror(errno));
    }
    return digest;
  }
};

// A transient failure: worth another attempt (connection, timeout, 5xx, 429).
struct Transient : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

std::string Challenge::Param(std::string_view name) const {
  for (const auto& [k, v] : params) {
    if (k == name) return v;
  }
  return {};
}

std::optional<Challenge> ParseChallenge(std::string_view header) {
  std::size_t i = 0;
  auto skip_ws = [&] {
    while (i < header.size() && (header[i] == ' ' || header[i] == '\t')) ++i;
  };
  skip_ws();
  const auto start = i;
  while (i < header.size() && header[i] != ' ') ++i;
  Challenge c;
  c.scheme = Lower(header.substr(start, i - start));
  if (c.scheme.empty()) return std::nullopt;
  while (i < header.size()) {
    skip_ws();
    const auto key_start = i;
    while (i < header.size() && header[i] != '=' && header[i] != ',') ++i;
    std::string key = Lower(header.substr(key_start, i - key_start));
    while (!key.empty() && key.back() == ' ') key.pop_back();
    if (i >= header.size() || header[i] != '=') {
      if (i < header.size()) ++i;
      continue;
    }
    ++i;  // '='
    skip_ws();
    std::string value;
    if (i < header.size() && header[i] == '"') {
      ++i;
      while (i < header.size() && header[i] != '"') {
        if (header[i] == '\\' && i + 1 < header.size()) ++i;
        value += header[i++];
      }
      if (i >= header.size()) return std::nullopt;  // unterminated quote
      ++i;
    } else {
      while (i < header.size() && header[i] != ',' && header[i] != ' ') value += header[i++];
    }
    c.params.emplace_back(std::move(key), std::move(value));
    skip_ws();
    if (i < header.size() && header[i] == ',') ++i;
  }
  return c;
}

class RegistryClient::Impl : public std::enable_shared_from_this<RegistryClient::Impl> {
 public:
  using Parser = http::response_parser<http::buffer_body>;

  // One pull's state: who it is for, the auth it has earned, what it has fetched.
  struct Job {
    PullRequest request;
    std::function<void(PullResult)> done;
    PullResult result;
    https::Url base;
    std::string authorization;  // "Bearer …" or "Basic …" once a challenge was met
    // When extracting: the extraction the layers stream into (its job on the pool), and
    // whether it has flushed (else a pull that ends stops it and waits for it).
    std::unique_ptr<StreamingExtraction> extraction;
    bool extracted = false;
    // Set when the pull is halted (its deadline): shared with the token request it makes.
    std::shared_ptr<Halt> halt = std::make_shared<Halt>();
  };

  // An answered request whose body has not been read yet.
  struct Exchange {
    std::unique_ptr<Conn> conn;
    std::unique_ptr<Parser> parser;
    int status = 0;
    std::string url;  // the URL that answered (after redirects)
  };

  Impl(Loop& loop, BlockingPool& pool, std::shared_ptr<spdlog::logger> log, RegistryOptions options)
      : loop_(loop), pool_(pool), log_(std::move(log)), options_(std::move(options)) {
    if (options_.extraction_threads > 0) {
      extraction_pool_ = std::make_unique<BlockingPool>(loop_, options_.extraction_threads);
    }
    // A registry CA that does not parse (or no CA at all) is an error now, not at the first pull.
    if (!options_.ca_pem.empty() || !options_.system_roots) MakeContext(false);
  }

  // The TLS context is made when a connection needs it and freed with the last connection (idle
  // ones included; a finished pull closes those): the system's trust store is every root of the
  // bundle parsed into the heap (about 1.5 MiB), which a node that pulls nothing should not hold.
  std::shared_ptr<ssl::context> Context() {
    if (auto ctx = ctx_.lock()) return ctx;
    auto ctx = MakeContext(options_.system_roots);
    ctx_ = ctx;
    return ctx;
  }

  std::shared_ptr<ssl::context> MakeContext(bool system_roots) const {
    auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
    if (!options_.ca_pem.empty()) {
      https::ConfigureClientContext(*ctx, options_.ca_pem, false);
      if (system_roots) {
        beast::error_code ec;
        ctx->set_default_verify_paths(ec);  // best effort: the registry CA is the one that matters
      }
    } else {
      https::ConfigureClientContext(*ctx, {}, system_roots);
    }
    return ctx;
  }

  // --- the pool, awaited

  // A pool job awaited now (loop/awaitables.hpp), or started now and awaited later, so the loop
  // reads the next chunk from the network while the pool hashes and writes this one (at most one
  // in flight per blob: the writes of a blob stay in order).
  using PoolJob = Pending<JobResult<void>>;

  std::shared_ptr<PoolJob> StartOnPool(std::function<void()> fn) {
    return gns::StartOnPool(pool_, loop_.Io(), std::move(fn));
  }

  // The job's exception, if any.
  static asio::awaitable<std::exception_ptr> AwaitJob(std::shared_ptr<PoolJob> job) {
    JobResult<void> result = co_await PoolJob::Wait(std::move(job));
    co_return result.failure;
  }

  asio::awaitable<void> Sleep(const Job& job, std::chrono::milliseconds d) {
    asio::steady_timer timer(loop_.Io());
    timers_.emplace(&timer, job.halt.get());
    timer.expires_after(d);
    beast::error_code ec;
    co_await timer.async_wait(asio::redirect_error(kAwait, ec));
    timers_.erase(&timer);
  }

  // --- connections

  // Whether `job` must end now (the client stopped, or the pull was halted), and the error it
  // ends with.
  bool Halted(const Job& job) const { return stopped_ || !job.halt->reason.empty(); }
  [[noreturn]] void ThrowHalted(const Job& job) const {
    if (!job.halt->reason.empty()) throw PullError(job.halt->reason, job.halt->message);
    throw PullError("Stopped", "client stopped");
  }

  // Stops one pull: closes the connections it uses, wakes its retry sleeps, aborts its
  // extraction. Its coroutine then fails at its next step with `reason`.
  void HaltJob(Job& job, std::string reason, std::string message) {
    if (!job.halt->reason.empty()) return;
    job.halt->reason = std::move(reason);
    job.halt->message = std::move(message);
    for (auto* conn : active_) {
      if (conn->owner == job.halt.get()) CloseConn(*conn);
    }
    for (auto& [timer, owner] : timers_) {
      if (owner == job.halt.get()) timer->cancel();
    }
    if (job.extraction) job.extraction->Abort({});
  }

  asio::awaitable<std::unique_ptr<Conn>> Connect(const Job& job, const https::Url& url, beast::error_code& ec) {
    tcp::resolver resolver(loop_.Io());
    auto endpoints = co_await resolver.async_resolve(url.host, url.port, asio::redirect_error(kAwait, ec));
    if (ec || Halted(job)) co_return nullptr;
    auto conn = std::make_unique<Conn>(loop_.Io(), Context());
    conn->host_header = url.host_header;
    conn->owner = job.halt.get();
    active_.insert(conn.get());
    auto& lowest = beast::get_lowest_layer(conn->stream);
    lowest.expires_after(options_.request_timeout);
    co_await lowest.async_connect(endpoints, asio::redirect_error(kAwait, ec));
    if (!ec && !Halted(job)) {
      https::PrepareStream(conn->stream, url);
      co_await conn->stream.async_handshake(ssl::stream_base::client, asio::redirect_error(kAwait, ec));
    }
    active_.erase(conn.get());
    if (Halted(job) && !ec) ec = asio::error::operation_aborted;
    if (ec) co_return nullptr;
    co_return conn;
  }

  void Release(std::unique_ptr<Conn> conn, const Parser& parser) {
    if (!conn) return;
    active_.erase(conn.get());
    conn->owner = nullptr;
    if (stopped_ || !parser.is_done() || !parser.keep_alive() || idle_.size() >= 8) {
      CloseConn(*conn);
      return;
    }
    idle_.push_back(std::move(conn));
  }

  void Drop(std::unique_ptr<Conn> conn) {
    if (!conn) return;
    active_.erase(conn.get());
    CloseConn(*conn);
  }

  // Sends one GET (following redirects) and reads the response header. Throws Transient for
  // what a retry may cure, PullError for what it cannot.
  asio::awaitable<Exchange> Open(Job& job, std::string url_text, std::vector<std::pair<http::field, std::string>> headers,
                                 bool send_auth) {
    for (int redirects = 0;; ++redirects) {
      https::Url url = https::Url::Parse(url_text);
      Exchange ex;
      ex.url = url_text;
      beast::error_code ec;
      for (int fresh = 0; fresh < 2; ++fresh) {
        ec = {};
        if (Halted(job)) ThrowHalted(job);
        bool reused = false;
        for (auto it = idle_.begin(); it != idle_.end(); ++it) {
          if ((*it)->host_header == url.host_header) {
            ex.conn = std::move(*it);
            idle_.erase(it);
            reused = true;
            break;
          }
        }
        if (!ex.conn) ex.conn = co_await Connect(job, url, ec);
        if (Halted(job)) {
          Drop(std::move(ex.conn));
          ThrowHalted(job);
        }
        if (!ex.conn) throw Transient("connect to " + url.host_header + ": " + https::Describe(ec));
        ex.conn->owner = job.halt.get();
        active_.insert(ex.conn.get());
        http::request<http::empty_body> req{http::verb::get, url.target, 11};
        req.set(http::field::host, url.host_header);
        req.set(http::field::user_agent, options_.user_agent);
        if (send_auth && !job.authorization.empty()) req.set(http::field::authorization, job.authorization);
        for (const auto& [field, value] : headers) req.set(field, value);
        req.keep_alive(true);
        auto& lowest = beast::get_lowest_layer(ex.conn->stream);
        lowest.expires_after(options_.request_timeout);
        co_await http::async_write(ex.conn->stream, req, asio::redirect_error(kAwait, ec));
        ex.parser = std::make_unique<Parser>();
        // Bodies are bounded by the caller (manifest limit, descriptor size), not here. Not
        // boost::none: Beast 1.74 rejects every Content-Length against it (TOOLCHAIN.md).
        ex.parser->body_limit(std::numeric_limits<std::uint64_t>::max());
        ex.parser->header_limit(64 * 1024);
        if (!ec) co_await http::async_read_header(ex.conn->stream, ex.conn->buffer, *ex.parser, asio::redirect_error(kAwait, ec));
        if (Halted(job)) {
          Drop(std::move(ex.conn));
          ThrowHalted(job);
        }
        if (!ec) break;
        const bool got_some = ex.parser->got_some();
        Drop(std::move(ex.conn));
        // A kept-alive connection the server closed while idle: the request never arrived.
        if (reused && !got_some) continue;
        throw Transient("GET " + url_text + ": " + https::Describe(ec));
      }
      if (!ex.conn) throw Transient("GET " + url_text + ": " + https::Describe(ec));
      ex.status = ex.parser->get().result_int();
      const bool redirect = ex.status == 301 || ex.status == 302 || ex.status == 303 || ex.status == 307 || ex.status == 308;
      if (!redirect) co_return ex;
      std::string location(ex.parser->get()[http::field::location]);
      co_await Discard(ex);
      if (redirects >= kMaxRedirects) throw PullError("RegistryError", "more than 5 redirects from " + url_text);
      if (location.empty()) throw PullError("RegistryError", "redirect without Location from " + url_text);
      if (location.front() == '/') location = "https://" + url.host_header + location;
      if (location.rfind("https://", 0) != 0) {
        throw PullError("RegistryError", "redirect to a non-https URL refused: " + location);
      }
      // Credentials stay with the registry: a blob store elsewhere gets none.
      if (https::Url::Parse(location).host_header != job.base.host_header) send_auth = false;
      url_text = std::move(location);
    }
  }

  // Reads (and drops) a bounded body, keeping the connection when it allows.
  asio::awaitable<void> Discard(Exchange& ex) {
    std::string ignored;
    beast::error_code ec;
    co_await ReadSmall(ex, 64 * 1024, ignored, ec, /*truncate=*/true);
  }

  // Reads a whole body up to `limit` bytes into `out`; ec set on a network error. With
  // `truncate`, a longer body is cut (and the connection closed) instead of an error.
  asio::awaitable<bool> ReadSmall(Exchange& ex, uint64_t limit, std::string& out, beast::error_code& ec,
                                  bool truncate = false) {
    auto& parser = *ex.parser;
    if (const auto len = parser.content_length(); len && *len > limit && !truncate) {
      Drop(std::move(ex.conn));
      co_return false;
    }
    std::array<char, 16 * 1024> buf{};
    auto& lowest = beast::get_lowest_layer(ex.conn->stream);
    while (!parser.is_done()) {
      parser.get().body().data = buf.data();
      parser.get().body().size = buf.size();
      lowest.expires_after(options_.request_timeout);
      co_await http::async_read(ex.conn->stream, ex.conn->buffer, parser, asio::redirect_error(kAwait, ec));
      if (ec == http::error::need_buffer) ec = {};
      out.append(buf.data(), buf.size() - parser.get().body().size);
      if (ec || stopped_) break;
      if (out.size() > limit) {
        Drop(std::move(ex.conn));
        co_return false;
      }
    }
    if (ec || stopped_) {
      Drop(std::move(ex.conn));
      co_return false;
    }
    Release(std::move(ex.conn), parser);
    co_return true;
  }

  // --- auth

  // Meets a 401's challenge: Basic with the pull secret, or a token from the Bearer realm.
  asio::awaitable<void> Authenticate(Job& job, const std::string& challenge_header) {
    const auto challenge = ParseChallenge(challenge_header);
    const auto& creds = job.request.credentials;
    if (!challenge) throw PullError("Unauthorized", "registry answered 401 with an unreadable challenge");
    if (challenge->scheme == "basic") {
      if (!creds) throw PullError("Unauthorized", "registry wants Basic credentials and no pull secret has them");
      job.authorization = "Basic " + Base64(creds->username + ":" + creds->password);
      co_return;
    }
    if (challenge->scheme != "bearer") {
      throw PullError("Unauthorized", "unsupported auth scheme \"" + challenge->scheme + "\"");
    }
    const std::string realm = challenge->Param("realm");
    if (realm.rfind("https://", 0) != 0) throw PullError("Unauthorized", "token realm \"" + realm + "\" is not https");
    std::string url = realm + (realm.find('?') == std::string::npos ? "?" : "&");
    std::string query;
    if (const auto service = challenge->Param("service"); !service.empty()) query += "service=" + QueryEscape(service);
    const std::string scope = challenge->Param("scope").empty() ? "repository:" + job.request.image.repository + ":pull"
                                                               : challenge->Param("scope");
    query += std::string(query.empty() ? "" : "&") + "scope=" + QueryEscape(scope);
    url += query;
    std::vector<std::pair<http::field, std::string>> headers;
    headers.emplace_back(http::field::accept, "application/json");
    if (creds && !creds->username.empty()) {
      headers.emplace_back(http::field::authorization, "Basic " + Base64(creds->username + ":" + creds->password));
    }
    Job token_job{job.request, nullptr, {}, https::Url::Parse(url), {}, nullptr, false, job.halt};
    auto ex = co_await Open(token_job, url, headers, false);
    std::string body;
    beast::error_code ec;
    const int status = ex.status;
    const bool whole = co_await ReadSmall(ex, 1024 * 1024, body, ec);
    if (status >= 500) throw Transient("token endpoint " + realm + " answered HTTP " + std::to_string(status));
    if (status != 200) throw PullError("Unauthorized", "token endpoint " + realm + " answered HTTP " + std::to_string(status));
    if (!whole) throw Transient("token endpoint " + realm + ": " + (ec ? https::Describe(ec) : "answer too large"));
    const auto j = nlohmann::json::parse(body, nullptr, false);
    std::string token;
    if (j.is_object()) {
      for (const char* key : {"token", "access_token"}) {
        if (const auto it = j.find(key); it != j.end() && it->is_string() && !it->get<std::string>().empty()) {
          token = it->get<std::string>();
          break;
        }
      }
    }
    if (token.empty()) throw PullError("Unauthorized", "token endpoint " + realm + " answered without a token");
    job.authorization = "Bearer " + token;
  }

  // Opens a registry path, meeting one auth challenge and failing on what is not 2xx.
  asio::awaitable<Exchange> OpenRegistry(Job& job, const std::string& path,
                                         std::vector<std::pair<http::field, std::string>> headers,
                                         const std::string& what) {
    const std::string url = "https://" + job.base.host_header + path;
    for (int auth_round = 0;; ++auth_round) {
      auto ex = co_await Open(job, url, headers, true);
      if (ex.status == 401 && auth_round == 0) {
        const std::string challenge(ex.parser->get()[http::field::www_authenticate]);
        co_await Discard(ex);
        co_await Authenticate(job, challenge);
        continue;
      }
      if (ex.status >= 200 && ex.status < 300) co_return ex;
      std::string body;
      beast::error_code ec;
      const int status = ex.status;
      co_await ReadSmall(ex, 4096, body, ec, true);
      const std::string why = what + ": HTTP " + std::to_string(status) + (body.empty() ? "" : " " + body.substr(0, 300));
      if (status >= 500 || status == 429 || status == 408) throw Transient(why);
      if (status == 401 || status == 403) throw PullError("Unauthorized", why);
      if (status == 404) throw PullError("NotFound", why);
      throw PullError("RegistryError", why);
    }
  }

  // Runs `step` up to max_attempts times while it fails with Transient.
  // `step` makes one attempt's coroutine (a plain lambda: g++ 12 miscompiles some coroutine
  // lambdas, so the attempts are member coroutines).
  asio::awaitable<void> WithRetries(Job& job, const std::string& what, std::function<asio::awaitable<void>()> step) {
    auto delay = options_.retry_delay;
    for (int attempt = 1;; ++attempt) {
      try {
        co_await step();
        co_return;
      } catch (const Transient& e) {
        if (Halted(job)) ThrowHalted(job);
        if (attempt >= options_.max_attempts) {
          throw PullError("RegistryUnavailable",
                          what + " failed after " + std::to_string(attempt) + " attempts: " + e.what());
        }
        log_->warn("{}: {} (attempt {} of {}); retrying in {} ms", job.request.image.ToString(), e.what(), attempt,
                   options_.max_attempts, delay.count());
      }
      co_await Sleep(job, delay);
      if (Halted(job)) ThrowHalted(job);
      delay *= 2;
    }
  }

  // --- manifests and blobs

  asio::awaitable<void> ManifestOnce(Job& job, const std::string& path, const std::string& reference,
                                     std::optional<uint64_t> size, std::string& body, std::string& content_type,
                                     std::string& header_digest) {
    std::vector<std::pair<http::field, std::string>> headers;
    headers.emplace_back(http::field::accept, ManifestAccept());
    auto ex = co_await OpenRegistry(job, path, std::move(headers), "manifest " + reference);
    content_type = std::string(ex.parser->get()[http::field::content_type]);
    header_digest = std::string(ex.parser->get()["Docker-Content-Digest"]);
    const uint64_t limit = size ? *size : options_.max_manifest_bytes;
    body.clear();
    beast::error_code ec;
    const auto announced = ex.parser->content_length();
    const bool whole = co_await ReadSmall(ex, limit, body, ec);
    job.result.bytes_pulled += body.size();
    if (ec) throw Transient("manifest " + reference + ": " + https::Describe(ec));
    if (!whole) {
      if (size) {
        throw PullError("SizeMismatch", "manifest " + reference + " is larger than the " + std::to_string(*size) +
                                            " bytes its descriptor says" +
                                            (announced ? " (" + std::to_string(*announced) + " announced)" : ""));
      }
      throw PullError("TooLarge", "manifest " + reference + " is larger than " + std::to_string(limit) + " bytes");
    }
  }

  // Hands one received chunk on: to the extraction, or to the pool that hashes and writes the
  // file. The returned job is done once the chunk's buffer may be filled again.
  std::shared_ptr<PoolJob> Consume(Job& job, const std::shared_ptr<BlobSink>& sink, const char* data, std::size_t n,
                                   const std::string& path) {
    if (job.extraction) {
      auto released = std::make_shared<PoolJob>(loop_.Io());
      job.extraction->Feed(data, n, [released] { released->Complete({}); });
      return released;
    }
    return StartOnPool([sink, data, n, path] { sink->Write(data, n, path); });
  }

  asio::awaitable<void> BlobOnce(Job& job, const Descriptor& d, const std::string& blob_path, const std::string& path,
                                 const std::string& what, std::shared_ptr<BlobSink> sink, uint64_t& offset,
                                 std::array<std::vector<char>, 2>& bufs) {
    std::vector<std::pair<http::field, std::string>> headers;
    if (offset > 0) headers.emplace_back(http::field::range, "bytes=" + std::to_string(offset) + "-");
    auto ex = co_await OpenRegistry(job, blob_path, headers, what);
    auto& parser = *ex.parser;
    if (offset > 0 && ex.status == 206) {
      const std::string range(parser.get()[http::field::content_range]);
      if (range.rfind("bytes " + std::to_string(offset) + "-", 0) != 0) {
        Drop(std::move(ex.conn));
        throw PullError("RegistryError", what + ": asked for bytes from " + std::to_string(offset) +
                                             ", got Content-Range \"" + range + "\"");
      }
    }
    // A registry that ignores Range sends the whole blob again: what we have is skipped (and
    // a registry that sends other bytes this time fails the digest check at the end).
    uint64_t skip = offset > 0 && ex.status != 206 ? offset : 0;
    if (const auto len = parser.content_length(); len && (skip > 0 ? 0 : offset) + *len > d.size) {
      Drop(std::move(ex.conn));
      throw PullError("SizeMismatch", what + ": the registry sends " + std::to_string(offset + *len) +
                                          " bytes, the manifest says " + std::to_string(d.size));
    }
    // Two buffers: the network fills one while the pool hashes and writes the other. What this
    // pull holds is these two chunks, whatever the size of the blob.
    auto& lowest = beast::get_lowest_layer(ex.conn->stream);
    std::shared_ptr<PoolJob> writing;
    std::exception_ptr failure;
    std::size_t current = 0;
    try {
      beast::error_code ec;
      while (!parser.is_done()) {
        auto& buf = bufs[current];
        parser.get().body().data = buf.data();
        parser.get().body().size = buf.size();
        lowest.expires_after(options_.request_timeout);
        co_await http::async_read(ex.conn->stream, ex.conn->buffer, parser, asio::redirect_error(kAwait, ec));
        if (ec == http::error::need_buffer) ec = {};
        std::size_t n = buf.size() - parser.get().body().size;
        if (Halted(job)) ThrowHalted(job);
        std::size_t from = 0;
        if (skip > 0 && n > 0) {
          from = static_cast<std::size_t>(std::min<uint64_t>(skip, n));
          skip -= from;
          job.result.bytes_pulled += from;
          n -= from;
        }
        if (n > 0) {
          if (offset + n > d.size) {
            throw PullError("SizeMismatch", what + ": more than the " + std::to_string(d.size) + " bytes the manifest says");
          }
          job.result.bytes_pulled += n;
          if (writing) {
            if (auto e = co_await AwaitJob(std::move(writing))) std::rethrow_exception(e);
          }
          writing = Consume(job, sink, buf.data() + from, n, path);
          offset += n;
          current ^= 1;
        }
        if (ec) {
          throw Transient(what + " broke after " + std::to_string(offset) + " of " + std::to_string(d.size) +
                          " bytes: " + https::Describe(ec));
        }
      }
    } catch (...) {
      failure = std::current_exception();
    }
    // The chunk in flight lands before anything else touches the sink or its buffer (a retry
    // resumes after it; a failed pull frees the buffers).
    if (writing) {
      if (auto e = co_await AwaitJob(std::move(writing)); e && !failure) failure = e;
    }
    if (failure) {
      Drop(std::move(ex.conn));
      std::rethrow_exception(failure);
    }
    Release(std::move(ex.conn), parser);
  }

  asio::awaitable<void> ConfigOnce(Job& job, const std::string& path, const std::string& what, uint64_t size,
                                   std::string& config_text) {
    auto ex = co_await OpenRegistry(job, path, {}, what);
    config_text.clear();
    beast::error_code ec;
    const bool whole = co_await ReadSmall(ex, size, config_text, ec);
    job.result.bytes_pulled += config_text.size();
    if (ec) throw Transient(what + ": " + https::Describe(ec));
    if (!whole) throw PullError("SizeMismatch", what + ": more than the " + std::to_string(size) + " bytes the manifest says");
  }

  // A manifest by tag or digest: its bytes checked against `digest` when given; returns the
  // body, its content type and its own sha256.
  asio::awaitable<std::tuple<std::string, std::string, std::string>> FetchManifest(Job& job, const std::string& reference,
                                                                                  const std::string& digest,
                                                                                  std::optional<uint64_t> size) {
    std::string body, content_type, header_digest;
    const std::string path = "/v2/" + job.request.image.repository + "/manifests/" + reference;
    std::function<asio::awaitable<void>()> step = [&] {
      return ManifestOnce(job, path, reference, size, body, content_type, header_digest);
    };
    const std::string what = "manifest " + reference;
    co_await WithRetries(job, what, std::move(step));
    const std::string actual = Sha256Digest(body);
    if (!digest.empty() && actual != digest) {
      throw PullError("DigestMismatch", "manifest " + reference + " hashes to " + actual + ", expected " + digest);
    }
    if (digest.empty() && !header_digest.empty() && header_digest != actual) {
      throw PullError("DigestMismatch", "manifest " + reference + " hashes to " + actual +
                                            " but the registry says Docker-Content-Digest " + header_digest);
    }
    if (size && body.size() != *size) {
      throw PullError("SizeMismatch", "manifest " + reference + " is " + std::to_string(body.size()) +
                                          " bytes, its descriptor says " + std::to_string(*size));
    }
    co_return std::make_tuple(std::move(body), std::move(content_type), actual);
  }

  // --- the extraction, awaited (its completions run on the loop, each exactly once)

  static asio::awaitable<std::tuple<std::string, std::exception_ptr>> EndLayer(StreamingExtraction& extraction) {
    auto start = [&extraction](auto resume) {
      extraction.EndLayer(
          [resume](std::string digest, std::exception_ptr e) { resume(std::make_tuple(std::move(digest), e)); });
    };
    return AwaitCallback<std::tuple<std::string, std::exception_ptr>>(std::move(start));
  }

  static asio::awaitable<std::tuple<ExtractStats, std::exception_ptr>> FinishExtraction(StreamingExtraction& extraction) {
    auto start = [&extraction](auto resume) {
      extraction.Finish([resume](ExtractStats stats, std::exception_ptr e) { resume(std::make_tuple(stats, e)); });
    };
    return AwaitCallback<std::tuple<ExtractStats, std::exception_ptr>>(std::move(start));
  }

  static asio::awaitable<void> StopExtraction(StreamingExtraction& extraction) {
    auto start = [&extraction](auto resume) { extraction.Abort(std::move(resume)); };
    return AwaitCallback<void>(std::move(start));
  }

  // A blob streamed into `path` (hashed and written on the pool chunk by chunk) or into the
  // job's extraction; a broken transfer resumes where it stopped (Range), a registry ignoring
  // Range sends it again from the start.
  asio::awaitable<void> FetchBlob(Job& job, const Descriptor& d, const std::string& path, const std::string& layer) {
    std::shared_ptr<BlobSink> sink;
    if (job.extraction) {
      job.extraction->BeginLayer(layer);
    } else {
      sink = std::make_shared<BlobSink>();
      std::function<void()> open = [sink, path] { sink->Open(path); };
      JobResult<void> opened = co_await OnPool(pool_, std::move(open));
      if (opened.failure) std::rethrow_exception(opened.failure);
    }
    uint64_t offset = 0;
    std::array<std::vector<char>, 2> bufs{std::vector<char>(options_.chunk_bytes), std::vector<char>(options_.chunk_bytes)};
    const std::string what = "blob " + d.digest;
    const std::string blob_path = "/v2/" + job.request.image.repository + "/blobs/" + d.digest;
    std::function<asio::awaitable<void>()> step = [&] { return BlobOnce(job, d, blob_path, path, what, sink, offset, bufs); };
    co_await WithRetries(job, what, std::move(step));
    if (offset != d.size) {
      throw PullError("SizeMismatch", what + ": the registry sent " + std::to_string(offset) +
                                          " bytes, the manifest says " + std::to_string(d.size));
    }
    std::string actual;
    if (job.extraction) {
      auto [digest, extract_error] = co_await EndLayer(*job.extraction);
      // A wrong digest first: a tampered layer may also be a broken archive, and the digest says why.
      if (extract_error && digest.empty()) std::rethrow_exception(extract_error);
      if (digest != d.digest) throw PullError("DigestMismatch", what + ": the bytes received hash to " + digest);
      if (extract_error) std::rethrow_exception(extract_error);
      co_return;
    }
    std::function<void()> finish = [sink, &actual, &path] { actual = sink->Finish(path); };
    JobResult<void> finished = co_await OnPool(pool_, std::move(finish));
    if (finished.failure) std::rethrow_exception(finished.failure);
    if (actual != d.digest) {
      throw PullError("DigestMismatch", what + ": the bytes received hash to " + actual);
    }
  }

  // The pull's run to its end; its failure as a value, also handed to `ended`.
  static asio::awaitable<bool> Attempt(std::shared_ptr<Impl> self, std::shared_ptr<Job> job,
                                       std::shared_ptr<Pending<std::exception_ptr>> ended) {
    std::exception_ptr failure;
    try {
      co_await self->RunJob(*job);
    } catch (...) {
      failure = std::current_exception();
    }
    ended->Complete(failure);
    co_return true;
  }

  static asio::awaitable<void> Run(std::shared_ptr<Impl> self, std::shared_ptr<Job> job) {
    ++self->running_;
    auto ended = std::make_shared<Pending<std::exception_ptr>>(self->loop_.Io());
    auto attempt = Attempt(self, job, ended);
    if (job->request.deadline.count() > 0) {
      // The whole pull against its deadline (loop/awaitables.hpp). At the deadline the pull is
      // halted (its sockets closed), and its run is awaited to its end all the same: the
      // extraction must have stopped writing before the caller removes the directory.
      Timed<bool> timed = co_await WithDeadline(self->loop_.Io(), job->request.deadline, std::move(attempt));
      if (timed.timed_out) {
        self->HaltJob(*job, "DeadlineExceeded",
                   "pull of " + job->request.image.ToString() + " from registry " + job->request.image.Host() +
                       " did not finish within its deadline of " + LimitText(job->request.deadline) +
                       " (pullTimeout)");
      }
    } else {
      co_await std::move(attempt);
    }
    std::exception_ptr failure = co_await Pending<std::exception_ptr>::Wait(ended);
    try {
      if (failure) std::rethrow_exception(failure);
    } catch (const PullError& e) {
      job->result.reason = e.reason;
      job->result.error = e.what();
    } catch (const std::exception& e) {
      job->result.reason = "RegistryError";
      job->result.error = e.what();
    }
    if (!job->result.Ok() && !job->halt->reason.empty()) {
      // Whatever the halted run failed with (a closed socket, a stopped extraction), the
      // reason is the halt's.
      job->result.reason = job->halt->reason;
      job->result.error = job->halt->message;
    }
    if (job->extraction) {
      // A pull that did not flush its tree stops the extraction and waits until it writes no
      // more: the caller removes the directory next.
      if (!job->extracted) co_await StopExtraction(*job->extraction);
      self->extractions_.erase(job->extraction.get());
    }
    if (self->stopped_ && job->result.Ok()) {
      job->result.reason = "Stopped";
      job->result.error = "client stopped";
    }
    // Pulls are rare: once none runs, the idle connections (and with them the TLS context) go.
    if (--self->running_ == 0) {
      for (auto& conn : self->idle_) CloseConn(*conn);
      self->idle_.clear();
    }
    auto done = std::move(job->done);
    done(std::move(job->result));
  }

  asio::awaitable<void> RunJob(Job& job) {
    auto& req = job.request;
    if (!req.digest.empty() && !IsSha256Digest(req.digest)) {
      throw PullError("BadDigest", "resolved digest \"" + req.digest + "\" is not sha256:<64 hex>");
    }
    job.base = https::Url::Parse("https://" + req.image.Host());
    const std::string first = !req.digest.empty() ? req.digest : req.image.Reference();
    const std::string pinned = !req.digest.empty() ? req.digest : req.image.digest;
    auto [body, content_type, digest] = co_await FetchManifest(job, first, pinned, std::nullopt);
    job.result.digest = digest;
    Manifest manifest = ParseManifest(body, content_type);
    if (manifest.is_index) {
      const Descriptor* chosen = PickManifest(manifest, options_.os, options_.architecture);
      if (!chosen) throw PullError("BadManifest", "image index " + digest + " lists no manifests");
      auto [inner, inner_type, inner_digest] = co_await FetchManifest(job, chosen->digest, chosen->digest, chosen->size);
      manifest = ParseManifest(inner, inner_type);
      if (manifest.is_index) throw PullError("BadManifest", "image index " + digest + " points at another index");
    }
    uint64_t total = manifest.config.size;
    for (const auto& layer : manifest.layers) {
      if (layer.size > options_.max_image_bytes || total + layer.size > options_.max_image_bytes) {
        throw PullError("TooLarge", "image " + req.image.ToString() + " is larger than the limit of " +
                                        std::to_string(options_.max_image_bytes) + " bytes");
      }
      total += layer.size;
    }
    if (manifest.layers.empty()) throw PullError("BadManifest", "manifest " + digest + " has no layers");
    // The config: small, held in memory, checked like a manifest.
    if (manifest.config.size > options_.max_manifest_bytes) {
      throw PullError("TooLarge", "image config of " + std::to_string(manifest.config.size) + " bytes");
    }
    std::string config_text;
    {
      const std::string what = "config " + manifest.config.digest;
      const std::string path = "/v2/" + req.image.repository + "/blobs/" + manifest.config.digest;
      std::function<asio::awaitable<void>()> step = [&] {
        return ConfigOnce(job, path, what, manifest.config.size, config_text);
      };
      co_await WithRetries(job, what, std::move(step));
      if (config_text.size() != manifest.config.size) {
        throw PullError("SizeMismatch", what + ": " + std::to_string(config_text.size()) + " bytes, the manifest says " +
                                            std::to_string(manifest.config.size));
      }
      if (Sha256Digest(config_text) != manifest.config.digest) {
        throw PullError("DigestMismatch", what + ": the bytes received hash to " + Sha256Digest(config_text));
      }
      job.result.config = nlohmann::json::parse(config_text, nullptr, false);
      if (job.result.config.is_discarded() || !job.result.config.is_object()) {
        throw PullError("BadManifest", what + " is not a JSON object");
      }
    }
    if (!req.extract_to.empty()) {
      job.extraction = std::make_unique<StreamingExtraction>(loop_, extraction_pool_ ? *extraction_pool_ : pool_,
                                                             req.extract_to, req.max_extract_bytes);
      extractions_.insert(job.extraction.get());
    }
    for (std::size_t i = 0; i < manifest.layers.size(); ++i) {
      const std::string path = req.dir + "/layer-" + std::to_string(i);
      co_await FetchBlob(job, manifest.layers[i], path, "layer " + std::to_string(i));
      if (!job.extraction) job.result.layer_files.push_back(path);
      job.result.layer_media_types.push_back(manifest.layers[i].media_type);
    }
    if (job.extraction) {
      auto [stats, error] = co_await FinishExtraction(*job.extraction);
      if (error) std::rethrow_exception(error);
      job.result.extracted = stats;
      job.extracted = true;
    }
  }

  void Shutdown() {
    if (stopped_) return;
    stopped_ = true;
    for (auto& conn : idle_) CloseConn(*conn);
    idle_.clear();
    for (auto* conn : active_) CloseConn(*conn);
    for (auto& [timer, owner] : timers_) timer->cancel();
    for (auto* extraction : extractions_) extraction->Abort({});
  }

  Loop& loop_;
  BlockingPool& pool_;
  std::shared_ptr<spdlog::logger> log_;
  RegistryOptions options_;
  // The extractions' own threads (options_.extraction_threads): held by this Impl, which every
  // pull's coroutine keeps alive, so no extraction outlives them.
  std::unique_ptr<BlockingPool> extraction_pool_;
  std::weak_ptr<ssl::context> ctx_;  // see Context()
  int running_ = 0;                  // pulls in progress
  std::vector<std::unique_ptr<Conn>> idle_;
  std::set<Conn*> active_;
  std::map<asio::steady_timer*, const Halt*> timers_;  // retry sleeps, by the pull they belong to
  std::set<StreamingExtraction*> extractions_;
  bool stopped_ = false;
};

RegistryClient::RegistryClient(Loop& loop, BlockingPool& pool, std::shared_ptr<spdlog::logger> log,
                               RegistryOptions options)
    : impl_(std::make_shared<Impl>(loop, pool, std::move(log), std::move(options))) {}

RegistryClient::~RegistryClient() { impl_->Shutdown(); }

void RegistryClient::Shutdown() { impl_->Shutdown(); }

void RegistryClient::Pull(PullRequest request, std::function<void(PullResult)> done) {
  auto job = std::make_shared<Impl::Job>();
  job->request = std::move(request);
  job->done = std::move(done);
  if (impl_->stopped_) {
    impl_->loop_.Post([job] {
      job->result.reason = "Stopped";
      job->result.error = "client stopped";
      job->done(std::move(job->result));
    });
    return;
  }
  asio::co_spawn(impl_->loop_.Io(), Impl::Run(impl_, job), asio::detached);
}

}  // namespace gns::gkm
