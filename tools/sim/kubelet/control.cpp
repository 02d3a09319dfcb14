// Control commands of the fake kubelet: parse one line, call KubeletSim, answer in JSON.
#include "control.h"

#include <exception>
#include <optional>
#include <sstream>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

namespace gns::sim {

namespace {

using nlohmann::json;

constexpr std::string_view kHelp =
    "state | restart | probe | "
    "allocate [--pod=NS/NAME --containers=C1,C2..] RESOURCE ID,ID[ ID,ID...] (one list per container) | "
    "preferred RESOURCE AVAILABLE_IDS MUST_INCLUDE_IDS|- SIZE | prestart RESOURCE ID,ID | "
    "prepare [--version=v1|v1beta1 | --pod=NS/NAME [--container=C]] DRIVER CLAIM_JSON | "
    "unprepare [--version=v1|v1beta1] DRIVER CLAIM_JSON "
    "(CLAIM_JSON: {\"namespace\":..,\"uid\":..,\"name\":..} or a list of them) | "
    "pod-resources (what List answers) | forget-pod NS/NAME | "
    "inject-pod-devices NS/NAME CONTAINER RESOURCE ID,ID (no plugin call) | pod-resources-socket on|off | "
    "(the binary, csi.h:) csi-publish [--readonly] [--no-pod-info] DRIVER NS/POD POD_UID VOLUME [ATTRIBUTES_JSON] | "
    "csi-unpublish POD_UID VOLUME | csi-volumes";

std::vector<std::string> SplitWords(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::vector<std::string> SplitComma(std::string_view text) {
  std::vector<std::string> items;
  if (text == "-" || text.empty()) return items;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    std::string item(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (!item.empty()) items.push_back(std::move(item));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

// Next word of `rest`, consumed; "" at the end.
std::string TakeWord(std::string_view& rest) {
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  std::size_t end = 0;
  while (end < rest.size() && rest[end] != ' ' && rest[end] != '\t') ++end;
  std::string word(rest.substr(0, end));
  rest.remove_prefix(end);
  return word;
}

json Error(const std::string& message) { return json{{"ok", false}, {"error", message}}; }

// "NS/NAME" -> binding; false when the shape is wrong.
bool ParsePod(std::string_view text, PodBinding& pod) {
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == text.size()) return false;
  pod.namespace_ = std::string(text.substr(0, slash));
  pod.name = std::string(text.substr(slash + 1));
  return pod.name.find('/') == std::string::npos;
}

json FromStatus(const RpcStatus& status) {
  if (status.ok()) return json{{"ok", true}};
  return json{{"ok", false}, {"code", std::string(StatusCodeName(status.code))}, {"error", status.message}};
}

json ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(message, &text, print).ok()) return json();
  return json::parse(text, nullptr, false);
}

std::vector<DraClaim> ParseClaims(std::string_view text) {
  const json parsed = json::parse(text);
  std::vector<DraClaim> claims;
  auto add = [&](const json& object) {
    if (!object.is_object()) throw std::invalid_argument("a claim must be an object");
    DraClaim claim{object.value("namespace", std::string()), object.value("uid", std::string()),
                   object.value("name", std::string())};
    if (claim.uid.empty()) throw std::invalid_argument("a claim needs a \"uid\"");
    claims.push_back(std::move(claim));
  };
  if (parsed.is_array()) {
    for (const json& object : parsed) add(object);
  } else {
    add(parsed);
  }
  return claims;
}

json Prepare(KubeletSim& sim, std::string_view rest, bool prepare) {
  std::optional<DraVersion> version;
  std::optional<PodBinding> pod;
  std::string driver = TakeWord(rest);
  for (;;) {
    if (driver.starts_with("--version=")) {
      const std::string value = driver.substr(10);
      if (value == "v1") {
        version = DraVersion::kV1;
      } else if (value == "v1beta1") {
        version = DraVersion::kV1beta1;
      } else {
        return Error("--version must be v1 or v1beta1");
      }
    } else if (driver.starts_with("--pod=") && prepare) {
      pod.emplace();
      if (!ParsePod(driver.substr(6), *pod)) return Error("--pod must be NAMESPACE/NAME");
    } else if (driver.starts_with("--container=") && prepare) {
      if (!pod) return Error("--container needs --pod first");
      pod->containers = {driver.substr(12)};
    } else {
      break;
    }
    driver = TakeWord(rest);
  }
  if (pod && version) return Error("--pod uses the negotiated version; give --version or --pod, not both");
  if (driver.empty()) return Error(std::string(prepare ? "prepare" : "unprepare") + " DRIVER CLAIM_JSON");
  std::vector<DraClaim> claims;
  try {
    claims = ParseClaims(rest);
  } catch (const std::exception& e) {
    return Error(std::string("bad CLAIM_JSON: ") + e.what());
  }
  if (prepare) {
    const DraPrepareResult result = version ? sim.NodePrepareResources(driver, claims, *version)
                                    : pod   ? sim.NodePrepareResources(driver, claims, *pod)
                                            : sim.NodePrepareResources(driver, claims);
    json reply = FromStatus(result.status);
    reply["service"] = result.service;
    reply["endpoint"] = result.endpoint;
    json out = json::object();
    for (const auto& [uid, claim] : result.claims) {
      json devices = json::array();
      for (const DraPreparedDevice& d : claim.devices) {
        devices.push_back(json{{"request_names", d.request_names},
                               {"pool_name", d.pool_name},
                               {"device_name", d.device_name},
                               {"cdi_device_ids", d.cdi_device_ids}});
      }
      out[uid] = json{{"devices", devices}, {"error", claim.error}};
    }
    reply["claims"] = out;
    reply["missing_claims"] = result.missing_claims;
    return reply;
  }
  const DraUnprepareResult result =
      version ? sim.NodeUnprepareResources(driver, claims, *version) : sim.NodeUnprepareResources(driver, claims);
  json reply = FromStatus(result.status);
  reply["service"] = result.service;
  reply["endpoint"] = result.endpoint;
  json out = json::object();
  for (const auto& [uid, error] : result.claims) out[uid] = json{{"error", error}};
  reply["claims"] = out;
  reply["missing_claims"] = result.missing_claims;
  return reply;
}

json Run(KubeletSim& sim, std::string_view line) {
  std::string_view rest = line;
  const std::string command = TakeWord(rest);
  if (command.empty()) return Error("empty command; try help");
  if (command == "help") return json{{"ok", true}, {"commands", kHelp}};
  if (command == "state") {
    json reply = KubeletStateToJson(sim.State());
    reply["ok"] = true;
    return reply;
  }
  if (command == "restart") {
    sim.Restart();
    return json{{"ok", true}};
  }
  if (command == "probe") {
    json sockets = json::object();
    bool all_ok = true;
    for (const auto& [socket, status] : sim.ProbePluginSockets()) {
      sockets[socket] = status.ToString();
      all_ok = all_ok && status.ok();
    }
    return json{{"ok", all_ok}, {"sockets", sockets}};
  }
  if (command == "prepare" || command == "unprepare") return Prepare(sim, rest, command == "prepare");

  std::vector<std::string> words = SplitWords(rest);
  if (command == "allocate") {
    std::optional<PodBinding> pod;
    std::vector<std::string> container_names;
    while (!words.empty() && words.front().starts_with("--")) {
      const std::string flag = words.front();
      words.erase(words.begin());
      if (flag.starts_with("--pod=")) {
        pod.emplace();
        if (!ParsePod(std::string_view(flag).substr(6), *pod)) return Error("--pod must be NAMESPACE/NAME");
      } else if (flag.starts_with("--containers=")) {
        container_names = SplitComma(std::string_view(flag).substr(13));
      } else {
        return Error("allocate: unknown flag " + flag);
      }
    }
    if (words.size() < 2) return Error("allocate [--pod=NS/NAME --containers=C1,..] RESOURCE ID,ID[ ID,ID...]");
    std::vector<std::vector<std::string>> containers;
    for (std::size_t i = 1; i < words.size(); ++i) containers.push_back(SplitComma(words[i]));
    if (!pod && !container_names.empty()) return Error("--containers needs --pod");
    if (pod) {
      // One container called "main" when none is named and one is requested.
      if (container_names.empty() && containers.size() == 1) container_names = {"main"};
      pod->containers = container_names;
    }
    const auto result = pod ? sim.Allocate(words[0], containers, *pod) : sim.Allocate(words[0], containers);
    json reply = FromStatus(result.status);
    if (result.ok()) reply["response"] = ProtoJson(result.response);
    return reply;
  }
  if (command == "preferred") {
    if (words.size() != 4) return Error("preferred RESOURCE AVAILABLE_IDS MUST_INCLUDE_IDS|- SIZE");
    int size = 0;
    try {
      size = std::stoi(words[3]);
    } catch (const std::exception&) {
      return Error("SIZE must be a number");
    }
    const auto result = sim.GetPreferredAllocation(words[0], SplitComma(words[1]), SplitComma(words[2]), size);
    json reply = FromStatus(result.status);
    if (result.ok()) reply["response"] = ProtoJson(result.response);
    return reply;
  }
  if (command == "pod-resources") {
    json pods = json::array();
    for (const auto& [key, pod] : sim.Pods()) {
      json containers = json::object();
      for (const auto& [name, c] : pod.containers) {
        json dynamic = json::array();
        for (const PodDynamicResource& d : c.dynamic_resources) {
          dynamic.push_back(json{{"claim", d.claim_namespace + "/" + d.claim_name}, {"driver", d.driver}});
        }
        containers[name] = json{{"devices", c.devices}, {"dynamic_resources", dynamic}};
      }
      pods.push_back(json{{"namespace", pod.namespace_}, {"name", pod.name}, {"containers", containers}});
    }
    const KubeletState state = sim.State();
    return json{{"ok", true},
                {"serving", state.pod_resources_serving},
                {"socket", sim.PodResourcesSocket().string()},
                {"lists", state.pod_resources_lists},
                {"pods", pods}};
  }
  if (command == "forget-pod") {
    PodBinding pod;
    if (words.size() != 1 || !ParsePod(words[0], pod)) return Error("forget-pod NAMESPACE/NAME");
    if (!sim.ForgetPod(pod.namespace_, pod.name)) return Error("no pod " + words[0]);
    return json{{"ok", true}};
  }
  if (command == "inject-pod-devices") {
    PodBinding pod;
    if (words.size() != 4 || !ParsePod(words[0], pod)) {
      return Error("inject-pod-devices NAMESPACE/NAME CONTAINER RESOURCE ID,ID");
    }
    sim.InjectPodDevices(pod.namespace_, pod.name, words[1], words[2], SplitComma(words[3]));
    return json{{"ok", true}};
  }
  if (command == "pod-resources-socket") {
    if (words.size() != 1 || (words[0] != "on" && words[0] != "off")) return Error("pod-resources-socket on|off");
    if (words[0] == "on") {
      sim.StartPodResources();
    } else {
      sim.StopPodResources();
    }
    return json{{"ok", true}};
  }
  if (command == "prestart") {
    if (words.size() != 2) return Error("prestart RESOURCE ID,ID");
    return FromStatus(sim.PreStartContainer(words[0], SplitComma(words[1])).status);
  }
  return Error("unknown command " + command + "; commands: " + std::string(kHelp));
}

json OptionsJson(const DevicePluginOptions& options) {
  return json{{"pre_start_required", options.pre_start_required},
              {"get_preferred_allocation_available", options.get_preferred_allocation_available}};
}

}  // namespace

json KubeletStateToJson(const KubeletState& state) {
  json resources = json::object();
  for (const auto& [name, rs] : state.resources) {
    json devices = json::array();
    for (const DeviceInfo& d : rs.devices) devices.push_back(json{{"id", d.id}, {"health", d.health}, {"numa", d.numa_nodes}});
    resources[name] = json{{"endpoint", rs.endpoint},
                           {"registration_socket", rs.registration_socket},
                           {"connected", rs.connected},
                           {"registrations", rs.registrations},
                           {"options", OptionsJson(rs.options)},
                           {"devices", devices},
                           {"healthy", rs.CountHealth("Healthy")},
                           {"unhealthy", rs.CountHealth("Unhealthy")},
                           {"list_and_watch_messages", rs.list_and_watch_messages},
                           {"disconnects", rs.disconnects},
                           {"disconnect_reason", rs.disconnect_reason}};
  }
  json rejected = json::array();
  for (const RejectedRegistration& r : state.rejected) {
    rejected.push_back(json{{"resource", r.resource},
                            {"version", r.version},
                            {"endpoint", r.endpoint},
                            {"code", std::string(StatusCodeName(r.status.code))},
                            {"error", r.status.message}});
  }
  json drivers = json::object();
  for (const auto& [name, dra] : state.dra_drivers) {
    json endpoints = json::array();
    for (const DraEndpointState& e : dra.endpoints) {
      endpoints.push_back(json{{"endpoint", e.endpoint},
                               {"registration_socket", e.registration_socket},
                               {"service", e.service},
                               {"supported_versions", e.supported_versions}});
    }
    drivers[name] = json{{"registered", dra.registered()}, {"registrations", dra.registrations}, {"endpoints", endpoints}};
    if (dra.health_streams > 0) {
      // KEP-4680: what the health stream said last, by device.
      json health = json::object();
      const auto now = std::chrono::steady_clock::now();
      for (const DraDeviceHealth& d : dra.health) {
        health[d.device_name] = json{{"pool", d.pool_name},
                                     {"health", d.health},
                                     {"seen", d.SeenAt(now, dra.health_default_timeout)},
                                     {"lastUpdatedTime", d.last_updated_time}};
        if (d.health_check_timeout_seconds > 0) health[d.device_name]["timeoutSeconds"] = d.health_check_timeout_seconds;
        if (!d.message.empty()) health[d.device_name]["message"] = d.message;
      }
      drivers[name]["health"] = json{{"streams", dra.health_streams},
                                     {"service", dra.health_service},
                                     {"open", dra.health_stream_open},
                                     {"messages", dra.health_messages},
                                     {"devices", health}};
      if (!dra.health_stream_end.empty()) drivers[name]["health"]["ended"] = dra.health_stream_end;
    }
  }
  json sockets = json::object();
  for (const auto& [path, ps] : state.plugin_sockets) {
    sockets[path] = json{{"type", ps.info.type},
                         {"name", ps.info.name},
                         {"endpoint", ps.info.endpoint},
                         {"supported_versions", ps.info.supported_versions},
                         {"registered", ps.registered},
                         {"registrations", ps.registrations},
                         {"attempts", ps.attempts},
                         {"getinfo_ok", ps.getinfo_ok},
                         {"getinfo_failures", ps.getinfo_failures},
                         {"last_getinfo", ps.last_getinfo.ToString()},
                         {"last_notified_registered", ps.last_notified_registered},
                         {"last_notified_error", ps.last_notified_error},
                         {"last_notify", ps.last_notify.ToString()}};
  }
  json csi = json::object();
  for (const auto& [name, driver] : state.csi_drivers) {
    csi[name] = json{{"endpoint", driver.endpoint},
                     {"registration_socket", driver.registration_socket},
                     {"versions", driver.versions},
                     {"highest_version", driver.highest_version},
                     {"node_id", driver.node_id},
                     {"registrations", driver.registrations}};
  }
  return json{{"running", state.running},
              {"restarts", state.restarts},
              {"resources", resources},
              {"rejected", rejected},
              {"dra_drivers", drivers},
              {"csi_drivers", csi},
              {"plugin_sockets", sockets}};
}

std::string HandleKubeletCommand(KubeletSim& sim, std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  json reply;
  try {
    reply = Run(sim, line);
  } catch (const std::exception& e) {
    reply = Error(e.what());
  }
  // Device IDs and messages come from plugins: never let a bad byte break the reply line.
  return reply.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace gns::sim
