#pragma once
// A strict reader of the Prometheus text exposition format for tests: every line must be a
// HELP/TYPE comment or `name{labels} value`, TYPE must precede a family's samples, and each
// family appears in one block.

#include <map>
#include <stdexcept>
#include <string>

namespace gns::test {

struct PrometheusScrape {
  std::map<std::string, std::string> types;  // family → counter|gauge|…
  std::map<std::string, double> samples;     // `name{labels}` exactly as written → value
  double Value(const std::string& series) const;
};

// Throws std::runtime_error naming the offending line.
PrometheusScrape ParsePrometheus(const std::string& text);

}  // namespace gns::test
