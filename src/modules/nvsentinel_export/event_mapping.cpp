// Our health facts as NVSentinel HealthEvents: see event_mapping.hpp.
#include "modules/nvsentinel_export/event_mapping.hpp"

#include "modules/nvsentinel_export/event_store.hpp"

#include <array>
#include <stdexcept>

namespace gns::nvsentinel_export {

namespace {

constexpr uint32_t kEventVersion = 1;

void SetTime(datamodels::HealthEvent& e, int64_t seconds, int32_t nanos) {
  e.mutable_generatedtimestamp()->set_seconds(seconds);
  e.mutable_generatedtimestamp()->set_nanos(nanos);
}
void SetTimeMs(datamodels::HealthEvent& e, int64_t unix_ms) {
  SetTime(e, unix_ms / 1000, static_cast<int32_t>((unix_ms % 1000) * 1000000));
}

datamodels::HealthEvent Base(const ExportSettings& settings) {
  datamodels::HealthEvent e;
  e.set_version(kEventVersion);
  e.set_agent(settings.agent);
  e.set_nodename(settings.node_name);
  e.set_processingstrategy(settings.strategy);
  return e;
}

void SetAction(datamodels::HealthEvent& e, std::string_view name) {
  e.set_recommendedaction(ActionFromName(name));
  if (!name.empty() && datamodels::RecommendedAction_Name(e.recommendedaction()) != name) {
    (*e.mutable_metadata())["recommendedActionName"] = std::string(name);
  }
}

void AddGpu(datamodels::HealthEvent& e, const std::string& uuid, const std::map<std::string, std::string>& pci_of) {
  if (uuid.empty() || uuid == "node") return;
  auto* entity = e.add_entitiesimpacted();
  entity->set_entitytype("GPU_UUID");
  entity->set_entityvalue(uuid);
  if (auto it = pci_of.find(uuid); it != pci_of.end() && !it->second.empty()) {
    auto* pci = e.add_entitiesimpacted();
    pci->set_entitytype("PCI");
    pci->set_entityvalue(it->second);
  }
}

// The check names the connector turns into Node conditions: one per kind of fact.
constexpr std::string_view kResetCheck = "GpuReset";
constexpr std::string_view kImexCheck = "ImexHealth";
constexpr std::string_view kVerdictCheck = "SysLogsXIDError";
constexpr std::string_view kSxidVerdictCheck = "SysLogsSXIDError";

}  // namespace

std::string StableId(std::initializer_list<std::string_view> parts) {
  return StableId(std::vector<std::string>(parts.begin(), parts.end()));
}

std::string StableId(const std::vector<std::string>& parts) {
  std::string joined;
  for (const auto& part : parts) joined.append(std::to_string(part.size())).append(":").append(part).append(";");
  const uint64_t a = Fnv1a64(joined);
  const uint64_t b = Fnv1a64(joined, 0x84222325cbf29ce4ull ^ a);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                static_cast<unsigned>(b >> 48), static_cast<unsigned long long>(b & 0xffffffffffffull));
  return buf;
}

datamodels::RecommendedAction ActionFromName(std::string_view name) {
  if (name.empty() || name == "RESTART_APP") return datamodels::NONE;
  datamodels::RecommendedAction action = datamodels::UNKNOWN;
  if (!datamodels::RecommendedAction_Parse(std::string(name), &action)) return datamodels::UNKNOWN;
  return action;
}

std::string IdOfGpuHealthEvent(const gpu_health::HealthEvent& event, const std::string& node_name) {
  std::string entities;
  for (const auto& entity : event.entities_impacted) entities += entity.type + "=" + entity.value + ",";
  std::string codes;
  for (const auto& code : event.error_code) codes += code + ",";
  return StableId({"gpu-health.event", node_name, event.check_name, event.is_healthy ? "healthy" : "unhealthy",
                   entities, codes, event.source, event.message, std::to_string(event.generated_seconds),
                   std::to_string(event.generated_nanos), std::to_string(event.suppressed_before)});
}

datamodels::HealthEvent FromGpuHealthEvent(const gpu_health::HealthEvent& event, const ExportSettings& settings) {
  datamodels::HealthEvent e = Base(settings);
  if (!event.agent.empty()) e.set_agent(event.agent);
  e.set_componentclass(event.component_class);
  e.set_checkname(event.check_name);
  e.set_isfatal(event.is_fatal);
  e.set_ishealthy(event.is_healthy);
  e.set_message(event.message);
  SetAction(e, event.recommended_action_name);
  for (const auto& code : event.error_code) e.add_errorcode(code);
  for (const auto& entity : event.entities_impacted) {
    auto* out = e.add_entitiesimpacted();
    out->set_entitytype(entity.type);
    out->set_entityvalue(entity.value);
  }
  if (!event.node_name.empty()) e.set_nodename(event.node_name);
  SetTime(e, event.generated_seconds, event.generated_nanos);
  auto& metadata = *e.mutable_metadata();
  if (!event.source.empty()) metadata["source"] = event.source;
  if (event.suppressed_before != 0) metadata["suppressedBefore"] = std::to_string(event.suppressed_before);
  if (!event.pods.empty()) {
    std::string pods;
    for (const auto& pod : event.pods) pods += (pods.empty() ? "" : ",") + pod;
    metadata["pods"] = pods;
  }
  e.set_id(IdOfGpuHealthEvent(event, e.nodename()));
  return e;
}

nlohmann::json BookToJson(const ExportBook& book) {
  nlohmann::json j = nlohmann::json::object();
  j["version"] = 1;
  if (book.verdicts) {
    auto& v = j["verdicts"] = nlohmann::json::object();
    for (const auto& [key, verdict] : *book.verdicts) {
      v[key] = {{"healthy", verdict.healthy}, {"xid", verdict.xid}, {"sinceUnixMs", verdict.since_unix_ms}};
    }
  }
  if (book.conditions) {
    auto& c = j["conditions"] = nlohmann::json::object();
    for (const auto& [key, condition] : *book.conditions) {
      c[key] = {{"severity", condition.severity}, {"sinceUnixMs", condition.since_unix_ms}};
    }
  }
  if (book.imex) {
    j["imex"] = {{"status", book.imex->status}, {"reason", book.imex->reason}, {"generation", book.imex->generation}};
  }
  if (book.resets) j["resets"] = *book.resets;
  if (book.taken_events) j["takenEvents"] = *book.taken_events;
  return j;
}

ExportBook BookFromJson(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  if (j.value("version", 0) != 1) throw std::runtime_error("version is not 1");
  ExportBook book;
  try {
    if (j.contains("verdicts")) {
      auto& verdicts = book.verdicts.emplace();
      for (const auto& [key, v] : j.at("verdicts").items()) {
        verdicts[key] = {v.at("healthy").get<bool>(), v.at("xid").get<uint64_t>(), v.at("sinceUnixMs").get<int64_t>()};
      }
    }
    if (j.contains("conditions")) {
      auto& conditions = book.conditions.emplace();
      for (const auto& [key, c] : j.at("conditions").items()) {
        conditions[key] = {c.at("severity").get<std::string>(), c.at("sinceUnixMs").get<int64_t>()};
      }
    }
    if (j.contains("imex")) {
      const auto& i = j.at("imex");
      book.imex = ExportBook::Imex{i.at("status").get<std::string>(), i.at("reason").get<std::string>(),
                                   i.at("generation").get<uint64_t>()};
    }
    if (j.contains("resets")) book.resets = j.at("resets").get<std::set<std::string>>();
    if (j.contains("takenEvents")) {
      book.taken_events = j.at("takenEvents").get<std::vector<std::string>>();
      if (book.taken_events->size() > ExportBook::kMaxTakenEvents) {
        throw std::runtime_error("takenEvents holds more than " + std::to_string(ExportBook::kMaxTakenEvents) + " ids");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("a field is missing or of the wrong type: ") + e.what());
  }
  return book;
}

std::vector<datamodels::HealthEvent> DiffConditions(ExportBook& book, const gpu_health::GpuHealthChecks& checks,
                                                    const std::map<std::string, std::string>& pci_of,
                                                    const ExportSettings& settings, int64_t now_unix_ms) {
  std::vector<datamodels::HealthEvent> out;
  // Only a pass that ran says which conditions hold: a check set that is disabled, waiting
  // for its sampler, or has not passed yet clears nothing.
  if (checks.status != "running" || checks.passes == 0) return out;
  std::map<std::string, const gpu_health::GpuHealthChecks::Held*> held;
  for (const auto& h : checks.conditions) {
    // Warnings do not fail a check: NVSentinel would make a failing Node condition of them.
    if (h.severity == "warning") continue;
    held[h.gpu + "/" + h.check] = &h;
  }
  auto& known = book.conditions ? *book.conditions : book.conditions.emplace();
  // Cleared: held before, not now (or held now since another instant: cleared and back).
  for (auto it = known.begin(); it != known.end();) {
    auto now = held.find(it->first);
    if (now != held.end() && now->second->since_unix_ms == it->second.since_unix_ms &&
        now->second->severity == it->second.severity) {
      ++it;
      continue;
    }
    if (now == held.end()) {
      const auto slash = it->first.find('/');
      const std::string gpu = it->first.substr(0, slash);
      const std::string check = slash == std::string::npos ? it->first : it->first.substr(slash + 1);
      datamodels::HealthEvent e = Base(settings);
      e.set_componentclass("GPU");
      e.set_checkname(check);
      e.set_ishealthy(true);
      e.set_message(check + " passes again");
      AddGpu(e, gpu, pci_of);
      SetTimeMs(e, now_unix_ms);
      e.set_id(StableId({"check-cleared", settings.node_name, it->first, std::to_string(it->second.since_unix_ms)}));
      out.push_back(std::move(e));
    }
    it = known.erase(it);
  }
  for (const auto& [key, h] : held) {
    if (known.count(key) != 0) continue;
    datamodels::HealthEvent e = Base(settings);
    e.set_componentclass(h->component.empty() ? "GPU" : h->component);
    e.set_checkname(h->check);
    e.set_isfatal(h->severity == "fatal");
    e.set_ishealthy(false);
    e.set_message(h->message);
    SetAction(e, h->recommended_action);
    if (!h->error_code.empty()) e.add_errorcode(h->error_code);
    AddGpu(e, h->gpu, pci_of);
    SetTimeMs(e, h->since_unix_ms);
    e.set_id(StableId({"check", settings.node_name, key, h->severity, std::to_string(h->since_unix_ms)}));
    out.push_back(std::move(e));
    known[key] = {h->severity, h->since_unix_ms};
  }
  return out;
}

std::vector<datamodels::HealthEvent> DiffImex(ExportBook& book, const imex_health::ImexHealth& imex,
                                              const ExportSettings& settings, int64_t now_unix_ms) {
  std::vector<datamodels::HealthEvent> out;
  // "Unknown" is not a verdict (the bus not read yet): nothing to say.
  if (imex.status != "True" && imex.status != "False") return out;
  const bool first = !book.imex;
  ExportBook::Imex& known = first ? book.imex.emplace() : *book.imex;
  if (known.status == imex.status && known.reason == imex.reason) return out;
  // First sight of a healthy IMEX: nothing changed for the receiver.
  const bool say = !(first && imex.ready);
  known.status = imex.status;
  known.reason = imex.reason;
  if (!say) return out;
  ++known.generation;
  datamodels::HealthEvent e = Base(settings);
  e.set_componentclass("IMEX");
  e.set_checkname(std::string(kImexCheck));
  e.set_ishealthy(imex.ready);
  // IMEX down takes the node's multi-node workloads down, not the GPUs: no action on the node.
  e.set_isfatal(false);
  e.set_message(imex.reason + (imex.message.empty() ? "" : ": " + imex.message));
  if (!imex.ready) e.add_errorcode(imex.reason);
  if (!imex.unit.empty()) (*e.mutable_metadata())["unit"] = imex.unit;
  SetTimeMs(e, now_unix_ms);
  e.set_id(StableId({"imex", settings.node_name, std::to_string(known.generation), imex.status, imex.reason}));
  out.push_back(std::move(e));
  return out;
}

std::vector<datamodels::HealthEvent> DiffResets(ExportBook& book, const gpu_reset::GpuResetState& state,
                                                const std::map<std::string, std::string>& pci_of,
                                                const ExportSettings& settings, int64_t now_unix_ms) {
  std::vector<datamodels::HealthEvent> out;
  if (!state.jobs.is_array()) return out;
  // First sight: the finished jobs are history, recorded without exporting.
  const bool first = !book.resets;
  auto& known = first ? book.resets.emplace() : *book.resets;
  std::set<std::string> now;
  for (const auto& job : state.jobs) {
    if (!job.is_object()) continue;
    const std::string id = job.value("id", "");
    const std::string phase = job.value("phase", "");
    if (id.empty() || (phase != "Succeeded" && phase != "Failed")) continue;
    const std::string key = id + "/" + phase;
    now.insert(key);
    if (first || known.count(key) != 0) continue;
    const bool ok = phase == "Succeeded";
    datamodels::HealthEvent e = Base(settings);
    e.set_componentclass("GPU");
    e.set_checkname(std::string(kResetCheck));
    e.set_ishealthy(ok);
    // A reset that failed leaves the GPU as it was; the next remedy is a reboot of the node.
    e.set_isfatal(!ok);
    e.set_recommendedaction(ok ? datamodels::NONE : datamodels::RESTART_BM);
    std::string message = "GPU reset " + std::string(ok ? "succeeded" : "failed");
    if (const std::string reason = job.value("reason", ""); !reason.empty()) message += " (" + reason + ")";
    if (const std::string detail = job.value("message", ""); !detail.empty()) message += ": " + detail;
    e.set_message(message);
    if (!ok) e.add_errorcode(job.value("reason", "ResetFailed"));
    if (job.contains("gpus") && job["gpus"].is_array()) {
      for (const auto& gpu : job["gpus"]) {
        if (gpu.is_object()) AddGpu(e, gpu.value("uuid", ""), pci_of);
      }
    }
    (*e.mutable_metadata())["resetJob"] = id;
    const int64_t completed = job.value("completedUnixMs", int64_t{0});
    SetTimeMs(e, completed != 0 ? completed : now_unix_ms);
    e.set_id(StableId({"reset", settings.node_name, id, phase}));
    out.push_back(std::move(e));
  }
  // Jobs the reset module no longer lists (trimmed) are forgotten: the book stays bounded.
  known = std::move(now);
  return out;
}

std::vector<datamodels::HealthEvent> DiffVerdicts(ExportBook& book, const std::vector<gpu_health::DeviceHealth>& now,
                                                  const ExportSettings& settings, int64_t now_unix_ms) {
  std::vector<datamodels::HealthEvent> out;
  const bool first = !book.verdicts;
  auto& known = first ? book.verdicts.emplace() : *book.verdicts;
  for (const auto& d : now) {
    const std::string key = d.RetainKey();
    auto it = known.find(key);
    // A GPU first seen healthy, or whose healthy/unhealthy did not flip, needs no event.
    const bool was_healthy = it == known.end() ? true : it->second.healthy;
    if (was_healthy == d.healthy) continue;
    datamodels::HealthEvent e = Base(settings);
    e.set_componentclass("GPU");
    // The check of the verdict's cause: an XID's (or none: a recovery), the NVSwitch SXid's, or
    // the polled check whose condition made it.
    e.set_checkname(d.sxid != 0 ? std::string(kSxidVerdictCheck) : !d.check.empty() ? d.check : std::string(kVerdictCheck));
    e.set_ishealthy(d.healthy);
    e.set_isfatal(!d.healthy && ActionFromName(d.recommended_action) != datamodels::NONE);
    e.set_message(d.reason.empty() ? std::string(d.healthy ? "healthy" : "unhealthy") : d.reason);
    if (!d.healthy) {
      SetAction(e, d.recommended_action);
      if (d.xid != 0) e.add_errorcode(std::to_string(d.xid));
      if (d.sxid != 0) e.add_errorcode(std::to_string(d.sxid));
    }
    std::map<std::string, std::string> pci_of;
    if (!d.pci.empty()) pci_of[d.uuid] = d.pci;
    AddGpu(e, d.uuid, pci_of);
    if (d.gpu_instance != gpu_health::kWholeGpu) {
      (*e.mutable_metadata())["gpuInstance"] = std::to_string(d.gpu_instance);
    }
    (*e.mutable_metadata())["source"] = "verdict-at-start";
    SetTimeMs(e, d.since_unix_ms != 0 ? d.since_unix_ms : now_unix_ms);
    // An XID verdict's id is as it always was; another cause adds itself.
    std::vector<std::string> id_parts{"verdict", settings.node_name, key, d.healthy ? "healthy" : "unhealthy",
                                      std::to_string(d.xid), std::to_string(d.since_unix_ms)};
    if (d.sxid != 0) id_parts.push_back("sxid " + std::to_string(d.sxid));
    if (!d.check.empty()) id_parts.push_back("check " + d.check);
    e.set_id(StableId(id_parts));
    out.push_back(std::move(e));
  }
  RecordVerdicts(book, now);
  return out;
}

void RecordVerdicts(ExportBook& book, const std::vector<gpu_health::DeviceHealth>& now) {
  auto& known = book.verdicts ? *book.verdicts : book.verdicts.emplace();
  known.clear();
  for (const auto& d : now) known[d.RetainKey()] = {d.healthy, d.xid, d.since_unix_ms};
}

}  // namespace gns::nvsentinel_export
