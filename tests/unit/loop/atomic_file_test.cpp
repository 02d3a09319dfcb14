// Atomic file replacement: content, exact mode, no temp files left, clear errors.
#include "loop/atomic_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

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

TEST(AtomicFile, TempNamesRoundTripAndOnlyThatShapeParses) {
  const auto name = AtomicWriteTempName("checkpoint.json", 4242, 17);
  EXPECT_EQ(name, "checkpoint.json.tmp.4242.17");
  const auto temp = ParseAtomicWriteTemp(name);
  ASSERT_TRUE(temp);
  EXPECT_EQ(temp->target, "checkpoint.json");
  EXPECT_EQ(temp->pid, 4242);
  EXPECT_EQ(ParseAtomicWriteTemp("a.b.tmp.1.0")->target, "a.b");
  for (const char* other : {"checkpoint.json", "checkpoint.json.tmp", "x.tmp.1", "x.tmp.1.", "x.tmp..3", "x.tmp.a.3",
                            "x.tmp.1.3b", ".tmp.1.2", "x.tmpl.1.2", "x.json.tmp-1-2", "x.tmp.-1.2"}) {
    EXPECT_FALSE(ParseAtomicWriteTemp(other)) << other;
  }
}

TEST(AtomicFile, InterruptedWritesAreRemovedAndNothingElse) {
  const auto dir = fs::temp_directory_path() / ("gns-sweep-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "module");
  auto touch = [&](const fs::path& p) { std::ofstream(p) << "x"; };
  touch(dir / "cursor.txt.tmp.99999.12");                      // ours, a dead writer
  touch(dir / "module" / "checkpoint.json.tmp.1234.5");        // ours, in a subdirectory
  touch(dir / "cursor.txt");                                   // a real file
  touch(dir / "notes.tmp");                                    // not our shape
  touch(dir / ("live.json.tmp." + std::to_string(::getpid()) + ".7"));  // this process's, in flight
  fs::create_directories(dir / "dir.tmp.1.2");                  // a directory of that name: kept
  fs::create_symlink(dir / "cursor.txt", dir / "link.tmp.1.2");  // not a regular file: kept

  const auto flat = RemoveInterruptedWrites(dir.string(), false, [](std::string_view) { return true; });
  EXPECT_TRUE(flat.errors.empty());
  EXPECT_EQ(flat.removed, std::vector<std::string>{(dir / "cursor.txt.tmp.99999.12").string()});
  EXPECT_TRUE(fs::exists(dir / "module" / "checkpoint.json.tmp.1234.5"));

  // `ours` decides by the target's name.
  auto only_cursor = RemoveInterruptedWrites(dir.string(), true, [](std::string_view t) { return t == "cursor.txt"; });
  EXPECT_TRUE(only_cursor.removed.empty());
  const auto deep = RemoveInterruptedWrites(dir.string(), true, [](std::string_view) { return true; });
  EXPECT_EQ(deep.removed, std::vector<std::string>{(dir / "module" / "checkpoint.json.tmp.1234.5").string()});
  for (const char* kept : {"cursor.txt", "notes.tmp", "dir.tmp.1.2", "link.tmp.1.2"}) {
    EXPECT_TRUE(fs::exists(fs::symlink_status(dir / kept))) << kept;
  }
  EXPECT_TRUE(fs::exists(dir / ("live.json.tmp." + std::to_string(::getpid()) + ".7")));
  EXPECT_TRUE(RemoveInterruptedWrites((dir / "missing").string(), true, [](std::string_view) { return true; })
                  .errors.empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gns
