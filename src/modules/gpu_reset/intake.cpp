// The request sources turned into jobs (see intake.hpp).
#include "modules/gpu_reset/intake.hpp"

#include "loop/pci_address.hpp"
#include "modules/gpu_reset/reset_request.hpp"
#include "modules/kube/api/client.hpp"

#include <algorithm>

namespace gns::gpu_reset {

namespace {

// Terminal in the API (Complete True/False): done before, by us or someone else.
bool Complete(const nlohmann::json& object) {
  const auto status = object.find("status");
  if (status == object.end() || !status->is_object()) return false;
  const auto conditions = status->find("conditions");
  if (conditions == status->end() || !conditions->is_array()) return false;
  for (const auto& c : *conditions) {
    if (c.value("type", "") == "Complete" && (c.value("status", "") == "True" || c.value("status", "") == "False")) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string OtherStatusWriter(const nlohmann::json& object, std::string_view field_manager) {
  const auto meta = object.find("metadata");
  if (meta != object.end() && meta->is_object()) {
    const auto managed = meta->find("managedFields");
    if (managed != meta->end() && managed->is_array()) {
      for (const auto& entry : *managed) {
        if (!entry.is_object() || entry.value("subresource", "") != "status") continue;
        const std::string manager = entry.value("manager", "");
        if (manager != field_manager) return "its status is written by field manager \"" + manager + "\"";
      }
    }
  }
  const auto status = object.find("status");
  if (status == object.end() || !status->is_object()) return "";
  const auto conditions = status->find("conditions");
  if (conditions == status->end() || !conditions->is_array()) return "";
  for (const auto& c : *conditions) {
    const std::string type = c.is_object() ? c.value("type", "") : "";
    if (!type.empty() && type != "Complete") return "its status has condition " + type + ", which gpu-reset never writes";
  }
  return "";
}

ObjectIntake ReadGpuResetObject(const nlohmann::json& object, std::string_view node_name,
                                const gpu_inventory::GpuInventory* inventory, int64_t now_ms,
                                std::string_view field_manager) {
  ObjectIntake intake;
  const auto meta = kube::ObjectMeta::From(object);
  if (!meta) return intake;
  intake.id = "GPUReset/" + meta->name + "/" + meta->uid;
  const auto spec = object.find("spec");
  if (spec == object.end() || !spec->is_object()) return intake;
  const auto node = spec->find("nodeName");
  if (node == spec->end() || !node->is_string() || node->get<std::string>() != node_name) return intake;  // another node's
  if (Complete(object)) return intake;
  intake.other_executor = OtherStatusWriter(object, field_manager);
  if (!intake.other_executor.empty()) return intake;
  intake.ours = true;
  const std::string node_text(node_name);
  ResetJob& job = intake.job;
  job.id = intake.id;
  job.source = "GPUReset";
  job.object_name = meta->name;
  job.object_uid = meta->uid;
  job.generation = object.value(nlohmann::json::json_pointer("/metadata/generation"), int64_t{0});
  job.created_unix_ms = now_ms;
  // Only a selector that names GPUs, or says all: true, selects any; anything else (missing,
  // empty, a misspelt key, a wrong type) is refused with the field it is about, nothing touched.
  const GpuSelection selection = ParseGpuSelector(*spec);
  std::vector<std::string>& uuids = intake.uuids;
  std::string& problem = intake.problem;
  problem = selection.error;
  if (problem.empty() && selection.all && inventory != nullptr) {
    for (const auto& gpu : inventory->gpus) uuids.push_back(gpu.uuid);
  }
  for (std::size_t i = 0; problem.empty() && i < selection.uuids.size(); ++i) {
    const std::string& uuid = selection.uuids[i];
    if (inventory == nullptr || inventory->FindByUuid(uuid) == nullptr) {
      problem = "spec.selector.uuids[" + std::to_string(i) + "]: GPU " + uuid + " is not on node " + node_text;
    } else {
      uuids.push_back(uuid);
    }
  }
  for (std::size_t i = 0; problem.empty() && i < selection.pci_bus_ids.size(); ++i) {
    const auto pci = ParsePciAddress(selection.pci_bus_ids[i]);
    const auto* gpu = pci && inventory != nullptr ? inventory->FindByPci(*pci) : nullptr;
    if (gpu == nullptr) {
      problem = "spec.selector.pciBusIDs[" + std::to_string(i) + "]: " + selection.pci_bus_ids[i] +
                " is no GPU of node " + node_text;
    } else {
      uuids.push_back(gpu->uuid);
    }
  }
  std::sort(uuids.begin(), uuids.end());
  uuids.erase(std::unique(uuids.begin(), uuids.end()), uuids.end());
  if (uuids.empty() && problem.empty()) problem = "no GPU is known on node " + node_text + " yet";
  if (problem.empty()) {
    for (const auto& uuid : uuids) job.gpus.push_back(NewGpuReset(uuid));
    return intake;
  }
  // Bad input: the whole object is refused with the reason; nothing is touched.
  GpuReset refused = NewGpuReset(uuids.empty() ? "unknown" : uuids.front());
  refused.outcome = "refused";
  refused.reason = "InvalidRequest";
  refused.message = problem;
  refused.step = Step::kDone;
  job.gpus.push_back(std::move(refused));
  job.phase = "Failed";
  job.reason = "InvalidRequest";
  job.message = problem;
  job.completed_unix_ms = now_ms;
  return intake;
}

CliIntake ReadResetGpuLine(std::string_view line, const gpu_inventory::GpuInventory* inventory) {
  constexpr std::string_view kVerb = "reset-gpu ";
  CliIntake intake;
  if (line.substr(0, kVerb.size()) != kVerb) {
    intake.error = "error: unknown request (expected: reset-gpu GPU-…)";
    return intake;
  }
  intake.uuid = std::string(line.substr(kVerb.size()));
  if (!LooksLikeGpuUuid(intake.uuid)) {
    intake.error = "error: \"" + intake.uuid + "\" is not a GPU UUID (GPU-…)";
  } else if (inventory == nullptr || inventory->FindByUuid(intake.uuid) == nullptr) {
    intake.error = "error: GPU " + intake.uuid + " is not on this node (gpu-inventory does not list it)";
  }
  return intake;
}

NodeMaintenance::PodView PodHoldersOf(const std::string& uuid, const pod_resources::GpuPodMap* map) {
  NodeMaintenance::PodView view;
  if (map == nullptr) return view;
  view.known = true;
  view.fresh = map->fresh;
  view.error = map->error;
  for (const auto& holder : map->Holders(uuid)) {
    std::string via;
    if (!holder.claim.empty()) {
      via = "claim " + holder.claim + " (" + holder.resource + (holder.device.empty() ? "" : " " + holder.device) + ")";
    } else if (!holder.device.empty()) {
      via = "MIG device " + holder.device;
    }
    view.holders.push_back({holder.namespace_name, holder.name, holder.container, std::move(via)});
  }
  for (const auto& other : map->OtherHolders(uuid)) {
    std::string what = other.claim.empty() ? "device " + other.device : "claim " + other.claim + " on " + other.device;
    if (!other.pod.empty()) what += " of pod " + other.pod;
    view.others.push_back(what + " (" + other.why + ")");
  }
  return view;
}

AutoReset CheckAutoReset(const std::string& uuid, const pod_resources::GpuPodMap* map) {
  if (map == nullptr) return AutoReset::kReset;
  if (!map->fresh) return AutoReset::kPodMapNotFresh;
  const auto view = PodHoldersOf(uuid, map);
  return view.holders.empty() && view.others.empty() ? AutoReset::kReset : AutoReset::kHeldByPods;
}

std::string AutoResetJobId(const std::string& uuid, int64_t since_unix_ms) {
  return "auto/" + uuid + "/" + std::to_string(since_unix_ms);
}

}  // namespace gns::gpu_reset
