// The shared test scaffolding keeps its promises: a held port cannot be taken by another
// socket (but can by a cooperating SO_REUSEPORT listener), a TempDir goes with its contents,
// Eventually waits for a late truth and gives up on a false one.
#include "support/eventually.hpp"
#include "support/held_port.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

namespace gns::test {
namespace {

// Binds (and listens on) ip:port; returns the errno of a failure, 0 on success.
int TryListen(const char* ip, std::uint16_t port, bool reuse_port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int on = 1;
  if (reuse_port) ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &addr.sin_addr);
  int error = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 1) != 0) error = errno;
  ::close(fd);
  return error;
}

TEST(HeldPort, NoOtherSocketTakesItButACooperatingListenerMay) {
  HeldPort held;
  ASSERT_NE(held.Port(), 0);
  EXPECT_EQ(TryListen("127.0.0.1", held.Port(), false), EADDRINUSE);
  EXPECT_EQ(TryListen("127.0.0.2", held.Port(), false), EADDRINUSE);
  EXPECT_EQ(TryListen("127.0.0.1", held.Port(), true), 0);
}

TEST(HeldPort, ReleasedWhenDropped) {
  std::uint16_t port = 0;
  {
    HeldPort held("127.0.0.1");
    port = held.Port();
    EXPECT_EQ(TryListen("127.0.0.1", port, false), EADDRINUSE);
  }
  EXPECT_EQ(TryListen("127.0.0.1", port, false), 0);
}

TEST(HeldPort, RejectsANonAddress) { EXPECT_THROW(HeldPort("not-an-ip"), std::system_error); }

TEST(TempDir, PrivateShortAndRemovedWithItsContents) {
  std::filesystem::path kept;
  {
    TempDir dir("gts");
    kept = dir.Path();
    EXPECT_EQ(kept.string().rfind("/tmp/gts-", 0), 0u) << kept;
    EXPECT_EQ(std::filesystem::status(kept).permissions(), std::filesystem::perms::owner_all);
    std::filesystem::create_directories(dir / "a/b");
    std::ofstream(dir / "a/b/file") << "x";
    EXPECT_TRUE(std::filesystem::exists(dir / "a/b/file"));
    TempDir other("gts");
    EXPECT_NE(other.Path(), kept);
  }
  EXPECT_FALSE(std::filesystem::exists(kept));
}

TEST(Eventually, WaitsForALateTruthAndGivesUpOnAFalseOne) {
  std::atomic<bool> flag{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // another thread's work, later
    flag = true;
  });
  EXPECT_TRUE(Eventually([&] { return flag.load(); }, std::chrono::seconds(10), std::chrono::milliseconds(5)));
  setter.join();
  const auto start = std::chrono::steady_clock::now();
  int calls = 0;
  EXPECT_FALSE(Eventually([&] { return ++calls < 0; }, std::chrono::milliseconds(100), std::chrono::milliseconds(10)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_GT(calls, 2);
}

}  // namespace
}  // namespace gns::test
