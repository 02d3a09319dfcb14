// `gpu-node-supervisor preflight`: see preflight_command.hpp.
#include "preflight_command.hpp"

#include "modules/gpu_inventory/nvml_session.hpp"
#include "modules/imex_health/host_checks.hpp"
#include "modules/imex_health/unit_watcher.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

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
  if (const auto ctl = FindBinary(paths, "nvidia-imex-ctl"); ctl.empty()) {
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

  // The NVML clique (the map must list this clique's nodes).
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
    }
    if (opened.session) opened.session->Close();
  }

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
