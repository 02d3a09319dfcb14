// /proc/devices: the IMEX channel major from a real-looking file, and clear errors for a missing
// file, a missing line and garbage (seed 000 §11: the module then fails to start).
#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/dra_compute_domain/proc_devices.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>

namespace gns::dra {
namespace {

// As a GB200 node prints it (majors vary per boot: the driver registers them dynamically).
constexpr const char* kRealLooking =
    "Character devices:\n"
    "  1 mem\n"
    "  4 /dev/vc/0\n"
    "  4 tty\n"
    "  5 /dev/tty\n"
    " 10 misc\n"
    "195 nvidia-frontend\n"
    "195 nvidia\n"
    "234 nvidia-caps-imex-channels\n"
    "235 nvidia-caps\n"
    "509 nvidia-nvswitch\n"
    "510 nvidia-uvm\n"
    "\n"
    "Block devices:\n"
    "  7 loop\n"
    "  8 sd\n"
    "259 blkext\n";

TEST(ProcDevicesTest, FindsTheImexChannelMajor) {
  const auto found = FindCharDeviceMajor(kRealLooking, kImexChannelsDeviceName, "/proc/devices");
  ASSERT_TRUE(found.ok()) << found.error;
  EXPECT_EQ(*found.major, 234u);
  // A prefix of another name is not a match ("nvidia-caps" vs "nvidia-caps-imex-channels").
  EXPECT_EQ(*FindCharDeviceMajor(kRealLooking, "nvidia-caps", "f").major, 235u);
}

TEST(ProcDevicesTest, ReadsTheFileUnderTheHostRoot) {
  gns::test::TempDir dir;
  std::filesystem::create_directories(dir / "host/proc");
  std::ofstream(dir / "host/proc/devices") << kRealLooking;
  const DriverPaths paths = MakeDriverPaths(SitePaths{"", "", "", dir / "host"});
  EXPECT_EQ(paths.proc_devices, dir / "host/proc/devices");
  const auto found = ReadImexChannelMajor(paths.proc_devices);
  ASSERT_TRUE(found.ok()) << found.error;
  EXPECT_EQ(*found.major, 234u);
  EXPECT_EQ(MakeDriverPaths(SitePaths{"", "", "", "/"}).proc_devices, "/proc/devices");
}

TEST(ProcDevicesTest, AMissingFileNamesTheFileAndTheDevice) {
  gns::test::TempDir dir;
  const auto found = ReadImexChannelMajor(dir / "proc/devices");
  EXPECT_FALSE(found.ok());
  EXPECT_NE(found.error.find(dir / "proc/devices"), std::string::npos) << found.error;
  EXPECT_NE(found.error.find("nvidia-caps-imex-channels"), std::string::npos) << found.error;
}

TEST(ProcDevicesTest, AMissingLineSaysTheDriverLacksImexChannels) {
  const std::string without = "Character devices:\n  1 mem\n195 nvidia\n\nBlock devices:\n234 nvidia-caps-imex-channels\n";
  const auto found = FindCharDeviceMajor(without, kImexChannelsDeviceName, "/host/proc/devices");
  EXPECT_FALSE(found.ok()) << "a block device of that name does not count";
  EXPECT_NE(found.error.find("/host/proc/devices: no character device named nvidia-caps-imex-channels"),
            std::string::npos)
      << found.error;
}

TEST(ProcDevicesTest, GarbageIsAClearError) {
  const auto binary = FindCharDeviceMajor(std::string("\x7f" "ELF\x02\x01\x01\0\0", 9), kImexChannelsDeviceName, "f");
  EXPECT_FALSE(binary.ok());
  EXPECT_NE(binary.error.find("no \"Character devices:\" section"), std::string::npos) << binary.error;

  const auto empty = FindCharDeviceMajor("", kImexChannelsDeviceName, "f");
  EXPECT_FALSE(empty.ok());

  for (const char* bad_major : {"abc", "-1", "12x", "99999", "4096"}) {
    const std::string text = std::string("Character devices:\n") + bad_major + " nvidia-caps-imex-channels\n";
    const auto found = FindCharDeviceMajor(text, kImexChannelsDeviceName, "f");
    EXPECT_FALSE(found.ok()) << bad_major;
    EXPECT_NE(found.error.find("has no valid major"), std::string::npos) << found.error;
  }
  // Malformed lines around ours do not hide it; CRLF and tabs are tolerated.
  const auto noisy = FindCharDeviceMajor("Character devices:\r\n???\r\n\t7\r\n241\tnvidia-caps-imex-channels\r\n",
                                         kImexChannelsDeviceName, "f");
  ASSERT_TRUE(noisy.ok()) << noisy.error;
  EXPECT_EQ(*noisy.major, 241u);
}

}  // namespace
}  // namespace gns::dra
