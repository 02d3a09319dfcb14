#pragma once
// Bus messages of the `gpu-health` module that other modules consume. Per-device health is
// retained state keyed by GPU UUID: the device plugin advertises exactly this.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

// The reason of a verdict held Unhealthy while the GPU is being reset (after the gpu-reset
// module's "GPU reset started" line, until its outcome line).
inline constexpr std::string_view kResetInProgress = "GPU reset in progress";

// DeviceHealth::gpu_instance of a verdict about the whole GPU (NVML's "no instance" value).
inline constexpr uint32_t kWholeGpu = 0xFFFFFFFFu;

struct DeviceHealth {
  static constexpr std::string_view kTopic = "gpu-health.device";
  static constexpr bool kRetained = true;
  std::string uuid;
  bool healthy = true;
  std::string reason;  // why unhealthy, or what made it healthy again
  uint64_t xid = 0;    // the XID that made it unhealthy (0 if none)
  // The cause when it is not an XID: the NVSwitch SXid on a port wired to this GPU, or the
  // polled check whose condition is the worst (its stable name, the HealthEvent's checkName).
  // At most one of xid, sxid and check is set on an Unhealthy verdict; none on a Healthy one.
  uint64_t sxid = 0;
  std::string check;
  std::string recommended_action;  // NVSentinel vocabulary, e.g. COMPONENT_RESET
  int64_t since_unix_ms = 0;
  std::string pci;  // "0000:3b:00" when known (added by gpu-health)
  // MIG: the GPU instance the verdict is about (kernel "GPU-I:NN", NVML gpuInstanceId);
  // kWholeGpu (the default) = the whole GPU, which covers all of its MIG devices. A verdict for
  // one GPU instance is retained beside the whole-GPU one (its own key).
  uint32_t gpu_instance = kWholeGpu;
  std::string RetainKey() const { return KeyOf(uuid, gpu_instance); }
  static std::string KeyOf(std::string_view gpu_uuid, uint32_t instance) {
    std::string key(gpu_uuid);
    if (instance != kWholeGpu) key += "/gi" + std::to_string(instance);
    return key;
  }
};

inline void to_json(nlohmann::json& j, const DeviceHealth& h) {
  j = nlohmann::json{{"healthy", h.healthy}, {"since_unix_ms", h.since_unix_ms}};
  if (!h.reason.empty()) j["reason"] = h.reason;
  if (h.xid != 0) j["xid"] = h.xid;
  if (h.sxid != 0) j["sxid"] = h.sxid;
  if (!h.check.empty()) j["check"] = h.check;
  if (!h.recommended_action.empty()) j["recommendedAction"] = h.recommended_action;
  if (!h.pci.empty()) j["pci"] = h.pci;
  if (h.gpu_instance != kWholeGpu) j["gpuInstance"] = h.gpu_instance;
}

// One impacted entity of a HealthEvent: "PCI" ("0000:3b:00") or "GPU_UUID" ("GPU-…").
struct ImpactedEntity {
  std::string type;
  std::string value;
  bool operator==(const ImpactedEntity&) const = default;
};

// A health event with the fields of NVSentinel's HealthEvent (seed 003): an XID that was
// reported (unhealthy), or a device that recovered (healthy: reset acknowledged, new boot,
// operator). An event without entities concerns every GPU of the check (a new boot).
struct HealthEvent {
  static constexpr std::string_view kTopic = "gpu-health.event";
  std::string agent = "gpu-node-supervisor";
  std::string component_class = "GPU";
  std::string check_name = "SysLogsXIDError";
  bool is_fatal = false;
  bool is_healthy = false;
  std::string message;
  int recommended_action = 0;            // NVSentinel's RecommendedAction enum value
  std::string recommended_action_name;   // its name, e.g. COMPONENT_RESET
  std::vector<std::string> error_code;   // the XID as text, e.g. {"48"}
  std::vector<ImpactedEntity> entities_impacted;
  std::string node_name;
  int64_t generated_seconds = 0;
  int32_t generated_nanos = 0;
  // Ours: where it came from ("kernel", "nvml", "reset-ack", "boot", "operator") and how many
  // identical occurrences the rate limit swallowed before this one.
  std::string source;
  uint64_t suppressed_before = 0;
  // Ours: the pods holding the GPU when the event was made ("namespace/name"), from the
  // pod-resources module's map — the workloads an unhealthy GPU hits.
  std::vector<std::string> pods;
};

inline void to_json(nlohmann::json& j, const HealthEvent& e) {
  nlohmann::json entities = nlohmann::json::array();
  for (const auto& entity : e.entities_impacted) {
    entities.push_back({{"entityType", entity.type}, {"entityValue", entity.value}});
  }
  j = nlohmann::json{{"agent", e.agent},
                     {"componentClass", e.component_class},
                     {"checkName", e.check_name},
                     {"isFatal", e.is_fatal},
                     {"isHealthy", e.is_healthy},
                     {"message", e.message},
                     {"recommendedAction", e.recommended_action},
                     {"recommendedActionName", e.recommended_action_name},
                     {"errorCode", e.error_code},
                     {"entitiesImpacted", entities},
                     {"nodeName", e.node_name},
                     {"generatedTimestamp", {{"seconds", e.generated_seconds}, {"nanos", e.generated_nanos}}},
                     {"source", e.source}};
  if (e.suppressed_before != 0) j["suppressedBefore"] = e.suppressed_before;
  if (!e.pods.empty()) j["pods"] = e.pods;
}

// Retained: the last HealthEvents gpu-health let out (newest last, at most `eventLog`), kept in
// its checkpoint. A consumer that must take every event once (nvsentinel-export) finds here, at
// its start, what a kill -9 kept from it: between gpu-health's checkpoint landing and the event
// reaching the bus, or between the bus and the consumer's own disk. Republished after each batch
// of events has gone out on the event topic, so it never holds an event the topic has not
// carried first in this run.
struct HealthEventLog {
  static constexpr std::string_view kTopic = "gpu-health.event-log";
  static constexpr bool kRetained = true;
  std::vector<HealthEvent> events;
};

inline void to_json(nlohmann::json& j, const HealthEventLog& log) { j = nlohmann::json{{"events", log.events}}; }

// Retained: the gpu-health module's view for /debug/state.
struct GpuHealthState {
  static constexpr std::string_view kTopic = "gpu-health.state";
  static constexpr bool kRetained = true;
  std::string boot_id;
  std::string catalog_source;
  std::vector<DeviceHealth> devices;       // every verdict (GPUs and GPU instances), by RetainKey
  std::vector<HealthEvent> recent_events;  // newest last, bounded
  std::vector<std::pair<std::string, std::string>> pci_to_uuid;  // learned from the kernel log
};

inline void to_json(nlohmann::json& j, const GpuHealthState& s) {
  nlohmann::json devices = nlohmann::json::object();
  for (const auto& d : s.devices) devices[d.RetainKey()] = d;
  nlohmann::json pci = nlohmann::json::object();
  for (const auto& [p, u] : s.pci_to_uuid) pci[p] = u;
  j = nlohmann::json{{"bootId", s.boot_id},   {"catalog", s.catalog_source}, {"devices", devices},
                     {"recentEvents", s.recent_events}, {"pciToUuid", pci}};
}

// Retained: the polled checks for /debug/state — whether they run (gpu-inventory's sampler may
// be absent), the last pass, and every condition that holds (warnings included), by GPU.
struct GpuHealthChecks {
  static constexpr std::string_view kTopic = "gpu-health.checks";
  static constexpr bool kRetained = true;
  struct Held {
    std::string gpu;  // GPU UUID, or "node"
    std::string check;
    std::string component;
    std::string severity;  // fatal | non-fatal | warning
    std::string recommended_action;
    std::string message;
    std::string error_code;
    int64_t since_unix_ms = 0;
  };
  std::string status;  // "running", "disabled", or why not ("no GpuHealthSampler: gpu-inventory …")
  std::vector<std::pair<std::string, int64_t>> intervals_ms;  // group → interval (0: off)
  uint64_t passes = 0;
  uint64_t failed_passes = 0;
  bool last_ok = false;
  std::string last_error;  // why the last pass judged nothing
  uint32_t last_groups = 0;
  int64_t last_unix_ms = 0;
  int64_t last_pass_micros = 0;
  std::vector<Held> conditions;
};

inline void to_json(nlohmann::json& j, const GpuHealthChecks::Held& h) {
  j = nlohmann::json{{"gpu", h.gpu},
                     {"check", h.check},
                     {"component", h.component},
                     {"severity", h.severity},
                     {"recommendedAction", h.recommended_action},
                     {"message", h.message},
                     {"sinceUnixMs", h.since_unix_ms}};
  if (!h.error_code.empty()) j["errorCode"] = h.error_code;
}

inline void to_json(nlohmann::json& j, const GpuHealthChecks& c) {
  nlohmann::json intervals = nlohmann::json::object();
  for (const auto& [group, ms] : c.intervals_ms) intervals[group] = ms;
  j = nlohmann::json{{"status", c.status},       {"intervalsMs", intervals},   {"passes", c.passes},
                     {"failedPasses", c.failed_passes}, {"lastOk", c.last_ok},  {"lastGroups", c.last_groups},
                     {"lastUnixMs", c.last_unix_ms},    {"lastPassMicros", c.last_pass_micros},
                     {"conditions", c.conditions}};
  if (!c.last_error.empty()) j["lastError"] = c.last_error;
}

}  // namespace gns::gpu_health
