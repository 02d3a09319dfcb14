#pragma once
// The metrics module's `gpuMetrics`: per-pod GPU series under dcgm-exporter's names (issue 27),
// without DCGM. Every `interval` it asks gpu-inventory's GpuHealthSampler for one pass over all
// GPUs and MIG devices (usage, ECC and row remapping, NVLink and PCIe counters, temperatures: the
// pass runs on the blocking pool under gpu-inventory's deadline, one at a time); it keeps the
// last answer, and renders the DCGM_FI_* text (dcgm_series.hpp) again whenever the sample, the
// inventory, the pod map or an XID changes. A scrape copies that text and never touches NVML;
// the series of a pod that ended go at the next pod-map change, not at the next sample.
//
// A failed pass (NVML unavailable, released for a reset, hung past its deadline) or a
// sampler that is not there (gpu-inventory off or stopped) drops every series: no stale values.
// `listen` optionally serves the same text on a listener of its own (/metrics), for sites that
// scrape exporters by port (dcgm-exporter's :9400).

#include "loop/gate.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/module.hpp"
#include "modules/gpu_inventory/api/health_sample.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/pod_resources/messages.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace gns::metrics {

class HttpServer;

struct GpuMetricsSettings {
  bool enabled = true;
  // dcgm-exporter's collect interval is 30 s; no tighter than 1 s.
  std::chrono::milliseconds interval{30000};
  std::optional<boost::asio::ip::tcp::endpoint> listen;  // a listener of its own; nullopt: none
  std::string hostname;                                   // the `Hostname` label: the node name
  std::chrono::milliseconds read_timeout{10000};          // of the listener's requests
};

class GpuMetricsExporter {
 public:
  // What a sample is read with: usage, plus the health groups the DCGM families show.
  static constexpr uint32_t kGroups = gpu_inventory::kHealthUsage | gpu_inventory::kHealthMemory |
                                      gpu_inventory::kHealthNvLink | gpu_inventory::kHealthPcie |
                                      gpu_inventory::kHealthThermal;

  GpuMetricsExporter(ModuleContext& context, GpuMetricsSettings settings);
  ~GpuMetricsExporter();
  GpuMetricsExporter(const GpuMetricsExporter&) = delete;
  GpuMetricsExporter& operator=(const GpuMetricsExporter&) = delete;

  // Subscribes, adds the DCGM_FI_ families to the registry, asks for the first pass, opens the
  // listener (throws if its address cannot be bound).
  void Start();
  void Stop(std::function<void()> done);

  // The DCGM_FI_* text a scrape serves now.
  const std::string& Text() const { return text_; }
  // Where the listener of its own is bound ("" when none).
  const std::string& ListenAddress() const { return listen_address_; }

 private:
  void RequestPass();
  void ScheduleNext();
  void OnPass(gpu_inventory::HealthSample sample);
  void Rebuild();

  ModuleContext& context_;
  GpuMetricsSettings settings_;
  Gate lifetime_;
  boost::asio::steady_timer timer_;
  bool pass_in_flight_ = false;
  std::optional<gpu_inventory::HealthSample> sample_;
  std::optional<gpu_inventory::GpuInventory> inventory_;
  std::optional<pod_resources::GpuPodMap> pods_;
  std::map<std::string, uint64_t> last_xid_;
  std::string text_;
  std::string last_failure_;  // logged once per distinct reason
  bool served_ = false;       // a pass worked since Start
  std::string listen_address_;
  std::unique_ptr<HttpServer> server_;
  MetricsRegistry::Series* passes_;
  MetricsRegistry::Series* failed_passes_;
  MetricsRegistry::Series* series_;
  MetricsRegistry::Series* pass_seconds_;
  MetricsRegistry::CollectorHandle families_;
  Subscription inventory_sub_;
  Subscription pods_sub_;
  Subscription xid_sub_;
};

}  // namespace gns::metrics
