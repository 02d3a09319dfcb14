#include "support/module_calls.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <stdexcept>
#include <tuple>

namespace gns::test {

std::string Describe(const Grant& g) {
  return g.scope + " " + (g.group.empty() ? "core" : g.group) + "/" + g.resource + " " + g.verb +
         (g.name.empty() ? "" : " (" + g.name + ")");
}

YAML::Node MergeConfig(const YAML::Node& base, const YAML::Node& overlay) {
  if (!base.IsMap() || !overlay.IsMap()) return YAML::Clone(overlay);
  YAML::Node out = YAML::Clone(base);
  for (const auto& kv : overlay) {
    const auto key = kv.first.as<std::string>();
    out[key] = out[key] ? MergeConfig(out[key], kv.second) : YAML::Clone(kv.second);
  }
  return out;
}

// (yaml-cpp: indexing a missing key of a const node gives an invalid node, and indexing that
// throws: every level is checked.)
YAML::Node SiteView::Module(const std::string& name) const {
  const auto modules = config["modules"];
  return modules && modules.IsMap() ? modules[name] : YAML::Node();
}

bool SiteView::Enabled(const std::string& name) const {
  const auto m = Module(name);
  return m && m["enabled"] && m["enabled"].as<bool>();
}

bool SiteView::Gate(const std::string& name, bool fallback) const {
  if (auto it = gates.find(name); it != gates.end()) return it->second;
  const auto file_gates = config["featureGates"];
  if (!file_gates || !file_gates.IsMap() || !file_gates[name]) return fallback;
  return file_gates[name].as<bool>();
}

std::string SiteView::Expand(const std::string& value) const {  // ${POD_NAMESPACE:-default}
  static const std::regex var(R"(\$\{POD_NAMESPACE(:-[^}]*)?\})");
  return std::regex_replace(value, var, pod_namespace);
}

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kAgent = "gpu-node-supervisor";
constexpr std::string_view kProcess = "(process)";
// The modules whose calls depend on the IMEX mode (see the header).
const std::set<std::string> kImexModeModules = {"dra-compute-domain", "compute-domain-controller"};

// "<group or core>/<resource>[/<subresource>] <verb>"
std::string CallText(const std::string& verb, const std::string& group, const std::string& resource,
                     const std::string& subresource) {
  return (group.empty() ? "core" : group) + "/" + resource + (subresource.empty() ? "" : "/" + subresource) + " " + verb;
}

// The other way: group ("" for core), resource with "/subresource", verb.
std::optional<std::tuple<std::string, std::string, std::string>> ParseCall(const std::string& text) {
  const auto space = text.rfind(' ');
  const auto slash = text.find('/');
  if (space == std::string::npos || slash == std::string::npos || slash > space) return std::nullopt;
  std::string group = text.substr(0, slash);
  if (group == "core") group.clear();
  return std::tuple{group, text.substr(slash + 1, space - slash - 1), text.substr(space + 1)};
}

std::optional<json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return json::parse(in);  // a malformed recording throws: the test says so
}

std::string LeaseNamespace(const SiteView& site, const std::string& module) {
  const auto le = site.Module(module)["leaderElection"];
  return site.Expand(le && le["namespace"] ? le["namespace"].as<std::string>() : site.pod_namespace);
}

}  // namespace

std::string RecordingsDir() {
  const char* source = std::getenv("GNS_SOURCE_DIR");
  return (fs::path(source && *source ? source : GNS_TEST_SOURCE_DIR) / "deploy/recorded-api-calls").string();
}

std::map<std::string, bool> ResolvedImexGates(const SiteView& site) {
  const bool host_managed = site.Gate("HostManagedIMEX", false);
  return {{"HostManagedIMEX", host_managed},
          {"ComputeDomainCliques", !host_managed && site.Gate("ComputeDomainCliques", true)}};
}

std::set<Grant> ModuleCalls(const SiteView& site) {
  std::set<Grant> calls;
  const auto gates = json(ResolvedImexGates(site));
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(RecordingsDir())) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const auto recording = ReadJson(file);
    if (!recording) throw std::runtime_error("cannot read " + file.string());
    const bool same_mode = recording->value("featureGates", json::object()) == gates;
    for (const auto& [module, list] : recording->at("calls").items()) {
      // Calls outside any module are the kube client's own: made whenever it runs.
      if (!site.Enabled(module == kProcess ? "kube" : module)) continue;
      if (kImexModeModules.contains(module) && !same_mode) continue;
      for (const auto& text : list) {
        const auto call = ParseCall(text.get<std::string>());
        if (!call) throw std::runtime_error(file.string() + ": not a call: " + text.dump());
        const auto& [group, resource, verb] = *call;
        Grant g{"cluster", group, resource, verb, ""};
        if (group == "coordination.k8s.io" && resource == "leases") {
          if (module == "kube") {
            const auto le = site.Module("kube")["leaderElection"];
            if (!le || !le["enabled"] || !le["enabled"].as<bool>()) continue;
          }
          g.scope = LeaseNamespace(site, module);
        } else if (module == "gkm-agent" && group.empty() && resource == "secrets" && verb == "get") {
          if (const auto secrets = site.Module("gkm-agent")["pullSecrets"]) {
            for (const auto& name : secrets) calls.insert(Grant{"cluster", "", "secrets", "get", name.as<std::string>()});
          }
          continue;
        } else if (module == "gpu-reset" && group.empty() && resource == "pods/eviction" && verb == "create") {
          const auto holders = site.Module("gpu-reset")["holders"];
          if (!holders || holders.as<std::string>() != "evict") continue;
        } else if (module == "pod-resources" && group.empty() && resource == "pods" && verb == "patch") {
          const auto annotate = site.Module("pod-resources")["annotate"];
          if (annotate && !annotate.as<bool>()) continue;
        }
        calls.insert(g);
      }
    }
  }
  return calls;
}

json CallsByModule(const json& stats) {
  std::map<std::string, std::set<std::string>> by_module;
  for (const auto& [agent, list] : stats.at("callsByAgent").items()) {
    std::string module;
    if (agent == kAgent) {
      module = kProcess;
    } else if (agent.size() > kAgent.size() + 1 && agent.compare(0, kAgent.size() + 1, std::string(kAgent) + "/") == 0) {
      module = agent.substr(kAgent.size() + 1);
    } else {
      continue;  // the test's own client, or another peer
    }
    for (const auto& c : list) {
      by_module[module].insert(CallText(c.at("verb").get<std::string>(), c.at("group").get<std::string>(),
                                        c.at("resource").get<std::string>(), c.at("subresource").get<std::string>()));
    }
  }
  json out = json::object();
  for (const auto& [module, set] : by_module) out[module] = json(std::vector<std::string>(set.begin(), set.end()));
  return out;
}

std::vector<std::string> CheckRecordedCalls(const std::string& scenario, const std::string& test, const json& stats,
                                            const std::map<std::string, bool>& gates) {
  const fs::path file = fs::path(RecordingsDir()) / (scenario + ".json");
  const json run = CallsByModule(stats);
  const char* record = std::getenv("GNS_RECORD_API_CALLS");
  std::vector<std::string> problems;
  if (record && std::string_view(record) == "1") {
    // Added to what is there (several tests or cases may make one scenario); to drop a call
    // the code no longer makes, delete the file and record again.
    json recording = ReadJson(file).value_or(json{{"scenario", scenario}, {"featureGates", json(gates)}, {"calls", json::object()}});
    if (recording.at("featureGates") != json(gates)) {
      return {file.string() + " was recorded with featureGates " + recording.at("featureGates").dump() + ", this run has " +
              json(gates).dump()};
    }
    for (const auto& [module, list] : run.items()) {
      std::set<std::string> merged;
      for (const auto& c : recording["calls"].value(module, json::array())) merged.insert(c.get<std::string>());
      for (const auto& c : list) merged.insert(c.get<std::string>());
      recording["calls"][module] = json(std::vector<std::string>(merged.begin(), merged.end()));
    }
    fs::create_directories(file.parent_path());
    const fs::path temp = file.string() + ".tmp";
    std::ofstream(temp) << recording.dump(2) << "\n";
    fs::rename(temp, file);
    return problems;
  }
  const auto recording = ReadJson(file);
  const std::string how = "if the code means to make it, record it: GNS_RECORD_API_CALLS=1 ctest -R " + test +
                          " (it adds the run's calls to " + file.string() + "), and grant it in deploy/";
  if (!recording) return {"no recording " + file.string() + ": " + how};
  if (recording->value("featureGates", json::object()) != json(gates)) {
    problems.push_back(file.string() + " was recorded with featureGates " + recording->value("featureGates", json::object()).dump() +
                       ", this run has " + json(gates).dump() + ": delete it and record it again");
  }
  for (const auto& [module, list] : run.items()) {
    const auto recorded = recording->at("calls").value(module, json::array());
    for (const auto& c : list) {
      if (std::find(recorded.begin(), recorded.end(), c) == recorded.end()) {
        problems.push_back("module " + module + " called " + c.get<std::string>() + ", which " + file.filename().string() +
                           " lacks: " + how);
      }
    }
  }
  return problems;
}

}  // namespace gns::test
