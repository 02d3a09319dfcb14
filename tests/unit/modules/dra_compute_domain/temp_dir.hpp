#pragma once
// A private directory under /tmp for one test, removed with everything in it. Short on purpose:
// unix socket paths must fit in 108 bytes.

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace gns::dra::test {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/gdra-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;  // best effort: a leftover temp dir must not fail the test
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& Path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace gns::dra::test
