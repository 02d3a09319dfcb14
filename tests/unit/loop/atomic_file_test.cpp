// Atomic file replacement: content, exact mode, no temp files left, clear errors.
#include "loop/atomic_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <sys/stat.h>

namespace gns {
namespace {

namespace fs = std::filesystem;

TEST(AtomicFile, WritesReplacesAndKeepsTheModeTight) {
  const auto dir = fs::temp_directory_path() / ("gns-atomic-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = (dir / "state.json").string();
  ASSERT_TRUE(WriteFileAtomically(path, "first", 0600));
  ASSERT_TRUE(WriteFileAtomically(path, "second", 0600));
  std::string content, error;
  ASSERT_TRUE(ReadWholeFile(path, content, error)) << error;
  EXPECT_EQ(content, "second");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // no temp file left
  fs::remove_all(dir);
}

TEST(AtomicFile, MissingDirectoryIsAnErrorNamingThePath) {
  const auto result = WriteFileAtomically("/nonexistent-gns-dir/x.json", "x");
  EXPECT_FALSE(result);
  EXPECT_EQ(result.error.rfind("create temp file: /nonexistent-gns-dir/x.json.tmp.", 0), 0u) << result.error;
  EXPECT_NE(result.error.find("No such file or directory"), std::string::npos);
}

}  // namespace
}  // namespace gns
