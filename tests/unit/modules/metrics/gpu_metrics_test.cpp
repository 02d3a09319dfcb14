// gpuMetrics end to end in one process: the metrics module with gpuMetrics on, the real
// gpu-inventory module against the fake libnvidia-ml.so.1 (its health pass reads the usage on
// the pool), and the pod map published on the bus as pod-resources publishes it. Shows that a
// pod's GPU series appear and disappear with the pod (at the pod-map change, with no new pass),
// that a scrape never calls NVML (the fake counts every call), and the listener of its own.
#include "loop/metrics_registry.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/metrics/messages.hpp"
#include "modules/metrics/metrics_module.hpp"
#include "modules/pod_resources/messages.hpp"
#include "support/http_client.hpp"
#include "support/loop_harness.hpp"
#include "support/prometheus.hpp"
#include "support/temp_dir.hpp"

#include "fake_nvml_control.h"

#include <dlfcn.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace gns::metrics {
namespace {

using std::chrono::milliseconds;
namespace inv = gns::gpu_inventory;
namespace pr = gns::pod_resources;

constexpr const char* kLibraryPath = GNS_FAKE_NVML_LIBRARY;
constexpr const char* kSupervisor = GNS_SUPERVISOR_BIN;
constexpr const char* kGpus8Path = GNS_FAKE_NVML_GPUS8;
constexpr const char* kGpu0 = "GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10";  // gpus-8.json's GPU 0

class GpuMetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    library_ = dlopen(kLibraryPath, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    call_count_ = reinterpret_cast<fakeNvmlCallCount_t>(dlsym(library_, "fakeNvmlCallCount"));
    set_health_ = reinterpret_cast<fakeNvmlSetHealth_t>(dlsym(library_, "fakeNvmlSetHealth"));
    clear_health_ = reinterpret_cast<fakeNvmlClearHealth_t>(dlsym(library_, "fakeNvmlClearHealth"));
    inject_xid_ = reinterpret_cast<fakeNvmlInjectXid_t>(dlsym(library_, "fakeNvmlInjectXid"));
  }

  void SetUp() override {
    ASSERT_NE(call_count_, nullptr);
    ASSERT_NE(set_health_, nullptr);
    setenv("FAKE_NVML_CONFIG", kGpus8Path, 1);
    setenv("FAKE_NVML_CONTROL", (dir_.Path() / "nvml.sock").c_str(), 1);
    // Before nvmlInit: kept by UUID for the life of the process, over the config.
    ASSERT_EQ(set_health_(kGpu0, R"({"gpuUtil":87,"powerMilliwatts":312456,
        "nvlinkThroughput":{"0":{"dataTxKiB":5000,"dataRxKiB":700},"1":{"dataTxKiB":300,"dataRxKiB":0}}})"),
              0);

    inv::GpuInventoryModule::Config inventory;
    inventory.nvml_library = kLibraryPath;
    inventory.event_wait_timeout = milliseconds(100);
    inventory.event_waiter_program = kSupervisor;
    inventory.refresh_interval = std::chrono::hours(1);
    inventory_context_ = std::make_unique<ModuleContext>(
        h_.Parts(), "gpu-inventory", [](std::string) {}, [](ModuleHealth, std::string) {});
    inventory_ = std::make_unique<inv::GpuInventoryModule>(*inventory_context_, inventory);
    inventory_->Start();

    MetricsModule::Config metrics;
    metrics.listen = *ParseListenAddress("127.0.0.1:0");
    metrics.gpu_metrics.enabled = true;
    metrics.gpu_metrics.interval = std::chrono::hours(1);  // one pass at start: nothing else samples
    metrics.gpu_metrics.listen = ParseListenAddress("127.0.0.1:0");
    metrics.gpu_metrics.hostname = "node-a";
    metrics_context_ = std::make_unique<ModuleContext>(
        h_.Parts(), "metrics", [](std::string) {}, [](ModuleHealth, std::string) {});
    metrics_ = std::make_unique<MetricsModule>(*metrics_context_, metrics);
    metrics_->Start();
  }

  void TearDown() override {
    bool stopped = false;
    if (metrics_) metrics_->Stop([&] { stopped = true; });
    EXPECT_TRUE(h_.RunUntil([&] { return stopped; }));
    metrics_.reset();
    if (inventory_) inventory_->Stop([] {});
    inventory_.reset();
    h_.Drain();
    clear_health_();
    // NVML is shut down on the pool after Stop: wait for it, so the next test reads its own config.
    EXPECT_TRUE(h_.RunUntil([&] { return inject_xid_("GPU-none", 0) == 1; }));
  }

  std::string Scrape() { return h_.metrics.Render(); }
  double Passes() {
    return h_.metrics.Counter("gpu_node_supervisor_gpu_metrics_passes_total", "").Value();
  }
  unsigned long long Calls() {
    unsigned long long calls = 0;
    EXPECT_EQ(call_count_(&calls), 0);
    return calls;
  }
  static std::string Gpu0Labels() {
    return std::string("gpu=\"0\",UUID=\"") + kGpu0 +
           "\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H200\",Hostname=\"node-a\"";
  }

  static inline void* library_ = nullptr;
  static inline fakeNvmlCallCount_t call_count_ = nullptr;
  static inline fakeNvmlSetHealth_t set_health_ = nullptr;
  static inline fakeNvmlClearHealth_t clear_health_ = nullptr;
  static inline fakeNvmlInjectXid_t inject_xid_ = nullptr;

  test::TempDir dir_{"gpu_metrics_test"};
  test::LoopHarness h_;
  std::unique_ptr<ModuleContext> inventory_context_;
  std::unique_ptr<inv::GpuInventoryModule> inventory_;
  std::unique_ptr<ModuleContext> metrics_context_;
  std::unique_ptr<MetricsModule> metrics_;
};

TEST_F(GpuMetricsTest, APodsGpuSeriesAppearAndDisappearWithThePod) {
  const std::string idle = "DCGM_FI_DEV_GPU_UTIL{" + Gpu0Labels() + "}";
  ASSERT_TRUE(h_.RunUntil([&] { return Scrape().find(idle) != std::string::npos; })) << Scrape();
  EXPECT_EQ(test::ParsePrometheus(Scrape()).Value(idle), 87);
  const double passes = Passes();

  pr::GpuPodMap map;
  map.listed = map.fresh = true;
  map.gpus[kGpu0] = {pr::PodContainerRef{"team-a", "train-0", "uid-1", "main", "nvidia.com/gpu"}};
  h_.bus.Publish(map);
  const std::string held =
      "DCGM_FI_DEV_GPU_UTIL{" + Gpu0Labels() + ",container=\"main\",namespace=\"team-a\",pod=\"train-0\"}";
  ASSERT_TRUE(h_.RunUntil([&] { return Scrape().find(held) != std::string::npos; })) << Scrape();
  auto scrape = test::ParsePrometheus(Scrape());
  EXPECT_EQ(scrape.Value(held), 87);
  EXPECT_DOUBLE_EQ(scrape.Value("DCGM_FI_DEV_POWER_USAGE{" + Gpu0Labels() +
                                ",container=\"main\",namespace=\"team-a\",pod=\"train-0\"}"),
                   312.456);
  EXPECT_EQ(scrape.samples.count(idle), 0u);  // the held GPU's only series are the pod's

  map.gpus.clear();  // the pod ended
  h_.bus.Publish(map);
  ASSERT_TRUE(h_.RunUntil([&] { return Scrape().find("train-0") == std::string::npos; })) << Scrape();
  EXPECT_EQ(test::ParsePrometheus(Scrape()).Value(idle), 87);
  EXPECT_EQ(Passes(), passes) << "the pod's series went with the pod-map change, not with a new pass";
}

TEST_F(GpuMetricsTest, NvLinkBandwidthComesFromNvmlThroughputOverAllLinks) {
  const std::string gpu0 = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{" + Gpu0Labels() + "}";
  ASSERT_TRUE(h_.RunUntil([&] { return Scrape().find(gpu0) != std::string::npos; })) << Scrape();
  const auto scrape = test::ParsePrometheus(Scrape());
  EXPECT_EQ(scrape.Value(gpu0), 5000 + 700 + 300);  // KiB, both directions, both links
  EXPECT_EQ(scrape.types.at("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), "counter");
  // gpus-8.json's other GPUs have links and no traffic: a zero each, not nothing.
  std::size_t series = 0;
  for (const auto& sample : scrape.samples) {
    if (sample.first.starts_with("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{")) ++series;
  }
  EXPECT_EQ(series, 8u);
}

TEST_F(GpuMetricsTest, AScrapeNeverCallsNvml) {
  ASSERT_TRUE(h_.RunUntil([&] { return Scrape().find("DCGM_FI_DEV_GPU_UTIL{") != std::string::npos; }));
  h_.RunUntil([] { return false; }, milliseconds(50));  // let the start settle
  const unsigned long long before = Calls();
  ASSERT_GT(before, 0u) << "the pass itself did call the fake";
  for (int i = 0; i < 50; ++i) ASSERT_NE(Scrape().find("DCGM_FI_DEV_FB_USED{"), std::string::npos);
  EXPECT_EQ(Calls(), before);
}

TEST_F(GpuMetricsTest, TheSameSeriesOnAListenerOfTheirOwn) {
  ASSERT_TRUE(h_.RunUntil([&] { return Scrape().find("DCGM_FI_DEV_GPU_UTIL{") != std::string::npos; }));
  const auto* endpoint = h_.bus.Latest<MetricsEndpoint>();
  ASSERT_NE(endpoint, nullptr);
  const std::string address = endpoint->gpu_metrics_address;
  ASSERT_FALSE(address.empty());
  const auto port = static_cast<unsigned short>(std::stoi(address.substr(address.rfind(':') + 1)));
  const auto result = h_.OffLoop([port] { return test::HttpRequest("127.0.0.1", port, "GET", "/metrics"); });
  ASSERT_EQ(result.status, 200) << result.error;
  EXPECT_EQ(result.body, h_.metrics.RenderForeign("DCGM_FI_"));
  EXPECT_NE(result.body.find("DCGM_FI_DEV_GPU_UTIL{" + Gpu0Labels() + "} 87"), std::string::npos) << result.body;
  EXPECT_EQ(result.body.find("gpu_node_supervisor_"), std::string::npos) << "only the DCGM_FI_* series there";
  const auto other = h_.OffLoop([port] { return test::HttpRequest("127.0.0.1", port, "GET", "/debug/state"); });
  EXPECT_EQ(other.status, 404);
}

}  // namespace
}  // namespace gns::metrics
