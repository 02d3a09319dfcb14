// Bus publish→deliver cost beside a bare asio::post of the same work, in the same run.
// Target (issue #2): bus ≤ 2× the bare post. Compare the ratio, not absolute numbers (Debian's
// Google Benchmark is a debug build, see TOOLCHAIN.md).
#include "loop/bus.hpp"
#include "loop/loop.hpp"

#include <benchmark/benchmark.h>

namespace {

struct Sample {
  static constexpr std::string_view kTopic = "bench.sample";
  uint64_t value = 0;
};

constexpr int kBatch = 1000;

// Throughput: kBatch messages queued, then the loop drains them.
void BM_BarePostThroughput(benchmark::State& state) {
  gns::Loop loop;
  loop.BindToCurrentThread();
  uint64_t sum = 0;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) {
      Sample s{static_cast<uint64_t>(i)};
      loop.Post([&sum, s] { sum += s.value; });
    }
    loop.Io().restart();
    loop.Io().poll();
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_BarePostThroughput);

void BM_BusThroughput(benchmark::State& state) {
  gns::Loop loop;
  loop.BindToCurrentThread();
  gns::Bus bus(loop);
  uint64_t sum = 0;
  auto sub = bus.Subscribe<Sample>([&sum](const Sample& s) { sum += s.value; });
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) bus.Publish(Sample{static_cast<uint64_t>(i)});
    loop.Io().restart();
    loop.Io().poll();
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_BusThroughput);

// Latency: one message, from publish until its handler ran, on an otherwise idle loop.
void BM_BarePostLatency(benchmark::State& state) {
  gns::Loop loop;
  loop.BindToCurrentThread();
  uint64_t sum = 0;
  for (auto _ : state) {
    loop.Post([&sum] { ++sum; });
    loop.Io().restart();
    loop.Io().poll_one();
  }
  benchmark::DoNotOptimize(sum);
}
BENCHMARK(BM_BarePostLatency);

void BM_BusLatency(benchmark::State& state) {
  gns::Loop loop;
  loop.BindToCurrentThread();
  gns::Bus bus(loop);
  uint64_t sum = 0;
  auto sub = bus.Subscribe<Sample>([&sum](const Sample& s) { sum += s.value + 1; });
  for (auto _ : state) {
    bus.Publish(Sample{1});
    loop.Io().restart();
    loop.Io().poll_one();
  }
  benchmark::DoNotOptimize(sum);
}
BENCHMARK(BM_BusLatency);

// Fan-out: one message to 8 subscribers (per-delivery cost).
void BM_BusFanOut8(benchmark::State& state) {
  gns::Loop loop;
  loop.BindToCurrentThread();
  gns::Bus bus(loop);
  uint64_t sum = 0;
  std::vector<gns::Subscription> subs;
  for (int i = 0; i < 8; ++i) subs.push_back(bus.Subscribe<Sample>([&sum](const Sample& s) { sum += s.value; }));
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) bus.Publish(Sample{static_cast<uint64_t>(i)});
    loop.Io().restart();
    loop.Io().poll();
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations() * kBatch * 8);
}
BENCHMARK(BM_BusFanOut8);

}  // namespace

BENCHMARK_MAIN();
