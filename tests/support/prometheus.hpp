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

// promtool (issue 29): the path CMake found (GNS_PROMTOOL in the test's environment, from
// tools/install-deps.sh), or empty. A test that needs it fails when it is empty, unless
// PromtoolOptedOut() (GNS_ALLOW_NO_PROMTOOL=1): then it skips, knowingly.
std::string PromtoolPath();
bool PromtoolOptedOut();
struct PromtoolResult {
  int exit_code = -1;  // 0 clean, 3 lint problems, 1 a parse error
  std::string output;  // one problem per line
};
// `promtool check metrics` on `text`.
PromtoolResult PromtoolCheckMetrics(const std::string& promtool, const std::string& text);

// In a gtest: `GNS_REQUIRE_PROMTOOL(path);` declares `path` or fails/skips the test.
#define GNS_REQUIRE_PROMTOOL(path)                                                                         \
  const std::string path = ::gns::test::PromtoolPath();                                                    \
  if (path.empty()) {                                                                                      \
    if (::gns::test::PromtoolOptedOut()) GTEST_SKIP() << "promtool not found; GNS_ALLOW_NO_PROMTOOL=1";   \
    FAIL() << "promtool not found (GNS_PROMTOOL): run tools/install-deps.sh and re-run cmake, or set "     \
              "GNS_ALLOW_NO_PROMTOOL=1 to skip knowingly";                                                 \
  }

}  // namespace gns::test
