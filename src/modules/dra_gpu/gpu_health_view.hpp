#pragma once
// What Kubernetes is told about each GPU's health, from gpu-health's verdicts (the one judge of
// "is this GPU healthy": this file follows it, it never judges). One place maps a verdict to a
// device's health; both outlets read it:
//   - the ResourceSlice: a DeviceTaint (KEP-5055) on each unhealthy GPU, gone once the verdict
//     turns healthy again (a validated reset, a new boot, the operator);
//   - the kubelet's health stream (KEP-4680): HEALTHY / UNHEALTHY / UNKNOWN per device.
// Pure: no bus, no clock; the module feeds it.

#include "modules/gpu_health/messages.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gns::dra_gpu {

// Taint keys. Upstream's GPU plugin (kubernetes-sigs/dra-driver-nvidia-gpu, WIRE-FACTS §6) uses
// the first two; a verdict from another check (memory, NVLink, thermal, …) has no upstream key
// and gets the third, its value naming the check.
inline constexpr std::string_view kTaintKeyXid = "gpu.nvidia.com/xid";
inline constexpr std::string_view kTaintKeyGpuLost = "gpu.nvidia.com/gpu-lost";
// Ours (upstream's plugin does not read SXids): the NVSwitch SXid on a port this GPU's link ends in.
inline constexpr std::string_view kTaintKeySxid = "gpu.nvidia.com/sxid";
inline constexpr std::string_view kTaintKeyUnhealthy = "gpu.nvidia.com/unhealthy";
// Upstream's key for a device its health monitor cannot watch (kubernetes-sigs/dra-driver-nvidia-gpu
// cmd/gpu-kubelet-plugin/device_health.go: no NVML handle, no supported events, registration
// refused): no value, effect None (KEP-5055's informational effect, Kubernetes 1.35+). Ours is set,
// when the site asks (`unmonitoredTaint`), while no judge (gpu-health) watches the GPUs.
inline constexpr std::string_view kTaintKeyUnmonitored = "gpu.nvidia.com/unmonitored";
// gpu-health's presence check (presence_checks.cpp): the GPU is gone from NVML.
inline constexpr std::string_view kGpuLostCheck = "GpuLost";

// DeviceTaint.effect. NoSchedule keeps new claims off the GPU; NoExecute also evicts the pods
// of claims already allocated it (the scheduler's eviction controller), so a site asks for it.
enum class TaintEffect { kNoSchedule, kNoExecute };
// The one source of the default of modules.dra-gpu.taintEffect.
inline constexpr TaintEffect kDefaultTaintEffect = TaintEffect::kNoSchedule;
std::string_view TaintEffectName(TaintEffect effect);

enum class HealthStatus { kUnknown, kHealthy, kUnhealthy };
std::string_view HealthStatusName(HealthStatus status);  // "Unknown", "Healthy", "Unhealthy"

struct GpuHealth {
  HealthStatus status = HealthStatus::kUnknown;
  // Unhealthy only: the taint's key and value (label-value syntax, <= 63 characters).
  std::string taint_key;
  std::string taint_value;
  // When the verdict turned (Unix ms); without a verdict, when the judge was first seen; 0 when
  // the judge is not known (Unknown).
  int64_t since_unix_ms = 0;
  std::string message;  // gpu-health's reason
  bool operator==(const GpuHealth&) const = default;
};

// `text` as a label value (the DeviceTaint value's syntax): at most 63 characters of
// [A-Za-z0-9-_.], starting and ending with an alphanumeric; anything else becomes '-' (runs
// folded into one). Empty when nothing of `text` is left.
std::string LabelValue(std::string_view text);

// RFC 3339 in UTC with second precision ("2026-11-28T09:40:00Z"), as the API prints metav1.Time.
std::string Rfc3339(int64_t unix_ms);

class GpuHealthView {
 public:
  // gpu-health is running (its state was seen): a GPU without a verdict is Healthy from then.
  // Only the first call counts. Returns true when it changed anything.
  bool JudgeSeen(int64_t now_unix_ms);
  // A verdict from gpu-health (retained, one per GPU and one per GPU instance). Returns true when
  // it changed the health of that GPU or GPU instance.
  bool OnVerdict(const gpu_health::DeviceHealth& verdict);

  bool JudgeKnown() const { return judge_since_unix_ms_ != 0; }
  // A whole GPU: its own verdict.
  GpuHealth Of(const std::string& uuid) const;
  // A MIG device (GPU instance `gpu_instance` of GPU `parent_uuid`): the whole GPU's verdict when
  // it is Unhealthy (it covers every MIG device of the GPU), else its GPU instance's when that one
  // is Unhealthy, else the whole GPU's health.
  GpuHealth OfMig(const std::string& parent_uuid, uint32_t gpu_instance) const;

 private:
  GpuHealth OfKey(const std::string& key) const;
  int64_t judge_since_unix_ms_ = 0;
  // By DeviceHealth::RetainKey: "<uuid>" for a whole GPU, "<uuid>/gi<n>" for a GPU instance.
  std::map<std::string, gpu_health::DeviceHealth> verdicts_;
};

// The slice's taints for a GPU of this health: one DeviceTaint when Unhealthy, none otherwise.
nlohmann::json TaintsFor(const GpuHealth& health, TaintEffect effect);
// The taint of a device no judge watches: upstream's unmonitored key, effect None (it keeps no
// claim off the device: it says its health is not known), added at `since_unix_ms` (> 0; the
// API would otherwise fill it in, and the slice would differ from ours on every compare).
nlohmann::json UnmonitoredTaint(int64_t since_unix_ms);

}  // namespace gns::dra_gpu
