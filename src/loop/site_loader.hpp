#pragma once
// Loads the site YAML (a base file and optional overlays), applies command-line overrides,
// validates everything — including every module section present, enabled or not — and
// returns what the runtime needs, before any module is constructed. Any problem throws
// ConfigError naming file:line:column and the key path.

#include "loop/config.hpp"
#include "loop/logging.hpp"
#include "loop/module.hpp"
#include "loop/site.hpp"
#include "loop/supervisor.hpp"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gns {

struct CommandLineOverrides {
  std::vector<std::string> enable;
  std::vector<std::string> disable;
  std::map<std::string, bool> feature_gates;
  std::optional<std::string> log_format;
  std::optional<std::string> log_level;
};

struct RuntimeSettings {
  SupervisorSettings supervisor;
  std::size_t blocking_threads = 2;
  // The loop's heartbeat (LoopHeartbeat): how late a timer fires, and that the loop turns. Not a
  // config key: each tick wakes the loop, which at rest has little else to do. 10 s, not 5: at
  // rest the shipped module set's loop wakes for the heartbeat, the leader lease (2 wake-ups per
  // renewal every 10 s) and the polled checks; a 5 s tick alone took 0.2 of the 0.5 wake-ups a
  // second issue #23 allows, and the set measured 0.53/s with it (tools/idle-bench.sh). A stall
  // still fails /healthz within heartbeat + maxHeartbeatAge (20 s), inside the DaemonSet's
  // liveness probe of 3 failures 10 s apart.
  std::chrono::milliseconds heartbeat_interval{10000};
};

struct LoadedConfig {
  SiteConfig site;
  LoggingConfig logging;
  RuntimeSettings runtime;
  std::vector<ModuleSpec> modules;          // enabled, in manifest order
  std::vector<std::string> gate_overrides;  // lines for the startup log (seed 000 §5)
};

// `files[0]` is the base; later files are overlays laid on top in order.
LoadedConfig LoadSiteConfig(const std::vector<std::string>& files, const CommandLineOverrides& overrides,
                            const std::vector<ModuleDescriptor>& manifest);

}  // namespace gns
