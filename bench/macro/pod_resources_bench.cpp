// Issue #12 figures for `pod-resources`, in one process: the real module on its own loop thread
// with the kube module's KubeClient / InformerRegistry against the API simulator (its own
// thread), and the kubelet simulator serving PodResourcesLister over gRPC on its unix socket.
//  - pod change -> annotation written: a pod bound to this node appears in the API (the kubelet
//    already reports its GPU) until the annotated pod is seen on the watch (what NVSentinel's
//    node-drainer would see); p50/p90/p99;
//  - API requests of pod-resources at steady state (target 0): after the rounds, a period of
//    re-list triggers (our plugin's Allocate events for GPUs already held, a 1 s resync) with
//    every request counted by the API simulator, watches excluded.
//
//   pod_resources_bench [--rounds N] [--steady-ms N]
#include "bench_util.hpp"
#include "support/api_sim.hpp"
#include "kubelet_sim.h"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"
#include "modules/pod_resources/pod_map.hpp"
#include "modules/pod_resources/pod_resources_module.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

using gns::bench::Ms;
using gns::bench::OnLoop;
using gns::bench::Report;

constexpr const char* kNode = "bench-node";
constexpr const char* kNs = "bench";

}  // namespace

int main(int argc, char** argv) {
  int rounds = 200, steady_ms = 3000;
  if (!gns::bench::ParseIntOptions(argc, argv, "pod_resources_bench [--rounds N] [--steady-ms N]",
                                   {{"--rounds", &rounds}, {"--steady-ms", &steady_ms}})) {
    return 2;
  }
  if (rounds < 1 || steady_ms < 0) {
    std::fprintf(stderr, "--rounds must be at least 1, --steady-ms at least 0\n");
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

  gns::test::ApiSim api(dir + "/api");

  gns::sim::KubeletSimOptions sim_options;
  sim_options.kubelet_dir = site.paths.kubelet_dir;
  gns::sim::KubeletSim kubelet(sim_options);
  kubelet.Start();

  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);

  std::unique_ptr<gns::test::KubeServices> kube;
  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  std::unique_ptr<gns::ModuleContext> context;
  std::unique_ptr<gns::pod_resources::PodResourcesModule> module;

  // The annotated pods as the watch shows them (a second informer on the same spec is the same
  // informer: the module's; its events are what any watcher of these pods sees).
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, Clock::time_point> annotated_at;
  gns::Subscription events_sub;
  const gns::kube::InformerSpec spec{gns::kube::ResourcePath::Core("pods").Collection(), "",
                                     std::string("spec.nodeName=") + kNode};
  OnLoop(loop, [&] {
    // The production rate limit: the annotation patches are paced as on a node.
    gns::kube::ClientConfig config = api.ClientConfig();
    config.qps = gns::kube::ClientConfig{}.qps;
    config.burst = gns::kube::ClientConfig{}.burst;
    kube = std::make_unique<gns::test::KubeServices>(loop, clock, bus, metrics, services, config, quiet, false);
    events_sub = bus.Subscribe<gns::kube::ResourceEvent>([&](const gns::kube::ResourceEvent& event) {
      if (event.informer_key != spec.Key() || !event.object) return;
      const json::json_pointer ptr("/metadata/annotations/dgxc.nvidia.com~1devices");
      if (!event.object->contains(ptr)) return;
      const auto name = event.object->at(json::json_pointer("/metadata/name")).get<std::string>();
      std::lock_guard lock(mutex);
      annotated_at.emplace(name, Clock::now());
      cv.notify_all();
    });
    auto report_failure = [](std::string why) { std::fprintf(stderr, "module failure: %s\n", why.c_str()); };
    auto ignore_health = [](gns::ModuleHealth, std::string) {};
    context = std::make_unique<gns::ModuleContext>(parts, "pod-resources", report_failure, ignore_health);
    gns::pod_resources::PodResourcesModule::Config config_pr;
    config_pr.socket = site.paths.kubelet_dir + "/pod-resources/kubelet.sock";
    config_pr.resync = milliseconds(1000);
    module = std::make_unique<gns::pod_resources::PodResourcesModule>(*context, config_pr);
    module->Start();
  });

  // Round i: the kubelet admits pod-i with GPU-(i % 8); then the pod shows up in the API.
  std::vector<double> latencies;
  int failures = 0;
  for (int i = 0; i < rounds; ++i) {
    const std::string name = "pod-" + std::to_string(i);
    kubelet.InjectPodDevices(kNs, name, "main", "nvidia.com/gpu", {"GPU-" + std::to_string(i % 8)});
    const auto start = Clock::now();
    api.Seed(json{{"apiVersion", "v1"},
                  {"kind", "Pod"},
                  {"metadata", {{"name", name}, {"namespace", kNs}}},
                  {"spec", {{"nodeName", kNode}, {"containers", {{{"name", "main"}, {"image", "cuda"}}}}}},
                  {"status", {{"phase", "Running"}}}});
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return annotated_at.contains(name); })) {
      ++failures;
      continue;
    }
    latencies.push_back(Ms(annotated_at.at(name) - start));
  }
  if (latencies.empty()) {
    std::fprintf(stderr, "no pod was ever annotated\n");
    return 1;
  }
  Report("pod created (GPU already allocated) -> annotation seen on the watch", latencies);

  // Steady state: let the last echoes land, then count every API request but the watch.
  std::this_thread::sleep_for(milliseconds(500));
  const auto lists_before = kubelet.State().pod_resources_lists;
  api.ResetRequestCounts();
  const auto steady_end = Clock::now() + milliseconds(steady_ms);
  while (Clock::now() < steady_end) {
    OnLoop(loop, [&] { bus.Publish(gns::pod_resources::DevicesAllocated{"nvidia.com/gpu", {"GPU-0"}}); });
    std::this_thread::sleep_for(milliseconds(50));
  }
  const auto counts = api.RequestCounts();
  uint64_t non_watch = 0;
  for (const auto& [verb, count] : counts) non_watch += verb == "watch" ? 0 : count;
  std::printf("steady state over %d ms: %llu List calls to the kubelet, %llu API requests besides the watch "
              "(target 0)%s\n",
              steady_ms, static_cast<unsigned long long>(kubelet.State().pod_resources_lists - lists_before),
              static_cast<unsigned long long>(non_watch), non_watch == 0 ? "" : "  <-- MISSED");
  if (failures > 0) std::printf("%d pod(s) never annotated within 10 s\n", failures);

  OnLoop(loop, [&] {
    module->Stop([] {});
    module.reset();
    events_sub = {};
    kube->Shutdown();
    kube.reset();
  });
  loop_thread.Stop();
  kubelet.Stop();
  api.Stop();
  fs::remove_all(dir);
  return failures == 0 && non_watch == 0 ? 0 : 1;
}
