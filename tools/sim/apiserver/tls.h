// A throwaway certificate authority for the simulator, made with the OpenSSL 3 API at start:
// an EC P-256 CA, a server certificate (SAN IP 127.0.0.1, ::1, DNS localhost) and a client
// certificate, both signed by it. Everything is PEM text.
#pragma once

#include <string>
#include <vector>

namespace gns::sim::api {

struct TlsMaterial {
  std::string ca_cert_pem;
  std::string server_cert_pem;
  std::string server_key_pem;
  std::string client_cert_pem;  // CN=gns-sim-client, O=system:masters
  std::string client_key_pem;
};

// Throws std::runtime_error with the OpenSSL error text on failure.
TlsMaterial GenerateTlsMaterial(const std::vector<std::string>& extra_ip_sans = {});

}  // namespace gns::sim::api
