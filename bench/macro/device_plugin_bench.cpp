// Issue #4 figures, in one process: the real gpu-inventory module on the fake NVML, the real
// gpu-health module (the one judge of every XID) and the real device-plugin module on their own
// loop thread, the kubelet simulator on its threads.
//  - XID injected at the fake NVML → Unhealthy received by the kubelet simulator: p50/p99
//    (target p99 ≤ 5 ms), then set Healthy again through gpu-health, alternating over the GPUs;
//  - Allocate latency through the simulator (real gRPC on unix sockets);
//  - kubelet restart → re-registered with the device list (target: within 1 s).
//
//   device_plugin_bench --fake-nvml PATH --gpus JSON [--rounds N] [--allocations N] [--restarts N]
#include "bench_util.hpp"
#include "fake_nvml_control.h"
#include "kubelet_sim.h"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/gpu_health/gpu_health_module.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

namespace {

using gns::bench::Ms;
using gns::bench::OnLoop;
using gns::bench::Report;

}  // namespace

int main(int argc, char** argv) {
  std::string fake_nvml, gpus;
  int rounds = 400, allocations = 1000, restarts = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fake-nvml" && i + 1 < argc) fake_nvml = argv[++i];
    else if (a == "--gpus" && i + 1 < argc) gpus = argv[++i];
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--allocations" && i + 1 < argc) allocations = std::atoi(argv[++i]);
    else if (a == "--restarts" && i + 1 < argc) restarts = std::atoi(argv[++i]);
  }
  if (fake_nvml.empty() || gpus.empty()) {
    std::fprintf(stderr, "usage: device_plugin_bench --fake-nvml PATH --gpus JSON [--rounds N] [--allocations N]\n");
    return 2;
  }
  ::setenv("FAKE_NVML_CONFIG", gpus.c_str(), 1);
  gns::LoggingConfig logging;
  logging.level = spdlog::level::err;  // the figures, not 400 rounds of XID warnings
  gns::SetupLogging(logging);
  char tmpl[] = "/tmp/gnsbench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  // The NVML event waiter is a child process: injected XIDs reach it through the fake driver's
  // control socket (tools/sim/fake_nvml/README.md, several processes).
  const std::string control = dir + "/nvml.sock";
  ::setenv("FAKE_NVML_CONTROL", control.c_str(), 1);

  gns::Loop loop;
  gns::SystemClock clock;
  gns::Bus bus(loop);
  gns::MetricsRegistry metrics;
  gns::Services services;
  gns::SiteConfig site;
  site.node_name = "bench";
  site.paths.kubelet_dir = dir + "/kubelet";
  site.paths.host_root = dir + "/host";
  fs::create_directories(site.paths.kubelet_dir);
  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);

  gns::sim::KubeletSimOptions options;
  options.kubelet_dir = site.paths.kubelet_dir;
  gns::sim::KubeletSim kubelet(options);
  kubelet.Start();

  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  auto ignore_failure = [](std::string why) { std::fprintf(stderr, "module failure: %s\n", why.c_str()); };
  auto ignore_health = [](gns::ModuleHealth, std::string) {};
  std::unique_ptr<gns::ModuleContext> inventory_context, plugin_context, health_context;
  std::unique_ptr<gns::Module> inventory, plugin;
  std::unique_ptr<gns::gpu_health::GpuHealthModule> health;
  std::vector<std::string> uuids;
  gns::Subscription inventory_sub;
  OnLoop(loop, [&] {
    inventory_context = std::make_unique<gns::ModuleContext>(parts, "gpu-inventory", ignore_failure, ignore_health);
    plugin_context = std::make_unique<gns::ModuleContext>(parts, "device-plugin", ignore_failure, ignore_health);
    gns::gpu_inventory::GpuInventoryModule::Config inventory_config;
    inventory_config.nvml_library = fake_nvml;
    inventory_config.event_waiter_program = GNS_SUPERVISOR_BIN;  // not /proc/self/exe: this is the bench
    inventory_config.event_wait_timeout = std::chrono::milliseconds(1000);
    inventory = std::make_unique<gns::gpu_inventory::GpuInventoryModule>(*inventory_context, inventory_config);
    plugin = std::make_unique<gns::device_plugin::DevicePluginModule>(*plugin_context,
                                                                       gns::device_plugin::DevicePluginModule::Config{});
    health_context = std::make_unique<gns::ModuleContext>(parts, "gpu-health", ignore_failure, ignore_health);
    gns::gpu_health::GpuHealthModule::Config health_config;
    health_config.catalog = gns::gpu_health::XidCatalog::Builtin();
    health_config.admin_socket = false;
    health = std::make_unique<gns::gpu_health::GpuHealthModule>(*health_context, health_config);
    inventory->Start();
    health->Start();
    plugin->Start();
  });

  const std::string resource = "nvidia.com/gpu";
  if (!kubelet.WaitForDevices(resource, [](const auto& d) {
        return d.size() == 8 && std::all_of(d.begin(), d.end(), [](const auto& x) { return x.health == "Healthy"; });
      }, seconds(30))) {
    std::fprintf(stderr, "the kubelet simulator never saw 8 healthy GPUs\n");
    return 1;
  }
  for (const auto& d : kubelet.Devices(resource)) uuids.push_back(d.id);

  // The fake is already loaded by the module (same soname): reach its control entry point.
  void* handle = ::dlopen(fake_nvml.c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto inject = handle ? reinterpret_cast<fakeNvmlInjectXid_t>(::dlsym(handle, "fakeNvmlInjectXid")) : nullptr;
  if (inject == nullptr) {
    std::fprintf(stderr, "fakeNvmlInjectXid not found in %s\n", fake_nvml.c_str());
    return 1;
  }

  std::vector<double> to_unhealthy, to_healthy;
  for (int round = 0; round < rounds; ++round) {
    const std::string& uuid = uuids[static_cast<std::size_t>(round) % uuids.size()];
    const auto injected = Clock::now();
    inject(uuid.c_str(), 79);
    if (!kubelet.WaitForDeviceHealth(resource, uuid, "Unhealthy", seconds(10))) {
      std::fprintf(stderr, "round %d: %s never became Unhealthy\n", round, uuid.c_str());
      return 1;
    }
    // The simulator stamps each ListAndWatch message when it reads it off the stream.
    const auto state = kubelet.Resource(resource);
    Clock::time_point seen{};
    for (auto it = state->updates.rbegin(); it != state->updates.rend(); ++it) {
      const auto found = std::find_if(it->devices.begin(), it->devices.end(), [&](const auto& d) { return d.id == uuid; });
      if (found != it->devices.end() && found->health == "Unhealthy") seen = it->received;
      else break;
    }
    to_unhealthy.push_back(Ms(seen - injected));

    const auto restored = Clock::now();
    loop.Post([&health, uuid] { health->SetHealthy(uuid, "bench"); });
    if (!kubelet.WaitForDeviceHealth(resource, uuid, "Healthy", seconds(10))) {
      std::fprintf(stderr, "round %d: %s never became Healthy again\n", round, uuid.c_str());
      return 1;
    }
    to_healthy.push_back(Ms(Clock::now() - restored));
  }
  Report("XID at fake NVML -> Unhealthy at the kubelet simulator", to_unhealthy);
  Report("set-healthy at gpu-health -> Healthy seen by the kubelet simulator (incl. wake-up)", to_healthy);

  std::vector<double> allocate;
  for (int i = 0; i < allocations; ++i) {
    const auto start = Clock::now();
    const auto result = kubelet.Allocate(resource, {{uuids[static_cast<std::size_t>(i) % uuids.size()]}});
    allocate.push_back(Ms(Clock::now() - start));
    if (!result.ok()) {
      std::fprintf(stderr, "Allocate failed: %s\n", result.status.ToString().c_str());
      return 1;
    }
  }
  Report("Allocate round trip (kubelet simulator -> plugin -> loop -> reply)", allocate);

  // Kubelet restart (sockets wiped, kubelet.sock recreated) → registered again with 8 devices
  // on the new connection (issue #4: within 1 s).
  std::vector<double> reregister;
  for (int restart = 0; restart < restarts; ++restart) {
    const int before = kubelet.Registrations(resource);
    const auto start = Clock::now();
    kubelet.Restart();
    const bool back = kubelet.WaitFor(
        [&](const gns::sim::KubeletState& st) {
          const auto* r = st.FindResource(resource);
          return r != nullptr && r->registrations > before && r->connected && r->devices.size() == 8;
        },
        seconds(10));
    if (!back) {
      std::fprintf(stderr, "restart %d: the plugin did not register again\n", restart);
      return 1;
    }
    reregister.push_back(Ms(Clock::now() - start));
  }
  if (!reregister.empty()) Report("kubelet restart -> registered again with 8 devices listed", reregister);

  std::promise<void> stopped;
  int running = 3;
  loop.Post([&] {
    auto one_stopped = [&] {
      if (--running == 0) stopped.set_value();
    };
    plugin->Stop(one_stopped);
    health->Stop(one_stopped);
    inventory->Stop(one_stopped);
  });
  stopped.get_future().wait();
  kubelet.Stop();
  OnLoop(loop, [&] {
    plugin.reset();
    health.reset();
    inventory.reset();
  });
  loop_thread.Stop();
  fs::remove_all(dir);
  return 0;
}
