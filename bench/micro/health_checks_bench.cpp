// One pass of gpu-health's polled checks on 8 GPUs (issue 26's budget: ≤ 2 ms of CPU per pass,
// the NVML reads aside, which gpu-inventory does on the pool): every group read, every reading
// present, 18 NVLinks per GPU, the findings applied to the check book. Only the judging runs
// on the loop; this is its cost.
#include "modules/gpu_health/check_book.hpp"
#include "modules/gpu_health/health_checks.hpp"

#include <benchmark/benchmark.h>

namespace {

namespace inv = gns::gpu_inventory;

inv::HealthSample EightGpus() {
  inv::HealthSample sample;
  sample.ok = true;
  sample.groups = inv::kHealthAll;
  sample.pci_gpu_count = 8;
  for (uint32_t i = 0; i < 8; ++i) {
    inv::GpuHealthReading gpu;
    gpu.uuid = "GPU-00000000-0000-0000-0000-00000000000" + std::to_string(i);
    gpu.pci_bus_id = "00000000:" + std::to_string(10 + i) + ":00.0";
    gpu.index = i;
    gpu.ecc_enabled = true;
    gpu.ecc = {10, 0, 100, 0};
    gpu.remapped_rows = inv::RemappedRows{1, 0, false, false};
    gpu.remap_histogram = inv::RowRemapHistogram{640, 0, 0, 0, 0};
    for (uint32_t l = 0; l < 18; ++l) {
      inv::NvLinkReading link;
      link.link = l;
      link.active = true;
      link.replay = link.recovery = link.crc_flit = link.crc_data = 5;
      gpu.nvlinks.push_back(link);
    }
    gpu.fabric = inv::FabricReading{3, 0, 2, 1, "cluster"};
    gpu.pcie = {5, 16, 5, 16, 0};
    gpu.thermal.clock_event_reasons = 0;
    gpu.thermal.gpu_temperature_c = 40;
    gpu.thermal.slowdown_threshold_c = 90;
    gpu.thermal.memory_temperature_c = 45;
    gpu.thermal.memory_max_c = 95;
    gpu.persistence_mode = true;
    sample.gpus.push_back(std::move(gpu));
  }
  return sample;
}

void BM_ChecksPassEightGpus(benchmark::State& state) {
  gns::gpu_health::HealthChecks checks(gns::gpu_health::ChecksConfig{});
  gns::gpu_health::CheckBook book;
  inv::HealthSample sample = EightGpus();
  int64_t at = 1'700'000'000'000;
  for (auto _ : state) {
    sample.taken_unix_ms = (at += 30'000);  // a pass every 30 s: the windows keep their readings
    const auto found = checks.Judge(sample, 8);
    for (const auto& gpu : found.gpus) benchmark::DoNotOptimize(book.Apply(gpu.uuid, gpu.pci, gpu.findings, at));
  }
}
BENCHMARK(BM_ChecksPassEightGpus);

}  // namespace

BENCHMARK_MAIN();
