// Issue #14 figures, in one process (real modules on their own loop thread, the kubelet
// simulator on its threads, real gRPC on unix sockets):
//  - MIG enumeration through the fake NVML: gpu-inventory start → 8 GPUs × 7 MIG devices read;
//  - registration of 8 × 7 MIG devices: device-plugin start (mixed strategy) → the kubelet
//    simulator has nvidia.com/mig-1g.10gb registered with 56 devices listed;
//  - Allocate round trip with time-sliced replicas (8 GPUs × 4 replicas);
//  - CDI spec rewrite on change: a MIG layout change published → the new spec on disk.
//
//   device_plugin_sharing_bench --fake-nvml PATH [--rounds N] [--allocations N] [--cdi-changes N]
#include "bench_util.hpp"
#include "kubelet_sim.h"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;
using gns::bench::Ms;
using gns::bench::OnLoop;
using gns::bench::Report;

namespace {

// 8 H100-80GB GPUs, each split into 7 × 1g.10gb.
std::string WriteMigNode(const std::string& dir) {
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < 8; ++i) {
    char uuid[64], bus[32];
    std::snprintf(uuid, sizeof(uuid), "GPU-bench000-%04d-4000-8000-000000000000", i);
    std::snprintf(bus, sizeof(bus), "00000000:%02X:00.0", 0x10 + 0x10 * i);
    nlohmann::json migs = nlohmann::json::array();
    for (int s = 0; s < 7; ++s) {
      char mig[64];
      std::snprintf(mig, sizeof(mig), "MIG-bench%03d-%04d-4000-8000-000000000000", i, s);
      migs.push_back({{"uuid", mig}, {"gpuInstanceId", 7 + s}, {"gpuInstanceSliceCount", 1}, {"memorySizeMB", 9856}});
    }
    gpus.push_back({{"uuid", uuid}, {"name", "NVIDIA H100 80GB HBM3"}, {"pciBusId", bus}, {"minor", i},
                    {"memoryTotalBytes", 85520809984ULL}, {"numaNode", i / 4}, {"migEnabled", true},
                    {"migDevices", migs}});
  }
  const std::string path = dir + "/gpus-8x7.json";
  std::ofstream(path) << nlohmann::json{{"gpus", gpus}}.dump(1);
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  std::string fake_nvml;
  int rounds = 50, allocations = 1000, cdi_changes = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fake-nvml" && i + 1 < argc) fake_nvml = argv[++i];
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--allocations" && i + 1 < argc) allocations = std::atoi(argv[++i]);
    else if (a == "--cdi-changes" && i + 1 < argc) cdi_changes = std::atoi(argv[++i]);
  }
  if (fake_nvml.empty()) {
    std::fprintf(stderr, "usage: device_plugin_sharing_bench --fake-nvml PATH [--rounds N] [--allocations N] [--cdi-changes N]\n");
    return 2;
  }
  gns::LoggingConfig logging;
  logging.level = spdlog::level::err;
  gns::SetupLogging(logging);
  char tmpl[] = "/tmp/gnsbench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ::setenv("FAKE_NVML_CONFIG", WriteMigNode(dir).c_str(), 1);

  gns::Loop loop;
  gns::SystemClock clock;
  gns::Bus bus(loop);
  gns::MetricsRegistry metrics;
  gns::Services services;
  gns::SiteConfig site;
  site.node_name = "bench";
  site.paths.kubelet_dir = dir + "/kubelet";
  site.paths.host_root = dir + "/host";
  site.paths.cdi_dir = dir + "/cdi";
  fs::create_directories(site.paths.kubelet_dir);
  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);
  gns::sim::KubeletSimOptions options;
  options.kubelet_dir = site.paths.kubelet_dir;
  gns::sim::KubeletSim kubelet(options);
  kubelet.Start();

  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  auto on_failure = [](std::string why) { std::fprintf(stderr, "module failure: %s\n", why.c_str()); };
  auto ignore_health = [](gns::ModuleHealth, std::string) {};
  std::unique_ptr<gns::ModuleContext> inventory_context, plugin_context;
  std::unique_ptr<gns::Module> inventory, plugin;
  auto stop = [&](std::unique_ptr<gns::Module>& m) {
    std::promise<void> stopped;
    loop.Post([&] { m->Stop([&] { stopped.set_value(); }); });
    stopped.get_future().wait();
    OnLoop(loop, [&] { m.reset(); });
  };

  // MIG enumeration through NVML.
  std::promise<void> read;
  bool read_done = false;
  gns::Subscription inventory_sub;
  const auto enumerate_start = Clock::now();
  OnLoop(loop, [&] {
    inventory_sub = bus.Subscribe<gns::gpu_inventory::GpuInventory>([&](const gns::gpu_inventory::GpuInventory& inv) {
      std::size_t migs = 0;
      for (const auto& g : inv.gpus) migs += g.mig_devices.size();
      if (!read_done && inv.available && migs == 56) {
        read_done = true;
        read.set_value();
      }
    });
    inventory_context = std::make_unique<gns::ModuleContext>(parts, "gpu-inventory", on_failure, ignore_health);
    gns::gpu_inventory::GpuInventoryModule::Config config;
    config.nvml_library = fake_nvml;
    config.event_waiter_program = GNS_SUPERVISOR_BIN;  // not /proc/self/exe: this is the bench
    config.event_wait_timeout = std::chrono::milliseconds(1000);
    inventory = std::make_unique<gns::gpu_inventory::GpuInventoryModule>(*inventory_context, config);
    inventory->Start();
  });
  if (read.get_future().wait_for(seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "gpu-inventory never read 56 MIG devices\n");
    return 1;
  }
  std::printf("NVML enumeration of 8 GPUs x 7 MIG devices (gpu-inventory start -> inventory published): %.3f ms\n",
              Ms(Clock::now() - enumerate_start));

  // Registration of 56 MIG devices, fresh plugin each round.
  const std::string mig_resource = "nvidia.com/mig-1g.10gb";
  std::vector<double> registration;
  for (int round = 0; round < rounds; ++round) {
    const int before = kubelet.Registrations(mig_resource);
    const auto start = Clock::now();
    OnLoop(loop, [&] {
      plugin_context = std::make_unique<gns::ModuleContext>(parts, "device-plugin", on_failure, ignore_health);
      gns::device_plugin::DevicePluginModule::Config config;
      config.mig_strategy = gns::device_plugin::MigStrategy::kMixed;
      plugin = std::make_unique<gns::device_plugin::DevicePluginModule>(*plugin_context, config);
      plugin->Start();
    });
    const bool ok = kubelet.WaitFor(
        [&](const gns::sim::KubeletState& st) {
          const auto* r = st.FindResource(mig_resource);
          return r != nullptr && r->registrations > before && r->connected && r->devices.size() == 56;
        },
        seconds(10));
    if (!ok) {
      std::fprintf(stderr, "round %d: 56 MIG devices never registered\n", round);
      return 1;
    }
    registration.push_back(Ms(Clock::now() - start));
    stop(plugin);
  }
  Report("device-plugin start (mixed) -> 8x7 MIG devices registered and listed", registration);
  stop(inventory);
  inventory_sub.Reset();

  // Allocate with replicas, and the CDI spec, on a plugin fed from the bus.
  gns::gpu_inventory::GpuInventory whole;
  whole.available = true;
  for (uint32_t i = 0; i < 8; ++i) {
    gns::gpu_inventory::GpuInfo g;
    g.index = i;
    g.minor = i;
    g.uuid = "GPU-" + std::to_string(i);
    whole.gpus.push_back(g);
  }
  std::promise<void> written;
  int cdi_writes = 0, awaited = 1;
  std::unique_ptr<std::promise<void>> next_write = std::make_unique<std::promise<void>>();
  gns::Subscription state_sub;
  OnLoop(loop, [&] {
    bus.Publish(whole);
    state_sub = bus.Subscribe<gns::device_plugin::DevicePluginState>([&](const gns::device_plugin::DevicePluginState& s) {
      if (s.cdi_writes > cdi_writes) {
        cdi_writes = s.cdi_writes;
        if (cdi_writes >= awaited && next_write) next_write->set_value();
      }
    });
    plugin_context = std::make_unique<gns::ModuleContext>(parts, "device-plugin", on_failure, ignore_health);
    gns::device_plugin::DevicePluginModule::Config config;
    config.sharing.resources = {{"nvidia.com/gpu", "", 4}};
    config.cdi_spec = true;
    plugin = std::make_unique<gns::device_plugin::DevicePluginModule>(*plugin_context, config);
    plugin->Start();
  });
  if (!kubelet.WaitForDevices("nvidia.com/gpu", [](const auto& d) { return d.size() == 32; }, seconds(10))) {
    std::fprintf(stderr, "32 replicas never listed\n");
    return 1;
  }
  std::vector<double> allocate;
  for (int i = 0; i < allocations; ++i) {
    const std::string id = "GPU-" + std::to_string(i % 8) + "::" + std::to_string((i / 8) % 4);
    const auto start = Clock::now();
    const auto result = kubelet.Allocate("nvidia.com/gpu", {{id}});
    allocate.push_back(Ms(Clock::now() - start));
    if (!result.ok()) {
      std::fprintf(stderr, "Allocate failed: %s\n", result.status.ToString().c_str());
      return 1;
    }
  }
  Report("Allocate of one time-sliced replica (8 GPUs x 4) round trip", allocate);

  if (next_write->get_future().wait_for(seconds(10)) != std::future_status::ready) {
    std::fprintf(stderr, "the CDI spec was never written\n");
    return 1;
  }
  std::vector<double> rewrite;
  for (int change = 0; change < cdi_changes; ++change) {
    auto inv = whole;
    inv.gpus.resize(change % 2 == 0 ? 7 : 8);  // a GPU leaves and comes back: the device set changes
    next_write = std::make_unique<std::promise<void>>();
    auto future = next_write->get_future();
    const auto start = Clock::now();
    OnLoop(loop, [&] {
      awaited = cdi_writes + 1;
      bus.Publish(inv);
    });
    if (future.wait_for(seconds(10)) != std::future_status::ready) {
      std::fprintf(stderr, "change %d: the CDI spec was not rewritten\n", change);
      return 1;
    }
    rewrite.push_back(Ms(Clock::now() - start));
  }
  Report("device set change -> CDI spec rewritten on disk (discover, build, atomic write)", rewrite);

  stop(plugin);
  OnLoop(loop, [&] { state_sub.Reset(); });
  kubelet.Stop();
  loop_thread.Stop();
  fs::remove_all(dir);
  return 0;
}
