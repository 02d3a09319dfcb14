// KubeClient's network side: the only translation unit of the module with Beast, Asio SSL and
// coroutines. Requests share a small pool of keep-alive TLS connections; every watch has its
// own connection. Everything runs on the loop thread.
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/json_reader.hpp"
#include "loop/https.hpp"
#include "loop/wake_grid.hpp"

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

#include <deque>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace gns::kube {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kAwait = asio::use_awaitable;
constexpr std::size_t kStatusBodyLimit = 64 * 1024;

struct Conn {
  Conn(asio::io_context& io, ssl::context& ctx) : stream(io, ctx) {}
  beast::ssl_stream<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
};

void CloseConn(Conn& conn) {
  beast::error_code ec;
  // Abrupt close on purpose: a TLS close_notify would need another round trip, and the peer
  // treats a closed socket the same way.
  beast::get_lowest_layer(conn.stream).socket().close(ec);
}

using https::Describe;

bool IsJson(std::string_view content_type) { return content_type.rfind("application/json", 0) == 0; }

// The message of a Status object, or a generic text.
std::string StatusMessage(int status, const nlohmann::json& body) {
  if (body.is_object()) {
    const auto it = body.find("message");
    if (it != body.end() && it->is_string() && !it->get<std::string>().empty()) {
      return "HTTP " + std::to_string(status) + ": " + it->get<std::string>();
    }
  }
  return "HTTP " + std::to_string(status);
}

// Retry-After from the header, else from a Status's details.retryAfterSeconds.
std::chrono::milliseconds RetryAfterOf(std::string_view header, const nlohmann::json& body) {
  if (auto from_header = ParseRetryAfter(header); from_header.count() > 0) return from_header;
  if (!body.is_object()) return std::chrono::milliseconds(0);
  const auto details = body.find("details");
  if (details == body.end() || !details->is_object()) return std::chrono::milliseconds(0);
  const auto seconds = details->find("retryAfterSeconds");
  if (seconds == details->end() || !seconds->is_number_integer()) return std::chrono::milliseconds(0);
  const auto n = seconds->get<int64_t>();
  // Bounded before converting: a day is already far beyond any RetryPolicy::max_retry_after.
  return n > 0 ? std::chrono::milliseconds(std::min<int64_t>(n, 86400) * 1000) : std::chrono::milliseconds(0);
}

}  // namespace

bool IsTransient(int http_status) {
  return http_status == 0 || http_status == 429 || http_status == 500 || http_status == 502 ||
         http_status == 503 || http_status == 504;
}

std::chrono::milliseconds ParseRetryAfter(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  if (value.empty() || value.size() > 9) return std::chrono::milliseconds(0);
  int64_t seconds = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return std::chrono::milliseconds(0);
    seconds = seconds * 10 + (c - '0');
  }
  return std::chrono::milliseconds(std::min<int64_t>(seconds, 86400) * 1000);
}

std::chrono::milliseconds RetryDelay(std::chrono::milliseconds retry_after, Backoff& backoff,
                                     std::chrono::milliseconds max_retry_after) {
  if (retry_after.count() > 0) {
    // The server said when: that, not our own guess (which still grows, so consecutive
    // failures without a Retry-After keep backing off).
    backoff.Next();
    return std::min(retry_after, max_retry_after);
  }
  return backoff.Next();
}

class KubeClient::Impl : public std::enable_shared_from_this<KubeClient::Impl> {
 public:
  struct Call {
    std::string verb;
    http::verb method;
    std::string target;
    std::string body;
    std::string content_type;
    Callback cb;
    // The User-Agent (KubeClient::ModuleAgent), read as the request is sent; null: the config's.
    std::shared_ptr<const std::string> agent;
    // A JSON body of a 2xx answer decoded by this instead of ParseJson (list pages of a cache).
    std::function<nlohmann::json(std::string_view body, std::string* error)> decode;
    bool retried_after_401 = false;
    Clock::SteadyTime start;
    int attempts = 0;
    // How the latest attempt failed without an HTTP answer.
    enum class NoAnswer { kNone, kNotSent, kCut, kTimeout, kPermanent } no_answer = NoAnswer::kNone;
    std::unique_ptr<Backoff> backoff;  // made on the first retry
  };

  struct Watch {
    WatchCallbacks callbacks;
    std::string target;
    std::shared_ptr<const std::string> agent;  // as Call::agent
    std::chrono::milliseconds idle_timeout{300000};
    bool stopped = false;
    Conn* conn = nullptr;
  };

  Impl(Deps deps, ClientConfig config)
      : deps_(deps),
        config_(std::move(config)),
        limiter_timer_(deps.loop.Io()),
        token_timer_(deps.loop.Io()) {
    ParseServer();
    https::ConfigureClientContext(ctx_, config_.ca_pem, /*allow_system_roots=*/false);
    beast::error_code ec;
    if (!config_.client_cert_pem.empty()) {
      ctx_.use_certificate_chain(asio::buffer(config_.client_cert_pem), ec);
      if (ec) throw std::runtime_error("client certificate: " + Describe(ec));
      ctx_.use_private_key(asio::buffer(config_.client_key_pem), ssl::context::pem, ec);
      if (ec) throw std::runtime_error("client key: " + Describe(ec));
    }
    if (config_.qps <= 0 || config_.burst < 1) throw std::runtime_error("qps and burst must be positive");
    if (config_.retry.max_attempts < 1) throw std::runtime_error("retry.max_attempts must be at least 1");
    tokens_ = config_.burst;
    last_refill_ = deps_.clock.Now();
    token_ = config_.token;
    if (!config_.token_file.empty()) ReadTokenFile();
  }

  void StartTimers() {
    if (!config_.token_file.empty()) ArmTokenTimer();
  }

  void ParseServer() {
    if (config_.server.rfind("https://", 0) != 0) {
      throw std::runtime_error("server must be https://, got \"" + config_.server + "\"");
    }
    server_ = https::Url::Parse(config_.server);
    host_ = server_.host;
    port_ = server_.port;
    host_is_ip_ = server_.host_is_ip;
    host_header_ = server_.host_header;
  }

  // --- tokens

  void ReadTokenFile() {
    // A few bytes from a tmpfs-backed projected volume: read inline, as client-go does.
    std::ifstream in(config_.token_file, std::ios::binary);
    std::ostringstream text;
    if (in) text << in.rdbuf();
    std::string token = text.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
    ++stats_.token_reloads;
    if (!in || token.empty()) {
      deps_.log->warn("cannot read the token file {}; keeping the previous token", config_.token_file);
      return;
    }
    token_ = std::move(token);
  }

  void ArmTokenTimer() {
    // On the loop's wake grid (src/loop/wake_grid.hpp): at rest the re-read shares a wake-up.
    const auto now = deps_.clock.Now();
    token_timer_.expires_after(SnapToWakeGrid(now + config_.token_refresh, config_.token_refresh) - now);
    token_timer_.async_wait([weak = weak_from_this()](const beast::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->stopped_) return;
      self->ReadTokenFile();
      self->ArmTokenTimer();
    });
  }

  // --- rate limit (token bucket)

  void Admit(std::function<void()> go) {
    waiting_.push_back(std::move(go));
    Pump();
  }

  void Pump() {
    const auto now = deps_.clock.Now();
    const double elapsed = std::chrono::duration<double>(now - last_refill_).count();
    last_refill_ = now;
    tokens_ = std::min<double>(config_.burst, tokens_ + elapsed * config_.qps);
    while (!waiting_.empty() && tokens_ >= 1.0 && !stopped_) {
      tokens_ -= 1.0;
      auto go = std::move(waiting_.front());
      waiting_.pop_front();
      go();
    }
    if (waiting_.empty() || limiter_armed_ || stopped_) return;
    limiter_armed_ = true;
    const auto wait = std::chrono::duration<double>((1.0 - tokens_) / config_.qps);
    limiter_timer_.expires_after(std::chrono::duration_cast<std::chrono::microseconds>(wait) +
                                 std::chrono::microseconds(100));
    limiter_timer_.async_wait([weak = weak_from_this()](const beast::error_code& ec) {
      auto self = weak.lock();
      if (!self) return;
      self->limiter_armed_ = false;
      if (!ec) self->Pump();
    });
  }

  // --- requests

  void Submit(std::shared_ptr<Call> call) {
    call->start = deps_.clock.Now();
    if (stopped_) {
      deps_.loop.Post([call] { call->cb(Result{0, nullptr, "client stopped"}); });
      return;
    }
    Admit([self = shared_from_this(), call] { asio::co_spawn(self->deps_.loop.Io(), Exchange(self, call), asio::detached); });
  }

  static asio::awaitable<void> Exchange(std::shared_ptr<Impl> self, std::shared_ptr<Call> call) {
    ++call->attempts;
    Result result = co_await self->RoundTrip(*call);
    if (result.http_status == 401 && !call->retried_after_401 && !self->stopped_ && !self->config_.token_file.empty()) {
      // The token may have been rotated under us: re-read it and try once more.
      call->retried_after_401 = true;
      self->ReadTokenFile();
      result = co_await self->RoundTrip(*call);
    }
    if (self->ShouldRetry(*call, result)) {
      if (!call->backoff) call->backoff = std::make_unique<Backoff>(self->config_.retry.backoff);
      const auto delay = RetryDelay(result.retry_after, *call->backoff, self->config_.retry.max_retry_after);
      self->Record(call->verb, result.http_status, call->start);
      ++self->stats_.retries;
      self->stats_.last_retry_delay = delay;
      self->deps_.log->debug("{} {}: {}; attempt {} in {} ms", call->verb, call->target,
                             result.error.empty() ? "HTTP " + std::to_string(result.http_status) : result.error,
                             call->attempts + 1, delay.count());
      asio::steady_timer timer(self->deps_.loop.Io());
      timer.expires_after(delay);
      self->retry_timers_.insert(&timer);
      beast::error_code ec;
      co_await timer.async_wait(asio::redirect_error(kAwait, ec));
      self->retry_timers_.erase(&timer);
      if (!self->stopped_) {
        // Through the token bucket again: a retry is a request like any other.
        self->Admit([self, call] { asio::co_spawn(self->deps_.loop.Io(), Exchange(self, call), asio::detached); });
        co_return;
      }
    }
    if (self->stopped_) result = Result{0, nullptr, "client stopped"};
    self->Record(call->verb, result.http_status, call->start);
    auto cb = std::move(call->cb);
    cb(std::move(result));
  }

  // RetryPolicy's rules (client.hpp).
  bool ShouldRetry(const Call& call, const Result& result) const {
    if (stopped_ || result.Ok() || call.attempts >= config_.retry.max_attempts) return false;
    if (result.http_status == 0) {
      if (call.no_answer == Call::NoAnswer::kNotSent) return true;
      return call.method == http::verb::get && call.no_answer == Call::NoAnswer::kCut;
    }
    if (!IsTransient(result.http_status)) return false;
    if (result.http_status == 429 || result.retry_after.count() > 0) return true;
    return call.method == http::verb::get;
  }

  void Record(const std::string& verb, int status, Clock::SteadyTime start) {
    ++stats_.requests;
    deps_.metrics
        .Counter("gpu_node_supervisor_kube_requests_total", "API requests by verb and HTTP status (0: no answer)",
                 {{"verb", verb}, {"code", std::to_string(status)}})
        .Inc();
    const double seconds = std::chrono::duration<double>(deps_.clock.Now() - start).count();
    // Requests (not watches, which stay open): milliseconds, up to the request timeout.
    static constexpr double kBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    deps_.metrics
        .Histogram("gpu_node_supervisor_kube_request_duration_seconds", "API request latency by verb", kBuckets,
                   {{"verb", verb}})
        .Observe(seconds);
  }

  void CountDecodeError(std::string_view what) {
    deps_.metrics
        .Counter("gpu_node_supervisor_kube_decode_errors_total", "Responses or watch lines that could not be decoded",
                 {{"what", std::string(what)}})
        .Inc();
  }

  http::request<http::string_body> BuildRequest(http::verb method, const std::string& target, const std::string& body,
                                                const std::string& content_type, const std::string* agent) {
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, host_header_);
    req.set(http::field::user_agent, agent ? *agent : config_.user_agent);
    req.set(http::field::accept, "application/json");
    if (!token_.empty()) req.set(http::field::authorization, "Bearer " + token_);
    if (!body.empty() || method == http::verb::post || method == http::verb::put || method == http::verb::patch) {
      req.set(http::field::content_type, content_type.empty() ? "application/json" : content_type);
      req.body() = body;
    }
    req.keep_alive(true);
    req.prepare_payload();
    return req;
  }

  asio::awaitable<std::unique_ptr<Conn>> Connect(Clock::SteadyTime deadline, beast::error_code& ec, Watch* watch) {
    (void)deadline;
    tcp::resolver resolver(deps_.loop.Io());
    auto endpoints = co_await resolver.async_resolve(host_, port_, asio::redirect_error(kAwait, ec));
    if (ec || stopped_ || (watch && watch->stopped)) co_return nullptr;
    auto conn = std::make_unique<Conn>(deps_.loop.Io(), ctx_);
    active_.insert(conn.get());
    if (watch) watch->conn = conn.get();
    auto& lowest = beast::get_lowest_layer(conn->stream);
    lowest.expires_after(config_.request_timeout);
    co_await lowest.async_connect(endpoints, asio::redirect_error(kAwait, ec));
    if (!ec) {
      https::PrepareStream(conn->stream, server_);
      co_await conn->stream.async_handshake(ssl::stream_base::client, asio::redirect_error(kAwait, ec));
    }
    active_.erase(conn.get());
    if (watch) watch->conn = nullptr;
    if (ec) co_return nullptr;
    ++stats_.connections_opened;
    co_return conn;
  }

  asio::awaitable<Result> RoundTrip(Call& call) {
    call.no_answer = Call::NoAnswer::kPermanent;
    for (int attempt = 0;; ++attempt) {
      if (stopped_) co_return Result{0, nullptr, "client stopped"};
      beast::error_code ec;
      std::unique_ptr<Conn> conn;
      const bool reused = !idle_.empty();
      if (reused) {
        conn = std::move(idle_.back());
        idle_.pop_back();
      } else {
        conn = co_await Connect(deps_.clock.Now() + config_.request_timeout, ec, nullptr);
        if (!conn) {
          // A certificate the CA does not vouch for stays so: only a refused or reset
          // connection is worth another try.
          call.no_answer = ec.category() == asio::error::get_ssl_category() ? Call::NoAnswer::kPermanent
                                                                           : Call::NoAnswer::kNotSent;
          co_return Result{0, nullptr, stopped_ ? "client stopped" : "connect to " + host_header_ + ": " + Describe(ec)};
        }
      }
      active_.insert(conn.get());
      auto req = BuildRequest(call.method, call.target, call.body, call.content_type, call.agent.get());
      beast::get_lowest_layer(conn->stream).expires_after(config_.request_timeout);
      co_await http::async_write(conn->stream, req, asio::redirect_error(kAwait, ec));
      http::response_parser<http::string_body> parser;
      parser.body_limit(config_.max_response_bytes);
      parser.header_limit(256 * 1024);
      // The header alone first: Beast 1.74's eager parse (async_read) drops the body_limit error
      // of a Content-Length over the limit when body bytes follow the header in the same read,
      // and string_body then reserves the announced length.
      if (!ec) co_await http::async_read_header(conn->stream, conn->buffer, parser, asio::redirect_error(kAwait, ec));
      if (!ec && parser.content_length() && *parser.content_length() > config_.max_response_bytes) {
        ec = http::error::body_limit;
      }
      if (!ec && !parser.is_done()) {
        co_await http::async_read(conn->stream, conn->buffer, parser, asio::redirect_error(kAwait, ec));
      }
      active_.erase(conn.get());
      if (stopped_) co_return Result{0, nullptr, "client stopped"};
      if (ec) {
        CloseConn(*conn);
        // A kept-alive connection the server closed while idle fails before any answer: that
        // request never reached the server, so it is safe to send it once more.
        if (reused && attempt == 0 && !parser.got_some()) continue;
        if (ec == http::error::body_limit) {
          CountDecodeError("too-large");
          co_return Result{0, nullptr, "response larger than " + std::to_string(config_.max_response_bytes) + " bytes"};
        }
        call.no_answer = ec == beast::error::timeout ? Call::NoAnswer::kTimeout : Call::NoAnswer::kCut;
        co_return Result{0, nullptr, Describe(ec)};
      }
      call.no_answer = Call::NoAnswer::kNone;
      auto& res = parser.get();
      if (res.keep_alive() && idle_.size() < config_.max_idle_connections) {
        idle_.push_back(std::move(conn));
      } else {
        CloseConn(*conn);
      }
      co_return Decode(res, call);
    }
  }

  Result Decode(http::response<http::string_body>& res, const Call& call) {
    Result result;
    result.http_status = res.result_int();
    const std::string content_type(res[http::field::content_type]);
    if (result.http_status >= 300 && result.http_status < 400) {
      result.error = "redirect (HTTP " + std::to_string(result.http_status) + ") to \"" +
                     std::string(res[http::field::location]) + "\" not followed";
      return result;
    }
    const bool ok = result.http_status >= 200 && result.http_status < 300;
    if (!res.body().empty()) {
      if (IsJson(content_type)) {
        std::string why;
        result.object = ok && call.decode ? call.decode(res.body(), &why) : ParseJson(res.body(), &why);
        if (result.object.is_discarded()) {
          result.object = nullptr;
          CountDecodeError("json");
          result.error = "malformed JSON in the response: " + why;
          return result;
        }
      } else if (ok) {
        CountDecodeError("content-type");
        result.error = "unexpected content type \"" + content_type + "\"";
        return result;
      }
    }
    if (!ok) {
      result.error = StatusMessage(result.http_status, result.object);
      const auto header = res[http::field::retry_after];
      result.retry_after = RetryAfterOf(std::string_view(header.data(), header.size()), result.object);
    }
    return result;
  }

  // --- watches

  static asio::awaitable<void> RunWatch(std::shared_ptr<Impl> self, std::shared_ptr<Watch> w) {
    std::size_t lines = 0;
    auto end = [&](WatchEnd e) {
      if (w->stopped) return;
      w->stopped = true;
      e.lines = lines;
      auto on_end = std::move(w->callbacks.on_end);
      w->callbacks = {};
      if (self->stopped_ && e.error.empty()) e.error = "client stopped";
      on_end(e);
    };
    const auto start = self->deps_.clock.Now();
    beast::error_code ec;
    auto conn = co_await self->Connect(start + self->config_.request_timeout, ec, w.get());
    if (w->stopped) co_return;
    if (!conn) {
      self->Record("watch", 0, start);
      end(WatchEnd{0, false, false, self->stopped_ ? "client stopped" : "connect: " + Describe(ec), nullptr});
      co_return;
    }
    w->conn = conn.get();
    self->active_.insert(conn.get());
    struct Untrack {
      Impl* impl;
      Watch* w;
      Conn* c;
      ~Untrack() {
        impl->active_.erase(c);
        w->conn = nullptr;
      }
    } untrack{self.get(), w.get(), conn.get()};

    auto& lowest = beast::get_lowest_layer(conn->stream);
    auto req = self->BuildRequest(http::verb::get, w->target, {}, {}, w->agent.get());
    lowest.expires_after(self->config_.request_timeout);
    co_await http::async_write(conn->stream, req, asio::redirect_error(kAwait, ec));
    http::response_parser<http::buffer_body> parser;
    // A watch is an endless body. Not boost::none: Beast 1.74 compares a Content-Length with
    // the optional limit as `len > none`, which is always true (every 410 body fails).
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.header_limit(256 * 1024);
    if (!ec) co_await http::async_read_header(conn->stream, conn->buffer, parser, asio::redirect_error(kAwait, ec));
    if (w->stopped) co_return;
    if (ec) {
      self->Record("watch", 0, start);
      end(WatchEnd{0, false, false, Describe(ec), nullptr});
      co_return;
    }
    const int status = parser.get().result_int();
    self->Record("watch", status, start);
    const std::string content_type(parser.get()[http::field::content_type]);
    std::vector<char> buf(64 * 1024);
    std::string pending;

    if (status != 200) {
      // Collect a bounded Status body to say why.
      while (!parser.is_done() && pending.size() < kStatusBodyLimit) {
        parser.get().body().data = buf.data();
        parser.get().body().size = buf.size();
        lowest.expires_after(self->config_.request_timeout);
        co_await http::async_read(conn->stream, conn->buffer, parser, asio::redirect_error(kAwait, ec));
        if (ec == http::error::need_buffer) ec = {};
        pending.append(buf.data(), buf.size() - parser.get().body().size);
        if (ec || w->stopped) break;
      }
      if (w->stopped) co_return;
      WatchEnd e{status, false, false, {}, nullptr};
      if (IsJson(content_type)) {
        e.status = ParseJson(pending);
        if (e.status.is_discarded()) e.status = nullptr;
      }
      e.error = status >= 300 && status < 400
                    ? "redirect (HTTP " + std::to_string(status) + ") not followed"
                    : StatusMessage(status, e.status);
      const auto header = parser.get()[http::field::retry_after];
      e.retry_after = RetryAfterOf(std::string_view(header.data(), header.size()), e.status);
      // As for requests: the token may have rotated under us; the next attempt sends the
      // file's current one.
      if (status == 401 && !self->config_.token_file.empty()) self->ReadTokenFile();
      CloseConn(*conn);
      end(std::move(e));
      co_return;
    }
    if (!IsJson(content_type)) {
      self->CountDecodeError("content-type");
      CloseConn(*conn);
      end(WatchEnd{200, false, true, "unexpected watch content type \"" + content_type + "\"", nullptr});
      co_return;
    }

    for (;;) {
      parser.get().body().data = buf.data();
      parser.get().body().size = buf.size();
      lowest.expires_after(w->idle_timeout);
      // read_some, not read: async_read would hold lines back until the buffer is full.
      co_await http::async_read_some(conn->stream, conn->buffer, parser, asio::redirect_error(kAwait, ec));
      if (w->stopped) co_return;
      if (ec == http::error::need_buffer) ec = {};
      const std::size_t n = buf.size() - parser.get().body().size;
      // Split into lines; a line may span any number of chunks and reads.
      std::size_t from = 0;
      const char* data = buf.data();
      for (std::size_t i = 0; i < n; ++i) {
        if (data[i] != '\n') continue;
        std::string_view line;
        if (pending.empty()) {
          line = std::string_view(data + from, i - from);
        } else {
          pending.append(data + from, i - from);
          line = pending;
        }
        from = i + 1;
        if (line.size() > self->config_.max_watch_line_bytes) {
          // A whole over-long line can arrive in one read: the same cap as for one still
          // being assembled below.
          self->CountDecodeError("too-large");
          CloseConn(*conn);
          end(WatchEnd{200, false, true,
                       "watch line longer than " + std::to_string(self->config_.max_watch_line_bytes) + " bytes",
                       nullptr});
          co_return;
        }
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (!line.empty()) {
          ++lines;
          w->callbacks.on_line(line);
          if (w->stopped) co_return;
        }
        pending.clear();
      }
      pending.append(data + from, n - from);
      if (pending.size() > self->config_.max_watch_line_bytes) {
        self->CountDecodeError("too-large");
        CloseConn(*conn);
        end(WatchEnd{200, false, true,
                     "watch line longer than " + std::to_string(self->config_.max_watch_line_bytes) + " bytes",
                     nullptr});
        co_return;
      }
      if (ec) {
        CloseConn(*conn);
        end(WatchEnd{200, false, false,
                     ec == beast::error::timeout ? "read idle timeout" : Describe(ec), nullptr});
        co_return;
      }
      if (parser.is_done()) {
        CloseConn(*conn);
        end(WatchEnd{200, pending.empty(), !pending.empty(),
                     pending.empty() ? std::string() : "stream ended inside a line", nullptr});
        co_return;
      }
    }
  }

  void Shutdown() {
    if (stopped_) return;
    stopped_ = true;
    beast::error_code ec;
    limiter_timer_.cancel();
    token_timer_.cancel();
    for (auto* timer : retry_timers_) timer->cancel();
    for (auto& conn : idle_) CloseConn(*conn);
    idle_.clear();
    for (auto* conn : active_) CloseConn(*conn);
    // Queued (rate-limited) requests still complete, with an error.
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& go : waiting) go();
  }

  Deps deps_;
  ClientConfig config_;
  ssl::context ctx_{ssl::context::tls_client};
  https::Url server_;
  std::string host_, port_, host_header_;
  bool host_is_ip_ = false;
  std::string token_;
  std::vector<std::unique_ptr<Conn>> idle_;
  std::set<Conn*> active_;
  bool stopped_ = false;
  double tokens_ = 0;
  Clock::SteadyTime last_refill_;
  std::deque<std::function<void()>> waiting_;
  asio::steady_timer limiter_timer_;
  bool limiter_armed_ = false;
  asio::steady_timer token_timer_;
  std::set<asio::steady_timer*> retry_timers_;  // requests waiting to be retried
  Stats stats_;
};

namespace {

class WatchHandleImpl final : public WatchHandle {
 public:
  WatchHandleImpl(std::shared_ptr<KubeClient::Impl::Watch> w) : w_(std::move(w)) {}
  ~WatchHandleImpl() override { Stop(); }
  void Stop() override {
    if (w_->stopped) return;
    w_->stopped = true;
    // Do not destroy the callbacks here: Stop may be called from inside one of them. The
    // coroutine drops them when it sees the flag.
    if (w_->conn) CloseConn(*w_->conn);
  }

 private:
  std::shared_ptr<KubeClient::Impl::Watch> w_;
};

std::string Join(std::string path, std::string_view query) {
  if (query.empty()) return path;
  return path + (path.find('?') == std::string::npos ? "?" : "&") + std::string(query);
}

}  // namespace

KubeClient::KubeClient(Deps deps, ClientConfig config) : impl_(std::make_shared<Impl>(deps, std::move(config))) {
  impl_->StartTimers();
}

KubeClient::KubeClient(std::shared_ptr<Impl> impl, std::shared_ptr<const std::string> agent)
    : impl_(std::move(impl)), agent_(std::move(agent)), owner_(false) {}

KubeClient::~KubeClient() {
  if (owner_) impl_->Shutdown();
}

std::string KubeClient::ModuleAgent(std::string_view holders) const {
  return impl_->config_.user_agent + "/" + std::string(holders);
}

std::shared_ptr<KubeClient> KubeClient::ForModule(std::string_view module) const {
  return WithAgent(std::make_shared<const std::string>(ModuleAgent(module)));
}

std::shared_ptr<KubeClient> KubeClient::WithAgent(std::shared_ptr<const std::string> agent) const {
  // (The constructor is private: no make_shared.)
  return std::shared_ptr<KubeClient>(new KubeClient(impl_, std::move(agent)));
}

std::string KubeClient::Agent() const { return agent_ ? *agent_ : impl_->config_.user_agent; }

void KubeClient::Shutdown() { impl_->Shutdown(); }
void KubeClient::ReloadToken() { impl_->ReadTokenFile(); }
KubeClient::Stats KubeClient::GetStats() const { return impl_->stats_; }
const Clock& KubeClient::GetClock() const { return impl_->deps_.clock; }
const RetryPolicy& KubeClient::Retry() const { return impl_->config_.retry; }
asio::io_context& KubeClient::Io() const { return impl_->deps_.loop.Io(); }

void KubeClient::Request(std::string_view verb, std::string_view method, std::string target, std::string body,
                         std::string content_type, Callback cb) {
  auto call = std::make_shared<Impl::Call>();
  call->verb = std::string(verb);
  call->method = http::string_to_verb(beast::string_view(method.data(), method.size()));
  call->target = std::move(target);
  call->body = std::move(body);
  call->content_type = std::move(content_type);
  call->cb = std::move(cb);
  call->agent = agent_;
  impl_->Submit(std::move(call));
}

void KubeClient::Get(const std::string& path, Callback cb) { Request("get", "GET", path, {}, {}, std::move(cb)); }

void KubeClient::List(const std::string& path, const ListOptions& options, Callback cb) {
  List(path, options, nullptr, {}, std::move(cb));
}

void KubeClient::List(const std::string& path, const ListOptions& options, const Projection::Node& item_projection,
                      CachedFn cached, Callback cb) {
  List(path, options, std::make_shared<const Projection::Node>(item_projection), std::move(cached), std::move(cb));
}

void KubeClient::List(const std::string& path, const ListOptions& options,
                      std::shared_ptr<const Projection::Node> item_projection, CachedFn cached, Callback cb) {
  struct Pages {
    std::string base;
    nlohmann::json items = nlohmann::json::array();
    std::string resource_version;
    Callback cb;
  };
  auto pages = std::make_shared<Pages>();
  std::string query;
  if (!options.label_selector.empty()) query += "&labelSelector=" + QueryEscape(options.label_selector);
  if (!options.field_selector.empty()) query += "&fieldSelector=" + QueryEscape(options.field_selector);
  if (options.limit > 0) query += "&limit=" + std::to_string(options.limit);
  pages->base = Join(path, query.empty() ? query : std::string_view(query).substr(1));
  pages->cb = std::move(cb);
  auto next = std::make_shared<std::function<void(std::string)>>();
  // `next` refers to itself only through a weak pointer held by the callback chain's captures.
  // Copies of the client's parts, not `this`: a view may be gone before the last page.
  *next = [impl = impl_, agent = agent_, pages, item_projection = std::move(item_projection), cached = std::move(cached),
           weak_next = std::weak_ptr<std::function<void(std::string)>>(next)](std::string token) {
    auto keep = weak_next.lock();
    std::string target = token.empty() ? pages->base : Join(pages->base, "continue=" + QueryEscape(token));
    auto call = std::make_shared<Impl::Call>();
    call->verb = "list";
    call->method = http::verb::get;
    call->target = std::move(target);
    call->agent = agent;
    if (item_projection) {
      call->decode = [item_projection, cached](std::string_view body, std::string* error) {
        return ParseListPage(body, *item_projection, cached, error);
      };
    }
    call->cb = [pages, keep, impl](Result r) {
      if (!r.Ok()) {
        pages->cb(std::move(r));
        return;
      }
      auto& object = r.object;
      const auto items = object.find("items");
      const auto meta = object.find("metadata");
      if (!object.is_object() || items == object.end() || !(items->is_array() || items->is_null()) ||
          meta == object.end() || !meta->is_object()) {
        impl->CountDecodeError("list");
        pages->cb(Result{r.http_status, nullptr, "list response without items or metadata"});
        return;
      }
      // Absent or null: empty. Anything else but a string is a malformed list (json::value
      // would throw, and a throw here would end the request without a callback).
      auto text = [&](const char* key) -> std::optional<std::string> {
        const auto it = meta->find(key);
        if (it == meta->end() || it->is_null()) return std::string();
        if (!it->is_string()) return std::nullopt;
        return it->get<std::string>();
      };
      const auto rv = text("resourceVersion");
      const auto cont_text = text("continue");
      if (!rv || !cont_text) {
        impl->CountDecodeError("list");
        pages->cb(Result{r.http_status, nullptr, "list metadata with a resourceVersion or continue that is not a string"});
        return;
      }
      if (items->is_array()) {
        for (auto& item : *items) pages->items.push_back(std::move(item));
      }
      if (pages->resource_version.empty()) pages->resource_version = *rv;
      const std::string cont = *cont_text;
      if (!cont.empty()) {
        (*keep)(cont);
        return;
      }
      nlohmann::json out = {{"metadata", {{"resourceVersion", pages->resource_version}}}, {"items", std::move(pages->items)}};
      pages->cb(Result{r.http_status, std::move(out), {}});
    };
    impl->Submit(std::move(call));
  };
  (*next)({});
}

void KubeClient::Create(const std::string& collection_path, const nlohmann::json& object, Callback cb) {
  Request("create", "POST", collection_path, object.dump(), "application/json", std::move(cb));
}

void KubeClient::Update(const std::string& path, const nlohmann::json& object, Callback cb) {
  Request("update", "PUT", path, object.dump(), "application/json", std::move(cb));
}

void KubeClient::Patch(const std::string& path, PatchType type, const nlohmann::json& body,
                       const std::string& field_manager, Callback cb, bool force) {
  std::string content_type = type == PatchType::kMerge  ? "application/merge-patch+json"
                             : type == PatchType::kJson ? "application/json-patch+json"
                                                        : "application/apply-patch+yaml";
  if (type == PatchType::kApply && field_manager.empty()) {
    impl_->deps_.loop.Post([cb = std::move(cb)] { cb(Result{0, nullptr, "server-side apply needs a field manager"}); });
    return;
  }
  std::string query;
  if (!field_manager.empty()) query = "fieldManager=" + QueryEscape(field_manager);
  if (type == PatchType::kApply && force) query += "&force=true";
  Request(type == PatchType::kApply ? "apply" : "patch", "PATCH", Join(path, query), body.dump(), content_type,
          std::move(cb));
}

void KubeClient::Delete(const std::string& path, const Preconditions& preconditions, Callback cb) {
  std::string body;
  if (!preconditions.uid.empty() || !preconditions.resource_version.empty()) {
    nlohmann::json options = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}, {"preconditions", nlohmann::json::object()}};
    if (!preconditions.uid.empty()) options["preconditions"]["uid"] = preconditions.uid;
    if (!preconditions.resource_version.empty()) {
      options["preconditions"]["resourceVersion"] = preconditions.resource_version;
    }
    body = options.dump();
  }
  std::string content_type = body.empty() ? std::string() : "application/json";
  Request("delete", "DELETE", path, std::move(body), std::move(content_type), std::move(cb));
}

void KubeClient::UpdateStatus(const std::string& path, const nlohmann::json& object, Callback cb) {
  Update(path + "/status", object, std::move(cb));
}

void KubeClient::PatchStatus(const std::string& path, PatchType type, const nlohmann::json& body,
                             const std::string& field_manager, Callback cb, bool force) {
  Patch(path + "/status", type, body, field_manager, std::move(cb), force);
}

std::unique_ptr<WatchHandle> KubeClient::Watch(const std::string& collection_path, const WatchOptions& options,
                                               WatchCallbacks callbacks) {
  auto w = std::make_shared<Impl::Watch>();
  w->callbacks = std::move(callbacks);
  w->idle_timeout = options.idle_timeout;
  w->agent = agent_;
  std::string query = "watch=1";
  if (options.bookmarks) query += "&allowWatchBookmarks=true";
  if (!options.resource_version.empty()) query += "&resourceVersion=" + QueryEscape(options.resource_version);
  if (!options.label_selector.empty()) query += "&labelSelector=" + QueryEscape(options.label_selector);
  if (!options.field_selector.empty()) query += "&fieldSelector=" + QueryEscape(options.field_selector);
  if (options.timeout_seconds > 0) query += "&timeoutSeconds=" + std::to_string(options.timeout_seconds);
  w->target = Join(collection_path, query);
  auto impl = impl_;
  if (impl->stopped_) {
    impl->deps_.loop.Post([w] {
      if (w->stopped) return;
      w->stopped = true;
      w->callbacks.on_end(WatchEnd{0, false, false, "client stopped", nullptr});
    });
  } else {
    impl->Admit([impl, w] {
      if (w->stopped) return;
      asio::co_spawn(impl->deps_.loop.Io(), Impl::RunWatch(impl, w), asio::detached);
    });
  }
  return std::make_unique<WatchHandleImpl>(std::move(w));
}

}  // namespace gns::kube
