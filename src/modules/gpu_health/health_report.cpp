// gpu-health's outputs besides the bus verdicts (see health_report.hpp).
#include "modules/gpu_health/health_report.hpp"

#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"

#include <algorithm>
#include <set>

namespace gns::gpu_health {

HealthReport::HealthReport(Bus& bus, MetricsRegistry& metrics, const Clock& clock, spdlog::logger& log,
                           Settings settings)
    : bus_(bus), metrics_(metrics), log_(log), settings_(std::move(settings)), warn_(clock), clock_(clock) {
  const std::string devices = "gpu_node_supervisor_gpu_health_devices";
  const char* devices_help = "GPUs by health as decided by gpu-health";
  healthy_gauge_ = &metrics_.Gauge(devices, devices_help, {{"health", "Healthy"}});
  unhealthy_gauge_ = &metrics_.Gauge(devices, devices_help, {{"health", "Unhealthy"}});
}

HealthReport::~HealthReport() { lifetime_.Close(); }

void HealthReport::UseKube(std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::EventRecorder> recorder) {
  recorder_ = std::move(recorder);
  conditions_.reset();
  condition_in_flight_ = false;
  if (client && !settings_.node_name.empty()) {
    conditions_ = std::make_shared<kube::NodeConditions>(std::move(client), clock_, settings_.field_manager);
    UpdateCondition();
  }
}

void HealthReport::Verdicts(const std::vector<DeviceHealth>& devices, std::size_t known_gpus) {
  devices_ = devices;
  std::size_t unhealthy = 0;
  std::size_t gpus = 0;
  for (const auto& d : devices_) {
    if (d.gpu_instance != kWholeGpu) {
      // A MIG GPU instance's own verdict: its own gauge; the GPU's counts are about whole GPUs.
      metrics_
          .Gauge("gpu_node_supervisor_gpu_instance_healthy",
                 "1 while the MIG GPU instance is Healthy, 0 while an XID that named it holds it Unhealthy",
                 {{"gpu", d.uuid}, {"gpu_instance", std::to_string(d.gpu_instance)}})
          .Set(d.healthy ? 1 : 0);
      continue;
    }
    ++gpus;
    unhealthy += d.healthy ? 0 : 1;
    metrics_.Gauge("gpu_node_supervisor_gpu_healthy", "1 while the GPU is Healthy, 0 while Unhealthy", {{"gpu", d.uuid}})
        .Set(d.healthy ? 1 : 0);
  }
  // GPUs with a verdict that the inventory does not list count too.
  const std::size_t total = std::max(known_gpus, gpus);
  healthy_gauge_->Set(static_cast<double>(total - unhealthy));
  unhealthy_gauge_->Set(static_cast<double>(unhealthy));
  UpdateCondition();
}

void HealthReport::Persistence(const std::string& problem) {
  if (problem == persist_problem_) return;
  persist_problem_ = problem;
  UpdateCondition();
}

void HealthReport::Event(const HealthEvent& event, bool k8s, std::string_view type, std::string_view reason) {
  if (k8s && recorder_ && !event.node_name.empty()) {
    kube::ObjectReference node;
    node.name = event.node_name;
    std::string note = event.message;
    for (const auto& entity : event.entities_impacted) note += " " + entity.type + "=" + entity.value;
    if (!event.recommended_action_name.empty() && !event.is_healthy) {
      note += "; recommended action " + event.recommended_action_name;
    }
    if (!event.pods.empty()) {
      note += "; pods on it:";
      for (const auto& pod : event.pods) note += " " + pod;
    }
    recorder_->Record(node, type, reason, event.is_healthy ? "Recovered" : "XidReported", note);
  }
  if (settings_.recent_events > 0) {
    recent_.push_back(event);
    while (recent_.size() > settings_.recent_events) recent_.pop_front();
  }
}

void HealthReport::PublishState(const std::string& boot_id, const std::vector<DeviceHealth>& devices,
                                std::vector<std::pair<std::string, std::string>> pci_to_uuid) {
  GpuHealthState state;
  state.boot_id = boot_id;
  state.catalog_source = settings_.catalog_source;
  state.devices = devices;
  state.recent_events.assign(recent_.begin(), recent_.end());
  state.pci_to_uuid = std::move(pci_to_uuid);
  bus_.Publish(std::move(state));
}

void HealthReport::UpdateCondition() {
  if (!conditions_) return;
  if (condition_in_flight_) {
    condition_dirty_ = true;
    return;
  }
  kube::NodeCondition condition;
  condition.type = settings_.condition_type;
  std::vector<std::string> bad;
  std::set<std::string_view> bad_gpus;  // a GPU with verdicts for several GPU instances counts once
  for (const auto& d : devices_) {
    if (d.healthy) continue;
    // A GPU instance's reason names the instance ("… on GPU instance N").
    bad.push_back(d.uuid + ": " + d.reason + " → " + d.recommended_action);
    bad_gpus.insert(d.uuid);
  }
  if (bad.empty()) {
    condition.status = "True";
    condition.reason = "NoFatalXid";
    condition.message = "no GPU has an unrecovered fatal XID";
  } else {
    condition.status = "False";
    condition.reason = "FatalXid";
    condition.message = std::to_string(bad_gpus.size()) + " GPU(s) unhealthy: ";
    for (std::size_t i = 0; i < bad.size(); ++i) condition.message += (i ? "; " : "") + bad[i];
  }
  // The verdicts hold, but a restart may not know them: whoever reads the condition is told.
  if (!persist_problem_.empty()) condition.message += "; health is not persisted: " + persist_problem_;
  condition_in_flight_ = true;
  conditions_->Set(settings_.node_name, condition, lifetime_.Guard([this](kube::Result result) {
    condition_in_flight_ = false;
    if (!result.Ok()) warn_.Warn(log_, "node_condition_failed", result.error);
    if (condition_dirty_) {
      condition_dirty_ = false;
      UpdateCondition();
    }
  }));
}

}  // namespace gns::gpu_health
