// Informer throughput on Node objects of realistic size (~5 KB of JSON: labels, annotations,
// capacity, conditions, addresses, node info, images): decode + apply rate of watch lines, a
// relist of 10k Nodes from the LIST pages' text against a full cache, and the heap cost of one cached Node (counter
// `bytes_per_node`). Bus deliveries are drained as they go. Each runs twice: /0 caches whole
// objects (the default: all but managedFields), /1 with the projection a Node consumer such as
// imex-peers declares (labels and addresses: what it reads). Targets (issue #15): >= 50k
// events/s, <= 1.5x the JSON size per cached object, relist <= 200 ms.
#include "loop/bus.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "modules/kube/api/informer.hpp"

#include <benchmark/benchmark.h>
#include <malloc.h>
#include <spdlog/sinks/null_sink.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

// 10k Nodes; GNS_BENCH_NODES (the smoke test's 500) makes it a check that the bench runs, not
// a figure: under ASan the 10k-object pages alone take minutes to build.
const int kNodes = [] {
  const char* n = std::getenv("GNS_BENCH_NODES");
  return n != nullptr && std::atoi(n) > 0 ? std::atoi(n) : 10000;
}();

json MakeNode(int i, int rv) {
  const std::string name = "gpu-node-" + std::to_string(i);
  json labels = {{"kubernetes.io/hostname", name},
                 {"kubernetes.io/os", "linux"},
                 {"kubernetes.io/arch", "amd64"},
                 {"node.kubernetes.io/instance-type", "p5.48xlarge"},
                 {"topology.kubernetes.io/zone", "us-east-1a"},
                 {"topology.kubernetes.io/region", "us-east-1"},
                 {"nvidia.com/gpu.present", "true"},
                 {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
                 {"nvidia.com/gpu.count", "8"},
                 {"nvidia.com/cuda.driver.major", "550"},
                 {"nvidia.com/gpu.clique", "a1b2c3d4.7"},
                 {"feature.node.kubernetes.io/pci-10de.present", "true"}};
  json conditions = json::array();
  for (const char* type : {"MemoryPressure", "DiskPressure", "PIDPressure", "Ready", "GpuHealthy"}) {
    conditions.push_back({{"type", type},
                          {"status", std::string(type) == "Ready" || std::string(type) == "GpuHealthy" ? "True" : "False"},
                          {"lastHeartbeatTime", "2025-01-01T00:00:00Z"},
                          {"lastTransitionTime", "2025-01-01T00:00:00Z"},
                          {"reason", std::string("Kubelet") + type},
                          {"message", std::string("kubelet reports ") + type + " as expected on this node"}});
  }
  json images = json::array();
  for (int k = 0; k < 12; ++k) {
    images.push_back({{"names", {"nvcr.io/nvidia/image-" + std::to_string(k) + "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                                 "nvcr.io/nvidia/image-" + std::to_string(k) + ":24.0" + std::to_string(k)}},
                      {"sizeBytes", 1234567890 + k}});
  }
  json capacity = {{"cpu", "192"}, {"memory", "2113407312Ki"}, {"pods", "110"}, {"nvidia.com/gpu", "8"},
                   {"ephemeral-storage", "3750000000Ki"}, {"hugepages-1Gi", "0"}, {"hugepages-2Mi", "0"}};
  return {{"kind", "Node"},
          {"apiVersion", "v1"},
          {"metadata",
           {{"name", name},
            {"uid", "5d3c1f2e-0000-4000-8000-" + std::to_string(100000000000 + i)},
            {"resourceVersion", std::to_string(rv)},
            {"creationTimestamp", "2025-01-01T00:00:00Z"},
            {"labels", labels},
            {"annotations",
             {{"node.alpha.kubernetes.io/ttl", "0"},
              {"volumes.kubernetes.io/controller-managed-attach-detach", "true"},
              {"csi.volume.kubernetes.io/nodeid", "{\"ebs.csi.aws.com\":\"i-0123456789abcdef0\"}"}}}}},
          {"spec", {{"providerID", "aws:///us-east-1a/i-0123456789abcdef0"}, {"podCIDR", "10.1.2.0/24"}}},
          {"status",
           {{"capacity", capacity},
            {"allocatable", capacity},
            {"conditions", conditions},
            {"addresses", {{{"type", "InternalIP"}, {"address", "10.0.1.2"}}, {{"type", "Hostname"}, {"address", name}}}},
            {"nodeInfo",
             {{"machineID", "ec2a0b1c2d3e4f5a6b7c8d9e0f1a2b3c"},
              {"systemUUID", "ec2a0b1c-2d3e-4f5a-6b7c-8d9e0f1a2b3c"},
              {"bootID", "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e"},
              {"kernelVersion", "6.1.0-18-cloud-amd64"},
              {"osImage", "Debian GNU/Linux 12 (bookworm)"},
              {"containerRuntimeVersion", "containerd://1.7.13"},
              {"kubeletVersion", "v1.31.2"},
              {"kubeProxyVersion", "v1.31.2"},
              {"operatingSystem", "linux"},
              {"architecture", "amd64"}}},
            {"images", images}}}};
}

gns::kube::InformerSpec Spec(bool projected) {
  gns::kube::InformerSpec spec{"/api/v1/nodes", "", "", {}};
  if (projected) spec.fields = {"metadata.labels", "status.addresses"};
  return spec;
}

struct Fixture {
  explicit Fixture(bool projected)
      : log(std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>())),
        informer(Spec(projected), nullptr, bus, loop.Io(), metrics, log, {}) {
    loop.BindToCurrentThread();
  }
  void Drain() {
    loop.Io().restart();
    loop.Io().poll();
  }
  gns::Loop loop;
  gns::Bus bus{loop};
  gns::MetricsRegistry metrics;
  std::shared_ptr<spdlog::logger> log;
  gns::kube::Informer informer;
};

std::vector<std::string> WatchLines(int rv_base) {
  std::vector<std::string> lines;
  lines.reserve(kNodes);
  for (int i = 0; i < kNodes; ++i) {
    lines.push_back(json{{"type", "MODIFIED"}, {"object", MakeNode(i, rv_base + i)}}.dump());
  }
  return lines;
}

void BM_WatchDecodeApply(benchmark::State& state) {
  Fixture f(state.range(0) != 0);
  auto gns_subscription = f.bus.Subscribe<gns::kube::ResourceEvent>([](const gns::kube::ResourceEvent&) {});
  const auto lines = WatchLines(1000);
  std::size_t bytes = 0;
  for (const auto& l : lines) bytes += l.size();
  // Steady state: the cache already holds every Node (a first pass would measure the heap
  // growing by 10k objects, not the decoding), so each timed event replaces one.
  for (const auto& line : lines) f.informer.HandleLineForTest(line);
  f.Drain();
  for (auto _ : state) {
    for (std::size_t i = 0; i < lines.size(); ++i) {
      f.informer.HandleLineForTest(lines[i]);
      if (i % 1000 == 999) f.Drain();
    }
    f.Drain();
  }
  state.SetItemsProcessed(state.iterations() * kNodes);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["avg_line_bytes"] = static_cast<double>(bytes) / kNodes;
}
BENCHMARK(BM_WatchDecodeApply)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The LIST response pages of 10k Nodes as the API server sends them (the informer's page size,
// 500 a page): Node i at resourceVersion rv(i).
template <typename Rv>
std::vector<std::string> ListPages(Rv rv, int list_rv) {
  const int64_t page_size = gns::kube::InformerOptions{}.page_size;
  std::vector<std::string> pages;
  for (int first = 0; first < kNodes; first += static_cast<int>(page_size)) {
    json items = json::array();
    for (int i = first; i < std::min(kNodes, first + static_cast<int>(page_size)); ++i) items.push_back(MakeNode(i, rv(i)));
    pages.push_back(json{{"kind", "NodeList"},
                         {"apiVersion", "v1"},
                         {"metadata", {{"resourceVersion", std::to_string(list_rv)}}},
                         {"items", std::move(items)}}
                        .dump());
  }
  return pages;
}

// A relist from the pages' text to the published difference: decoding (through the informer's
// projection, the cached objects not built again), replacing the cache, the bus.
void BM_Relist10kNodes(benchmark::State& state) {
  Fixture f(state.range(0) != 0);
  auto gns_subscription = f.bus.Subscribe<gns::kube::ResourceEvent>([](const gns::kube::ResourceEvent&) {});
  f.informer.RelistForTest(ListPages([](int i) { return 1000 + i; }, 20000), "20000");
  f.Drain();
  int round = 0;
  for (auto _ : state) {
    state.PauseTiming();
    // Every tenth Node changed, the rest as cached: the usual shape of a relist after 410.
    ++round;
    const int list_rv = 100000 * round + kNodes;
    const auto pages = ListPages([round](int i) { return i % 10 == 0 ? 100000 * round + i : 1000 + i; }, list_rv);
    state.ResumeTiming();
    f.informer.RelistForTest(pages, std::to_string(list_rv));
    f.Drain();
    state.PauseTiming();
    if (f.informer.Size() != static_cast<std::size_t>(kNodes)) state.SkipWithError("the relist lost Nodes");
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kNodes);
}
BENCHMARK(BM_Relist10kNodes)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_MemoryPerCachedNode(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    // The watch lines are made first, so the measured growth is the cache alone.
    std::vector<std::string> lines;
    lines.reserve(kNodes);
    std::size_t line_bytes = 0;
    for (int i = 0; i < kNodes; ++i) {
      lines.push_back(json{{"type", "ADDED"}, {"object", MakeNode(i, 1000 + i)}}.dump());
      line_bytes += lines.back().size();
    }
    auto f = std::make_unique<Fixture>(state.range(0) != 0);
    f->Drain();
    malloc_trim(0);
    const auto before = mallinfo2().uordblks;
    state.ResumeTiming();
    for (int i = 0; i < kNodes; ++i) {
      f->informer.HandleLineForTest(lines[static_cast<std::size_t>(i)]);
      if (i % 1000 == 999) f->Drain();
    }
    f->Drain();
    state.PauseTiming();
    malloc_trim(0);
    const auto after = mallinfo2().uordblks;
    state.counters["bytes_per_node"] = (static_cast<double>(after) - static_cast<double>(before)) / kNodes;
    state.counters["json_bytes_per_node"] = static_cast<double>(line_bytes) / kNodes;
    f.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_MemoryPerCachedNode)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
