// `gpu-node-supervisor preflight`: see preflight_command.hpp.
#include "preflight_command.hpp"

#include "loop/clock.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "modules/gpu_inventory/api/nvml_session.hpp"
#include "modules/imex_peers/api/node_address.hpp"
#include "modules/kube/api/client.hpp"
#include "preflight/domain_check.hpp"
#include "preflight/host_checks.hpp"
#include "preflight/unit_watcher.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/null_sink.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

namespace gns {
namespace {

using imex_health::CheckResult;
using imex_health::CheckStatus;

// Looks for a binary in the host's usual directories (under host_root).
std::string FindBinary(const imex_health::HostPaths& paths, const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin"}) {
    const std::string path = paths.Under(std::string(dir) + "/" + name);
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return {};
}

void PrintText(const std::vector<CheckResult>& checks) {
  std::size_t width = 5;
  for (const auto& c : checks) width = std::max(width, c.name.size());
  for (const auto& c : checks) {
    std::string status(imex_health::ToString(c.status));
    std::transform(status.begin(), status.end(), status.begin(), ::toupper);
    std::printf("%-4s  %-*s  %s\n", status.c_str(), static_cast<int>(width), c.name.c_str(), c.message.c_str());
    if (!c.fix.empty()) std::printf("      %-*s  fix: %s\n", static_cast<int>(width), "", c.fix.c_str());
  }
}

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// API credentials the way the supervisor finds them: a kubeconfig, else in-cluster; nullopt
// (with `why`) when there are none.
std::optional<kube::ClientConfig> ApiCredentials(const PreflightOptions& options, std::string& why) {
  std::string path = options.kubeconfig;
  if (path.empty()) {
    if (const char* env = std::getenv("KUBECONFIG"); env && *env) path = env;
  }
  try {
    if (!path.empty()) return kube::LoadKubeconfig(path);
    if (std::getenv("KUBERNETES_SERVICE_HOST")) return kube::InClusterConfig();
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
  why = "no API credentials (--kubeconfig, $KUBECONFIG, or in-cluster)";
  return std::nullopt;
}

// One request to completion on a private loop (preflight runs before, or beside, the service).
kube::Result Request(Loop& loop, const std::function<void(kube::KubeClient::Callback)>& call) {
  std::optional<kube::Result> out;
  call([&out](kube::Result r) { out = std::move(r); });
  auto& io = loop.Io();
  io.restart();
  while (!out && io.run_one() > 0) {
  }
  return out.value_or(kube::Result{0, nullptr, "no answer"});
}

// The node map against the Nodes of this node's clique (as imex-peers renders it).
CheckResult CliqueMapCheck(const PreflightOptions& options, const imex_health::HostScan& scan,
                           const std::string& nvml_clique) {
  const std::string name = "nodes-config-clique";
  std::string why;
  auto credentials = ApiCredentials(options, why);
  if (!credentials) return {name, CheckStatus::kSkip, why, ""};
  credentials->request_timeout = std::chrono::seconds(options.timeout_seconds);
  std::string node_name = options.node_name;
  if (node_name.empty()) {
    if (const char* env = std::getenv("NODE_NAME"); env && *env) node_name = env;
  }
  if (node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) node_name = host;
  }
  Loop loop;
  SystemClock clock;
  MetricsRegistry metrics;
  auto log = std::make_shared<spdlog::logger>("preflight", std::make_shared<spdlog::sinks::null_sink_mt>());
  std::unique_ptr<kube::KubeClient> client;
  try {
    client = std::make_unique<kube::KubeClient>(kube::KubeClient::Deps{loop, clock, metrics, log}, *credentials);
  } catch (const std::exception& e) {
    return {name, CheckStatus::kFail, std::string("API client: ") + e.what(), "check the kubeconfig / service account"};
  }
  std::string clique = nvml_clique;
  if (clique.empty()) {
    const auto node = Request(loop, [&](auto cb) { client->Get(kube::ResourcePath::Core("nodes").Object(node_name), cb); });
    if (!node.Ok()) {
      client->Shutdown();
      return {name, CheckStatus::kFail, "reading Node " + node_name + ": " + node.error,
              "pass --node NAME (the Node of this host) and check the credentials' RBAC (get nodes)"};
    }
    const auto labels = node.object.value("/metadata/labels"_json_pointer, nlohmann::json::object());
    if (labels.is_object() && labels.contains(options.clique_label) && labels[options.clique_label].is_string()) {
      clique = labels[options.clique_label].get<std::string>();
    }
    if (clique.empty()) {
      client->Shutdown();
      return {name, CheckStatus::kFail, "Node " + node_name + " has no " + options.clique_label + " label and NVML gave no clique",
              "enable imex-peers (it labels the Node) or GFD; gpu-node-supervisor inventory"};
    }
  }
  kube::ListOptions list;
  list.label_selector = options.clique_label + "=" + clique;
  const auto nodes =
      Request(loop, [&](auto cb) { client->List(kube::ResourcePath::Core("nodes").Collection(), list, cb); });
  client->Shutdown();
  loop.Io().restart();
  loop.Io().poll();  // let the client close its connections
  if (!nodes.Ok()) {
    return {name, CheckStatus::kFail, "listing the Nodes of clique " + clique + ": " + nodes.error,
            "check the credentials' RBAC (list nodes)"};
  }
  const std::string type = options.address_type == "hostname" ? "Hostname" : "InternalIP";
  std::vector<std::string> expected;
  std::vector<std::string> without;
  for (const auto& item : nodes.object.value("items", nlohmann::json::array())) {
    const std::string address = imex_peers::NodeAddressOf(item, type);
    if (address.empty()) without.push_back(item.value("/metadata/name"_json_pointer, std::string("?")));
    else expected.push_back(address);
  }
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  std::vector<std::string> listed = scan.nodes.peers;
  std::sort(listed.begin(), listed.end());
  listed.erase(std::unique(listed.begin(), listed.end()), listed.end());
  std::vector<std::string> missing, extra;
  std::set_difference(expected.begin(), expected.end(), listed.begin(), listed.end(), std::back_inserter(missing));
  std::set_difference(listed.begin(), listed.end(), expected.begin(), expected.end(), std::back_inserter(extra));
  const std::string fix = "write the clique's " + type + " addresses to " + scan.nodes_config_path +
                          " on every node of the clique (imex-peers does; guide §3.2), then drain and "
                          "sudo systemctl restart " + options.unit;
  if (expected.empty()) {
    return {name, CheckStatus::kFail,
            "no Node of clique " + clique + " has an " + type + " address" +
                (without.empty() ? std::string() : " (" + JoinList(without) + ")"),
            "check the Nodes' status.addresses"};
  }
  if (!missing.empty() || !extra.empty()) {
    std::string message = "the map differs from the " + std::to_string(expected.size()) + " Node(s) of clique " + clique;
    if (!missing.empty()) message += "; missing from the map: " + JoinList(missing);
    if (!extra.empty()) message += "; not in the clique: " + JoinList(extra);
    return {name, CheckStatus::kFail, message, fix};
  }
  std::string message = "the map lists the " + std::to_string(expected.size()) + " Node(s) of clique " + clique;
  if (!without.empty()) {
    return {name, CheckStatus::kWarn, message + "; Nodes without an " + type + " address: " + JoinList(without),
            "check those Nodes' status.addresses"};
  }
  return {name, CheckStatus::kPass, message, ""};
}

}  // namespace

int RunPreflight(const PreflightOptions& options) {
  imex_health::HostPaths paths;
  paths.host_root = options.host_root;
  if (!options.config_files.empty()) paths.config_files = options.config_files;
  if (!options.nodes_config.empty()) paths.nodes_config = options.nodes_config;
  std::vector<CheckResult> checks;

  // §3.1 / §3.6: the binaries.
  if (options.skip_nvml) {
    checks.push_back({"nvidia-smi", CheckStatus::kSkip, "not checked (--skip-nvml)", ""});
  } else if (const auto smi = FindBinary(paths, "nvidia-smi"); smi.empty()) {
    checks.push_back({"nvidia-smi", CheckStatus::kFail, "nvidia-smi not found", "install the NVIDIA driver (guide §3.1)"});
  } else {
    checks.push_back({"nvidia-smi", CheckStatus::kPass, smi, ""});
  }
  if (const auto imex = FindBinary(paths, "nvidia-imex"); imex.empty()) {
    checks.push_back({"nvidia-imex", CheckStatus::kFail, "nvidia-imex not found",
                      "install the nvidia-imex package of the driver version (guide §3.1)"});
  } else {
    checks.push_back({"nvidia-imex", CheckStatus::kPass, imex, ""});
  }
  const std::string ctl = paths.Under(options.imex_ctl);
  const bool have_ctl = ::access(ctl.c_str(), X_OK) == 0;
  if (!have_ctl) {
    checks.push_back({"nvidia-imex-ctl", CheckStatus::kSkip, "nvidia-imex-ctl not installed (optional, for diagnostics)", ""});
  } else {
    checks.push_back({"nvidia-imex-ctl", CheckStatus::kPass, ctl, ""});
  }

  // §3.4, §3.3, §3.7: files.
  const auto self = options.self.empty() ? imex_health::LocalAddresses() : options.self;
  const auto scan = imex_health::ScanHost(paths, self, options.resolve);
  for (auto& check : imex_health::FileChecks(scan)) checks.push_back(std::move(check));

  // §3.5 / §3.6: the unit, over D-Bus as the module reads it.
  const auto unit = imex_health::ReadUnitOnce(options.bus_address, options.unit, std::chrono::seconds(5));
  const std::string status_fix = "sudo systemctl status " + options.unit + " --no-pager; journalctl -u " +
                                 options.unit + " -n 100 --no-pager";
  if (!unit.known) {
    checks.push_back({"unit-active", CheckStatus::kFail, unit.error,
                      "run where the host's system bus is reachable (mount /run/dbus/system_bus_socket)"});
  } else if (unit.load_state != "loaded") {
    checks.push_back({"unit-active", CheckStatus::kFail, options.unit + " is not installed (LoadState " + unit.load_state + ")",
                      "install the unit of guide §3.5; sudo systemctl daemon-reload"});
  } else {
    if (unit.active_state == "active") {
      checks.push_back({"unit-active", CheckStatus::kPass,
                        options.unit + " active (" + unit.sub_state + "), NRestarts " + std::to_string(unit.n_restarts), ""});
    } else {
      checks.push_back({"unit-active", CheckStatus::kFail, options.unit + " is " + unit.active_state + " (" + unit.sub_state + ")",
                        "sudo systemctl enable --now " + options.unit + "; " + status_fix});
    }
    if (unit.unit_file_state == "enabled" || unit.unit_file_state == "static") {
      checks.push_back({"unit-enabled", CheckStatus::kPass, options.unit + " " + unit.unit_file_state, ""});
    } else {
      checks.push_back({"unit-enabled", CheckStatus::kWarn,
                        options.unit + " is " + (unit.unit_file_state.empty() ? "of unknown enablement" : unit.unit_file_state) +
                            ": it will not start at boot",
                        "sudo systemctl enable " + options.unit});
    }
    if (scan.nodes_config_mtime_known && unit.active_state == "active" && unit.active_enter_usec != 0 &&
        scan.nodes_config_mtime_usec > unit.active_enter_usec) {
      checks.push_back({"nodes-config-loaded", CheckStatus::kFail,
                        scan.nodes_config_path + " changed after " + options.unit + " started: IMEX runs the old map",
                        "drain IMEX workloads, then sudo systemctl restart " + options.unit + " (guide §8.4)"});
    } else if (scan.nodes_config_mtime_known) {
      checks.push_back({"nodes-config-loaded", CheckStatus::kPass, "the running IMEX started after the map was written", ""});
    }
  }

  // §3.5 / §8.3: the domain, when nvidia-imex-ctl is there and the unit runs.
  if (!have_ctl) {
    checks.push_back({"imex-domain", CheckStatus::kSkip, "nvidia-imex-ctl not installed", ""});
  } else if (!unit.known || unit.active_state != "active") {
    checks.push_back({"imex-domain", CheckStatus::kSkip, options.unit + " is not active", ""});
  } else {
    imex_health::DomainCheckOptions domain;
    domain.command = ctl;
    domain.config_file = scan.config_path;
    domain.timeout = std::chrono::seconds(options.timeout_seconds);
    const auto result = imex_health::RunDomainCheckBlocking(domain);
    if (result.ready) {
      checks.push_back({"imex-domain", CheckStatus::kPass, "nvidia-imex-ctl " + result.state, ""});
    } else {
      checks.push_back({"imex-domain", CheckStatus::kFail, result.reason + ": " + result.message,
                        "nvidia-imex-ctl -N -c " + (scan.config_path.empty() ? std::string("/etc/nvidia-imex/config.cfg")
                                                                             : scan.config_path) +
                            "; " + status_fix + " (guide §8.3)"});
    }
  }

  // The NVML clique (the map must list this clique's nodes).
  std::string nvml_clique;
  if (options.skip_nvml) {
    checks.push_back({"nvml-clique", CheckStatus::kSkip, "not checked (--skip-nvml)", ""});
  } else {
    gpu_inventory::SessionOptions nvml;
    nvml.library = options.nvml_library;
    nvml.host_root = options.host_root;
    auto opened = gpu_inventory::NvmlSession::Open(nvml);
    if (!opened.session || !opened.read.ok) {
      checks.push_back({"nvml-clique", CheckStatus::kFail, "NVML (" + options.nvml_library + "): " + opened.read.error,
                        "check the driver: nvidia-smi; gpu-node-supervisor inventory"});
    } else if (opened.read.clique.clique_id.empty()) {
      checks.push_back({"nvml-clique", CheckStatus::kFail, "no NVLink clique: " + opened.read.clique.reason,
                        "check the fabric: nvidia-smi -q | grep -A3 Fabric"});
    } else {
      checks.push_back({"nvml-clique", CheckStatus::kPass, "clique " + opened.read.clique.clique_id, ""});
      nvml_clique = opened.read.clique.clique_id;
    }
    if (opened.session) opened.session->Close();
  }

  // The map against the clique's Nodes in the API (when there are credentials).
  checks.push_back(CliqueMapCheck(options, scan, nvml_clique));

  const bool failed =
      std::any_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.status == CheckStatus::kFail; });
  if (options.output == "json") {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& c : checks) {
      list.push_back({{"name", c.name}, {"status", imex_health::ToString(c.status)}, {"message", c.message}, {"fix", c.fix}});
    }
    std::cout << nlohmann::json{{"checks", std::move(list)}}.dump(2) << "\n";
  } else {
    PrintText(checks);
    std::printf("%s\n", failed ? "FAIL" : "OK");
  }
  return failed ? 1 : 0;
}

}  // namespace gns
