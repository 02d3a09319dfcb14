// Prometheus text parser for tests.
#include "support/prometheus.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>

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
    // A histogram's samples are <family>_bucket, _sum and _count; a summary's _sum and _count.
    const std::string& type = current.empty() ? current : out.types[current];
    const bool histogram_part = (type == "histogram" && name == current + "_bucket") ||
                                ((type == "histogram" || type == "summary") &&
                                 (name == current + "_sum" || name == current + "_count"));
    if (name != current && !histogram_part) fail("sample outside its family's block (TYPE " + current + ")");
    const std::string series = name + std::string(m[2]);
    if (out.samples.count(series)) fail("duplicate series");
    out.samples[series] = std::strtod(std::string(m[7]).c_str(), nullptr);
  }
  return out;
}

std::string PromtoolPath() {
  const char* path = std::getenv("GNS_PROMTOOL");
  if (path == nullptr || *path == '\0' || access(path, X_OK) != 0) return {};
  return path;
}

bool PromtoolOptedOut() {
  const char* opt_out = std::getenv("GNS_ALLOW_NO_PROMTOOL");
  return opt_out != nullptr && std::string_view(opt_out) == "1";
}

PromtoolResult PromtoolCheckMetrics(const std::string& promtool, const std::string& text) {
  char file[] = "/tmp/gns-promtool-XXXXXX";
  const int fd = mkstemp(file);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  close(fd);
  std::ofstream(file) << text;
  const std::string command = promtool + " check metrics < " + file + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  PromtoolResult result;
  if (pipe != nullptr) {
    char buf[512];
    while (fgets(buf, sizeof buf, pipe) != nullptr) result.output += buf;
    const int status = pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::remove(file);
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  return result;
}

}  // namespace gns::test
