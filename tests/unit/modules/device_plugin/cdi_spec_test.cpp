// Our CDI spec: discovery parts (linker cache, MIG minors), the spec built from the plan's
// devices, and its validation against the CDI rules of WIRE-FACTS §6.
#include "modules/device_plugin/cdi_spec.hpp"

#include "loop/atomic_file.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace gns::device_plugin {
namespace {

namespace fs = std::filesystem;

// A linker cache in glibc's new format with the given (soname, path) entries for this machine's
// 64-bit ABI, plus one 32-bit entry that must be skipped.
std::string MakeLdCache(const std::vector<std::pair<std::string, std::string>>& libs) {
#if defined(__x86_64__)
  const int32_t flags = 0x0303;
#else
  const int32_t flags = 0x0a03;
#endif
  std::vector<std::pair<std::string, std::string>> all = libs;
  all.emplace_back("libcuda.so.1", "/usr/lib32/libcuda.so.1");
  const uint32_t n = static_cast<uint32_t>(all.size());
  const std::size_t strings_at = 48 + 24 * n;
  std::string strings;
  std::string entries;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const uint32_t key = static_cast<uint32_t>(strings_at + strings.size());
    strings += all[i].first + '\0';
    const uint32_t value = static_cast<uint32_t>(strings_at + strings.size());
    strings += all[i].second + '\0';
    const int32_t f = i + 1 == all.size() ? 0x0003 : flags;  // the last: a 32-bit library
    char e[24] = {};
    std::memcpy(e, &f, 4);
    std::memcpy(e + 4, &key, 4);
    std::memcpy(e + 8, &value, 4);
    entries.append(e, sizeof(e));
  }
  std::string header(48, '\0');
  std::memcpy(header.data(), "glibc-ld.so.cache1.1", 20);
  std::memcpy(header.data() + 20, &n, 4);
  const uint32_t len = static_cast<uint32_t>(strings.size());
  std::memcpy(header.data() + 24, &len, 4);
  return header + entries + strings;
}

TEST(LdCache, FindsTheDriverLibrariesOfOurAbiOnly) {
  std::string error;
  const auto libs = LibrariesFromLdCache(
      MakeLdCache({{"libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                   {"libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"},
                   {"libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"}}),
      {"libcuda.so.", "libnvidia-ml.so."}, error);
  EXPECT_EQ(error, "");
  EXPECT_EQ(libs, (std::vector<std::string>{"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                                            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}));
}

TEST(LdCache, OnePathPerSonameTheFirstTheCacheLists) {
  // As on the real H200 node: the driver's directory and /lib both in the cache.
  std::string error;
  const auto libs = LibrariesFromLdCache(
      MakeLdCache({{"libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"},
                   {"libcuda.so.1", "/lib/libcuda.so.1"},
                   {"libnvidia-ml.so.1", "/lib/libnvidia-ml.so.1"}}),
      {"libcuda.so.", "libnvidia-ml.so."}, error);
  EXPECT_EQ(error, "");
  EXPECT_EQ(libs, (std::vector<std::string>{"/lib/libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"}));
}

TEST(LdCache, ReadsThisMachinesRealCache) {
  // The format check that does not rest on our own writer: glibc's cache on this machine.
  std::string bytes, error;
  ASSERT_TRUE(ReadWholeFile("/etc/ld.so.cache", bytes, error)) << error;
  const auto libs = LibrariesFromLdCache(bytes, {"libc.so."}, error);
  EXPECT_EQ(error, "");
  ASSERT_FALSE(libs.empty());
  for (const auto& lib : libs) EXPECT_TRUE(fs::exists(lib)) << lib;
}

TEST(LdCache, GarbageAndTruncationAreErrorsNotCrashes) {
  std::string error;
  EXPECT_TRUE(LibrariesFromLdCache("not a cache", {"libcuda.so."}, error).empty());
  EXPECT_NE(error.find("not a glibc ld.so.cache"), std::string::npos);
  const std::string cache = MakeLdCache({{"libcuda.so.1", "/usr/lib/libcuda.so.1"}});
  for (std::size_t cut : {std::size_t{30}, std::size_t{60}, std::size_t{48 + 48 + 5}}) {
    error.clear();
    LibrariesFromLdCache(cache.substr(0, cut), {"libcuda.so."}, error);
    EXPECT_FALSE(error.empty()) << cut;
  }
}

TEST(MigMinors, GpuAndComputeInstanceCapabilities) {
  CdiHostFacts facts;
  ParseMigMinors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi7/access 90\n", facts);
  EXPECT_EQ(facts.gi_caps.at({0, 1}), 12u);
  EXPECT_EQ(facts.ci_caps.at({0, 1, 0}), 13u);
  EXPECT_EQ(facts.gi_caps.at({1, 7}), 90u);
  EXPECT_EQ(facts.gi_caps.size(), 2u);
}

std::vector<PhysicalDevice> Devices(bool index_ids) {
  PhysicalDevice gpu;
  gpu.uuid = gpu.parent_uuid = "GPU-a";
  gpu.id = index_ids ? "0" : "GPU-a";
  gpu.minor = 0;
  PhysicalDevice mig;
  mig.uuid = "MIG-b";
  mig.parent_uuid = "GPU-b";
  mig.id = index_ids ? "1:0" : "MIG-b";
  mig.minor = 1;
  mig.mig = true;
  mig.gpu_instance = 1;
  mig.compute_instance = 0;
  return {gpu, mig};
}

TEST(CdiSpec, OneDevicePerGpuAndMigDevicePlusAllWithControlNodesAndDriverMounts) {
  CdiHostFacts facts;
  facts.control_nodes = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
  ParseMigMinors("gpu1/gi1/access 21\ngpu1/gi1/ci0/access 22\n", facts);
  facts.driver_files = {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/bin/nvidia-smi"};
  const auto spec = BuildCdiSpec({"nvidia.com/gpu", "/run/nvidia/driver"}, Devices(false), facts);
  EXPECT_EQ(ValidateCdiSpec(spec), "");
  EXPECT_EQ(spec["kind"], "nvidia.com/gpu");
  ASSERT_EQ(spec["devices"].size(), 3u);
  EXPECT_EQ(spec["devices"][0]["name"], "GPU-a");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia0");
  const auto& mig_nodes = spec["devices"][1]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(mig_nodes.size(), 3u);
  EXPECT_EQ(mig_nodes[1]["path"], "/dev/nvidia-caps/nvidia-cap21");
  EXPECT_EQ(mig_nodes[2]["path"], "/dev/nvidia-caps/nvidia-cap22");
  EXPECT_EQ(spec["devices"][2]["name"], "all");
  EXPECT_EQ(spec["devices"][2]["containerEdits"]["deviceNodes"].size(), 4u);
  const auto& edits = spec["containerEdits"];
  EXPECT_EQ(edits["deviceNodes"].size(), 2u);
  ASSERT_EQ(edits["mounts"].size(), 2u);
  // The driver root is where the host has the files; the container sees them at their own path.
  EXPECT_EQ(edits["mounts"][0]["hostPath"], "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  EXPECT_EQ(edits["mounts"][0]["containerPath"], "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
}

TEST(CdiSpec, IndexNamesNeedAndGetVersion050) {
  const auto spec = BuildCdiSpec({}, Devices(true), {});
  EXPECT_EQ(ValidateCdiSpec(spec), "");
  EXPECT_EQ(spec["devices"][1]["name"], "1:0");
  auto old = spec;
  old["cdiVersion"] = "0.4.0";
  EXPECT_EQ(ValidateCdiSpec(old), "cdiVersion 0.4.0 is below the 0.5.0 its content needs");
}

TEST(CdiSpec, ValidationCatchesWhatTheCdiRulesForbid) {
  auto spec = BuildCdiSpec({}, Devices(false), {});
  auto dup = spec;
  dup["devices"][1]["name"] = "GPU-a";
  EXPECT_EQ(ValidateCdiSpec(dup), "device name \"GPU-a\" is used twice");
  auto bad_name = spec;
  bad_name["devices"][0]["name"] = "-x";
  EXPECT_EQ(ValidateCdiSpec(bad_name), "device name \"-x\" is not valid");
  auto bad_kind = spec;
  bad_kind["kind"] = "nvidia.com";
  EXPECT_EQ(ValidateCdiSpec(bad_kind), "kind \"nvidia.com\" is not <vendor>/<class>");
  auto unknown = spec;
  unknown["cdiVersion"] = "0.9.0";
  EXPECT_NE(ValidateCdiSpec(unknown).find("unknown"), std::string::npos);
  // A dot in the class needs 0.6.0, and the builder says so.
  EXPECT_EQ(BuildCdiSpec({"example.com/gpu.shared", "/"}, Devices(false), {})["cdiVersion"], "0.6.0");
  EXPECT_EQ(ValidateCdiSpec(BuildCdiSpec({"example.com/gpu.shared", "/"}, Devices(false), {})), "");
  EXPECT_EQ(CdiSpecFileName("nvidia.com/gpu"), "nvidia.com-gpu.json");
}

TEST(CdiSpec, DiscoveryReadsTheHostUnderItsRoot) {
  char tmpl[] = "/tmp/gnscdi-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  fs::create_directories(root + "/dev");
  fs::create_directories(root + "/drv/etc");
  fs::create_directories(root + "/drv/usr/lib/x86_64-linux-gnu");
  fs::create_directories(root + "/drv/usr/bin");
  fs::create_directories(root + "/proc/driver/nvidia-caps");
  std::ofstream(root + "/dev/nvidiactl") << "";
  std::ofstream(root + "/dev/nvidia-uvm") << "";
  std::ofstream(root + "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.1") << "";
  std::ofstream(root + "/drv/usr/bin/nvidia-smi") << "";
  std::ofstream(root + "/proc/driver/nvidia-caps/mig-minors") << "gpu1/gi1/access 21\n";
  // libnvidia-ml is in the cache but not on disk: not mounted.
  std::ofstream(root + "/drv/etc/ld.so.cache", std::ios::binary)
      << MakeLdCache({{"libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                      {"libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}});
  const auto facts = DiscoverCdiHostFacts(root, CdiSettings{"nvidia.com/gpu", "/drv"});
  EXPECT_EQ(facts.control_nodes, (std::vector<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm"}));
  EXPECT_EQ(facts.driver_files,
            (std::vector<std::string>{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/bin/nvidia-smi"}));
  EXPECT_EQ(facts.gi_caps.at({1, 1}), 21u);
  EXPECT_TRUE(facts.warnings.empty());
  // No hook binary under the host root: "auto" finds none, and the spec has no hooks.
  EXPECT_EQ(facts.hook_path, "");
  EXPECT_FALSE(BuildCdiSpec({}, Devices(false), facts)["containerEdits"].contains("hooks"));
  fs::remove_all(root);
}

// A host as the driver installer leaves it: versioned libraries behind their soname links, a
// .so link for some, GSP firmware per driver version, and the toolkit's hook binary.
class CdiHostRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gnscdi-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    const std::string lib = root_ + "/drv/usr/lib/x86_64-linux-gnu";
    fs::create_directories(lib);
    fs::create_directories(root_ + "/drv/etc");
    for (const char* name : {"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"}) {
      std::ofstream(lib + "/" + name + ".550.90.07") << "";
      fs::create_symlink(std::string(name) + ".550.90.07", lib + "/" + name + ".1");
    }
    fs::create_symlink("libnvidia-ml.so.1", lib + "/libnvidia-ml.so");  // the .so link on the host
    std::ofstream(root_ + "/drv/etc/ld.so.cache", std::ios::binary)
        << MakeLdCache({{"libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                        {"libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"},
                        {"libnvidia-ptxjitcompiler.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1"}});
    const std::string fw = root_ + "/drv/lib/firmware/nvidia";
    fs::create_directories(fw + "/550.90.07");
    fs::create_directories(fw + "/535.104.05");
    std::ofstream(fw + "/550.90.07/gsp_tu10x.bin") << "";
    std::ofstream(fw + "/550.90.07/gsp_ga10x.bin") << "";
    std::ofstream(fw + "/550.90.07/README") << "";           // not gsp*.bin
    std::ofstream(fw + "/535.104.05/gsp_ga10x.bin") << "";   // another driver's
  }
  void TearDown() override { fs::remove_all(root_); }

  void InstallHook(const std::string& path) {
    fs::create_directories(fs::path(root_ + path).parent_path());
    std::ofstream(root_ + path) << "#!/bin/sh\n";
    fs::permissions(root_ + path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  }

  CdiHostFacts Discover(const std::string& hook_path) {
    return DiscoverCdiHostFacts(root_, CdiSettings{"nvidia.com/gpu", "/drv", hook_path});
  }

  std::string root_;
};

TEST_F(CdiHostRoot, FirmwareOfTheDriversVersionIsMounted) {
  const auto facts = Discover("");
  EXPECT_EQ(facts.driver_version, "550.90.07") << "from libcuda.so.1 -> libcuda.so.550.90.07";
  EXPECT_EQ(facts.firmware_files, (std::vector<std::string>{"/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin",
                                                             "/lib/firmware/nvidia/550.90.07/gsp_tu10x.bin"}));
  const auto spec = BuildCdiSpec({"nvidia.com/gpu", "/drv"}, Devices(false), facts);
  EXPECT_EQ(ValidateCdiSpec(spec), "");
  std::map<std::string, std::string> mounts;
  for (const auto& m : spec["containerEdits"]["mounts"]) mounts[m["containerPath"]] = m["hostPath"];
  EXPECT_EQ(mounts.at("/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin"), "/drv/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin");
  EXPECT_EQ(mounts.count("/lib/firmware/nvidia/535.104.05/gsp_ga10x.bin"), 0u);
  EXPECT_EQ(mounts.size(), 5u) << "three libraries, two firmware files";
  EXPECT_FALSE(spec["containerEdits"].contains("hooks")) << "hooks off";

  // No library says its version: the kernel module's.
  fs::remove(root_ + "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  fs::remove(root_ + "/drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  std::ofstream(root_ + "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.1") << "";
  fs::create_directories(root_ + "/sys/module/nvidia");
  std::ofstream(root_ + "/sys/module/nvidia/version") << "535.104.05\n";
  const auto older = Discover("");
  EXPECT_EQ(older.driver_version, "535.104.05");
  EXPECT_EQ(older.firmware_files, std::vector<std::string>{"/lib/firmware/nvidia/535.104.05/gsp_ga10x.bin"});
}

TEST(CdiFirmware, TheKernelsSearchOrderEachFileOnce) {
  char tmpl[] = "/tmp/gnscdi-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  for (const char* dir : {"/opt/fw", "/lib/firmware/updates/6.1.0-test", "/lib/firmware/updates",
                                "/lib/firmware/6.1.0-test", "/lib/firmware", "/lib/firmware/6.1.0-other"}) {
    fs::create_directories(root + dir + "/nvidia/550.90.07");
    std::ofstream(root + dir + "/nvidia/550.90.07/gsp_ga10x.bin") << "";
  }
  fs::create_directories(root + "/lib/firmware/nvidia/550.90.07/gsp_dir.bin");  // a directory: skipped
  EXPECT_EQ(FirmwareFiles(root, "550.90.07", "6.1.0-test", "/opt/fw/"),
            (std::vector<std::string>{"/opt/fw/nvidia/550.90.07/gsp_ga10x.bin",
                                      "/lib/firmware/updates/6.1.0-test/nvidia/550.90.07/gsp_ga10x.bin",
                                      "/lib/firmware/updates/nvidia/550.90.07/gsp_ga10x.bin",
                                      "/lib/firmware/6.1.0-test/nvidia/550.90.07/gsp_ga10x.bin",
                                      "/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin"}));
  EXPECT_TRUE(FirmwareFiles(root, "", "6.1.0-test", "").empty()) << "no version, no firmware";
  fs::remove_all(root);
}

TEST_F(CdiHostRoot, TheToolkitsHooksWhenItsBinaryIsOnTheHost) {
  InstallHook("/usr/local/nvidia/toolkit/nvidia-cdi-hook");
  const auto facts = Discover("auto");
  EXPECT_EQ(facts.hook_path, "/usr/local/nvidia/toolkit/nvidia-cdi-hook");
  // libcuda.so always (programs dlopen it by that name); libnvidia-ml.so because the host has
  // that link; none for ptxjitcompiler (no .so link on the host).
  EXPECT_EQ(facts.symlinks, (std::vector<std::string>{"libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                                                       "libnvidia-ml.so.1::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so"}));
  const auto spec = BuildCdiSpec({"nvidia.com/gpu", "/drv"}, Devices(false), facts);
  EXPECT_EQ(ValidateCdiSpec(spec), "");
  const auto& hooks = spec["containerEdits"]["hooks"];
  ASSERT_EQ(hooks.size(), 2u);
  EXPECT_EQ(hooks[0]["hookName"], "createContainer");
  EXPECT_EQ(hooks[0]["path"], "/usr/local/nvidia/toolkit/nvidia-cdi-hook");
  EXPECT_EQ(hooks[0]["args"], nlohmann::json({"nvidia-cdi-hook", "create-symlinks", "--link",
                                              "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so", "--link",
                                              "libnvidia-ml.so.1::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so"}));
  EXPECT_EQ(hooks[1]["hookName"], "createContainer");
  EXPECT_EQ(hooks[1]["args"],
            nlohmann::json({"nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"}));
  EXPECT_EQ(hooks[1]["env"], nlohmann::json({"NVIDIA_CTK_DEBUG=false"}));

  // The toolkit package's binary wins over the operator's; an older nvidia-ctk alone runs the
  // same hooks under its `hook` subcommand.
  InstallHook("/usr/bin/nvidia-cdi-hook");
  EXPECT_EQ(Discover("auto").hook_path, "/usr/bin/nvidia-cdi-hook");
  fs::remove(root_ + "/usr/bin/nvidia-cdi-hook");
  fs::remove(root_ + "/usr/local/nvidia/toolkit/nvidia-cdi-hook");
  InstallHook("/usr/bin/nvidia-ctk");
  const auto ctk = BuildCdiSpec({"nvidia.com/gpu", "/drv"}, Devices(false), Discover("auto"));
  EXPECT_EQ(ctk["containerEdits"]["hooks"][1]["args"],
            nlohmann::json({"nvidia-ctk", "hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"}));

  // Off, or a configured path the host does not have (said in the warnings): no hooks.
  EXPECT_EQ(Discover("").hook_path, "");
  const auto missing = Discover("/opt/toolkit/nvidia-cdi-hook");
  EXPECT_EQ(missing.hook_path, "");
  ASSERT_EQ(missing.warnings.size(), 1u);
  EXPECT_NE(missing.warnings[0].find("/opt/toolkit/nvidia-cdi-hook"), std::string::npos);
  EXPECT_FALSE(BuildCdiSpec({}, Devices(false), missing)["containerEdits"].contains("hooks"));
  // A non-executable file is not a hook.
  fs::permissions(root_ + "/usr/bin/nvidia-ctk", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(Discover("auto").hook_path, "");
}

TEST(CdiSpec, HooksAreValidatedAsCdiDoes) {
  CdiHostFacts facts;
  facts.driver_files = {"/usr/lib/x86_64-linux-gnu/libcuda.so.1"};
  facts.hook_path = "/usr/bin/nvidia-cdi-hook";
  facts.symlinks = {"libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"};
  const auto spec = BuildCdiSpec({}, Devices(false), facts);
  ASSERT_EQ(ValidateCdiSpec(spec), "");
  auto bad_name = spec;
  bad_name["containerEdits"]["hooks"][0]["hookName"] = "preStart";
  EXPECT_EQ(ValidateCdiSpec(bad_name), "spec: a hook needs a known hookName");
  auto relative = spec;
  relative["containerEdits"]["hooks"][0]["path"] = "nvidia-cdi-hook";
  EXPECT_EQ(ValidateCdiSpec(relative), "spec: a hook needs an absolute path");
  auto timeout = spec;
  timeout["containerEdits"]["hooks"][1]["timeout"] = 0;
  EXPECT_EQ(ValidateCdiSpec(timeout), "spec: a hook's timeout must be positive");
  auto env = spec;
  env["containerEdits"]["hooks"][0]["env"] = {"NVIDIA_CTK_DEBUG"};
  EXPECT_EQ(ValidateCdiSpec(env), "spec: hook env entries are K=V");
}

}  // namespace
}  // namespace gns::device_plugin
