// Issue #5 figures, in one process: the real dra-compute-domain module (HostManagedIMEX) on its
// own loop thread with the kube module's KubeClient / InformerRegistry / EventRecorder against
// the API simulator (its own thread), and the kubelet simulator on its threads calling the
// plugin through real gRPC on unix sockets.
//  - NodePrepareResources and NodeUnprepareResources latency through the kubelet simulator
//    (the claim and its ComputeDomain served by the API simulator), beside one fsync'd atomic
//    write (gns::WriteFileAtomically) of a checkpoint-sized file in the checkpoint's directory,
//    interleaved in the same run: the ratios of the medians (target prepare ≤ 1.5× the write);
//  - 1000 sequential prepare/unprepare cycles: total, p50/p99 per cycle, and at the end the
//    checkpoint is empty and no CDI spec is left.
//
//   dra_prepare_bench [--rounds N] [--cycles N]
#include "bench_util.hpp"
#include "support/api_sim.hpp"
#include "channel_claim.h"
#include "kubelet_sim.h"
#include "loop/atomic_file.hpp"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/feature_gates.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/dra_compute_domain/cdi_spec.hpp"
#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_log.hpp"
#include "modules/dra_compute_domain/dra_module.hpp"
#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/dra_compute_domain/messages.hpp"
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
constexpr const char* kClique = "7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.32766";
const std::string kDriver(gns::dra::kDriverName);
const std::string kClaims = std::string("/apis/resource.k8s.io/v1/namespaces/") + kNs + "/resourceclaims";
const std::string kDomains = std::string("/apis/resource.nvidia.com/v1beta1/namespaces/") + kNs + "/computedomains";

void WriteFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// A channel claim as the controller's claim template produces it, allocated on kNode.
json ChannelClaim(const std::string& name, const std::string& domain_uid) {
  const json parameters{{"apiVersion", "resource.nvidia.com/v1beta1"},
                        {"kind", "ComputeDomainChannelConfig"},
                        {"domainID", domain_uid},
                        {"allocationMode", "Single"}};
  return gns::sim::AllocatedChannelClaim(kNs, name, kNode, parameters, kDriver);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 300, cycles = 1000;
  if (!gns::bench::ParseIntOptions(argc, argv, "dra_prepare_bench [--rounds N] [--cycles N]",
                                   {{"--rounds", &rounds}, {"--cycles", &cycles}})) {
    return 2;
  }
  if (rounds < 1 || cycles < 1) {
    std::fprintf(stderr, "--rounds and --cycles must be at least 1\n");
    return 2;
  }
  auto quiet = gns::bench::QuietLogging();
  const std::string dir = gns::bench::ScratchDir();

  gns::Loop loop;
  gns::SystemClock clock;
  gns::Bus bus(loop);
  gns::MetricsRegistry metrics;
  gns::Services services;
  gns::FeatureGates gates;
  gates.Set(gns::gates::kHostManagedIMEX, true);
  const gns::SiteConfig site = gns::bench::BenchSite(kNode, dir, gates);
  const gns::dra::DriverPaths paths = gns::dra::MakeDriverPaths(site.paths);
  WriteFile(paths.proc_devices, "Character devices:\n  1 mem\n195 nvidia\n509 nvidia-caps-imex-channels\n");
  fs::create_directories(site.paths.kubelet_dir);

  gns::test::ApiSim api(dir + "/api");
  api.Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
  api.Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                {"kind", "ComputeDomain"},
                {"metadata", {{"name", "train"}, {"namespace", kNs}}},
                {"spec", {{"numNodes", 0}, {"channel", {{"allocationMode", "Single"}}}}},
                {"_resource", kDomains}});
  const std::string domain_uid = api.Call("GET", kDomains + "/train").Json()["metadata"]["uid"].get<std::string>();
  int seeded = 0;
  auto seed_claim = [&] {
    const std::string name = "claim-" + std::to_string(seeded++);
    api.Seed(ChannelClaim(name, domain_uid));
    const auto uid = api.Call("GET", kClaims + "/" + name).Json()["metadata"]["uid"].get<std::string>();
    return gns::sim::DraClaim{kNs, uid, name};
  };

  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);

  // The kube services, as the kube module provides them. The client's rate limit is set out of
  // the way (production: qps 20, burst 40): this measures the plugin, not the limiter.
  std::unique_ptr<gns::test::KubeServices> kube;
  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  std::unique_ptr<gns::ModuleContext> context;
  std::unique_ptr<gns::dra::DraComputeDomainModule> module;
  std::mutex state_mutex;
  std::condition_variable state_cv;
  bool registered = false;
  gns::Subscription state_sub;
  OnLoop(loop, [&] {
    gns::kube::ClientConfig config = api.ClientConfig();
    config.qps = config.burst = 100000;
    kube = std::make_unique<gns::test::KubeServices>(loop, clock, bus, metrics, services, config, quiet, true);
    bus.Publish(gns::gpu_inventory::NodeClique{kClique, "", true});
    state_sub = bus.Subscribe<gns::dra::DraComputeDomainState>([&](const gns::dra::DraComputeDomainState& s) {
      if (!s.registered) return;
      std::lock_guard lock(state_mutex);
      registered = true;
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
    context = std::make_unique<gns::ModuleContext>(parts, "dra-compute-domain", report_failure, ignore_health);
    module = std::make_unique<gns::dra::DraComputeDomainModule>(*context, gns::dra::DraComputeDomainModule::Config{});
    module->Start();
  });
  if (!kubelet.WaitForDraDriver(kDriver, seconds(30))) {
    std::fprintf(stderr, "the kubelet simulator never registered %s\n", kDriver.c_str());
    return 1;
  }
  {
    std::unique_lock lock(state_mutex);
    if (!state_cv.wait_for(lock, seconds(30), [&] { return registered; })) {
      std::fprintf(stderr, "the module never heard it was registered\n");
      return 1;
    }
  }

  auto prepare = [&](const gns::sim::DraClaim& claim) {
    const auto result = kubelet.NodePrepareResources(kDriver, {claim});
    const auto it = result.claims.find(claim.uid);
    if (!result.ok() || it == result.claims.end() || !it->second.error.empty() || it->second.devices.empty()) {
      std::fprintf(stderr, "prepare %s failed: %s %s\n", claim.name.c_str(), result.status.ToString().c_str(),
                   it == result.claims.end() ? "<no entry>" : it->second.error.c_str());
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

  // The reference write: the bytes of a one-claim checkpoint, into the checkpoint's directory.
  std::string checkpoint_bytes;
  {
    const auto claim = seed_claim();
    prepare(claim);
    // The state a restart would recover (checkpoint + claim log), as one checkpoint file.
    const auto state = gns::dra::LoadClaimState(paths.checkpoint_file, paths.claim_log_file);
    if (state.state.claims.size() != 1) {
      std::fprintf(stderr, "no durable record after a prepare\n");
      return 1;
    }
    checkpoint_bytes = gns::dra::SerializeCheckpoint(state.state);
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

  std::printf("dra-compute-domain (HostManagedIMEX) through the kubelet simulator, claims served by the API "
              "simulator; reference: one fsync'd atomic write of %zu bytes (a one-claim checkpoint) in %s\n",
              checkpoint_bytes.size(), paths.state_dir.c_str());
  // Where a prepare's time goes, each part alone in the same rounds: the API requests a prepare
  // makes (the claim, and the namespace's ComputeDomains, at the same time) through the module's
  // client; its files (the CDI spec, visible only, and one claim-log record with its fdatasync)
  // written by hand into a scratch directory on the same file system; and the kubelet's gRPC call
  // with one trip to the pool and nothing to write (an Unprepare of a claim the plugin never
  // prepared: the pool finds no spec to delete, and no record is written).
  const std::string scratch = dir + "/state/parts";
  fs::create_directories(scratch + "/cdi");
  gns::dra::ClaimLog scratch_log(scratch + "/claims.log");
  if (auto r = scratch_log.Reset(); !r) {
    std::fprintf(stderr, "scratch claim log: %s\n", r.error.c_str());
    return 1;
  }
  std::string scratch_record;
  {
    gns::dra::PreparedClaim entry;
    entry.uid = "00000000-0000-4000-8000-000000000000";
    entry.namespace_name = kNs;
    entry.name = "parts";
    entry.cdi_spec_file = gns::dra::CdiSpecFileName(entry.uid);
    entry.cdi_device_id = gns::dra::CdiQualifiedDeviceId(entry.uid);
    scratch_record = gns::dra::EncodeClaimLogRecord({1, gns::dra::ClaimLogRecord::Op::kPrepared, entry});
  }
  auto api_fetch = [&](const gns::sim::DraClaim& claim) {
    std::promise<void> done;
    int left = 2;
    const auto start = Clock::now();
    loop.Post([&] {
      auto one = [&](gns::kube::Result result) {
        if (!result.Ok()) {
          std::fprintf(stderr, "API request failed: %s\n", result.error.c_str());
          std::exit(1);
        }
        if (--left == 0) done.set_value();
      };
      kube->client->Get(kClaims + "/" + claim.name, one);
      kube->client->List(kDomains, gns::kube::ListOptions{}, one);
    });
    done.get_future().wait();
    return Ms(Clock::now() - start);
  };
  auto files_alone = [&](int round) {
    const auto start = Clock::now();
    const std::string uid = "00000000-0000-4000-8000-" + std::to_string(100000000000 + round);
    if (auto r = gns::dra::WriteChannelCdiSpec(scratch + "/cdi", uid, 509, 1, gns::dra::SpecDurability::kVisibleOnly);
        !r) {
      std::fprintf(stderr, "scratch CDI spec: %s\n", r.error.c_str());
      std::exit(1);
    }
    if (scratch_log.Used() + scratch_record.size() > gns::dra::kClaimLogCompactAt) scratch_log.Rewind();
    if (auto r = scratch_log.Append(scratch_record); !r) {
      std::fprintf(stderr, "scratch claim log: %s\n", r.error.c_str());
      std::exit(1);
    }
    const double took = Ms(Clock::now() - start);
    fs::remove(fs::path(scratch) / "cdi" / gns::dra::CdiSpecFileName(uid));
    return took;
  };
  const gns::sim::DraClaim never_prepared{kNs, "00000000-0000-4000-8000-0000000000ff", "never-prepared"};

  std::vector<double> prepares, unprepares, writes, api_parts, file_parts, grpc_parts;
  for (int round = 0; round < rounds; ++round) {
    const auto claim = seed_claim();  // not timed: the claim exists before the kubelet asks
    writes.push_back(atomic_write());
    auto start = Clock::now();
    prepare(claim);
    prepares.push_back(Ms(Clock::now() - start));
    writes.push_back(atomic_write());
    start = Clock::now();
    unprepare(claim);
    unprepares.push_back(Ms(Clock::now() - start));
    api_parts.push_back(api_fetch(claim));
    file_parts.push_back(files_alone(round));
    start = Clock::now();
    unprepare(never_prepared);
    grpc_parts.push_back(Ms(Clock::now() - start));
  }
  const double write_p50 = Report("fsync'd atomic write of a checkpoint-sized file (reference)", writes);
  const double prepare_p50 = Report("NodePrepareResources round trip (kubelet sim -> plugin -> API sim -> CDI + claim log)", prepares);
  const double unprepare_p50 = Report("NodeUnprepareResources round trip (kubelet sim -> plugin -> CDI + claim log)", unprepares);
  std::printf("where a prepare's time goes, each part alone (same rounds):\n  ");
  const double api_p50 = Report("API: GET claim + LIST ComputeDomains at once, through the module's client", api_parts);
  std::printf("  ");
  const double files_p50 = Report("files: CDI spec (visible) + one claim-log record with fdatasync", file_parts);
  std::printf("  ");
  const double grpc_p50 = Report("gRPC + one pool hop: Unprepare of a claim never prepared (no spec to delete, no record)", grpc_parts);
  std::printf("  sum of the parts' p50 %.3f ms (%.2fx the write); prepare p50 %.3f ms: %.3f ms in hops between "
              "threads and scheduling on this machine\n",
              api_p50 + files_p50 + grpc_p50, (api_p50 + files_p50 + grpc_p50) / write_p50, prepare_p50,
              prepare_p50 - (api_p50 + files_p50 + grpc_p50));
  const auto p99 = [](std::vector<double> samples) {
    std::sort(samples.begin(), samples.end());
    return gns::bench::Percentile(samples, 0.99);
  };
  const double write_p99 = p99(writes);
  const double prepare_p99 = p99(prepares);
  std::printf("prepare/atomic-write p50 ratio: %.2fx (target <= 1.5x); p99 ratio: %.2fx; unprepare/atomic-write p50 "
              "ratio: %.2fx\n",
              prepare_p50 / write_p50, prepare_p99 / write_p99, unprepare_p50 / write_p50);

  std::vector<gns::sim::DraClaim> claims;
  claims.reserve(static_cast<std::size_t>(cycles));
  for (int i = 0; i < cycles; ++i) claims.push_back(seed_claim());
  std::vector<double> cycle_ms;
  const auto all_start = Clock::now();
  for (const auto& claim : claims) {
    const auto start = Clock::now();
    prepare(claim);
    unprepare(claim);
    cycle_ms.push_back(Ms(Clock::now() - start));
  }
  const double total_ms = Ms(Clock::now() - all_start);
  std::sort(cycle_ms.begin(), cycle_ms.end());
  const auto recovered = gns::dra::LoadClaimState(paths.checkpoint_file, paths.claim_log_file);
  const auto& loaded = recovered.checkpoint;
  const auto specs = gns::dra::ListCdiSpecClaimUids(paths.cdi_dir);
  const bool checkpoint_empty = loaded.status == gns::dra::CheckpointStatus::kLoaded && recovered.state.claims.empty() &&
                                recovered.log.corruption.empty();
  const bool no_specs = specs.ok && specs.claim_uids.empty();
  std::printf("%d sequential prepare/unprepare cycles: total %.1f ms (%.0f cycles/s), per cycle p50 %.3f ms, "
              "p99 %.3f ms, max %.3f ms; at the end checkpoint %s (%zu entries), CDI specs left %zu\n",
              cycles, total_ms, cycles / (total_ms / 1000.0), gns::bench::Percentile(cycle_ms, 0.50), gns::bench::Percentile(cycle_ms, 0.99), cycle_ms.back(),
              checkpoint_empty ? "empty" : std::string(gns::dra::ToString(loaded.status)).c_str(),
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
  if (!checkpoint_empty || !no_specs) {
    std::fprintf(stderr, "state left behind after the cycles\n");
    return 1;
  }
  return 0;
}
