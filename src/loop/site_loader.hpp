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
  // config key: each tick wakes the loop, which at rest has nothing else to do (issue #15: at
  // most one wake-up a second at rest); a stall of the loop shows at the next tick.
  std::chrono::milliseconds heartbeat_interval{5000};
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
