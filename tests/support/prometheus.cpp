// Prometheus text parser for tests.
#include "support/prometheus.hpp"

#include <cstdlib>
#include <regex>
#include <set>
#include <sstream>

namespace gns::test {

double PrometheusScrape::Value(const std::string& series) const {
  const auto it = samples.find(series);
  if (it == samples.end()) throw std::runtime_error("no series " + series);
  return it->second;
}

PrometheusScrape ParsePrometheus(const std::string& text) {
  static const std::regex kSample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*)?\})? ([-+]?([0-9.]+([eE][-+]?[0-9]+)?|Inf|NaN))$)");
  static const std::regex kHelp(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$)");
  static const std::regex kType(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  PrometheusScrape out;
  std::set<std::string> closed;
  std::string current;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::smatch m;
    auto fail = [&](const std::string& why) {
      throw std::runtime_error("line " + std::to_string(number) + ": " + why + ": " + line);
    };
    if (line.empty()) continue;
    if (std::regex_match(line, m, kHelp)) continue;
    if (std::regex_match(line, m, kType)) {
      const std::string family = m[1];
      if (closed.count(family) || out.types.count(family)) fail("family declared twice");
      if (!current.empty()) closed.insert(current);
      current = family;
      out.types[family] = m[2];
      continue;
    }
    if (line[0] == '#') fail("unexpected comment");
    if (!std::regex_match(line, m, kSample)) fail("malformed sample");
    const std::string name = m[1];
    if (name != current) fail("sample outside its family's block (TYPE " + current + ")");
    const std::string series = name + std::string(m[2]);
    if (out.samples.count(series)) fail("duplicate series");
    out.samples[series] = std::strtod(std::string(m[7]).c_str(), nullptr);
  }
  return out;
}

}  // namespace gns::test
