#pragma once
// Blocking HTTP/1.1 client for tests (Beast over plain TCP). Call it from a thread other
// than the one turning the loop that serves the request.

#include <map>
#include <string>

namespace gns::test {

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  std::string error;  // transport failure, if any
};

HttpResult HttpRequest(const std::string& host, unsigned short port, const std::string& method,
                       const std::string& target, const std::string& body = {});

// Sends raw bytes and returns whatever comes back until the peer closes (or 5 s pass).
std::string RawExchange(const std::string& host, unsigned short port, const std::string& bytes);

}  // namespace gns::test
