// Temporary directories for tests.
#include "support/temp_dir.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace gns::test {

std::filesystem::path MakeTempDir(std::string_view prefix) {
  std::string pattern = "/tmp/" + std::string(prefix) + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  }
  return pattern;
}

TempDir::TempDir(std::string_view prefix) : path_(MakeTempDir(prefix)) {}

TempDir::~TempDir() {
  std::error_code ignored;  // best effort: a leftover temp dir must not fail the test
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace gns::test
