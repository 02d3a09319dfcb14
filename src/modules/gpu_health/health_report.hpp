// What gpu-health tells the world besides the bus verdicts: the Node condition of the check
// (one condition, not one per XID), Kubernetes Events on the Node, the gauges, and the
// retained GpuHealthState for /debug/state. The kube services are optional: without them
// (no API server, kube disabled) only the gauges and the bus state are kept.
#pragma once

#include "loop/gate.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/rate_limited_log.hpp"
#include "modules/gpu_health/messages.hpp"

#include <spdlog/logger.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns {
class Bus;
class Clock;
}  // namespace gns

namespace gns::kube {
class KubeClient;
class EventRecorder;
class NodeConditions;
}  // namespace gns::kube

namespace gns::gpu_health {

class HealthReport {
 public:
  struct Settings {
    std::string node_name;
    std::string condition_type = "GpuXidHealthy";
    std::string field_manager = "gpu-health";
    std::size_t recent_events = 32;
    std::string catalog_source;
  };

  HealthReport(Bus& bus, MetricsRegistry& metrics, const Clock& clock, spdlog::logger& log, Settings settings);
  ~HealthReport();

  // The kube services to report through (either may be null: that part is not reported).
  void UseKube(std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::EventRecorder> recorder);

  // The verdicts changed (all of them, as they are now), or the number of known GPUs did.
  void Verdicts(const std::vector<DeviceHealth>& devices, std::size_t known_gpus);
  // Whether the verdicts reach the disk: "" when they do, else why not (a read-only or full
  // state directory). The Node condition's message says so while they do not.
  void Persistence(const std::string& problem);
  // An event that left the process: recorded on the Node when `k8s` is set, kept for
  // /debug/state.
  void Event(const HealthEvent& event, bool k8s, std::string_view type, std::string_view reason);
  // /debug/state: the boot, the verdicts, the recent events and what the kernel log taught.
  void PublishState(const std::string& boot_id, const std::vector<DeviceHealth>& devices,
                    std::vector<std::pair<std::string, std::string>> pci_to_uuid);

 private:
  void UpdateCondition();

  Bus& bus_;
  MetricsRegistry& metrics_;
  spdlog::logger& log_;
  Settings settings_;
  RateLimitedLog warn_;
  std::shared_ptr<kube::NodeConditions> conditions_;
  std::shared_ptr<kube::EventRecorder> recorder_;
  std::vector<DeviceHealth> devices_;
  std::string persist_problem_;
  std::deque<HealthEvent> recent_;
  bool condition_in_flight_ = false;
  bool condition_dirty_ = false;
  Gate lifetime_;
  const Clock& clock_;
  MetricsRegistry::Series* healthy_gauge_;
  MetricsRegistry::Series* unhealthy_gauge_;
};

}  // namespace gns::gpu_health
