#pragma once
// What every integration test needs to start the real binary and find its files: the paths ctest
// passes in the environment (cmake/GnsTests.cmake) and the port a started process logs. One
// definition for all of them: the files of tests/integration are compiled as one unit.
#include <cstdlib>
#include <regex>
#include <string>

namespace gns {

// The supervisor under test (GNS_SUPERVISOR_BIN).
inline std::string Binary() { return std::getenv("GNS_SUPERVISOR_BIN"); }
// A file of the repository / of the build tree, by its path relative to the top.
inline std::string Source(const std::string& rel) { return std::string(std::getenv("GNS_SOURCE_DIR")) + "/" + rel; }
inline std::string Built(const std::string& rel) { return std::string(std::getenv("GNS_BINARY_DIR")) + "/" + rel; }

// The port of the first http://127.0.0.1:<port> in a log line; 0 when there is none.
inline unsigned short PortIn(const std::string& line) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) return 0;
  return static_cast<unsigned short>(std::stoi(m[1]));
}

}  // namespace gns
