// gpu-node-supervisor: command line, config, then the reactor.
//
//   gpu-node-supervisor run --config FILE [--config OVERLAY]… [--enable m1,m2] [--disable m3]
//                           [--feature-gates K=V,…] [--log-format text|json] [--log-level LEVEL]
//   gpu-node-supervisor validate-config --config FILE [--config OVERLAY]…
//   gpu-node-supervisor set-healthy --gpu UUID|all [--state-dir DIR]
//   gpu-node-supervisor reset-gpu --gpu UUID [--state-dir DIR]
//   gpu-node-supervisor inventory | preflight | scan …   (one-shot reads of this node)
//   gpu-node-supervisor version
//   gpu-node-supervisor nvml-events …   (hidden: gpu-inventory's NVML event waiter child)
//
// Exit codes: 0 ok, 1 hard stop (or too few file descriptors), 2 bad command line or config.
// Signals: SIGTERM/SIGINT stop gracefully; SIGHUP, SIGUSR1, SIGUSR2 are logged and ignored;
// SIGPIPE is ignored.

#include "admin_client.hpp"
#include "inventory_command.hpp"
#include "preflight_command.hpp"
#include "scan_command.hpp"
#include "loop/config.hpp"
#include "loop/feature_gates.hpp"
#include "loop/logging.hpp"
#include "loop/runtime.hpp"
#include "loop/site_loader.hpp"
#include "modules/gpu_inventory/api/nvml_events_command.hpp"
#include "modules/manifest.hpp"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <cstdio>
#include <functional>
#include <iostream>
#include <utility>

namespace {

constexpr int kExitUsage = 2;

struct Options {
  std::vector<std::string> configs;
  std::vector<std::string> enable;
  std::vector<std::string> disable;
  std::string feature_gates;
  std::string log_format;
  std::string log_level;
};

void AddConfigOptions(CLI::App* cmd, Options& o) {
  cmd->add_option("--config", o.configs, "Site YAML file; repeat to lay overlays on top of the first")->required();
  cmd->add_option("--enable", o.enable, "Enable modules (comma-separated), overriding the file")->delimiter(',');
  cmd->add_option("--disable", o.disable, "Disable modules (comma-separated), overriding the file")->delimiter(',');
  cmd->add_option("--feature-gates", o.feature_gates, "Feature gates NAME=true|false,…, overriding the file");
  cmd->add_option("--log-format", o.log_format, "text or json")->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--log-level", o.log_level, "trace, debug, info, warn, error, critical or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
}

// Memory at rest (issue #15, tools/idle-bench.sh), set before any thread starts:
// - glibc gives each thread that allocates an arena of its own (up to 8 per core), and each
//   arena keeps what it once held. Our threads are the loop and a few that allocate little
//   (gRPC's, the blocking pool, NVML's event waiter): they share kMallocArenas.
// - Blocks of kMmapThreshold and more are mmapped and go back to the kernel when freed. glibc
//   would raise the threshold to the size of each such block freed (a LIST page, simdjson's
//   buffers), after which the next ones stay in the heap once freed: fixed, it does not move.
constexpr int kMallocArenas = 2;
constexpr int kMmapThreshold = 256 * 1024;

void TuneMalloc() {
  mallopt(M_ARENA_MAX, kMallocArenas);
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
}

gns::LoadedConfig Load(const Options& o) {
  gns::CommandLineOverrides overrides;
  overrides.enable = o.enable;
  overrides.disable = o.disable;
  if (!o.feature_gates.empty()) {
    const auto error = gns::ParseFeatureGateList(o.feature_gates, overrides.feature_gates);
    if (!error.empty()) throw gns::ConfigError("--feature-gates: " + error);
  }
  if (!o.log_format.empty()) overrides.log_format = o.log_format;
  if (!o.log_level.empty()) overrides.log_level = o.log_level;
  return gns::LoadSiteConfig(o.configs, overrides, gns::ModuleManifest());
}

}  // namespace

int main(int argc, char** argv) {
  TuneMalloc();
  gns::IgnoreSigpipe();  // before any thread starts: every thread inherits it
  CLI::App app{"gpu-node-supervisor: the GPU node's device plugin, DRA plugin, health watchers and IMEX jobs "
               "in one event loop"};
  app.require_subcommand(1);
  Options run_options;
  Options validate_options;
  auto* run = app.add_subcommand("run", "Run the supervisor");
  AddConfigOptions(run, run_options);
  auto* validate = app.add_subcommand("validate-config", "Check a site config (and overlays) and exit");
  AddConfigOptions(validate, validate_options);
  auto* version = app.add_subcommand("version", "Print the version");
  std::string set_healthy_state_dir = "/var/lib/gpu-node-supervisor";
  std::string set_healthy_gpu;
  auto* set_healthy = app.add_subcommand("set-healthy", "Mark a GPU (or all) Healthy again in the running supervisor");
  set_healthy->add_option("--gpu", set_healthy_gpu, "GPU UUID (GPU-…) or all")->required();
  set_healthy->add_option("--state-dir", set_healthy_state_dir, "The supervisor's state directory (holds admin.sock)");

  std::string reset_state_dir = "/var/lib/gpu-node-supervisor";
  std::string reset_gpu;
  auto* reset_gpu_cmd = app.add_subcommand(
      "reset-gpu", "Reset one GPU in place through the running supervisor, printing each step; exit 0 when validated");
  reset_gpu_cmd->add_option("--gpu", reset_gpu, "GPU UUID (GPU-…)")->required();
  reset_gpu_cmd->add_option("--state-dir", reset_state_dir, "The supervisor's state directory (holds reset.sock)");

  std::string inventory_library = "libnvidia-ml.so.1";
  std::string inventory_host_root = "/";
  auto* inventory = app.add_subcommand("inventory", "Read the GPUs once through NVML, as gpu-inventory does, and print JSON");
  inventory->add_option("--nvml-library", inventory_library, "NVML to dlopen (soname or path)");
  inventory->add_option("--host-root", inventory_host_root, "Where the host's /sys is (NUMA fallback)");

  gns::ScanOptions scan_options;
  std::string scan_window;
  auto* scan = app.add_subcommand(
      "scan", "Run every GPU health check once through NVML and print the findings; exit 1 when a GPU is unhealthy");
  scan->add_option("--nvml-library", scan_options.nvml_library, "NVML to dlopen (soname or path)");
  scan->add_option("--host-root", scan_options.host_root, "Where the host's /sys is (the PCI bus count)");
  scan->add_option("--output", scan_options.output, "table or json")->check(CLI::IsMember({"table", "json"}));
  scan->add_option("--bus-address", scan_options.bus_address,
                   "System bus for the host services (default: $DBUS_SYSTEM_BUS_ADDRESS, else the well-known socket)");
  scan->add_option("--window", scan_window,
                   "Read twice, this long apart, to judge counter growth too (e.g. 10s; default: one pass)");

  gns::PreflightOptions preflight_options;
  auto* preflight = app.add_subcommand(
      "preflight", "Run the host IMEX node checks (operator guide §3.4, §3.6, §3.7) now; exit 1 when one fails");
  preflight->add_option("--host-root", preflight_options.host_root, "Where the host's / is");
  preflight->add_option("--unit", preflight_options.unit, "The IMEX systemd unit");
  preflight->add_option("--bus-address", preflight_options.bus_address,
                        "D-Bus system bus address (default: $DBUS_SYSTEM_BUS_ADDRESS, else the system socket)");
  preflight->add_option("--config-file", preflight_options.config_files, "IMEX config file(s) to look for, in order");
  preflight->add_option("--nodes-config", preflight_options.nodes_config,
                        "nodes_config.cfg when the IMEX config does not name one");
  preflight->add_option("--self", preflight_options.self,
                        "This node's address(es) or hostname in the node map (default: the host's global addresses)");
  preflight->add_option("--nvml-library", preflight_options.nvml_library, "NVML to dlopen (soname or path)");
  preflight->add_flag("--skip-nvml", preflight_options.skip_nvml, "Do not check nvidia-smi and the NVML clique");
  preflight->add_option("--kubeconfig", preflight_options.kubeconfig,
                        "API credentials for the clique check (default: $KUBECONFIG, else in-cluster; none: skipped)");
  preflight->add_option("--node", preflight_options.node_name, "This host's Node (default: $NODE_NAME, else the host name)");
  preflight->add_option("--clique-label", preflight_options.clique_label, "The Node label holding the clique");
  preflight->add_option("--address-type", preflight_options.address_type, "What the map lists: internalIP or hostname")
      ->check(CLI::IsMember({"internalIP", "hostname"}));
  preflight->add_option("--imex-ctl", preflight_options.imex_ctl, "nvidia-imex-ctl on the host (under --host-root)");
  preflight->add_option("--timeout", preflight_options.timeout_seconds, "Seconds per nvidia-imex-ctl call and API request")
      ->check(CLI::Range(1, 300));
  preflight->add_option("--output", preflight_options.output, "text or json")
      ->check(CLI::IsMember({"text", "json"}));

  // The child gpu-inventory starts to wait for NVML's events (event_waiter.hpp); not for people.
  gns::gpu_inventory::EventWaiterOptions waiter_options;
  auto* nvml_events = app.add_subcommand("nvml-events", "NVML event waiter (gpu-inventory's child process)");
  nvml_events->group("");
  nvml_events->add_option("--library", waiter_options.library)->required();
  nvml_events->add_option("--wait-ms", waiter_options.wait_ms);
  nvml_events->add_option("--exclude-index", waiter_options.excluded_indices);
  nvml_events->add_option("--exclude-uuid", waiter_options.excluded_uuids);

  // CLI11 reports a word that names no subcommand as "A subcommand is required": say which
  // word it was, and what there is.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    std::string known;
    bool found = false;
    const std::function<bool(const CLI::App*)> every = [](const CLI::App*) { return true; };
    for (const auto* sub : std::as_const(app).get_subcommands(every)) {
      found = found || sub->get_name() == word;
      if (sub->get_group().empty()) continue;  // hidden (nvml-events): not for people
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::cerr << "error: unknown subcommand \"" << word << "\" (known: " << known << ")\n";
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  if (version->parsed()) {
    std::cout << "gpu-node-supervisor " << GNS_VERSION << "\n";
    return 0;
  }

  if (nvml_events->parsed()) return gns::gpu_inventory::RunEventWaiter(waiter_options);
  if (set_healthy->parsed()) return gns::RunSetHealthy(set_healthy_state_dir, set_healthy_gpu);
  if (reset_gpu_cmd->parsed()) return gns::RunResetGpu(reset_state_dir, reset_gpu, std::cout, std::cerr);
  if (inventory->parsed()) return gns::RunInventory(inventory_library, inventory_host_root);
  if (preflight->parsed()) return gns::RunPreflight(preflight_options);
  if (scan->parsed()) {
    if (!scan_window.empty()) {
      const auto window = gns::ParseDuration(scan_window);
      if (!window || window->count() <= 0) {
        std::cerr << "error: --window " << scan_window << ": expected a duration such as 10s or 1m\n";
        return 2;
      }
      scan_options.window = *window;
    }
    return gns::RunScan(scan_options);
  }

  if (validate->parsed()) {
    try {
      const auto config = Load(validate_options);
      std::cout << "config ok: node " << config.site.node_name << ", modules enabled:";
      for (const auto& m : config.modules) std::cout << " " << m.name;
      std::cout << "\n";
      for (const auto& line : config.gate_overrides) std::cout << line << "\n";
      return 0;
    } catch (const gns::ConfigError& e) {
      std::cerr << "error: " << e.what() << "\n";
      return kExitUsage;
    }
  }

  gns::LoadedConfig config;
  try {
    config = Load(run_options);
  } catch (const gns::ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitUsage;
  }
  gns::SetupLogging(config.logging);
  // Before gRPC, the journal and the sockets open anything: with too few descriptors gRPC aborts.
  if (const auto fd_error = gns::RaiseOpenFileLimit(); !fd_error.empty()) {
    spdlog::critical("{}", fd_error);
    return gns::Runtime::kExitHardStop;
  }
  spdlog::info("gpu-node-supervisor {} starting with {}", GNS_VERSION, config.site.config_file);
  gns::Runtime runtime(std::move(config));
  return runtime.Run();
}
