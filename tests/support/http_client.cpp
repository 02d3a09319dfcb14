// Test HTTP client.
#include "support/http_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace gns::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

HttpResult HttpRequest(const std::string& host, unsigned short port, const std::string& method,
                       const std::string& target, const std::string& body) {
  HttpResult result;
  try {
    asio::io_context io;
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(10));
    stream.connect(tcp::endpoint(asio::ip::make_address(host), port));
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, host);
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    result.status = static_cast<int>(res.result_int());
    for (const auto& field : res) result.headers[std::string(field.name_string())] = std::string(field.value());
    result.body = res.body();
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);  // peer may be gone already
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

std::string RawExchange(const std::string& host, unsigned short port, const std::string& bytes) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::seconds(5));
  stream.connect(tcp::endpoint(asio::ip::make_address(host), port));
  asio::write(stream.socket(), asio::buffer(bytes));
  std::string out;
  char buf[4096];
  beast::error_code ec;
  for (;;) {
    const auto n = stream.read_some(asio::buffer(buf), ec);
    out.append(buf, n);
    if (ec) break;
  }
  return out;
}

}  // namespace gns::test
