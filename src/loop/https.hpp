#pragma once
// What every HTTPS client of the process shares (the kube API client, the gkm-agent's OCI
// registry client): parsing an https:// URL into host, port and Host header; a TLS client
// context that always verifies the peer; SNI and host-name verification on a stream; and one
// wording of network errors. Kept apart from gns_loop so that only the users of TLS link it.

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/system/error_code.hpp>

#include <string>
#include <string_view>

namespace gns::https {

struct Url {
  std::string host;         // without brackets for IPv6
  std::string port;         // "443" when absent
  std::string host_header;  // "host:port" ("[v6]:port")
  bool host_is_ip = false;
  std::string target;  // path + query, "/" when absent
  // Throws std::runtime_error naming the URL for anything but https://host[:port][/path].
  static Url Parse(std::string_view url);
};

// A TLS 1.2+ client context that verifies the peer: with `ca_pem` as the only trust anchors
// when given, else the system's default trust store. Throws std::runtime_error for a bad PEM.
void ConfigureClientContext(boost::asio::ssl::context& ctx, const std::string& ca_pem, bool allow_system_roots);

// SNI (host names only) and host-name verification on one connection, before its handshake.
template <typename SslStream>
void PrepareStream(SslStream& stream, const Url& url) {
  if (!url.host_is_ip) SSL_set_tlsext_host_name(stream.native_handle(), url.host.c_str());
  stream.set_verify_mode(boost::asio::ssl::verify_peer);
  stream.set_verify_callback(boost::asio::ssl::host_name_verification(url.host));
}

// "deadline exceeded", "TLS: …", or the error's message.
std::string Describe(const boost::system::error_code& ec);

}  // namespace gns::https
