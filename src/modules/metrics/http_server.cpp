// HTTP/1.1 server for the metrics and health endpoints.
#include "modules/metrics/http_server.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "loop/rate_limited_log.hpp"

#include <list>

namespace gns::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpServer::State {
  State(asio::io_context& io_, const Clock& c, HttpServerOptions o, Handler h, std::shared_ptr<spdlog::logger> l)
      : io(io_), clock(c), options(std::move(o)), handler(std::move(h)), log(std::move(l)), acceptor(io_), warn(c) {}

  struct Connection {
    beast::tcp_stream* stream = nullptr;
    bool waiting = false;  // for (the rest of) a request: may be closed to make room
    Clock::SteadyTime waiting_since{};
    bool evicted = false;  // closed to make room; its coroutine is unwinding
  };

  asio::io_context& io;
  const Clock& clock;
  HttpServerOptions options;
  Handler handler;
  std::shared_ptr<spdlog::logger> log;
  tcp::acceptor acceptor;
  std::list<Connection> connections;
  std::size_t live = 0;  // connections not evicted
  uint64_t evicted = 0;
  uint64_t refused = 0;
  RateLimitedLog warn;
  bool stopped = false;
  bool accepting = false;
  std::function<void()> on_idle;

  void MaybeIdle() {
    if (stopped && !accepting && connections.empty() && on_idle) {
      auto done = std::move(on_idle);
      on_idle = nullptr;
      done();
    }
  }
};

namespace {

HttpResponse Error(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

asio::awaitable<void> Serve(std::shared_ptr<HttpServer::State> state, tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  auto self = state->connections.insert(state->connections.end(), HttpServer::State::Connection{&stream});
  ++state->live;
  beast::flat_buffer buffer;
  beast::error_code ec;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(state->options.max_header_bytes));
    parser.body_limit(state->options.max_body_bytes);
    stream.expires_after(state->options.read_timeout);
    self->waiting = true;
    self->waiting_since = state->clock.Now();
    co_await http::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    self->waiting = false;
    if (self->evicted) break;
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted || ec == beast::error::timeout ||
        ec == asio::error::connection_reset || ec == asio::error::eof || state->stopped) {
      break;
    }
    HttpResponse response;
    bool keep_alive = false;
    unsigned version = 11;
    if (ec) {
      // A request we cannot parse: say so once and drop the connection.
      response = Error(ec == http::error::body_limit ? 413 : ec == http::error::header_limit ? 431 : 400,
                       "bad request: " + ec.message() + "\n");
    } else {
      const auto& req = parser.get();
      keep_alive = req.keep_alive();
      version = req.version();
      HttpRequest request;
      request.method = std::string(req.method_string());
      request.target = std::string(req.target());
      request.path = request.target.substr(0, request.target.find('?'));
      request.body = req.body();
      try {
        response = state->handler(request);
      } catch (const std::exception& e) {
        state->log->error("handler for {} threw: {}", request.path, e.what());
        response = Error(500, "internal error\n");
      }
      if (request.method == "HEAD") response.body.clear();
    }
    http::response<http::string_body> res{static_cast<http::status>(response.status), version};
    res.set(http::field::server, "gpu-node-supervisor");
    res.set(http::field::content_type, response.content_type);
    for (const auto& [k, v] : response.headers) res.set(k, v);
    res.keep_alive(keep_alive);
    res.body() = std::move(response.body);
    res.prepare_payload();
    stream.expires_after(state->options.read_timeout);
    co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
    if (ec || !keep_alive || state->stopped) break;
  }
  // Shutdown errors are expected here (peer gone, socket already closed by Stop).
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.close();
  if (!self->evicted) --state->live;
  state->connections.erase(self);
  state->MaybeIdle();
}

// At the cap: closes the connection that has waited longest for a request, so a new client (a
// kubelet probe) is served however many idle or dribbling clients hold the rest. False when every
// connection is busy answering (they finish quickly: the handlers do not block).
bool MakeRoom(HttpServer::State& state) {
  HttpServer::State::Connection* oldest = nullptr;
  for (auto& c : state.connections) {
    if (c.evicted || !c.waiting) continue;
    if (oldest == nullptr || c.waiting_since < oldest->waiting_since) oldest = &c;
  }
  if (oldest == nullptr) return false;
  oldest->evicted = true;
  --state.live;
  ++state.evicted;
  beast::error_code ec;  // the peer may be gone already: closed either way
  oldest->stream->socket().shutdown(tcp::socket::shutdown_both, ec);
  oldest->stream->socket().close(ec);
  state.warn.Warn(*state.log, "connection_evicted",
                  "connection limit (" + std::to_string(state.options.max_connections) +
                      ") reached; closed the connection that waited longest for a request");
  return true;
}

asio::awaitable<void> Accept(std::shared_ptr<HttpServer::State> state) {
  state->accepting = true;
  for (;;) {
    beast::error_code ec;
    tcp::socket socket(state->io);
    co_await state->acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (state->stopped) break;
    if (ec) {
      // EMFILE and friends: back off briefly instead of spinning on accept.
      state->log->warn("accept failed: {}", ec.message());
      asio::steady_timer pause(state->io, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (state->stopped) break;
      continue;
    }
    if (state->live >= state->options.max_connections && !MakeRoom(*state)) {
      ++state->refused;
      state->warn.Warn(*state->log, "connection_refused",
                       "connection limit (" + std::to_string(state->options.max_connections) +
                           ") reached with every connection busy; refusing a client");
      socket.close(ec);
      continue;
    }
    asio::co_spawn(state->io, Serve(state, std::move(socket)), asio::detached);
  }
  state->accepting = false;
  state->MaybeIdle();
}

}  // namespace

HttpServer::HttpServer(asio::io_context& io, const Clock& clock, HttpServerOptions options, Handler handler,
                       std::shared_ptr<spdlog::logger> log)
    : state_(std::make_shared<State>(io, clock, std::move(options), std::move(handler), std::move(log))) {}

HttpServer::~HttpServer() {
  state_->stopped = true;
  state_->handler = [](const HttpRequest&) { return Error(503, "stopping\n"); };
  beast::error_code ec;
  state_->acceptor.close(ec);
  for (auto& c : state_->connections) c.stream->socket().close(ec);
}

tcp::endpoint HttpServer::Start() {
  auto& acceptor = state_->acceptor;
  const auto& ep = state_->options.listen;
  acceptor.open(ep.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.bind(ep);
  acceptor.listen(asio::socket_base::max_listen_connections);
  asio::co_spawn(state_->io, Accept(state_), asio::detached);
  return acceptor.local_endpoint();
}

void HttpServer::Stop(std::function<void()> done) {
  state_->stopped = true;
  state_->on_idle = std::move(done);
  beast::error_code ec;
  state_->acceptor.close(ec);  // wakes the accept loop with operation_aborted
  for (auto& c : state_->connections) c.stream->socket().close(ec);
  // If nothing was ever started the state is already idle.
  asio::post(state_->io, [state = state_] { state->MaybeIdle(); });
}

std::size_t HttpServer::OpenConnections() const { return state_->connections.size(); }
uint64_t HttpServer::Evicted() const { return state_->evicted; }
uint64_t HttpServer::Refused() const { return state_->refused; }

}  // namespace gns::metrics
