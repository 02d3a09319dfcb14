// Issue #28 figures for dra-gpu (gpu.nvidia.com), in one process: the real dra-gpu module on its
// own loop thread with the kube module's client against the API simulator (its own thread), the
// kubelet simulator calling the plugin through real gRPC on unix sockets, 8 GPUs of which GPU 7
// is in MIG mode (seven 1g MIG devices: the slice offers gpu-0 … gpu-6 and gpu-7-mig-19-<i>-1).
//  - NodePrepareResources / NodeUnprepareResources latency of a whole-GPU claim (gpu-0, a
//    GpuConfig with time-slicing at the default interval) and of a MIG claim (gpu-7-mig-19-0-1,
//    a MigDeviceConfig with time-slicing: its spec also holds the GPU and compute instance's
//    /dev/nvidia-caps nodes), interleaved with one fsync'd atomic write of a checkpoint-sized file
//    in the checkpoint's directory (gns::WriteFileAtomically), in the same rounds: the ratios of
//    the medians, with the compute-domain driver's bar (target prepare <= 1.5x the write);
//  - at the end the claim state is empty and no CDI spec is left.
//
//   dra_gpu_prepare_bench [--rounds N]
#include "bench_util.hpp"
#include "support/api_sim.hpp"
#include "channel_claim.h"
#include "kubelet_sim.h"
#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/claim_specs.hpp"
#include "dra_plugin/plugin_paths.hpp"
#include "loop/atomic_file.hpp"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/dra_gpu/dra_gpu_module.hpp"
#include "modules/dra_gpu/gpu_claims.hpp"
#include "modules/dra_gpu/messages.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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
constexpr const char* kNs = "bench";
const std::string kDriver(gns::dra_gpu::kDriverName);
const std::string kClaims = std::string("/apis/resource.k8s.io/v1/namespaces/") + kNs + "/resourceclaims";
constexpr const char* kWholeDevice = "gpu-0";
constexpr const char* kMigDevice = "gpu-7-mig-19-0-1";

// 8 H200s; GPU 7 in MIG mode with seven 1g.18gb MIG devices (GPU instances 1…7, placements 0…6).
gns::gpu_inventory::GpuInventory EightGpusOneInMigMode() {
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
    if (i == 7) {
      gpu.mig_enabled = true;
      for (uint32_t m = 0; m < 7; ++m) {
        gns::gpu_inventory::MigDeviceInfo mig;
        mig.index = m;
        mig.uuid = "MIG-7777777" + std::to_string(m) + "-2222-3333-4444-555555555555";
        mig.gpu_instance = m + 1;
        mig.compute_instance = 0;
        mig.profile = "1g.18gb";
        mig.memory_bytes = uint64_t{18} << 30;
        mig.multiprocessors = 16;
        mig.gpu_instance_slices = mig.compute_instance_slices = 1;
        mig.copy_engines = mig.decoders = mig.jpeg_engines = 1;
        mig.placement_known = true;
        mig.gi_profile_id = 19;
        mig.placement_start = m;
        mig.placement_size = 1;
        gpu.mig_devices.push_back(mig);
      }
    }
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

// A claim allocated one device of this node with this driver's opaque config for it.
json GpuClaim(const std::string& name, const std::string& device) {
  const bool mig = device != kWholeDevice;
  const json parameters =
      mig ? json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                 {"kind", "MigDeviceConfig"},
                 {"sharing", {{"strategy", "TimeSlicing"}}}}
          : json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                 {"kind", "GpuConfig"},
                 {"sharing", {{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Default"}}}}}};
  json claim = gns::sim::AllocatedChannelClaim(kNs, name, kNode, parameters, kDriver);
  claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = mig ? "mig.nvidia.com" : "gpu.nvidia.com";
  claim["status"]["allocation"]["devices"]["results"][0]["device"] = device;
  return claim;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 300;
  if (!gns::bench::ParseIntOptions(argc, argv, "dra_gpu_prepare_bench [--rounds N]", {{"--rounds", &rounds}})) return 2;
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
  // GPU 7's MIG devices' capability minors, as the driver lists them.
  fs::create_directories(site.paths.host_root + "/proc/driver/nvidia-caps");
  {
    std::ofstream minors(site.paths.host_root + "/proc/driver/nvidia-caps/mig-minors");
    minors << "config 1\nmonitor 2\n";
    for (int gi = 1; gi <= 7; ++gi) {
      minors << "gpu7/gi" << gi << "/access " << 100 + 10 * gi << "\ngpu7/gi" << gi << "/ci0/access " << 101 + 10 * gi
             << "\n";
    }
  }
  const gns::dra::PluginPaths paths = gns::dra::MakePluginPaths(site.paths, kDriver, gns::dra_gpu::kStateFolder);

  gns::test::ApiSim api(dir + "/api");
  api.Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
  int seeded = 0;
  auto seed_claim = [&](const std::string& device) {
    const std::string name = "claim-" + std::to_string(seeded++);
    api.Seed(GpuClaim(name, device));
    const auto uid = api.Call("GET", kClaims + "/" + name).Json()["metadata"]["uid"].get<std::string>();
    return gns::sim::DraClaim{kNs, uid, name};
  };

  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);

  // The kube services, as the kube module provides them; the client's rate limit out of the way
  // (production: qps 20, burst 40): this measures the plugin, not the limiter.
  std::unique_ptr<gns::test::KubeServices> kube;
  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  std::unique_ptr<gns::ModuleContext> context;
  std::unique_ptr<gns::dra_gpu::DraGpuModule> module;
  std::mutex state_mutex;
  std::condition_variable state_cv;
  gns::dra_gpu::DraGpuState state;
  gns::Subscription state_sub;
  OnLoop(loop, [&] {
    gns::kube::ClientConfig config = api.ClientConfig();
    config.qps = config.burst = 100000;
    kube = std::make_unique<gns::test::KubeServices>(loop, clock, bus, metrics, services, config, quiet, true);
    bus.Publish(EightGpusOneInMigMode());
    bus.Publish(gns::gpu_health::GpuHealthState{});  // gpu-health runs
    state_sub = bus.Subscribe<gns::dra_gpu::DraGpuState>([&](const gns::dra_gpu::DraGpuState& s) {
      std::lock_guard lock(state_mutex);
      state = s;
      state_cv.notify_all();
    });
  });

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
  if (!kubelet.WaitForDraDriver(kDriver, seconds(30))) {
    std::fprintf(stderr, "the kubelet simulator never registered %s\n", kDriver.c_str());
    return 1;
  }
  {
    std::unique_lock lock(state_mutex);
    const auto serves = [&](const std::string& device) {
      return std::find(state.served.begin(), state.served.end(), device) != state.served.end();
    };
    if (!state_cv.wait_for(lock, seconds(30), [&] { return state.registered && serves(kWholeDevice) && serves(kMigDevice); })) {
      std::fprintf(stderr, "the module never served %s and %s (last error: %s)\n", kWholeDevice, kMigDevice,
                   state.last_error.c_str());
      return 1;
    }
  }

  // One prepare: its CDI device id must be the device's; a MIG claim's spec must hold the
  // instance's capability nodes (checked once, below).
  auto prepare = [&](const gns::sim::DraClaim& claim, const std::string& device) {
    const auto result = kubelet.NodePrepareResources(kDriver, {claim});
    const auto it = result.claims.find(claim.uid);
    if (!result.ok() || it == result.claims.end() || !it->second.error.empty() || it->second.devices.size() != 1 ||
        it->second.devices[0].cdi_device_ids != std::vector<std::string>{std::string(gns::dra_gpu::kCdiVendor) +
                                                                         "/claim=" + claim.uid + "-" + device}) {
      std::fprintf(stderr, "prepare %s (%s) failed: %s %s\n", claim.name.c_str(), device.c_str(),
                   result.status.ToString().c_str(), it == result.claims.end() ? "<no entry>" : it->second.error.c_str());
      std::exit(1);
    }
  };
  auto unprepare = [&](const gns::sim::DraClaim& claim) {
    const auto result = kubelet.NodeUnprepareResources(kDriver, {claim});
    const auto it = result.claims.find(claim.uid);
    if (!result.ok() || it == result.claims.end() || !it->second.empty()) {
      std::fprintf(stderr, "unprepare %s failed: %s %s\n", claim.name.c_str(), result.status.ToString().c_str(),
                   it == result.claims.end() ? "<no entry>" : it->second.c_str());
      std::exit(1);
    }
  };

  // The reference write: the bytes of a one-claim checkpoint (the MIG claim's, the larger
  // record), into the checkpoint's directory. The MIG claim's spec is checked meanwhile.
  std::string checkpoint_bytes;
  {
    const auto claim = seed_claim(kMigDevice);
    prepare(claim, kMigDevice);
    const auto recovered = gns::dra::LoadClaimState(paths.checkpoint_file, paths.claim_log_file);
    if (recovered.state.claims.size() != 1) {
      std::fprintf(stderr, "no durable record after a prepare\n");
      return 1;
    }
    checkpoint_bytes = gns::dra::SerializeCheckpoint(recovered.state);
    std::ifstream in(paths.cdi_dir + "/" + std::string(gns::dra_gpu::kCdiVendor) + "-claim_" + claim.uid + ".json");
    const json spec = json::parse(in, nullptr, false);
    const json nodes = spec.is_discarded() ? json() : spec.value("/devices/0/containerEdits/deviceNodes"_json_pointer, json());
    if (!nodes.is_array() || nodes.size() != 3 || nodes[0].value("path", "") != "/dev/nvidia7" ||
        nodes[1].value("path", "") != "/dev/nvidia-caps/nvidia-cap110" ||
        nodes[2].value("path", "") != "/dev/nvidia-caps/nvidia-cap111") {
      std::fprintf(stderr, "the MIG claim's spec is not what it should be: %s\n", spec.dump().c_str());
      return 1;
    }
    unprepare(claim);
  }
  const std::string reference = gns::dra::JoinPath(paths.state_dir, "bench-reference.json");
  auto atomic_write = [&] {
    const auto start = Clock::now();
    const auto written = gns::WriteFileAtomically(reference, checkpoint_bytes);
    const auto took = Clock::now() - start;
    if (!written) {
      std::fprintf(stderr, "reference write failed: %s\n", written.error.c_str());
      std::exit(1);
    }
    return Ms(took);
  };

  std::printf("dra-gpu (gpu.nvidia.com, 8 GPUs, GPU 7 in MIG mode) through the kubelet simulator, claims served by "
              "the API simulator; reference: one fsync'd atomic write of %zu bytes (a one-claim checkpoint) in %s\n",
              checkpoint_bytes.size(), paths.state_dir.c_str());
  std::vector<double> writes, gpu_prepares, gpu_unprepares, mig_prepares, mig_unprepares;
  for (int round = 0; round < rounds; ++round) {
    // Not timed: the claims exist before the kubelet asks.
    const auto whole = seed_claim(kWholeDevice);
    const auto mig = seed_claim(kMigDevice);
    writes.push_back(atomic_write());
    auto start = Clock::now();
    prepare(whole, kWholeDevice);
    gpu_prepares.push_back(Ms(Clock::now() - start));
    start = Clock::now();
    unprepare(whole);
    gpu_unprepares.push_back(Ms(Clock::now() - start));
    writes.push_back(atomic_write());
    start = Clock::now();
    prepare(mig, kMigDevice);
    mig_prepares.push_back(Ms(Clock::now() - start));
    start = Clock::now();
    unprepare(mig);
    mig_unprepares.push_back(Ms(Clock::now() - start));
  }
  const double write_p50 = Report("fsync'd atomic write of a checkpoint-sized file (reference)", writes);
  const double gpu_p50 =
      Report("whole GPU (gpu-0, GpuConfig): NodePrepareResources round trip (kubelet sim -> plugin -> API sim -> CDI + claim log)", gpu_prepares);
  const double gpu_un_p50 = Report("whole GPU (gpu-0): NodeUnprepareResources round trip", gpu_unprepares);
  const double mig_p50 =
      Report("MIG device (gpu-7-mig-19-0-1, MigDeviceConfig): NodePrepareResources round trip", mig_prepares);
  const double mig_un_p50 = Report("MIG device (gpu-7-mig-19-0-1): NodeUnprepareResources round trip", mig_unprepares);
  std::printf("prepare/atomic-write p50 ratio: whole GPU %.2fx, MIG device %.2fx (target <= 1.5x, the compute-domain "
              "driver's bar); unprepare/atomic-write p50 ratio: whole GPU %.2fx, MIG device %.2fx\n",
              gpu_p50 / write_p50, mig_p50 / write_p50, gpu_un_p50 / write_p50, mig_un_p50 / write_p50);

  const auto recovered = gns::dra::LoadClaimState(paths.checkpoint_file, paths.claim_log_file);
  const auto specs = gns::dra::ListClaimSpecs(paths.cdi_dir, gns::dra_gpu::GpuSpecNames());
  const bool state_empty = recovered.checkpoint.status == gns::dra::CheckpointStatus::kLoaded &&
                           recovered.state.claims.empty() && recovered.log.corruption.empty();
  const bool no_specs = specs.ok && specs.claim_uids.empty();
  std::printf("after %d rounds: claim state %s (%zu entries), CDI specs left %zu\n", rounds,
              state_empty ? "empty" : std::string(gns::dra::ToString(recovered.checkpoint.status)).c_str(),
              recovered.state.claims.size(), specs.claim_uids.size());
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
  OnLoop(loop, [] {});  // what the shutdown posted runs before this
  loop_thread.Stop();
  api.Stop();
  fs::remove_all(dir);
  if (!state_empty || !no_specs) {
    std::fprintf(stderr, "state left behind after the rounds\n");
    return 1;
  }
  return 0;
}
