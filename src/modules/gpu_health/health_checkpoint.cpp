// gpu-health's checkpoint file (see health_checkpoint.hpp).
#include "modules/gpu_health/health_checkpoint.hpp"

#include "modules/gpu_health/kernel_line_parser.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sys/stat.h>
#include <system_error>

namespace gns::gpu_health {
namespace {

constexpr std::size_t kMaxText = 1024;  // reason, action, pci, cursor

bool TextField(const nlohmann::json& d, const char* key, std::string& into) {
  const auto it = d.find(key);
  if (it == d.end() || !it->is_string() || it->get_ref<const std::string&>().size() > kMaxText) return false;
  into = it->get<std::string>();
  return true;
}

bool UnsignedField(const nlohmann::json& d, const char* key, uint64_t& into) {
  const auto it = d.find(key);
  if (it == d.end() || !it->is_number_unsigned()) return false;
  into = it->get<uint64_t>();
  return true;
}

constexpr std::size_t kMaxEventText = 8192;  // an event's message (a kernel line and more)
constexpr std::size_t kMaxEventList = 256;   // error codes, entities, pods of one event

bool StringList(const nlohmann::json& d, const char* key, std::vector<std::string>& into, bool required) {
  const auto it = d.find(key);
  if (it == d.end()) return !required;
  if (!it->is_array() || it->size() > kMaxEventList) return false;
  for (const auto& one : *it) {
    if (!one.is_string() || one.get_ref<const std::string&>().size() > kMaxText) return false;
    into.push_back(one.get<std::string>());
  }
  return true;
}

// One entry of "eventLog", as messages.hpp's to_json writes a HealthEvent.
bool ParseEvent(const nlohmann::json& e, HealthEvent& out, std::string& error) {
  if (!e.is_object()) {
    error = "not an object";
    return false;
  }
  const auto message = e.find("message");
  const auto fatal = e.find("isFatal");
  const auto healthy = e.find("isHealthy");
  const auto action = e.find("recommendedAction");
  if (!TextField(e, "agent", out.agent) || !TextField(e, "componentClass", out.component_class) ||
      !TextField(e, "checkName", out.check_name) || message == e.end() || !message->is_string() ||
      message->get_ref<const std::string&>().size() > kMaxEventText || fatal == e.end() || !fatal->is_boolean() ||
      healthy == e.end() || !healthy->is_boolean() || action == e.end() || !action->is_number_integer() ||
      !TextField(e, "recommendedActionName", out.recommended_action_name) || !TextField(e, "nodeName", out.node_name) ||
      !TextField(e, "source", out.source)) {
    error = "agent, componentClass, checkName, message, isFatal, isHealthy, recommendedAction, recommendedActionName, "
            "nodeName or source missing, too long or of the wrong type";
    return false;
  }
  out.message = message->get<std::string>();
  out.is_fatal = fatal->get<bool>();
  out.is_healthy = healthy->get<bool>();
  out.recommended_action = action->get<int>();
  if (!StringList(e, "errorCode", out.error_code, true) || !StringList(e, "pods", out.pods, false)) {
    error = "errorCode or pods is not a list of at most " + std::to_string(kMaxEventList) + " short texts";
    return false;
  }
  const auto entities = e.find("entitiesImpacted");
  if (entities == e.end() || !entities->is_array() || entities->size() > kMaxEventList) {
    error = "entitiesImpacted missing or not a list of at most " + std::to_string(kMaxEventList) + " entries";
    return false;
  }
  for (const auto& entity : *entities) {
    ImpactedEntity one;
    if (!entity.is_object() || !TextField(entity, "entityType", one.type) || !TextField(entity, "entityValue", one.value)) {
      error = "an entitiesImpacted entry lacks entityType or entityValue";
      return false;
    }
    out.entities_impacted.push_back(std::move(one));
  }
  const auto generated = e.find("generatedTimestamp");
  const bool timestamp_ok = generated != e.end() && generated->is_object() && generated->contains("seconds") &&
                            generated->at("seconds").is_number_integer() && generated->contains("nanos") &&
                            generated->at("nanos").is_number_integer();
  if (!timestamp_ok) {
    error = "generatedTimestamp.seconds or .nanos missing or not an integer";
    return false;
  }
  out.generated_seconds = generated->at("seconds").get<int64_t>();
  out.generated_nanos = generated->at("nanos").get<int32_t>();
  if (const auto suppressed = e.find("suppressedBefore"); suppressed != e.end()) {
    if (!suppressed->is_number_unsigned()) {
      error = "suppressedBefore is not a count";
      return false;
    }
    out.suppressed_before = suppressed->get<uint64_t>();
  }
  return true;
}

}  // namespace

std::string NormalizeBootId(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  std::string out;
  std::size_t dashes = 0;
  for (const char c : text) {
    if (c == '-') {
      ++dashes;
      continue;
    }
    if (!std::isxdigit(static_cast<unsigned char>(c))) return {};
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (out.size() != 32 || (dashes != 0 && dashes != 4)) return {};
  return out;
}

std::string HealthCheckpoint::Serialize() const {
  nlohmann::json out_devices = nlohmann::json::array();
  for (const auto& d : devices) {
    nlohmann::json device = {{"uuid", d.uuid},
                             {"healthy", d.healthy},
                             {"reason", d.reason},
                             {"xid", d.xid},
                             {"recommendedAction", d.recommended_action},
                             {"sinceUnixMs", d.since_unix_ms},
                             {"pci", d.pci}};
    // Only on a GPU instance's verdict: files without it read as before.
    if (d.gpu_instance != kWholeGpu) device["gpuInstance"] = d.gpu_instance;
    if (d.sxid != 0) device["sxid"] = d.sxid;  // likewise: only on an SXid's verdict
    if (const auto held = held_by.find(d.RetainKey()); held != held_by.end() && !held->second.empty()) {
      device["heldBy"] = held->second;
    }
    out_devices.push_back(std::move(device));
  }
  nlohmann::json counts = nlohmann::json::array();
  for (const auto& c : xid_counts) counts.push_back({{"gpu", c.gpu}, {"xid", c.xid}, {"count", c.count}});
  nlohmann::json held = nlohmann::json::array();
  for (const auto& [uuid, h] : conditions) {
    held.push_back({{"uuid", uuid},
                    {"check", h.condition.check},
                    {"component", ComponentName(h.condition.component)},
                    {"recommendedAction", ActionName(h.condition.action)},
                    {"message", h.condition.message},
                    {"errorCode", h.condition.error_code},
                    {"pci", h.pci},
                    {"sinceUnixMs", h.since_unix_ms}});
  }
  nlohmann::json out{{"version", kVersion},
                        {"bootId", boot_id},
                        {"devices", out_devices},
                        {"journal",
                         {{"bootId", journal.boot_id},
                          {"cursor", journal.cursor},
                          {"monotonicUsec", journal.monotonic_usec},
                          {"realtimeUsec", journal.realtime_usec}}},
                        {"xidCounts", counts}};
  // Only when there are some: a file without fatal check conditions reads as before.
  if (!held.empty()) out["checkConditions"] = std::move(held);
  if (!xid_boots.empty()) {
    nlohmann::json boots = nlohmann::json::array();
    for (const auto& e : xid_boots) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& b : e.boots) list.push_back({{"bootId", b.boot_id}, {"lastUnixMs", b.last_unix_ms}});
      boots.push_back({{"gpu", e.gpu}, {"xid", e.xid}, {"boots", std::move(list)}});
    }
    out["xidBoots"] = std::move(boots);
  }
  if (!event_log.empty()) out["eventLog"] = event_log;
  return out.dump(2) + "\n";
}

std::optional<HealthCheckpoint> HealthCheckpoint::Parse(std::string_view text, std::string& error) {
  if (text.size() > kMaxBytes) {
    error = "larger than " + std::to_string(kMaxBytes) + " bytes";
    return std::nullopt;
  }
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) {
    error = "not valid JSON (truncated or garbled)";
    return std::nullopt;
  }
  if (!doc.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    error = "no integer version";
    return std::nullopt;
  }
  const int64_t v = version->get<int64_t>();
  if (v != 1 && v != kVersion) {
    error = "unknown version " + std::to_string(v) + " (this build reads 1 and " + std::to_string(kVersion) + ")";
    return std::nullopt;
  }
  HealthCheckpoint out;
  const auto boot = doc.find("bootId");
  if (boot == doc.end() || !boot->is_string() ||
      (!boot->get<std::string>().empty() && NormalizeBootId(boot->get<std::string>()) != boot->get<std::string>())) {
    error = "bootId is not 32 lowercase hex digits";
    return std::nullopt;
  }
  out.boot_id = boot->get<std::string>();
  const auto devices = doc.find("devices");
  if (devices == doc.end() || !devices->is_array() || devices->size() > kMaxDevices) {
    error = "devices is not an array of at most " + std::to_string(kMaxDevices) + " entries";
    return std::nullopt;
  }
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const auto& d = (*devices)[i];
    const std::string where = "devices[" + std::to_string(i) + "]";
    DeviceHealth h;
    if (!d.is_object()) {
      error = where + " is not an object";
      return std::nullopt;
    }
    if (!TextField(d, "uuid", h.uuid) || h.uuid.size() < 5 || h.uuid.rfind("GPU-", 0) != 0 ||
        h.uuid.size() > kMaxUuidBytes) {
      error = where + ".uuid is not a GPU UUID";
      return std::nullopt;
    }
    const auto healthy = d.find("healthy");
    const auto since = d.find("sinceUnixMs");
    uint64_t xid = 0;
    if (healthy == d.end() || !healthy->is_boolean() || !UnsignedField(d, "xid", xid) ||
        xid > std::numeric_limits<uint32_t>::max() || since == d.end() || !since->is_number_integer() ||
        !TextField(d, "reason", h.reason) || !TextField(d, "recommendedAction", h.recommended_action) ||
        !TextField(d, "pci", h.pci)) {
      error = where + " (" + h.uuid + "): healthy, reason, xid, recommendedAction, sinceUnixMs or pci missing or "
              "of the wrong type";
      return std::nullopt;
    }
    h.healthy = healthy->get<bool>();
    h.xid = xid;
    h.since_unix_ms = since->get<int64_t>();
    if (d.contains("gpuInstance")) {
      uint64_t instance = 0;
      if (!UnsignedField(d, "gpuInstance", instance) || instance >= kWholeGpu) {
        error = where + " (" + h.uuid + "): gpuInstance is not a GPU instance number";
        return std::nullopt;
      }
      h.gpu_instance = static_cast<uint32_t>(instance);
    }
    if (d.contains("sxid")) {
      uint64_t sxid = 0;
      if (!UnsignedField(d, "sxid", sxid) || sxid == 0 || sxid > std::numeric_limits<uint32_t>::max()) {
        error = where + " (" + h.uuid + "): sxid is not an SXid number";
        return std::nullopt;
      }
      h.sxid = sxid;
    }
    if (const auto held = d.find("heldBy"); held != d.end()) {
      std::vector<uint32_t> xids;
      if (!held->is_array() || held->size() > 64) {
        error = where + " (" + h.uuid + "): heldBy is not an array of at most 64 XIDs";
        return std::nullopt;
      }
      for (const auto& x : *held) {
        if (!x.is_number_unsigned() || x.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
          error = where + " (" + h.uuid + "): heldBy holds something that is no XID";
          return std::nullopt;
        }
        xids.push_back(static_cast<uint32_t>(x.get<uint64_t>()));
      }
      out.held_by[h.RetainKey()] = std::move(xids);
    }
    if (std::any_of(out.devices.begin(), out.devices.end(),
                    [&](const auto& o) { return o.RetainKey() == h.RetainKey(); })) {
      error = where + ": " + h.RetainKey() + " appears twice";
      return std::nullopt;
    }
    out.devices.push_back(std::move(h));
  }
  if (v == 1) return out;  // verdicts only: no position, no counts

  const auto journal = doc.find("journal");
  if (journal == doc.end() || !journal->is_object() || !TextField(*journal, "bootId", out.journal.boot_id) ||
      !TextField(*journal, "cursor", out.journal.cursor) ||
      !UnsignedField(*journal, "monotonicUsec", out.journal.monotonic_usec) ||
      !UnsignedField(*journal, "realtimeUsec", out.journal.realtime_usec) ||
      (!out.journal.boot_id.empty() && NormalizeBootId(out.journal.boot_id) != out.journal.boot_id)) {
    error = "journal: bootId, cursor, monotonicUsec or realtimeUsec missing or of the wrong type";
    return std::nullopt;
  }
  const auto counts = doc.find("xidCounts");
  if (counts == doc.end() || !counts->is_array() || counts->size() > kMaxCounts) {
    error = "xidCounts is not an array of at most " + std::to_string(kMaxCounts) + " entries";
    return std::nullopt;
  }
  for (std::size_t i = 0; i < counts->size(); ++i) {
    const auto& c = (*counts)[i];
    XidCount count;
    uint64_t xid = 0;
    if (!c.is_object() || !TextField(c, "gpu", count.gpu) || !UnsignedField(c, "xid", xid) ||
        xid > std::numeric_limits<uint32_t>::max() || !UnsignedField(c, "count", count.count)) {
      error = "xidCounts[" + std::to_string(i) + "]: gpu, xid or count missing or of the wrong type";
      return std::nullopt;
    }
    count.xid = static_cast<uint32_t>(xid);
    out.xid_counts.push_back(std::move(count));
  }
  if (const auto boots = doc.find("xidBoots"); boots != doc.end()) {
    if (!boots->is_array() || boots->size() > XidBootHistory::kMaxKeys) {
      error = "xidBoots is not an array of at most " + std::to_string(XidBootHistory::kMaxKeys) + " entries";
      return std::nullopt;
    }
    for (std::size_t i = 0; i < boots->size(); ++i) {
      const auto& b = (*boots)[i];
      const std::string where = "xidBoots[" + std::to_string(i) + "]";
      XidBootHistory::Entry entry;
      uint64_t xid = 0;
      const auto list = b.is_object() ? b.find("boots") : b.end();
      if (!b.is_object() || !TextField(b, "gpu", entry.gpu) || !UnsignedField(b, "xid", xid) ||
          xid > std::numeric_limits<uint32_t>::max() || list == b.end() || !list->is_array() ||
          list->size() > XidBootHistory::kMaxBoots) {
        error = where + ": gpu, xid or boots (at most " + std::to_string(XidBootHistory::kMaxBoots) +
                ") missing or of the wrong type";
        return std::nullopt;
      }
      entry.xid = static_cast<uint32_t>(xid);
      for (const auto& one : *list) {
        XidBootHistory::Boot boot;
        const auto last = one.is_object() ? one.find("lastUnixMs") : one.end();
        if (!one.is_object() || !TextField(one, "bootId", boot.boot_id) || boot.boot_id.empty() ||
            boot.boot_id.size() > XidBootHistory::kMaxBootIdBytes || last == one.end() || !last->is_number_integer()) {
          error = where + ".boots: bootId or lastUnixMs missing or of the wrong type";
          return std::nullopt;
        }
        boot.last_unix_ms = last->get<int64_t>();
        entry.boots.push_back(std::move(boot));
      }
      out.xid_boots.push_back(std::move(entry));
    }
  }
  if (const auto log = doc.find("eventLog"); log != doc.end()) {
    if (!log->is_array() || log->size() > kMaxEventLog) {
      error = "eventLog is not an array of at most " + std::to_string(kMaxEventLog) + " entries";
      return std::nullopt;
    }
    for (std::size_t i = 0; i < log->size(); ++i) {
      HealthEvent event;
      if (!ParseEvent((*log)[i], event, error)) {
        error = "eventLog[" + std::to_string(i) + "]: " + error;
        return std::nullopt;
      }
      out.event_log.push_back(std::move(event));
    }
  }
  const auto held = doc.find("checkConditions");
  if (held == doc.end()) return out;
  if (!held->is_array() || held->size() > kMaxDevices) {
    error = "checkConditions is not an array of at most " + std::to_string(kMaxDevices) + " entries";
    return std::nullopt;
  }
  for (std::size_t i = 0; i < held->size(); ++i) {
    const auto& c = (*held)[i];
    const std::string where = "checkConditions[" + std::to_string(i) + "]";
    std::string uuid, component, action;
    HeldCondition h;
    const auto since = c.is_object() ? c.find("sinceUnixMs") : c.end();
    if (!c.is_object() || !TextField(c, "uuid", uuid) || uuid.rfind("GPU-", 0) != 0 || uuid.size() > kMaxUuidBytes ||
        !TextField(c, "check", h.condition.check) || h.condition.check.empty() || !TextField(c, "component", component) ||
        !TextField(c, "recommendedAction", action) || !TextField(c, "message", h.condition.message) ||
        !TextField(c, "errorCode", h.condition.error_code) || !TextField(c, "pci", h.pci) || since == c.end() ||
        !since->is_number_integer()) {
      error = where + ": uuid, check, component, recommendedAction, message, errorCode, pci or sinceUnixMs missing "
              "or of the wrong type";
      return std::nullopt;
    }
    const auto parsed_component = ParseComponentName(component);
    if (!parsed_component) {
      error = where + ": unknown component \"" + component + "\"";
      return std::nullopt;
    }
    h.condition.component = *parsed_component;
    // A name this build does not know ranks as UNKNOWN, as a verdict's does.
    h.condition.action = ParseActionName(action).value_or(RecommendedAction::kUnknown);
    h.condition.severity = Severity::kFatal;  // only fatal conditions are written
    h.since_unix_ms = since->get<int64_t>();
    out.conditions.emplace_back(std::move(uuid), std::move(h));
  }
  return out;
}

CheckpointWriter::CheckpointWriter(BlockingPool& pool, std::string path, Take take, Written written)
    : pool_(pool), path_(std::move(path)), take_(std::move(take)), written_(std::move(written)) {}

CheckpointWriter::~CheckpointWriter() { lifetime_.Close(); }

void CheckpointWriter::Dirty() {
  dirty_ = true;
  if (!writing_) Write();
}

void CheckpointWriter::Write() {
  dirty_ = false;
  writing_ = true;
  Snapshot snapshot = take_();
  const uint64_t covers = snapshot.covers;
  pool_.Run(
      [path = path_, content = std::move(snapshot.content)] {
        // 0700 whatever the umask, and so is every parent it creates.
        const std::string dir = std::filesystem::path(path).parent_path().string();
        std::string error;
        if (!EnsureDirectory(dir, 0700, error)) return FileWriteResult{false, error};
        return WriteFileAtomically(path, content, 0600);
      },
      [this, alive = lifetime_.Watch(), covers](FileWriteResult result, std::exception_ptr error) {
        if (!alive) return;
        writing_ = false;
        const bool ok = !error && result;
        // Called before the next write starts: the owner sees what landed in order.
        written_(covers, ok, ok ? std::string() : (error ? "exception writing " + path_ : result.error));
        if (!alive) return;  // the owner went away in `written_`
        if (dirty_) Write();
      });
}

}  // namespace gns::gpu_health
