#pragma once
// The three request sources, each turned into a job (or a refusal) before anything is queued:
// a GPUReset object for this node, a `reset-gpu GPU-…` line on reset.sock, and autoReset's
// COMPONENT_RESET verdict on a GPU no pod holds. Pure: what they are checked against (the
// inventory, the pod map) is passed in; the module looks the job up in the record and queues it.

#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_reset/reset_book.hpp"
#include "modules/gpu_reset/reset_runner.hpp"
#include "modules/pod_resources/messages.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_reset {

struct ObjectIntake {
  // A GPUReset for this node that the API does not show finished (Complete True/False);
  // anything else (another node's, malformed metadata or spec, done before) is left alone.
  bool ours = false;
  // id "GPUReset/<name>/<uid>"; pending with the GPUs it selects, or, when `problem` is set,
  // finished and refused (InvalidRequest) with it, nothing touched.
  ResetJob job;
  std::string problem;
  std::vector<std::string> uuids;  // the GPUs it selects, sorted, once each
  // Non-empty: another controller (NVSentinel's janitor) writes this object's status — what
  // shows it. The object is not ours (`ours` false): never two executors of one reset.
  std::string other_executor;
  std::string id;  // "GPUReset/<name>/<uid>" whenever the metadata is readable
};
// `field_manager`: the one our status writes carry; a status written under another name is
// another executor's.
ObjectIntake ReadGpuResetObject(const nlohmann::json& object, std::string_view node_name,
                                const gpu_inventory::GpuInventory* inventory, int64_t now_ms,
                                std::string_view field_manager = "gpu-reset");

// What shows that a controller other than `field_manager` writes the object's status: a
// managedFields entry of the status subresource under another manager, or a status condition
// we never write (ours: Complete only; janitor's: Ready, ServicesTornDown, ResetJobCreated, …).
// "" when nothing does.
std::string OtherStatusWriter(const nlohmann::json& object, std::string_view field_manager);

struct CliIntake {
  std::string error;  // non-empty: the reply ("error: …"), nothing queued
  std::string uuid;
};
// "reset-gpu GPU-…" for a GPU gpu-inventory lists.
CliIntake ReadResetGpuLine(std::string_view line, const gpu_inventory::GpuInventory* inventory);

// The holders of `uuid` as pod-resources' map shows them (the one judge of who holds a GPU):
// pods on the GPU, on its MIG devices and with a gpu.nvidia.com claim on it; claims prepared on
// it without a listed pod and holders whose GPU cannot be told as `others`. `map` null: the
// pod-resources module is not running (known false).
NodeMaintenance::PodView PodHoldersOf(const std::string& uuid, const pod_resources::GpuPodMap* map);

enum class AutoReset {
  kReset,            // nothing holds the GPU (as far as the pod map knows)
  kPodMapNotFresh,   // the kubelet's list is stale: not now, ask again at the next verdict
  kHeldByPods,       // pods (or DRA claims) hold it: left to the drainer (or the operator), for this verdict
};
// Without the pod-resources module (`map` null) the processes NVML sees are all we know: the
// holders step checks them.
AutoReset CheckAutoReset(const std::string& uuid, const pod_resources::GpuPodMap* map);
// One job per verdict: "auto/<uuid>/<since_unix_ms>".
std::string AutoResetJobId(const std::string& uuid, int64_t since_unix_ms);

}  // namespace gns::gpu_reset
