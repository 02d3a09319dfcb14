// Issue #28 part 3 figure, in one process: the real dra-gpu module (gpu.nvidia.com) on its own
// loop thread with the kube module's client against the API simulator, and the kubelet simulator
// reading its KEP-4680 health stream through real gRPC.
//  - verdict → slice: from gpu-health's verdict published on the bus (alternately a fatal XID and
//    healthy again, so every round changes the taint set) to the ResourceSlice update answered by
//    the API simulator (the module's state says the write finished);
//  - beside it, the figure it is measured against: what the publisher's write costs at the least,
//    one GET + one PUT of a slice-sized object through the same client (interleaved, same rounds);
//  - verdict → kubelet: to the health message read by the kubelet simulator.
//
//   dra_health_bench [--rounds N]
#include "bench_util.hpp"
#include "support/api_sim.hpp"
#include "kubelet_sim.h"
#include "dra_plugin/slice.hpp"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/dra_gpu/dra_gpu_module.hpp"
#include "modules/dra_gpu/messages.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::seconds;

namespace {

using gns::bench::Ms;
using gns::bench::OnLoop;
using gns::bench::Report;

constexpr const char* kNode = "bench-node";
const std::string kDriver = "gpu.nvidia.com";
const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";

gns::gpu_inventory::GpuInventory EightGpus() {
  gns::gpu_inventory::GpuInventory inventory;
  inventory.available = true;
  inventory.driver_version = "550.54.15";
  inventory.cuda_driver_version = 12040;
  for (uint32_t i = 0; i < 8; ++i) {
    gns::gpu_inventory::GpuInfo gpu;
    gpu.index = i;
    gpu.minor = i;
    gpu.uuid = "GPU-1111111" + std::to_string(i) + "-2222-3333-4444-555555555555";
    gpu.name = "NVIDIA H200";
    gpu.pci_bus_id = "00000000:1" + std::to_string(i) + ":00.0";
    gpu.memory_total_bytes = uint64_t{141} << 30;
    gpu.cc_major = 9;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 200;
  if (!gns::bench::ParseIntOptions(argc, argv, "dra_health_bench [--rounds N]", {{"--rounds", &rounds}})) return 2;
  if (rounds < 1) {
    std::fprintf(stderr, "--rounds must be at least 1\n");
    return 2;
  }
  auto quiet = gns::bench::QuietLogging();
  const std::string dir = gns::bench::ScratchDir();

  gns::Loop loop;
  gns::SystemClock clock;
  gns::Bus bus(loop);
  gns::MetricsRegistry metrics;
  gns::Services services;
  const gns::SiteConfig site = gns::bench::BenchSite(kNode, dir);
  fs::create_directories(site.paths.kubelet_dir);
  fs::create_directories(site.paths.host_root);

  gns::test::ApiSim api(dir + "/api");
  api.Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});

  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);

  std::unique_ptr<gns::test::KubeServices> kube;
  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  std::unique_ptr<gns::ModuleContext> context;
  std::unique_ptr<gns::dra_gpu::DraGpuModule> module;
  std::mutex state_mutex;
  std::condition_variable state_cv;
  gns::dra_gpu::DraGpuState state;
  gns::Subscription state_sub;
  const auto inventory = EightGpus();
  OnLoop(loop, [&] {
    gns::kube::ClientConfig config = api.ClientConfig();
    config.qps = config.burst = 100000;
    kube = std::make_unique<gns::test::KubeServices>(loop, clock, bus, metrics, services, config, quiet, true);
    bus.Publish(inventory);
    bus.Publish(gns::gpu_health::GpuHealthState{});  // gpu-health runs
    state_sub = bus.Subscribe<gns::dra_gpu::DraGpuState>([&](const gns::dra_gpu::DraGpuState& s) {
      std::lock_guard lock(state_mutex);
      state = s;
      state_cv.notify_all();
    });
  });
  auto wait_state = [&](const std::function<bool(const gns::dra_gpu::DraGpuState&)>& predicate) {
    std::unique_lock lock(state_mutex);
    if (!state_cv.wait_for(lock, seconds(30), [&] { return predicate(state); })) {
      std::fprintf(stderr, "the module's state never got there (last error: %s)\n", state.last_error.c_str());
      std::exit(1);
    }
    return state.slice_publishes;
  };

  gns::sim::KubeletSimOptions sim_options;
  sim_options.kubelet_dir = site.paths.kubelet_dir;
  gns::sim::KubeletSim kubelet(sim_options);
  kubelet.Start();

  auto report_failure = [](std::string why) { std::fprintf(stderr, "module failure: %s\n", why.c_str()); };
  auto ignore_health = [](gns::ModuleHealth, std::string) {};
  OnLoop(loop, [&] {
    context = std::make_unique<gns::ModuleContext>(parts, "dra-gpu", report_failure, ignore_health);
    module = std::make_unique<gns::dra_gpu::DraGpuModule>(*context, gns::dra_gpu::DraGpuModule::Config{});
    module->Start();
  });
  if (!kubelet.WaitForDraDriver(kDriver, seconds(30)) ||
      !kubelet.WaitForDraDeviceHealth(kDriver, "gpu-0", "HEALTHY", seconds(30))) {
    std::fprintf(stderr, "the kubelet simulator never registered %s or never read its health\n", kDriver.c_str());
    return 1;
  }
  wait_state([](const auto& s) { return s.registered && s.slice_publishes >= 1; });

  // The reference: a slice-sized object read and written back through the same client.
  const std::string slice_path = kSlices + "/" + gns::dra::SliceName(kNode, kDriver);
  const std::string reference_path = kSlices + "/bench-reference";
  {
    json reference = api.Call("GET", slice_path).Json();
    reference["metadata"] = json{{"name", "bench-reference"}};
    reference["_resource"] = kSlices;
    api.Seed(reference);
  }
  auto get_put = [&] {
    std::promise<void> done;
    const auto start = Clock::now();
    loop.Post([&] {
      kube->client->Get(reference_path, [&](gns::kube::Result current) {
        if (!current.Ok()) {
          std::fprintf(stderr, "reference GET failed: %s\n", current.error.c_str());
          std::exit(1);
        }
        json object = current.object;
        object["spec"]["pool"]["generation"] = object["spec"]["pool"]["generation"].get<int64_t>() + 1;
        kube->client->Update(reference_path, object, [&](gns::kube::Result updated) {
          if (!updated.Ok()) {
            std::fprintf(stderr, "reference PUT failed: %s\n", updated.error.c_str());
            std::exit(1);
          }
          done.set_value();
        });
      });
    });
    done.get_future().wait();
    return Ms(Clock::now() - start);
  };

  std::vector<double> to_slice, to_kubelet, reference;
  const int64_t base_ms = 1795858800000;
  for (int round = 0; round < rounds; ++round) {
    reference.push_back(get_put());
    const bool sick = round % 2 == 0;
    uint64_t before = 0;
    {
      std::lock_guard lock(state_mutex);
      before = state.slice_publishes;
    }
    // The kubelet's side is watched from another thread, from before the verdict is published.
    auto kubelet_saw = std::async(std::launch::async, [&, sick] {
      const bool seen = kubelet.WaitForDraDeviceHealth(kDriver, "gpu-0", sick ? "UNHEALTHY" : "HEALTHY", seconds(30));
      return std::make_pair(seen, Clock::now());
    });
    Clock::time_point start;
    OnLoop(loop, [&] {
      gns::gpu_health::DeviceHealth verdict;
      verdict.uuid = inventory.gpus[0].uuid;
      verdict.healthy = !sick;
      verdict.xid = sick ? 48 : 0;
      verdict.reason = sick ? "XID 48 (DBE)" : "GPU reset acknowledged";
      verdict.since_unix_ms = base_ms + round * 1000;
      start = Clock::now();
      bus.Publish(verdict);
    });
    wait_state([&](const auto& s) { return s.slice_publishes > before && s.tainted.empty() != sick; });
    to_slice.push_back(Ms(Clock::now() - start));
    const auto [seen, at] = kubelet_saw.get();
    if (!seen) {
      std::fprintf(stderr, "the kubelet never read the health change\n");
      return 1;
    }
    to_kubelet.push_back(Ms(at - start));
  }
  const json written = api.Call("GET", slice_path).Json();

  std::printf("dra-gpu (gpu.nvidia.com, 8 GPUs) against the API simulator and the kubelet simulator; %d verdict "
              "changes on gpu-0 (fatal XID / healthy again, alternating)\n", rounds);
  const double reference_p50 = Report("reference: GET + PUT of a slice-sized object through the same client", reference);
  const double slice_p50 = Report("verdict on the bus -> ResourceSlice update answered by the API simulator", to_slice);
  Report("verdict on the bus -> health message read by the kubelet simulator", to_kubelet);
  std::printf("verdict->slice / (GET+PUT) p50 ratio: %.2fx; slice pool generation after the rounds: %lld\n",
              slice_p50 / reference_p50, static_cast<long long>(written["spec"]["pool"]["generation"].get<int64_t>()));
  std::fflush(stdout);

  std::promise<void> stopped;
  loop.Post([&] { module->Stop([&] { stopped.set_value(); }); });
  stopped.get_future().wait();
  kubelet.Stop();
  OnLoop(loop, [&] {
    module.reset();
    context.reset();
    state_sub.Reset();
    kube->Shutdown();
    kube.reset();
  });
  OnLoop(loop, [] {});
  loop_thread.Stop();
  api.Stop();
  fs::remove_all(dir);
  return 0;
}
