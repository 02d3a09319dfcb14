// Shared parts of the polled checks (see health_check.hpp).
#include "modules/gpu_health/health_check.hpp"

#include <algorithm>
#include <cmath>

namespace gns::gpu_health {

std::string_view SeverityName(Severity severity) noexcept {
  switch (severity) {
    case Severity::kWarning: return "warning";
    case Severity::kNonFatal: return "non-fatal";
    case Severity::kFatal: return "fatal";
  }
  return "warning";
}

std::string_view ComponentName(Component component) noexcept {
  switch (component) {
    case Component::kGpu: return "GPU";
    case Component::kMemory: return "Memory";
    case Component::kNvLink: return "NVLink";
    case Component::kFabric: return "Fabric";
    case Component::kPcie: return "PCIe";
    case Component::kThermal: return "Thermal";
    case Component::kHost: return "Host";
  }
  return "GPU";
}

std::optional<Component> ParseComponentName(std::string_view name) noexcept {
  for (const Component c : {Component::kGpu, Component::kMemory, Component::kNvLink, Component::kFabric,
                            Component::kPcie, Component::kThermal, Component::kHost}) {
    if (ComponentName(c) == name) return c;
  }
  return std::nullopt;
}

std::string GpuName(const gpu_inventory::GpuHealthReading& gpu) {
  std::string out = "GPU " + std::to_string(gpu.index) + " (" + gpu.uuid;
  if (!gpu.pci_bus_id.empty()) out += ", " + gpu.pci_bus_id;
  return out + ")";
}

double RateSetting::Threshold() const {
  const double minutes = std::chrono::duration<double, std::ratio<60>>(window).count();
  return std::max(1.0, per_minute * minutes);
}

uint64_t CounterWindow::Add(uint64_t value, int64_t at_ms, std::chrono::milliseconds window) {
  // A counter that went down was reset (driver reload, GPU reset): what came before is gone.
  // A reading older than the newest one (a clock step back) starts again too.
  if (!readings_.empty() && (value < readings_.back().second || at_ms < readings_.back().first)) readings_.clear();
  readings_.emplace_back(at_ms, value);
  const int64_t since = at_ms - window.count();
  while (readings_.size() > 1 && readings_.front().first < since) readings_.pop_front();
  while (readings_.size() > kMaxReadings) readings_.pop_front();
  return value - readings_.front().second;
}

}  // namespace gns::gpu_health
