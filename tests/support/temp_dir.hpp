#pragma once
// A private directory for one test under /tmp, made by mkdtemp (unique, mode 0700). Kept short
// on purpose: unix socket paths made under it must fit in 108 bytes.

#include <filesystem>
#include <string>
#include <string_view>

namespace gns::test {

// Makes /tmp/<prefix>-XXXXXX and returns it; the caller removes it. Throws std::runtime_error.
std::filesystem::path MakeTempDir(std::string_view prefix = "gns");

// The same directory, removed with everything in it when the object dies.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "gns");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& Path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace gns::test
