// HTTP/1.1 server for the metrics and health endpoints.
#include "modules/metrics/http_server.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <list>

namespace gns::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpServer::State {
  State(asio::io_context& io_, HttpServerOptions o, Handler h, std::shared_ptr<spdlog::logger> l)
      : io(io_), options(std::move(o)), handler(std::move(h)), log(std::move(l)), acceptor(io_) {}

  asio::io_context& io;
  HttpServerOptions options;
  Handler handler;
  std::shared_ptr<spdlog::logger> log;
  tcp::acceptor acceptor;
  std::list<beast::tcp_stream*> connections;
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
  auto self = state->connections.insert(state->connections.end(), &stream);
  beast::flat_buffer buffer;
  beast::error_code ec;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(state->options.max_header_bytes));
    parser.body_limit(state->options.max_body_bytes);
    stream.expires_after(state->options.read_timeout);
    co_await http::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
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
  state->connections.erase(self);
  state->MaybeIdle();
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
    if (state->connections.size() >= state->options.max_connections) {
      state->log->warn("connection limit ({}) reached; refusing a client", state->options.max_connections);
      socket.close(ec);
      continue;
    }
    asio::co_spawn(state->io, Serve(state, std::move(socket)), asio::detached);
  }
  state->accepting = false;
  state->MaybeIdle();
}

}  // namespace

HttpServer::HttpServer(asio::io_context& io, HttpServerOptions options, Handler handler,
                       std::shared_ptr<spdlog::logger> log)
    : state_(std::make_shared<State>(io, std::move(options), std::move(handler), std::move(log))) {}

HttpServer::~HttpServer() {
  state_->stopped = true;
  state_->handler = [](const HttpRequest&) { return Error(503, "stopping\n"); };
  beast::error_code ec;
  state_->acceptor.close(ec);
  for (auto* c : state_->connections) c->socket().close(ec);
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
  for (auto* c : state_->connections) c->socket().close(ec);
  // If nothing was ever started the state is already idle.
  asio::post(state_->io, [state = state_] { state->MaybeIdle(); });
}

std::size_t HttpServer::OpenConnections() const { return state_->connections.size(); }

}  // namespace gns::metrics
