// Shared pieces of the process's HTTPS clients (see https.hpp).
#include "loop/https.hpp"

#include <boost/asio/error.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/error.hpp>

#include <stdexcept>

namespace gns::https {

Url Url::Parse(std::string_view url) {
  const std::string whole(url);
  if (url.rfind("https://", 0) != 0) throw std::runtime_error("URL must be https://, got \"" + whole + "\"");
  url.remove_prefix(8);
  Url out;
  std::string_view authority = url;
  if (const auto slash = url.find('/'); slash != std::string_view::npos) {
    authority = url.substr(0, slash);
    out.target = std::string(url.substr(slash));
  } else {
    out.target = "/";
  }
  if (authority.find('@') != std::string_view::npos) throw std::runtime_error("URL with user info: \"" + whole + "\"");
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) throw std::runtime_error("bad URL " + whole);
    out.host = std::string(authority.substr(1, close - 1));
    authority.remove_prefix(close + 1);
    if (!authority.empty() && authority.front() != ':') throw std::runtime_error("bad URL " + whole);
    out.port = authority.size() > 1 ? std::string(authority.substr(1)) : "443";
  } else {
    const auto colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    out.port = colon == std::string_view::npos ? "443" : std::string(authority.substr(colon + 1));
  }
  if (out.host.empty() || out.port.empty() || out.port.find_first_not_of("0123456789") != std::string::npos) {
    throw std::runtime_error("bad URL " + whole);
  }
  boost::system::error_code ec;
  boost::asio::ip::make_address(out.host, ec);
  out.host_is_ip = !ec;
  out.host_header = out.host_is_ip && out.host.find(':') != std::string::npos ? "[" + out.host + "]:" + out.port
                                                                                : out.host + ":" + out.port;
  return out;
}

void ConfigureClientContext(boost::asio::ssl::context& ctx, const std::string& ca_pem, bool allow_system_roots) {
  namespace ssl = boost::asio::ssl;
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                  ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  ctx.set_verify_mode(ssl::verify_peer);
  // A connection that waits (a watch, an idle keep-alive one) gives its TLS read and write
  // buffers back instead of holding ~34 KiB each; they are taken again with the next record.
  SSL_CTX_set_mode(ctx.native_handle(), SSL_MODE_RELEASE_BUFFERS);
  boost::system::error_code ec;
  if (!ca_pem.empty()) {
    ctx.add_certificate_authority(boost::asio::buffer(ca_pem), ec);
    if (ec) throw std::runtime_error("CA certificate: " + Describe(ec));
  } else if (allow_system_roots) {
    ctx.set_default_verify_paths(ec);
    if (ec) throw std::runtime_error("system trust store: " + Describe(ec));
  } else {
    throw std::runtime_error("no CA certificate: server verification cannot be disabled");
  }
}

std::string Describe(const boost::system::error_code& ec) {
  if (ec == boost::beast::error::timeout) return "deadline exceeded";
  if (ec.category() == boost::asio::error::get_ssl_category()) return "TLS: " + ec.message();
  return ec.message();
}

}  // namespace gns::https
