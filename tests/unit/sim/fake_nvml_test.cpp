// Tests of the fake libnvidia-ml.so.1 (tools/sim/fake_nvml) exactly as the daemon will use it:
// dlopen by path, dlsym of the versioned names from nvml_abi.hpp's symbol table, calls through
// nvml_abi.hpp's function types. Also checks the in-process and socket control paths and
// fakenvmlctl.py.
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fake_nvml_control.h"
#include "modules/gpu_inventory/api/nvml_abi.hpp"

namespace gns::sim {
namespace {

namespace nvml = gns::nvml;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kLibraryPath = GNS_FAKE_NVML_LIBRARY;
constexpr const char* kGpus8Path = GNS_FAKE_NVML_GPUS8;
constexpr const char* kCtlScript = GNS_FAKENVMLCTL;

// The fake's state is process-wide (like NVML's), so one dlopen serves every test; each test
// balances its own nvmlInit/nvmlShutdown.
class FakeNvmlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    library_ = dlopen(kLibraryPath, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    missing_ = nvml::ResolveApi(api_, [](const char* name) { return dlsym(library_, name); });
    inject_xid_ = reinterpret_cast<fakeNvmlInjectXid_t>(dlsym(library_, "fakeNvmlInjectXid"));
    set_failure_ = reinterpret_cast<fakeNvmlSetFailure_t>(dlsym(library_, "fakeNvmlSetFailure"));
    clear_failures_ = reinterpret_cast<fakeNvmlClearFailures_t>(dlsym(library_, "fakeNvmlClearFailures"));
    set_health_ = reinterpret_cast<fakeNvmlSetHealth_t>(dlsym(library_, "fakeNvmlSetHealth"));
    clear_health_ = reinterpret_cast<fakeNvmlClearHealth_t>(dlsym(library_, "fakeNvmlClearHealth"));
    hang_ = reinterpret_cast<fakeNvmlHang_t>(dlsym(library_, "fakeNvmlHang"));
    release_hangs_ = reinterpret_cast<fakeNvmlReleaseHangs_t>(dlsym(library_, "fakeNvmlReleaseHangs"));
    hung_calls_ = reinterpret_cast<fakeNvmlHungCalls_t>(dlsym(library_, "fakeNvmlHungCalls"));
    std::ifstream in(kGpus8Path);
    gpus8_ = json::parse(in);
  }

  void SetUp() override {
    ASSERT_NE(library_, nullptr);
    ASSERT_TRUE(missing_.empty());
    ASSERT_NE(clear_failures_, nullptr);
    setenv("FAKE_NVML_CONFIG", kGpus8Path, 1);
    unsetenv("FAKE_NVML_CONTROL");
    clear_failures_();
    char dir_template[] = "/tmp/fake_nvml_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    temp_dir_ = dir_template;
  }

  void TearDown() override {
    clear_failures_();
    if (release_hangs_ != nullptr) release_hangs_();
    if (clear_health_ != nullptr) clear_health_();
    std::filesystem::remove_all(temp_dir_);
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = temp_dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  static nvml::Device Handle(unsigned int index) {
    nvml::Device device = nullptr;
    EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(index, &device), nvml::kSuccess);
    return device;
  }

  static std::string Uuid(nvml::Device device) {
    char buffer[nvml::kDeviceUuidV2BufferSize] = {};
    EXPECT_EQ(api_.nvmlDeviceGetUUID(device, buffer, sizeof(buffer)), nvml::kSuccess);
    return buffer;
  }

  static inline void* library_ = nullptr;
  static inline nvml::Api api_;
  static inline std::vector<std::string_view> missing_;
  static inline fakeNvmlInjectXid_t inject_xid_ = nullptr;
  static inline fakeNvmlSetFailure_t set_failure_ = nullptr;
  static inline fakeNvmlClearFailures_t clear_failures_ = nullptr;
  static inline fakeNvmlSetHealth_t set_health_ = nullptr;
  static inline fakeNvmlClearHealth_t clear_health_ = nullptr;
  static inline fakeNvmlHang_t hang_ = nullptr;
  static inline fakeNvmlReleaseHangs_t release_hangs_ = nullptr;
  static inline fakeNvmlHungCalls_t hung_calls_ = nullptr;
  static inline json gpus8_;
  std::string temp_dir_;
};

// nvmlInit_v2 in the constructor, nvmlShutdown in the destructor.
class Session {
 public:
  explicit Session(const nvml::Api& api) : api_(api) { EXPECT_EQ(api_.nvmlInit_v2(), nvml::kSuccess); }
  ~Session() { EXPECT_EQ(api_.nvmlShutdown(), nvml::kSuccess); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  const nvml::Api& api_;
};

TEST_F(FakeNvmlTest, ExportsEveryVersionedSymbolUnderTheRealSoname) {
  for (const auto& symbol : nvml::kSymbols) {
    EXPECT_NE(dlsym(library_, std::string(symbol.name).c_str()), nullptr) << symbol.name;
  }
  EXPECT_NE(inject_xid_, nullptr);
  EXPECT_NE(set_failure_, nullptr);
  // glibc matches an already loaded object by its DT_SONAME, so this finds the fake (loaded by
  // full path) only if its soname is libnvidia-ml.so.1.
  void* by_soname = dlopen(nvml::kLibraryName, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_EQ(by_soname, library_);
  if (by_soname != nullptr) dlclose(by_soname);
  EXPECT_TRUE(std::string(kLibraryPath).ends_with("/libnvidia-ml.so.1"));
}

TEST_F(FakeNvmlTest, ReportsTheConfiguredInventory) {
  Session session(api_);
  unsigned int count = 0;
  ASSERT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);
  ASSERT_EQ(count, 8u);
  for (unsigned int i = 0; i < count; ++i) {
    SCOPED_TRACE(i);
    const json& want = gpus8_["gpus"][i];
    const nvml::Device device = Handle(i);
    EXPECT_EQ(Uuid(device), want["uuid"].get<std::string>());

    char name[nvml::kDeviceNameV2BufferSize] = {};
    ASSERT_EQ(api_.nvmlDeviceGetName(device, name, sizeof(name)), nvml::kSuccess);
    EXPECT_STREQ(name, "NVIDIA H200");

    nvml::PciInfo pci{};
    ASSERT_EQ(api_.nvmlDeviceGetPciInfo_v3(device, &pci), nvml::kSuccess);
    EXPECT_EQ(std::string(pci.busId), want["pciBusId"].get<std::string>());
    const std::string bus_hex = want["pciBusId"].get<std::string>().substr(9, 2);
    EXPECT_EQ(std::string(pci.busIdLegacy), "0000:" + bus_hex + ":00.0");
    EXPECT_EQ(pci.domain, 0u);
    EXPECT_EQ(pci.bus, std::stoul(bus_hex, nullptr, 16));
    EXPECT_EQ(pci.device, 0u);
    EXPECT_EQ(pci.pciDeviceId, 0x233510DEu);

    unsigned int minor = 99;
    ASSERT_EQ(api_.nvmlDeviceGetMinorNumber(device, &minor), nvml::kSuccess);
    EXPECT_EQ(minor, i);

    nvml::Memory memory{};
    ASSERT_EQ(api_.nvmlDeviceGetMemoryInfo(device, &memory), nvml::kSuccess);
    EXPECT_EQ(memory.total, 150754820096ULL);
    EXPECT_EQ(memory.used, 566231040ULL);
    EXPECT_EQ(memory.free, memory.total - memory.used);
    nvml::Memory_v2 memory2{};
    EXPECT_EQ(api_.nvmlDeviceGetMemoryInfo_v2(device, &memory2), nvml::kErrorArgumentVersionMismatch);
    memory2.version = nvml::kMemoryV2Version;
    ASSERT_EQ(api_.nvmlDeviceGetMemoryInfo_v2(device, &memory2), nvml::kSuccess);
    EXPECT_EQ(memory2.reserved, 566231040ULL);
    EXPECT_EQ(memory2.total, memory.total);

    const unsigned int want_numa = i < 4 ? 0 : 1;
    unsigned int numa = 99;
    ASSERT_EQ(api_.nvmlDeviceGetNumaNodeId(device, &numa), nvml::kSuccess);
    EXPECT_EQ(numa, want_numa);
    unsigned long node_set[2] = {~0UL, ~0UL};
    ASSERT_EQ(api_.nvmlDeviceGetMemoryAffinity(device, 2, node_set, nvml::kAffinityScopeNode), nvml::kSuccess);
    EXPECT_EQ(node_set[0], 1UL << want_numa);
    EXPECT_EQ(node_set[1], 0UL);

    nvml::Device by_uuid = nullptr;
    ASSERT_EQ(api_.nvmlDeviceGetHandleByUUID(want["uuid"].get<std::string>().c_str(), &by_uuid), nvml::kSuccess);
    EXPECT_EQ(by_uuid, device);
    // NVML accepts other spellings of the same address (short domain, lower case).
    nvml::Device by_pci = nullptr;
    std::string short_id = "0000:" + bus_hex + ":00.0";
    for (char& c : short_id) c = static_cast<char>(std::tolower(c));
    ASSERT_EQ(api_.nvmlDeviceGetHandleByPciBusId_v2(short_id.c_str(), &by_pci), nvml::kSuccess);
    EXPECT_EQ(by_pci, device);
  }
  nvml::Device none = nullptr;
  EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(8, &none), nvml::kErrorInvalidArgument);
  EXPECT_EQ(api_.nvmlDeviceGetHandleByUUID("GPU-nope", &none), nvml::kErrorNotFound);
  EXPECT_EQ(api_.nvmlDeviceGetHandleByPciBusId_v2("00000000:19:00.0", &none), nvml::kErrorNotFound);
  EXPECT_EQ(api_.nvmlDeviceGetHandleByPciBusId_v2("not-a-bus-id", &none), nvml::kErrorInvalidArgument);
}

TEST_F(FakeNvmlTest, SystemVersionsAndBufferSizes) {
  Session session(api_);
  char version[nvml::kSystemDriverVersionBufferSize] = {};
  ASSERT_EQ(api_.nvmlSystemGetDriverVersion(version, sizeof(version)), nvml::kSuccess);
  EXPECT_STREQ(version, "550.90.07");
  EXPECT_EQ(api_.nvmlSystemGetDriverVersion(version, 5), nvml::kErrorInsufficientSize);
  int cuda = 0;
  ASSERT_EQ(api_.nvmlSystemGetCudaDriverVersion_v2(&cuda), nvml::kSuccess);
  EXPECT_EQ(cuda, 12040);
  // gpus-8.json names no computeCapability: the fake reports an H200's 9.0.
  int major = 0, minor = -1;
  ASSERT_EQ(api_.nvmlDeviceGetCudaComputeCapability(Handle(0), &major, &minor), nvml::kSuccess);
  EXPECT_EQ(major, 9);
  EXPECT_EQ(minor, 0);
  EXPECT_EQ(api_.nvmlDeviceGetCudaComputeCapability(Handle(0), nullptr, &minor), nvml::kErrorInvalidArgument);
  char small[10];
  EXPECT_EQ(api_.nvmlDeviceGetUUID(Handle(0), small, sizeof(small)), nvml::kErrorInsufficientSize);
  EXPECT_STREQ(api_.nvmlErrorString(nvml::kErrorTimeout), "Timeout");
  EXPECT_STREQ(api_.nvmlErrorString(nvml::kErrorGpuIsLost), "GPU is lost");
}

TEST_F(FakeNvmlTest, NvLinkRemotePciInfoNamesThePairedGpu) {
  Session session(api_);
  for (unsigned int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    const nvml::Device device = Handle(i);
    nvml::PciInfo peer_pci{};
    ASSERT_EQ(api_.nvmlDeviceGetPciInfo_v3(Handle(i ^ 1u), &peer_pci), nvml::kSuccess);
    for (unsigned int link = 0; link < 2; ++link) {
      nvml::EnableState active = nvml::kFeatureDisabled;
      ASSERT_EQ(api_.nvmlDeviceGetNvLinkState(device, link, &active), nvml::kSuccess);
      EXPECT_EQ(active, nvml::kFeatureEnabled);
      nvml::PciInfo remote{};
      ASSERT_EQ(api_.nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &remote), nvml::kSuccess);
      EXPECT_STREQ(remote.busId, peer_pci.busId);
      EXPECT_EQ(remote.bus, peer_pci.bus);
      EXPECT_EQ(remote.pciDeviceId, peer_pci.pciDeviceId);
    }
    // gpus-8.json gives each GPU two links: link 2 is one it does not have.
    nvml::EnableState active = nvml::kFeatureEnabled;
    EXPECT_EQ(api_.nvmlDeviceGetNvLinkState(device, 2, &active), nvml::kErrorInvalidArgument);
    nvml::PciInfo remote{};
    EXPECT_EQ(api_.nvmlDeviceGetNvLinkRemotePciInfo_v2(device, 2, &remote), nvml::kErrorNotSupported);
    EXPECT_EQ(api_.nvmlDeviceGetNvLinkState(device, nvml::kNvLinkMaxLinks, &active), nvml::kErrorInvalidArgument);
  }
}

TEST_F(FakeNvmlTest, FabricInfoInEveryStructVersion) {
  Session session(api_);
  const unsigned char want_uuid[16] = {0xc9, 0xa0, 0xf3, 0xd2, 0x41, 0xb7, 0x4e, 0x6a,
                                       0x9d, 0x58, 0x2f, 0x1e, 0x7b, 0x3c, 0x8a, 0x64};
  const nvml::Device device = Handle(5);

  nvml::GpuFabricInfo v1{};
  ASSERT_EQ(api_.nvmlDeviceGetGpuFabricInfo(device, &v1), nvml::kSuccess);
  EXPECT_EQ(std::memcmp(v1.clusterUuid, want_uuid, 16), 0);
  EXPECT_EQ(v1.cliqueId, 32766u);
  EXPECT_EQ(v1.state, nvml::kGpuFabricStateCompleted);
  EXPECT_EQ(v1.status, nvml::kSuccess);

  nvml::GpuFabricInfoV v3{};
  v3.version = nvml::kGpuFabricInfoV3Version;
  ASSERT_EQ(api_.nvmlDeviceGetGpuFabricInfoV(device, &v3), nvml::kSuccess);
  EXPECT_EQ(std::memcmp(v3.clusterUuid, want_uuid, 16), 0);
  EXPECT_EQ(v3.cliqueId, 32766u);
  EXPECT_EQ(v3.state, nvml::kGpuFabricStateCompleted);

  // A v2 caller's buffer is only sizeof(v2) long: nothing past it may be written.
  struct {
    nvml::GpuFabricInfo_v2 info;
    unsigned char canary[8];
  } v2{};
  std::memset(v2.canary, 0xAB, sizeof(v2.canary));
  v2.info.version = nvml::kGpuFabricInfoV2Version;
  ASSERT_EQ(api_.nvmlDeviceGetGpuFabricInfoV(device, reinterpret_cast<nvml::GpuFabricInfoV*>(&v2.info)), nvml::kSuccess);
  EXPECT_EQ(v2.info.cliqueId, 32766u);
  EXPECT_EQ(v2.info.state, nvml::kGpuFabricStateCompleted);
  for (const unsigned char c : v2.canary) EXPECT_EQ(c, 0xAB);

  nvml::GpuFabricInfoV bad{};
  bad.version = 0;
  EXPECT_EQ(api_.nvmlDeviceGetGpuFabricInfoV(device, &bad), nvml::kErrorArgumentVersionMismatch);
}

TEST_F(FakeNvmlTest, XidFromAnotherThreadWakesTheWaiter) {
  Session session(api_);
  const nvml::Device device = Handle(3);
  unsigned long long supported = 0;
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(device, &supported), nvml::kSuccess);
  ASSERT_NE(supported & nvml::kEventTypeXidCriticalError, 0u);
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(device, nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);

  const std::string uuid = Uuid(device);
  std::thread injector([&] {
    // Not needed for correctness (an event queued before the wait is returned at once); it
    // only makes the "blocked waiter is woken" path the likely one.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(inject_xid_(uuid.c_str(), 79), nvml::kSuccess);
  });
  nvml::EventData data{};
  // Success (not TIMEOUT) within the long timeout is what shows the waiter was woken.
  const nvml::Return rc = api_.nvmlEventSetWait_v2(set, &data, 60000);
  injector.join();
  ASSERT_EQ(rc, nvml::kSuccess);
  EXPECT_EQ(data.device, device);
  EXPECT_EQ(data.eventType, nvml::kEventTypeXidCriticalError);
  EXPECT_EQ(data.eventData, 79u);
  EXPECT_EQ(data.gpuInstanceId, nvml::kInstanceIdNone);
  EXPECT_EQ(data.computeInstanceId, nvml::kInstanceIdNone);
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}

TEST_F(FakeNvmlTest, WaitTimesOutAndOnlyRegisteredGpusDeliver) {
  Session session(api_);
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(Handle(0), nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);
  nvml::EventData data{};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 30), nvml::kErrorTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));

  // GPU 5 is not registered in this set: its Xid is not delivered here.
  EXPECT_EQ(inject_xid_(Uuid(Handle(5)).c_str(), 31), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kErrorTimeout);
  // Events queue in order; a PCI bus id names a GPU too.
  EXPECT_EQ(inject_xid_("00000000:18:00.0", 48), nvml::kSuccess);
  EXPECT_EQ(inject_xid_(Uuid(Handle(0)).c_str(), 94), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kSuccess);
  EXPECT_EQ(data.eventData, 48u);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kSuccess);
  EXPECT_EQ(data.eventData, 94u);
  EXPECT_EQ(inject_xid_("GPU-unknown", 79), nvml::kErrorNotFound);

  // Unsupported event types: nothing is registered, NOT_SUPPORTED.
  EXPECT_EQ(api_.nvmlDeviceRegisterEvents(Handle(1), 1ULL << 40, set), nvml::kErrorNotSupported);
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kErrorInvalidArgument);
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kErrorInvalidArgument);
}

TEST_F(FakeNvmlTest, InjectedFailuresAndClearing) {
  Session session(api_);
  const nvml::Device device = Handle(0);
  char buffer[nvml::kDeviceUuidV2BufferSize];
  unsigned int count = 0;

  ASSERT_EQ(set_failure_("nvmlDeviceGetUUID", nvml::kErrorGpuIsLost), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetUUID(device, buffer, sizeof(buffer)), nvml::kErrorGpuIsLost);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);

  ASSERT_EQ(set_failure_("*", nvml::kErrorUnknown), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorUnknown);
  // A specific entry wins over "*".
  EXPECT_EQ(api_.nvmlDeviceGetUUID(device, buffer, sizeof(buffer)), nvml::kErrorGpuIsLost);

  ASSERT_EQ(clear_failures_(), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetUUID(device, buffer, sizeof(buffer)), nvml::kSuccess);
  EXPECT_EQ(set_failure_("nvmlDeviceGetUUIDX", 1), nvml::kErrorInvalidArgument);

  // A failure injected while a thread waits for events ends that wait with the code.
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(device, nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);
  std::atomic<nvml::Return> wait_rc{-1};
  std::thread waiter([&] {
    nvml::EventData data{};
    wait_rc = api_.nvmlEventSetWait_v2(set, &data, 10000);
  });
  ASSERT_EQ(set_failure_("nvmlEventSetWait_v2", nvml::kErrorGpuIsLost), nvml::kSuccess);
  waiter.join();
  EXPECT_EQ(wait_rc.load(), nvml::kErrorGpuIsLost);
  ASSERT_EQ(clear_failures_(), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}

TEST_F(FakeNvmlTest, InitCanBeMadeToFail) {
  ASSERT_EQ(set_failure_("nvmlInit_v2", nvml::kErrorDriverNotLoaded), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlInit_v2(), nvml::kErrorDriverNotLoaded);
  unsigned int count = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorUninitialized);
  ASSERT_EQ(clear_failures_(), nvml::kSuccess);
  Session session(api_);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);
}

TEST_F(FakeNvmlTest, LifecycleAndReferenceCounting) {
  unsigned int count = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorUninitialized);
  EXPECT_EQ(api_.nvmlShutdown(), nvml::kSuccess);  // more shutdowns than inits: no error

  ASSERT_EQ(api_.nvmlInit_v2(), nvml::kSuccess);
  const nvml::Device old_handle = Handle(0);
  ASSERT_EQ(api_.nvmlInitWithFlags(0), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlShutdown(), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);  // still one reference
  ASSERT_EQ(api_.nvmlShutdown(), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorUninitialized);

  // Handles do not survive a shutdown: a stale one is rejected, never dereferenced.
  Session session(api_);
  char buffer[nvml::kDeviceUuidV2BufferSize];
  EXPECT_EQ(api_.nvmlDeviceGetUUID(old_handle, buffer, sizeof(buffer)), nvml::kErrorInvalidArgument);
  EXPECT_EQ(api_.nvmlDeviceGetUUID(nullptr, buffer, sizeof(buffer)), nvml::kErrorInvalidArgument);
}

// NVML has no way to interrupt a wait: neither nvmlShutdown nor freeing the set ends one (doing
// so under a wait is the caller's bug). The wait runs to its timeout, then reports what became
// of the library.
TEST_F(FakeNvmlTest, NothingInterruptsAPendingWait) {
  ASSERT_EQ(api_.nvmlInit_v2(), nvml::kSuccess);
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  const auto last_wait = reinterpret_cast<fakeNvmlLastWaitTimeout_t>(dlsym(library_, "fakeNvmlLastWaitTimeout"));
  ASSERT_NE(last_wait, nullptr);
  std::atomic<nvml::Return> wait_rc{-1};
  std::thread waiter([&] {
    nvml::EventData data{};
    wait_rc = api_.nvmlEventSetWait_v2(set, &data, 1500);
  });
  // The fake records a wait's timeout as the wait begins.
  for (unsigned int ms = 0; ms != 1500;) {
    ASSERT_EQ(last_wait(&ms), nvml::kSuccess);
    std::this_thread::yield();
  }
  ASSERT_EQ(api_.nvmlShutdown(), nvml::kSuccess);
  EXPECT_EQ(wait_rc.load(), -1) << "nvmlShutdown ended the wait";
  waiter.join();
  EXPECT_EQ(wait_rc.load(), nvml::kErrorUninitialized);
}

TEST_F(FakeNvmlTest, BadConfigsFailInitNamingTheFileAndReason) {
  struct Case {
    std::string path;
    nvml::Return want;
    std::string reason;
  };
  const std::string missing = temp_dir_ + "/missing.json";
  const std::vector<Case> cases = {
      {missing, nvml::kErrorDriverNotLoaded, "No such file"},
      {WriteFile("broken.json", "{ \"gpus\": [ "), nvml::kErrorUnknown, "parse error"},
      {WriteFile("typo.json", R"({"gpus":[{"uuid":"GPU-1","pciBusId":"0:1:0.0","minor":0,"memoryTotalBytes":1,"numaNod":0}]})"),
       nvml::kErrorUnknown, "unknown key \"numaNod\""},
      {WriteFile("bus.json", R"({"gpus":[{"uuid":"GPU-1","pciBusId":"zz","minor":0,"memoryTotalBytes":1}]})"),
       nvml::kErrorUnknown, "is not a PCI address"},
      {WriteFile("type.json", R"({"gpus":[{"uuid":"GPU-1","pciBusId":"0:1:0.0","minor":"zero","memoryTotalBytes":1}]})"),
       nvml::kErrorUnknown, "type must be number"},
      {WriteFile("dup.json",
                 R"({"gpus":[{"uuid":"GPU-1","pciBusId":"0:1:0.0","minor":0,"memoryTotalBytes":1},)"
                 R"({"uuid":"GPU-1","pciBusId":"0:2:0.0","minor":1,"memoryTotalBytes":1}]})"),
       nvml::kErrorUnknown, "duplicate uuid GPU-1"},
      {WriteFile("peer.json", R"({"gpus":[{"uuid":"GPU-1","pciBusId":"0:1:0.0","minor":0,"memoryTotalBytes":1,"nvlinkPeers":["GPU-2"]}]})"),
       nvml::kErrorUnknown, "neither a configured GPU UUID nor a PCI bus id"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    setenv("FAKE_NVML_CONFIG", c.path.c_str(), 1);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(api_.nvmlInit_v2(), c.want);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr(c.path));
    EXPECT_THAT(err, HasSubstr(c.reason));
  }
  unsetenv("FAKE_NVML_CONFIG");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(api_.nvmlInit_v2(), nvml::kErrorDriverNotLoaded);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("FAKE_NVML_CONFIG is not set"));
  unsigned int count = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorUninitialized);

  // No GPUs: init fails unless the caller passes NVML_INIT_FLAG_NO_GPUS.
  setenv("FAKE_NVML_CONFIG", WriteFile("empty.json", R"({"gpus":[]})").c_str(), 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(api_.nvmlInit_v2(), nvml::kErrorDriverNotLoaded);
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(api_.nvmlInitWithFlags(nvml::kInitFlagNoGpus), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(api_.nvmlShutdown(), nvml::kSuccess);
}

// Sends one JSON datagram to the control socket from an abstract address and returns the reply.
json SendCommand(const std::string& socket_path, const std::string& command) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_un self{};
  self.sun_family = AF_UNIX;
  const std::string self_name = "fake_nvml_test-" + std::to_string(getpid());
  std::memcpy(self.sun_path + 1, self_name.data(), self_name.size());  // abstract: leading NUL
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&self), offsetof(sockaddr_un, sun_path) + 1 + self_name.size()), 0);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_un to{};
  to.sun_family = AF_UNIX;
  std::memcpy(to.sun_path, socket_path.c_str(), socket_path.size() + 1);
  EXPECT_EQ(sendto(fd, command.data(), command.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)),
            static_cast<ssize_t>(command.size()));
  char reply[4096];
  const ssize_t n = recv(fd, reply, sizeof(reply), 0);
  close(fd);
  EXPECT_GT(n, 0);
  return n > 0 ? json::parse(std::string(reply, static_cast<std::size_t>(n))) : json();
}

int RunCtl(const std::string& socket_path, const std::string& args) {
  const std::string command = "/usr/bin/python3 " + std::string(kCtlScript) + " --socket " + socket_path + " " + args + " >/dev/null 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ECC and clock events: delivered to the sets registered for that type only; a GPU's
// supportedEventTypes bound what can be registered; fakeNvmlRegisteredEvents says what was.
TEST_F(FakeNvmlTest, EccAndClockEventsFollowTheRegisteredAndSupportedTypes) {
  const auto inject = reinterpret_cast<fakeNvmlInjectEvent_t>(dlsym(library_, "fakeNvmlInjectEvent"));
  const auto registered = reinterpret_cast<fakeNvmlRegisteredEvents_t>(dlsym(library_, "fakeNvmlRegisteredEvents"));
  ASSERT_NE(inject, nullptr);
  ASSERT_NE(registered, nullptr);
  Session session(api_);
  unsigned long long supported = 0;
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(Handle(0), &supported), nvml::kSuccess);
  ASSERT_EQ(supported & 0x13ULL, 0x13ULL) << "SBE, DBE and clock events by default";
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(Handle(0), nvml::kEventTypeDoubleBitEccError | nvml::kEventTypeClock, set),
            nvml::kSuccess);
  unsigned long long types = 0;
  ASSERT_EQ(registered(Uuid(Handle(0)).c_str(), &types), nvml::kSuccess);
  EXPECT_EQ(types, nvml::kEventTypeDoubleBitEccError | nvml::kEventTypeClock);
  ASSERT_EQ(registered(Uuid(Handle(1)).c_str(), &types), nvml::kSuccess);
  EXPECT_EQ(types, 0u);
  EXPECT_EQ(registered("GPU-unknown", &types), nvml::kErrorNotFound);

  nvml::EventData data{};
  EXPECT_EQ(inject(Uuid(Handle(0)).c_str(), nvml::kEventTypeSingleBitEccError, 0), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kErrorTimeout) << "SBE not registered";
  EXPECT_EQ(inject(Uuid(Handle(0)).c_str(), nvml::kEventTypeDoubleBitEccError, 0), nvml::kSuccess);
  EXPECT_EQ(inject(Uuid(Handle(0)).c_str(), nvml::kEventTypeClock, 0x8), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kSuccess);
  EXPECT_EQ(data.device, Handle(0));
  EXPECT_EQ(data.eventType, nvml::kEventTypeDoubleBitEccError);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kSuccess);
  EXPECT_EQ(data.eventType, nvml::kEventTypeClock);
  EXPECT_EQ(data.eventData, 0x8u);
  EXPECT_EQ(inject(Uuid(Handle(0)).c_str(), 0x3, 0), nvml::kErrorInvalidArgument) << "one type per event";
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}

// A GPU whose supportedEventTypes leave out the ECC events cannot register them.
TEST_F(FakeNvmlTest, AGpuWithoutEccEventsCannotRegisterThem) {
  const std::string path = temp_dir_ + "/xid-only.json";
  {
    std::ifstream in(kGpus8Path);
    json config = json::parse(in);
    config["gpus"][1]["supportedEventTypes"] = 0x8;
    std::ofstream(path) << config.dump();
  }
  setenv("FAKE_NVML_CONFIG", path.c_str(), 1);
  Session session(api_);
  unsigned long long supported = 0;
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(Handle(1), &supported), nvml::kSuccess);
  EXPECT_EQ(supported, 0x8u);
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceRegisterEvents(Handle(1), nvml::kEventTypeDoubleBitEccError, set), nvml::kErrorNotSupported);
  EXPECT_EQ(api_.nvmlDeviceRegisterEvents(Handle(1), nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}

TEST_F(FakeNvmlTest, ControlSocketDrivesTheFakeFromOutside) {
  const std::string socket_path = temp_dir_ + "/control.sock";
  setenv("FAKE_NVML_CONTROL", socket_path.c_str(), 1);
  ASSERT_EQ(api_.nvmlInit_v2(), nvml::kSuccess);
  struct stat st {};
  ASSERT_EQ(stat(socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));

  const nvml::Device device = Handle(2);
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(device, nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);
  nvml::EventData data{};

  // Raw datagrams with replies.
  json reply = SendCommand(socket_path, R"({"injectXid":{"uuid":")" + Uuid(device) + R"(","xid":79}})");
  EXPECT_EQ(reply["ok"], true);
  EXPECT_EQ(reply["delivered"], 1);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 5000), nvml::kSuccess);
  EXPECT_EQ(data.device, device);
  EXPECT_EQ(data.eventData, 79u);
  reply = SendCommand(socket_path, R"({"fail":{"function":"*","return":999}})");
  EXPECT_EQ(reply["ok"], true);
  unsigned int count = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorUnknown);
  EXPECT_EQ(SendCommand(socket_path, R"({"clearFailures":true})")["ok"], true);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);
  ::testing::internal::CaptureStderr();
  reply = SendCommand(socket_path, R"({"bogus":1})");
  EXPECT_EQ(reply["ok"], false);
  EXPECT_THAT(reply["error"].get<std::string>(), HasSubstr("unknown command"));
  reply = SendCommand(socket_path, "not json");
  EXPECT_EQ(reply["ok"], false);
  ::testing::internal::GetCapturedStderr();

  // The same through fakenvmlctl.py.
  EXPECT_EQ(RunCtl(socket_path, "ping"), 0);
  EXPECT_EQ(RunCtl(socket_path, "fail nvmlDeviceGetCount_v2 GPU_IS_LOST"), 0);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kErrorGpuIsLost);
  EXPECT_EQ(RunCtl(socket_path, "clear-failures"), 0);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), nvml::kSuccess);
  EXPECT_EQ(RunCtl(socket_path, "inject-xid 00000000:3A:00.0 48"), 0);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 5000), nvml::kSuccess);
  EXPECT_EQ(data.device, device);
  EXPECT_EQ(data.eventData, 48u);
  // Any registered type through inject-event; the set holds XIDs only.
  EXPECT_EQ(RunCtl(socket_path, "inject-event 00000000:3A:00.0 doubleBitEcc"), 0);
  EXPECT_EQ(RunCtl(socket_path, "inject-event 00000000:3A:00.0 xid --data 31"), 0);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 5000), nvml::kSuccess);
  EXPECT_EQ(data.eventType, nvml::kEventTypeXidCriticalError);
  EXPECT_EQ(data.eventData, 31u) << "the DBE event was not registered: not delivered";
  reply = SendCommand(socket_path, R"({"registeredEvents":{"uuid":")" + Uuid(device) + R"("}})");
  EXPECT_EQ(reply["types"], nvml::kEventTypeXidCriticalError);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCtl(socket_path, "inject-event 00000000:3A:00.0 bogus"), 1);
  EXPECT_EQ(RunCtl(socket_path, "inject-xid GPU-unknown 48"), 1);
  ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlShutdown(), nvml::kSuccess);
  EXPECT_FALSE(std::filesystem::exists(socket_path)) << "nvmlShutdown removes the control socket";
  EXPECT_EQ(RunCtl(socket_path, "--timeout 1 ping"), 2);
}

TEST_F(FakeNvmlTest, UnusableControlPathFailsInit) {
  setenv("FAKE_NVML_CONTROL", (temp_dir_ + "/no/such/dir/control.sock").c_str(), 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(api_.nvmlInit_v2(), nvml::kErrorUnknown);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("cannot bind control socket"));
}

TEST_F(FakeNvmlTest, ConcurrentCallersAndInjection) {
  Session session(api_);
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  for (unsigned int i = 0; i < 8; ++i) {
    ASSERT_EQ(api_.nvmlDeviceRegisterEvents(Handle(i), nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);
  }
  std::vector<std::string> uuids;
  for (unsigned int i = 0; i < 8; ++i) uuids.push_back(Uuid(Handle(i)));

  constexpr int kInjections = 400;
  std::atomic<int> received{0};
  std::atomic<bool> errors{false};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // the event consumer
    nvml::EventData data{};
    while (received < kInjections) {
      const nvml::Return rc = api_.nvmlEventSetWait_v2(set, &data, 5000);
      if (rc == nvml::kSuccess) {
        ++received;
      } else {
        errors = true;
        return;
      }
    }
  });
  for (int t = 0; t < 3; ++t) {  // readers
    threads.emplace_back([&, t] {
      for (int n = 0; n < 300; ++n) {
        nvml::Device device = nullptr;
        char buffer[nvml::kDeviceUuidV2BufferSize];
        nvml::PciInfo pci{};
        if (api_.nvmlDeviceGetHandleByIndex_v2(static_cast<unsigned int>((n + t) % 8), &device) != nvml::kSuccess ||
            api_.nvmlDeviceGetUUID(device, buffer, sizeof(buffer)) != nvml::kSuccess ||
            api_.nvmlDeviceGetPciInfo_v3(device, &pci) != nvml::kSuccess) {
          errors = true;
        }
      }
    });
  }
  for (int n = 0; n < kInjections; ++n) {
    if (inject_xid_(uuids[static_cast<std::size_t>(n) % 8].c_str(), 13) != nvml::kSuccess) errors = true;
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(errors);
  EXPECT_EQ(received, kInjections);
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}


// Two GPUs, the first MIG-enabled with `mig` as its "migDevices" (JSON array text).
std::string MigConfig(const std::string& mig, const std::string& second_uuid = "GPU-re000000-0000-0000-0000-000000000002") {
  return R"({"gpus":[{"uuid":"GPU-re000000-0000-0000-0000-000000000001","pciBusId":"00000000:18:00.0","minor":0,
                     "memoryTotalBytes":85520809984,"migEnabled":true,"migDevices":)" +
         mig + R"(},
                    {"uuid":")" + second_uuid + R"(","pciBusId":"00000000:2A:00.0","minor":1,
                     "memoryTotalBytes":85520809984}]})";
}

TEST_F(FakeNvmlTest, ReloadConfigPlaysAMigReconfigurationAndQueuesItsEvent) {
  const auto reload = reinterpret_cast<fakeNvmlReloadConfig_t>(dlsym(library_, "fakeNvmlReloadConfig"));
  ASSERT_NE(reload, nullptr);
  unsigned int changed = 99;
  EXPECT_EQ(reload(&changed), nvml::kErrorUninitialized);

  const std::string two_slices =
      R"([{"uuid":"MIG-re000000-0000-0000-0000-00000000000a","gpuInstanceId":1,"gpuInstanceSliceCount":3,"memorySizeMB":40192},
          {"uuid":"MIG-re000000-0000-0000-0000-00000000000b","gpuInstanceId":2,"gpuInstanceSliceCount":3,"memorySizeMB":40192}])";
  const std::string seven_slices = [] {
    std::string text = "[";
    for (int i = 0; i < 7; ++i) {
      text += std::string(i == 0 ? "" : ",") + R"({"uuid":"MIG-re000000-0000-0000-0000-00000000010)" +
              std::to_string(i) + R"(","gpuInstanceId":)" + std::to_string(7 + i) +
              R"(,"gpuInstanceSliceCount":1,"memorySizeMB":9856})";
    }
    return text + "]";
  }();
  const std::string config = WriteFile("mig.json", MigConfig(two_slices));
  setenv("FAKE_NVML_CONFIG", config.c_str(), 1);
  const std::string socket_path = temp_dir_ + "/control.sock";
  setenv("FAKE_NVML_CONTROL", socket_path.c_str(), 1);
  Session session(api_);

  const nvml::Device mig_gpu = Handle(0);
  const nvml::Device plain_gpu = Handle(1);
  unsigned long long supported = 0;
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(mig_gpu, &supported), nvml::kSuccess);
  EXPECT_NE(supported & nvml::kEventMigConfigChange, 0u) << "MIG-enabled GPUs report MIG reconfigurations by default";
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(plain_gpu, &supported), nvml::kSuccess);
  EXPECT_NE(supported & nvml::kEventMigConfigChange, 0u) << "and whole GPUs that could be (compute capability 9.0)";
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(mig_gpu, nvml::kEventTypeXidCriticalError | nvml::kEventMigConfigChange, set),
            nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(plain_gpu, nvml::kEventTypeXidCriticalError, set), nvml::kSuccess);
  nvml::Device old_mig = nullptr;
  ASSERT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 1, &old_mig), nvml::kSuccess);
  EXPECT_EQ(Uuid(old_mig), "MIG-re000000-0000-0000-0000-00000000000b");

  // Unchanged file: no GPU changed, no event.
  changed = 99;
  ASSERT_EQ(reload(&changed), nvml::kSuccess);
  EXPECT_EQ(changed, 0u);
  nvml::EventData data{};
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kErrorTimeout);

  // 2 × 3g → 7 × 1g, woken from another thread as the driver would wake a waiter.
  WriteFile("mig.json", MigConfig(seven_slices));
  std::thread reloader([&] {
    unsigned int count = 0;
    EXPECT_EQ(reload(&count), nvml::kSuccess);
    EXPECT_EQ(count, 1u);
  });
  const nvml::Return rc = api_.nvmlEventSetWait_v2(set, &data, 60000);
  reloader.join();
  ASSERT_EQ(rc, nvml::kSuccess);
  EXPECT_EQ(data.device, mig_gpu) << "the whole-GPU handle stays valid and names the GPU";
  EXPECT_EQ(data.eventType, nvml::kEventMigConfigChange);
  EXPECT_EQ(data.eventData, 0u);
  EXPECT_EQ(data.gpuInstanceId, nvml::kInstanceIdNone);
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kErrorTimeout) << "one event for the one changed GPU";
  nvml::Device new_mig = nullptr;
  ASSERT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 6, &new_mig), nvml::kSuccess);
  EXPECT_EQ(Uuid(new_mig), "MIG-re000000-0000-0000-0000-000000000106");
  char buffer[nvml::kDeviceUuidV2BufferSize] = {};
  EXPECT_EQ(api_.nvmlDeviceGetUUID(plain_gpu, buffer, sizeof(buffer)), nvml::kSuccess);

  // The same through the control socket and fakenvmlctl.py: back to 2 × 3g.
  WriteFile("mig.json", MigConfig(two_slices));
  json reply = SendCommand(socket_path, R"({"reloadConfig":true})");
  EXPECT_EQ(reply["ok"], true);
  EXPECT_EQ(reply["changed"], 1);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 5000), nvml::kSuccess);
  EXPECT_EQ(data.eventType, nvml::kEventMigConfigChange);
  EXPECT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 6, &new_mig), nvml::kErrorNotFound);
  WriteFile("mig.json", MigConfig(seven_slices));
  EXPECT_EQ(RunCtl(socket_path, "reload-config"), 0);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 5000), nvml::kSuccess);
  EXPECT_EQ(data.eventType, nvml::kEventMigConfigChange);

  // A file with other GPUs is refused, and nothing changes.
  WriteFile("mig.json", MigConfig(two_slices, "GPU-re000000-0000-0000-0000-0000000000ff"));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(reload(&changed), nvml::kErrorInvalidArgument);
  reply = SendCommand(socket_path, R"({"reloadConfig":true})");
  EXPECT_EQ(reply["ok"], false);
  EXPECT_THAT(reply["error"].get<std::string>(), HasSubstr("the GPUs"));
  WriteFile("mig.json", "{not json");
  EXPECT_NE(reload(&changed), nvml::kSuccess);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kErrorTimeout);
  EXPECT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 6, &new_mig), nvml::kSuccess);
  EXPECT_EQ(Uuid(new_mig), "MIG-re000000-0000-0000-0000-000000000106");
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}

// Which GPUs report MIG reconfigurations by default: compute capability 8.0 (Ampere) or newer,
// MIG mode on or off, as current drivers; an older GPU only with MIG mode on. A whole GPU's way
// into MIG mode reaches an event set registered on it.
TEST_F(FakeNvmlTest, WholeMigCapableGpusReportGoingIntoMigMode) {
  const auto reload = reinterpret_cast<fakeNvmlReloadConfig_t>(dlsym(library_, "fakeNvmlReloadConfig"));
  ASSERT_NE(reload, nullptr);
  const auto gpus = [](const std::string& ampere_mig) {
    return R"({"gpus":[{"uuid":"GPU-ca000000-0000-0000-0000-000000000001","pciBusId":"00000000:18:00.0","minor":0,
                       "memoryTotalBytes":85520809984,"computeCapability":"8.0")" +
           ampere_mig + R"(},
                      {"uuid":"GPU-ca000000-0000-0000-0000-000000000002","pciBusId":"00000000:2A:00.0","minor":1,
                       "memoryTotalBytes":34359738368,"computeCapability":"7.0"}]})";
  };
  const std::string config = WriteFile("capable.json", gpus(""));
  setenv("FAKE_NVML_CONFIG", config.c_str(), 1);
  Session session(api_);
  unsigned long long supported = 0;
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(Handle(0), &supported), nvml::kSuccess);
  EXPECT_NE(supported & nvml::kEventMigConfigChange, 0u) << "Ampere, MIG mode off";
  ASSERT_EQ(api_.nvmlDeviceGetSupportedEventTypes(Handle(1), &supported), nvml::kSuccess);
  EXPECT_EQ(supported & nvml::kEventMigConfigChange, 0u) << "Volta";
  nvml::EventSet set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(Handle(0), nvml::kEventMigConfigChange, set), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceRegisterEvents(Handle(1), nvml::kEventMigConfigChange, set), nvml::kErrorNotSupported);

  WriteFile("capable.json", gpus(R"(,"migEnabled":true,"migDevices":[{"uuid":"MIG-ca000000-0000-0000-0000-00000000000a",
                                    "gpuInstanceId":0,"gpuInstanceSliceCount":7,"memorySizeMB":80384}])"));
  unsigned int changed = 0;
  ASSERT_EQ(reload(&changed), nvml::kSuccess);
  EXPECT_EQ(changed, 1u);
  nvml::EventData data{};
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kSuccess);
  EXPECT_EQ(data.device, Handle(0));
  EXPECT_EQ(data.eventType, nvml::kEventMigConfigChange);
  WriteFile("capable.json", gpus(""));
  ASSERT_EQ(reload(&changed), nvml::kSuccess);
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), nvml::kSuccess) << "and the way back";
  EXPECT_EQ(api_.nvmlEventSetFree(set), nvml::kSuccess);
}

// ---- Health readings (issue 26) ------------------------------------------------------------------

// What gpu-health reads of one GPU, through the same function types the daemon resolves.
struct Readings {
  nvml::EnableState ecc_current = nvml::kFeatureDisabled, ecc_pending = nvml::kFeatureDisabled;
  unsigned long long dbe_volatile = 99, sbe_aggregate = 99;
  nvml::RowRemapperHistogramValues histogram{};
  unsigned int remap_corrected = 9, remap_uncorrected = 9, remap_pending = 9, remap_failed = 9;
  unsigned int retired_dbe = 99;
  nvml::Return retired_dbe_rc = nvml::kErrorUnknown;
  nvml::EnableState link1 = nvml::kFeatureDisabled;
  unsigned long long link0_replay = 99;
  unsigned int gen = 0, width = 0, max_gen = 0, max_width = 0, replay = 99;
  unsigned long long reasons = 99, old_reasons = 99;
  unsigned int temp = 0, slowdown = 0, shutdown = 0, mem_max = 0;
  nvml::FieldValue memory_temp{};
  nvml::ViolationTime power{}, thermal{};
};

Readings ReadAll(const nvml::Api& api, nvml::Device d) {
  Readings r;
  EXPECT_EQ(api.nvmlDeviceGetEccMode(d, &r.ecc_current, &r.ecc_pending), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetTotalEccErrors(d, nvml::kMemoryErrorTypeUncorrected, nvml::kVolatileEcc, &r.dbe_volatile),
            nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetTotalEccErrors(d, nvml::kMemoryErrorTypeCorrected, nvml::kAggregateEcc, &r.sbe_aggregate),
            nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetRowRemapperHistogram(d, &r.histogram), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetRemappedRows(d, &r.remap_corrected, &r.remap_uncorrected, &r.remap_pending, &r.remap_failed),
            nvml::kSuccess);
  r.retired_dbe = 0;
  r.retired_dbe_rc = api.nvmlDeviceGetRetiredPages(d, nvml::kPageRetirementCauseDoubleBitEccError, &r.retired_dbe, nullptr);
  EXPECT_EQ(api.nvmlDeviceGetNvLinkState(d, 1, &r.link1), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetNvLinkErrorCounter(d, 0, nvml::kNvLinkErrorDlReplay, &r.link0_replay), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetCurrPcieLinkGeneration(d, &r.gen), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetCurrPcieLinkWidth(d, &r.width), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetMaxPcieLinkGeneration(d, &r.max_gen), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetMaxPcieLinkWidth(d, &r.max_width), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetPcieReplayCounter(d, &r.replay), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetCurrentClocksEventReasons(d, &r.reasons), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetCurrentClocksThrottleReasons(d, &r.old_reasons), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetTemperature(d, nvml::kTemperatureGpu, &r.temp), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetTemperatureThreshold(d, nvml::kTemperatureThresholdSlowdown, &r.slowdown), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetTemperatureThreshold(d, nvml::kTemperatureThresholdShutdown, &r.shutdown), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetTemperatureThreshold(d, nvml::kTemperatureThresholdMemMax, &r.mem_max), nvml::kSuccess);
  r.memory_temp.fieldId = nvml::kFieldDevMemoryTemp;
  EXPECT_EQ(api.nvmlDeviceGetFieldValues(d, 1, &r.memory_temp), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetViolationStatus(d, nvml::kPerfPolicyPower, &r.power), nvml::kSuccess);
  EXPECT_EQ(api.nvmlDeviceGetViolationStatus(d, nvml::kPerfPolicyThermal, &r.thermal), nvml::kSuccess);
  return r;
}

TEST_F(FakeNvmlTest, HealthReadingsAreHealthyByDefault) {
  Session session(api_);
  const Readings r = ReadAll(api_, Handle(3));
  EXPECT_EQ(r.ecc_current, nvml::kFeatureEnabled);
  EXPECT_EQ(r.ecc_pending, nvml::kFeatureEnabled);
  EXPECT_EQ(r.dbe_volatile, 0u);
  EXPECT_EQ(r.sbe_aggregate, 0u);
  EXPECT_EQ(r.histogram.max, 640u);
  EXPECT_EQ(r.histogram.none, 0u);
  EXPECT_EQ(r.remap_uncorrected, 0u);
  EXPECT_EQ(r.remap_pending, 0u);
  EXPECT_EQ(r.remap_failed, 0u);
  EXPECT_EQ(r.retired_dbe_rc, nvml::kSuccess);
  EXPECT_EQ(r.retired_dbe, 0u);
  EXPECT_EQ(r.link1, nvml::kFeatureEnabled);
  EXPECT_EQ(r.link0_replay, 0u);
  EXPECT_EQ(r.gen, 5u);
  EXPECT_EQ(r.width, 16u);
  EXPECT_EQ(r.max_gen, 5u);
  EXPECT_EQ(r.max_width, 16u);
  EXPECT_EQ(r.replay, 0u);
  EXPECT_EQ(r.reasons, 0u);
  EXPECT_EQ(r.old_reasons, 0u);
  EXPECT_LT(r.temp, r.slowdown);
  EXPECT_LT(r.slowdown, r.shutdown);
  EXPECT_EQ(r.memory_temp.nvmlReturn, nvml::kSuccess);
  EXPECT_EQ(r.memory_temp.valueType, nvml::kValueTypeUnsignedInt);
  EXPECT_LT(r.memory_temp.value.uiVal, r.mem_max);
  EXPECT_GT(r.memory_temp.timestamp, 0);
  EXPECT_EQ(r.power.violationTime, 0u);
  EXPECT_GT(r.power.referenceTime, 0u);
  EXPECT_EQ(r.thermal.violationTime, 0u);
  // A field the fake does not know is NOT_SUPPORTED in its own return code, not the call's.
  nvml::FieldValue fields[2]{};
  fields[0].fieldId = 1;
  fields[1].fieldId = nvml::kFieldDevMemoryTemp;
  EXPECT_EQ(api_.nvmlDeviceGetFieldValues(Handle(3), 2, fields), nvml::kSuccess);
  EXPECT_EQ(fields[0].nvmlReturn, nvml::kErrorNotSupported);
  EXPECT_EQ(fields[1].nvmlReturn, nvml::kSuccess);
  // The link numbers stop where the GPU's links do.
  unsigned long long counter = 0;
  EXPECT_EQ(api_.nvmlDeviceGetNvLinkErrorCounter(Handle(3), 2, nvml::kNvLinkErrorDlCrcFlit, &counter),
            nvml::kErrorInvalidArgument);
}

TEST_F(FakeNvmlTest, HealthFromTheConfigAndChangedAtRunTime) {
  json config = gpus8_;
  config["gpus"][0]["health"] = {{"pcieWidth", 8}, {"eccUncorrectedVolatile", 2}, {"retiredPagesDbe", 3}};
  config["gpus"][1]["nvlinkCount"] = 4;
  setenv("FAKE_NVML_CONFIG", WriteFile("health.json", config.dump()).c_str(), 1);
  Session session(api_);
  Readings r = ReadAll(api_, Handle(0));
  EXPECT_EQ(r.width, 8u);
  EXPECT_EQ(r.dbe_volatile, 2u);
  EXPECT_EQ(r.retired_dbe_rc, nvml::kErrorInsufficientSize) << "the count query answers the count";
  EXPECT_EQ(r.retired_dbe, 3u);
  unsigned long long pages[3] = {};
  unsigned int count = 3;
  EXPECT_EQ(api_.nvmlDeviceGetRetiredPages(Handle(0), nvml::kPageRetirementCauseDoubleBitEccError, &count, pages),
            nvml::kSuccess);
  EXPECT_EQ(count, 3u);
  EXPECT_NE(pages[2], 0u);
  nvml::EnableState active = nvml::kFeatureEnabled;
  EXPECT_EQ(api_.nvmlDeviceGetNvLinkState(Handle(1), 3, &active), nvml::kSuccess);
  EXPECT_EQ(active, nvml::kFeatureDisabled) << "a link past the peers is inactive";

  const std::string uuid = Uuid(Handle(2));
  ASSERT_EQ(set_health_(uuid.c_str(), R"({"remapPending":true,"nvlinkDown":[1],"fabricHealthMask":1,)"
                                      R"("clocksEventReasons":72,"nvlinkErrors":{"0":{"replay":7}},"memoryTemperature":99})"),
            nvml::kSuccess);
  r = ReadAll(api_, Handle(2));
  EXPECT_EQ(r.remap_pending, 1u);
  EXPECT_EQ(r.link1, nvml::kFeatureDisabled);
  EXPECT_EQ(r.link0_replay, 7u);
  EXPECT_EQ(r.reasons, 72u);
  EXPECT_EQ(r.old_reasons, 72u);
  EXPECT_EQ(r.memory_temp.value.uiVal, 99u);
  nvml::GpuFabricInfoV fabric{};
  fabric.version = nvml::kGpuFabricInfoV3Version;
  ASSERT_EQ(api_.nvmlDeviceGetGpuFabricInfoV(Handle(2), &fabric), nvml::kSuccess);
  EXPECT_EQ(fabric.healthMask, 1u);
  // Later changes merge with earlier ones; a bad one changes nothing.
  ASSERT_EQ(set_health_(uuid.c_str(), R"({"pcieWidth":4})"), nvml::kSuccess);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(set_health_(uuid.c_str(), R"({"pcieWidth":2,"bogus":1})"), nvml::kErrorInvalidArgument);
  EXPECT_EQ(set_health_(uuid.c_str(), "not json"), nvml::kErrorInvalidArgument);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("bogus"));
  r = ReadAll(api_, Handle(2));
  EXPECT_EQ(r.width, 4u);
  EXPECT_EQ(r.link1, nvml::kFeatureDisabled);
  // Kept across nvmlShutdown/nvmlInit, as a hardware fault is, until cleared.
  {
    Session again(api_);
  }
  EXPECT_EQ(ReadAll(api_, Handle(2)).width, 4u);
  clear_health_();
  r = ReadAll(api_, Handle(2));
  EXPECT_EQ(r.width, 16u);
  EXPECT_EQ(r.link1, nvml::kFeatureEnabled);
  EXPECT_EQ(ReadAll(api_, Handle(0)).width, 8u) << "the config's own health stays";
  // The maintenance keys stay (they are the GPU's state, which a reset changes).
  EXPECT_EQ(r.remap_pending, 1u);
  ASSERT_EQ(set_health_(uuid.c_str(), R"({"remapPending":false})"), nvml::kSuccess);
}

TEST_F(FakeNvmlTest, ALostGpuAnswersGpuIsLostFromEveryCallThatNamesIt) {
  Session session(api_);
  const nvml::Device device = Handle(5);
  const std::string uuid = Uuid(device);
  ASSERT_EQ(set_health_(uuid.c_str(), R"({"lost":true})"), nvml::kSuccess);
  unsigned int value = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCurrPcieLinkWidth(device, &value), nvml::kErrorGpuIsLost);
  EXPECT_EQ(api_.nvmlDeviceGetMinorNumber(device, &value), nvml::kErrorGpuIsLost);
  char buffer[nvml::kDeviceUuidV2BufferSize] = {};
  EXPECT_EQ(api_.nvmlDeviceGetUUID(device, buffer, sizeof(buffer)), nvml::kErrorGpuIsLost);
  nvml::Device other = nullptr;
  EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(5, &other), nvml::kErrorGpuIsLost);
  EXPECT_EQ(api_.nvmlDeviceGetHandleByUUID(uuid.c_str(), &other), nvml::kErrorGpuIsLost);
  EXPECT_EQ(api_.nvmlDeviceGetCurrPcieLinkWidth(Handle(4), &value), nvml::kSuccess) << "the others answer";
  ASSERT_EQ(set_health_(uuid.c_str(), R"({"lost":false})"), nvml::kSuccess);
  EXPECT_EQ(api_.nvmlDeviceGetCurrPcieLinkWidth(device, &value), nvml::kSuccess);
}

TEST_F(FakeNvmlTest, AHungCallBlocksOnlyItsCallerUntilReleased) {
  Session session(api_);
  const nvml::Device device = Handle(0);
  ASSERT_EQ(hang_("nvmlDeviceGetTemperature", 0), nvml::kSuccess);
  EXPECT_EQ(hang_("nvmlNoSuchFunction", 0), nvml::kErrorInvalidArgument);
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    unsigned int temp = 0;
    EXPECT_EQ(api_.nvmlDeviceGetTemperature(device, nvml::kTemperatureGpu, &temp), nvml::kSuccess);
    returned = true;
  });
  unsigned int hung = 0;
  for (int i = 0; i < 500 && hung == 0; ++i) {
    hung_calls_(&hung);
    if (hung == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(hung, 1u);
  // Other calls, the same GPU included, go on meanwhile.
  unsigned int width = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCurrPcieLinkWidth(device, &width), nvml::kSuccess);
  EXPECT_FALSE(returned);
  release_hangs_();
  caller.join();
  EXPECT_TRUE(returned);
  hung_calls_(&hung);
  EXPECT_EQ(hung, 0u);
  // With a number of seconds the hang ends by itself.
  ASSERT_EQ(hang_("*", 1), nvml::kSuccess);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(api_.nvmlDeviceGetCurrPcieLinkWidth(device, &width), nvml::kSuccess);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
}

TEST_F(FakeNvmlTest, HealthAndHangsThroughTheControlSocket) {
  const std::string socket_path = temp_dir_ + "/control.sock";
  setenv("FAKE_NVML_CONTROL", socket_path.c_str(), 1);
  ASSERT_EQ(api_.nvmlInit_v2(), nvml::kSuccess);
  const nvml::Device device = Handle(1);
  const std::string uuid = Uuid(device);
  EXPECT_EQ(RunCtl(socket_path, "set-health " + uuid + R"( '{"pcieMaxWidth":8,"remapFailure":true}')"), 0);
  unsigned int value = 0;
  EXPECT_EQ(api_.nvmlDeviceGetMaxPcieLinkWidth(device, &value), nvml::kSuccess);
  EXPECT_EQ(value, 8u);
  unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
  EXPECT_EQ(api_.nvmlDeviceGetRemappedRows(device, &corrected, &uncorrected, &pending, &failed), nvml::kSuccess);
  EXPECT_EQ(failed, 1u);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCtl(socket_path, "set-health " + uuid + R"( '{"pcieMaxWidth":"wide"}')"), 1);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(RunCtl(socket_path, "hang nvmlDeviceGetPcieReplayCounter"), 0);
  std::thread caller([&] {
    unsigned int replay = 0;
    EXPECT_EQ(api_.nvmlDeviceGetPcieReplayCounter(device, &replay), nvml::kSuccess);
  });
  json hung;
  for (int i = 0; i < 500; ++i) {
    hung = SendCommand(socket_path, R"({"getHung":true})");
    if (hung.value("hung", 0) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(hung.value("hung", 0), 1);
  EXPECT_EQ(RunCtl(socket_path, "release-hangs"), 0);
  caller.join();
  EXPECT_EQ(RunCtl(socket_path, "clear-health"), 0);
  EXPECT_EQ(api_.nvmlDeviceGetMaxPcieLinkWidth(device, &value), nvml::kSuccess);
  EXPECT_EQ(value, 16u);
  EXPECT_EQ(SendCommand(socket_path, R"({"setHealth":{"uuid":")" + uuid + R"(","remapFailure":false}})")["ok"], true);
  ASSERT_EQ(api_.nvmlShutdown(), nvml::kSuccess);
}

}  // namespace
}  // namespace gns::sim
