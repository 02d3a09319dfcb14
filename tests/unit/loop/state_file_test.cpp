// State files read without trusting them (issue #24 §6): a FIFO, a device, a directory or a huge
// file is refused without blocking or reading it all; bad files are moved aside under unique
// names; directories and sockets get their exact modes whatever the umask (§8).
#include "loop/admin_socket.hpp"
#include "loop/atomic_file.hpp"
#include "loop/socket_path.hpp"
#include "loop/state_file.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

namespace gns {
namespace {

namespace fs = std::filesystem;
using Status = StateFileRead::Status;

class StateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-state-file-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ::umask(saved_umask_);
    fs::remove_all(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static mode_t ModeOf(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  }

  fs::path dir_;
  mode_t saved_umask_ = ::umask(022);
};

TEST_F(StateFileTest, ARegularFileOrALinkToOneIsReadWhole) {
  std::ofstream(Path("cursor.json")) << "{\"a\":1}";
  auto read = ReadStateFile(Path("cursor.json"));
  EXPECT_EQ(read.status, Status::kRead);
  EXPECT_EQ(read.content, "{\"a\":1}");
  fs::create_symlink(Path("cursor.json"), Path("link.json"));
  read = ReadStateFile(Path("link.json"));
  EXPECT_EQ(read.status, Status::kRead);
  EXPECT_EQ(read.content, "{\"a\":1}");
  std::ofstream(Path("empty.json")).flush();
  EXPECT_EQ(ReadStateFile(Path("empty.json")).status, Status::kRead);
  EXPECT_EQ(ReadStateFile(Path("nope.json")).status, Status::kMissing);
}

TEST_F(StateFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  ASSERT_EQ(::mkfifo(Path("devices.json").c_str(), 0600), 0);
  // ReadWholeFile would block here for ever (no writer): the loop and /healthz with it.
  const auto read = ReadStateFile(Path("devices.json"));
  EXPECT_EQ(read.status, Status::kRejected);
  EXPECT_NE(read.error.find("is a FIFO, expected a regular file"), std::string::npos) << read.error;
}

TEST_F(StateFileTest, ALinkToADeviceOrADirectoryIsRefused) {
  fs::create_symlink("/dev/zero", Path("zero.json"));  // read whole: memory until the process dies
  auto read = ReadStateFile(Path("zero.json"));
  EXPECT_EQ(read.status, Status::kRejected);
  EXPECT_NE(read.error.find("is a character device"), std::string::npos) << read.error;
  EXPECT_TRUE(read.content.empty());
  fs::create_directories(Path("dir.json"));
  read = ReadStateFile(Path("dir.json"));
  EXPECT_EQ(read.status, Status::kRejected);
  EXPECT_NE(read.error.find("is a directory"), std::string::npos) << read.error;
}

TEST_F(StateFileTest, MoreThanTheBoundIsRefusedNamingBothSizes) {
  std::ofstream(Path("big.json")) << std::string(5000, 'x');
  const auto read = ReadStateFile(Path("big.json"), 4096);
  EXPECT_EQ(read.status, Status::kRejected);
  EXPECT_NE(read.error.find("5000 bytes, more than the 4096"), std::string::npos) << read.error;
  EXPECT_TRUE(read.content.empty());
  EXPECT_EQ(ReadStateFile(Path("big.json"), 5000).content.size(), 5000u);
}

TEST_F(StateFileTest, TheReadRunsOnThePoolAndAnswersOnTheLoop) {
  test::LoopHarness h;
  std::ofstream(Path("book.json")) << "[]";
  std::optional<StateFileRead> got;
  ReadStateFileOnPool(h.pool, Path("book.json"), 1024, [&](StateFileRead r) {
    EXPECT_TRUE(h.loop.OnLoopThread());
    got = std::move(r);
  });
  ASSERT_TRUE(h.RunUntil([&] { return got.has_value(); }));
  EXPECT_EQ(got->content, "[]");
}

TEST_F(StateFileTest, MovedAsideUnderUniqueNamesNeverOverAnEarlierOne) {
  std::ofstream(Path("gpu-reset.json")) << "first";
  const auto a = MoveStateFileAside(Path("gpu-reset.json"), 1767225600);
  ASSERT_TRUE(a.ok) << a.error;
  EXPECT_EQ(a.moved_to, Path("gpu-reset.json.corrupt-1767225600"));
  std::ofstream(Path("gpu-reset.json")) << "second";
  const auto b = MoveStateFileAside(Path("gpu-reset.json"), 1767225600);  // the same second
  ASSERT_TRUE(b.ok) << b.error;
  EXPECT_EQ(b.moved_to, Path("gpu-reset.json.corrupt-1767225600-1"));
  EXPECT_EQ(ReadStateFile(a.moved_to).content, "first");
  EXPECT_EQ(ReadStateFile(b.moved_to).content, "second");
  EXPECT_FALSE(fs::exists(Path("gpu-reset.json")));
  // A FIFO moves aside like any file.
  ASSERT_EQ(::mkfifo(Path("gpu-reset.json").c_str(), 0600), 0);
  EXPECT_TRUE(MoveStateFileAside(Path("gpu-reset.json"), 1767225601).ok);
  const auto gone = MoveStateFileAside(Path("gpu-reset.json"), 1767225602);
  EXPECT_FALSE(gone.ok);
  EXPECT_NE(gone.error.find("No such file"), std::string::npos) << gone.error;
}

TEST_F(StateFileTest, DirectoriesGetTheirExactModeUnderAnyUmask) {
  ::umask(0);  // a loose umask: mkdir alone would make these 0777
  std::string error;
  ASSERT_TRUE(EnsureDirectory(Path("state/journald"), 0700, error)) << error;
  EXPECT_EQ(ModeOf(Path("state")), 0700u);
  EXPECT_EQ(ModeOf(Path("state/journald")), 0700u);
  ::umask(0077);  // a tight one does not narrow what we ask for either
  ASSERT_TRUE(EnsureDirectory(Path("cdi"), 0755, error)) << error;
  EXPECT_EQ(ModeOf(Path("cdi")), 0755u);
}

TEST_F(StateFileTest, APrivatelyBoundSocketAppearsWithItsFinalModeAndLeavesNothingBehind) {
  ::umask(0);
  const std::string path = Path("reset.sock");
  {
    PrivateSocketBind bind(path);
    const std::string private_dir = fs::path(bind.BindPath()).parent_path().string();
    EXPECT_EQ(fs::path(private_dir).parent_path(), dir_);
    EXPECT_EQ(ModeOf(private_dir), 0700u);  // nobody else reaches what is bound in there
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", bind.BindPath().c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(::listen(fd, 1), 0);
    EXPECT_FALSE(fs::exists(path));  // not at its path before it has its mode
    bind.Publish(0600);
    EXPECT_EQ(ModeOf(path), 0600u);
    // Still the listening socket: a client connects through the final path.
    const int client = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un to{};
    to.sun_family = AF_UNIX;
    std::snprintf(to.sun_path, sizeof(to.sun_path), "%s", path.c_str());
    EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0) << std::strerror(errno);
    ::close(client);
    ::close(fd);
  }
  // Only the socket is left in the directory: the private directory is gone.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"reset.sock"});
}

TEST_F(StateFileTest, TheAdminSocketIs0600UnderUmask000) {
  ::umask(0);
  test::LoopHarness h;
  AdminSocket socket(h.loop.Io(), Path("admin.sock"), AdminSocket::OneShot([](std::string_view) { return "ok"; }));
  socket.Start();
  EXPECT_EQ(ModeOf(Path("admin.sock")) & 0777, 0600u);
  socket.Stop();
}

}  // namespace
}  // namespace gns
