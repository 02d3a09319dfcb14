// The on-disk queue: round trip, order, removal, damage moved aside, interrupted writes.
#include "modules/nvsentinel_export/event_store.hpp"

#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace gns::nvsentinel_export {
namespace {

namespace fs = std::filesystem;

StoredEvent Event(uint64_t seq, std::string id, std::string payload) { return StoredEvent{seq, std::move(id), std::move(payload)}; }

TEST(EventStoreTest, EncodeDecodeRoundTripAndChecksum) {
  const StoredEvent e = Event(7, "abc-1", std::string("pay\nload\0x", 10));
  std::string error;
  const auto bytes = EncodeStoredEvent(e);
  auto back = DecodeStoredEvent(7, bytes, error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(*back, e);
  std::string flipped = bytes;
  flipped.back() ^= 1;
  EXPECT_FALSE(DecodeStoredEvent(7, flipped, error));
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;
  EXPECT_FALSE(DecodeStoredEvent(7, bytes.substr(0, bytes.size() - 1), error));
  EXPECT_NE(error.find("header says"), std::string::npos) << error;
  EXPECT_FALSE(DecodeStoredEvent(7, "", error));
  EXPECT_EQ(error, "empty file");
  EXPECT_FALSE(DecodeStoredEvent(7, "GNSQ2 a 1 0000000000000000\nx", error));
}

TEST(EventStoreTest, FileNamesSortBySequence) {
  EXPECT_EQ(StoredEventFileName(42), "00000000000000000042.event");
  EXPECT_EQ(ParseStoredEventFileName("00000000000000000042.event"), 42u);
  EXPECT_FALSE(ParseStoredEventFileName("00000000000000000042.event.tmp"));
  EXPECT_FALSE(ParseStoredEventFileName("42.event"));
}

TEST(EventStoreTest, AppendLoadRemoveKeepsOrder) {
  test::TempDir dir;
  EventStore store((dir / "q").string());
  auto loaded = store.Load(1000);
  ASSERT_TRUE(loaded.error.empty()) << loaded.error;
  EXPECT_TRUE(loaded.events.empty());
  ASSERT_TRUE(store.Append({Event(10, "a", "1"), Event(2, "b", "2"), Event(300, "c", "3")}));
  loaded = store.Load(1000);
  ASSERT_EQ(loaded.events.size(), 3u);
  EXPECT_EQ(loaded.events[0].id, "b");
  EXPECT_EQ(loaded.events[1].id, "a");
  EXPECT_EQ(loaded.events[2].id, "c");
  ASSERT_TRUE(store.Remove({2, 300, 999}));  // 999: gone already, fine
  loaded = store.Load(1000);
  ASSERT_EQ(loaded.events.size(), 1u);
  EXPECT_EQ(loaded.events[0], Event(10, "a", "1"));
}

TEST(EventStoreTest, DamagedFileIsMovedAsideWithTheReasonAndTheRestServed) {
  test::TempDir dir;
  EventStore store((dir / "q").string());
  ASSERT_TRUE(store.Append({Event(1, "a", "one"), Event(2, "b", "two"), Event(3, "c", "three")}));
  const fs::path damaged = dir / "q" / StoredEventFileName(2);
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('X');
  }
  const auto loaded = store.Load(1234);
  ASSERT_EQ(loaded.events.size(), 2u);
  EXPECT_EQ(loaded.events[0].id, "a");
  EXPECT_EQ(loaded.events[1].id, "c");
  ASSERT_EQ(loaded.damaged.size(), 1u);
  EXPECT_NE(loaded.damaged[0].find(damaged.string() + ": checksum mismatch"), std::string::npos) << loaded.damaged[0];
  EXPECT_NE(loaded.damaged[0].find("moved to"), std::string::npos) << loaded.damaged[0];
  EXPECT_FALSE(fs::exists(damaged));
  EXPECT_TRUE(fs::exists(damaged.string() + ".corrupt-1234"));
  // Moved aside once: the next load is clean.
  EXPECT_TRUE(store.Load(1235).damaged.empty());
}

TEST(EventStoreTest, InterruptedWriteLeavesNoEventAndItsTempFileIsSwept) {
  test::TempDir dir;
  EventStore store((dir / "q").string());
  ASSERT_TRUE(store.Append({Event(1, "a", "one")}));
  // A kill -9 mid-write leaves the temp file of another pid (never a torn event file).
  const fs::path temp = dir / "q" / AtomicWriteTempName(StoredEventFileName(2), 1, 0);
  std::ofstream(temp) << "GNSQ1 b 3 00";
  const auto loaded = store.Load(1000);
  ASSERT_EQ(loaded.events.size(), 1u);
  EXPECT_TRUE(loaded.damaged.empty());
  EXPECT_FALSE(fs::exists(temp));
}

TEST(EventStoreTest, AnUnusableDirectoryIsAnError) {
  test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  EventStore store((dir / "file" / "q").string());
  const auto loaded = store.Load(1);
  EXPECT_FALSE(loaded.error.empty());
  EXPECT_FALSE(store.Append({Event(1, "a", "x")}));
}

}  // namespace
}  // namespace gns::nvsentinel_export
