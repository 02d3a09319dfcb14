#pragma once
// A small HTTP/1.1 server on the loop (Beast, C++20 coroutines): keep-alive, a read timeout on
// every request, header and body limits, a connection cap. Malformed requests get 400 and the
// connection is closed; nothing a client sends can take the process down.
// A crowd cannot starve a probe: at the cap, a new client takes the place of the connection that
// has waited longest for a request (idle keep-alives, slowloris dribblers), closed at once; only
// when every connection is busy answering is the new one refused. Evictions and refusals are
// counted and logged at most once a minute.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "loop/clock.hpp"

#include <spdlog/logger.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace gns::metrics {

struct HttpRequest {
  std::string method;  // "GET"
  std::string target;  // "/metrics?x=1"
  std::string path;    // "/metrics"
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::map<std::string, std::string> headers;
};

struct HttpServerOptions {
  boost::asio::ip::tcp::endpoint listen;
  std::chrono::milliseconds read_timeout{10000};
  std::size_t max_connections = 64;
  std::size_t max_body_bytes = 8192;
  std::size_t max_header_bytes = 8192;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer(boost::asio::io_context& io, const Clock& clock, HttpServerOptions options, Handler handler,
             std::shared_ptr<spdlog::logger> log);
  ~HttpServer();

  // Binds and starts accepting; throws std::system_error if the address cannot be bound.
  boost::asio::ip::tcp::endpoint Start();
  // Closes the listener and every connection; `done` runs on the loop once all are gone.
  void Stop(std::function<void()> done);

  std::size_t OpenConnections() const;
  // Connections closed to make room for a new one, and new ones refused (every one busy).
  uint64_t Evicted() const;
  uint64_t Refused() const;

  // Shared by the accept loop and the connection coroutines, which may outlive the server.
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace gns::metrics
