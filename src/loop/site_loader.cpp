// Site configuration loading and validation.
#include "loop/site_loader.hpp"

#include "loop/config_checks.hpp"

#include <algorithm>

namespace gns {

namespace {

const ModuleDescriptor* FindModule(const std::vector<ModuleDescriptor>& manifest, std::string_view name) {
  for (const auto& d : manifest)
    if (d.name == name) return &d;
  return nullptr;
}

std::string KnownModules(const std::vector<ModuleDescriptor>& manifest) {
  std::string out;
  for (const auto& d : manifest) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// The loggers there are: the supervisor's own and one per module (named after it).
constexpr std::string_view kSupervisorLogger = "supervisor";

LoggingConfig ParseLogging(ConfigMap& section, const std::vector<ModuleDescriptor>& manifest) {
  LoggingConfig out;
  out.format = section.Enum("format", {"text", "json"}, "text") == "json" ? LoggingConfig::Format::kJson
                                                                          : LoggingConfig::Format::kText;
  const std::string level = section.Enum("level", {"trace", "debug", "info", "warn", "error", "critical", "off"}, "info");
  ParseLogLevel(level, out.level);
  auto levels = section.Section("levels");
  for (const auto& name : levels.Keys()) {
    if (name != kSupervisorLogger && FindModule(manifest, name) == nullptr) {
      levels.FailKey(name, "no logger of that name (known: " + std::string(kSupervisorLogger) + ", " +
                               KnownModules(manifest) + ")");
    }
    const std::string value =
        levels.Enum(name, {"trace", "debug", "info", "warn", "error", "critical", "off"});
    ParseLogLevel(value, out.levels[name]);
  }
  levels.Finish();
  section.Finish();
  return out;
}

RuntimeSettings ParseRuntime(ConfigMap& section) {
  using std::chrono::milliseconds;
  RuntimeSettings out;
  out.supervisor.stop_timeout = section.Duration("stopTimeout", milliseconds(10), milliseconds(600000), milliseconds(5000));
  out.supervisor.stable_after = section.Duration("stableAfter", milliseconds(0), milliseconds(86400000), milliseconds(60000));
  auto backoff = section.Section("restartBackoff");
  out.supervisor.restart_backoff.initial =
      backoff.Duration("initial", milliseconds(1), milliseconds(3600000), milliseconds(1000));
  out.supervisor.restart_backoff.max =
      backoff.Duration("max", out.supervisor.restart_backoff.initial, milliseconds(86400000), milliseconds(60000));
  out.supervisor.restart_backoff.multiplier = backoff.Double("multiplier", 1.0, 10.0, 2.0);
  out.supervisor.restart_backoff.jitter = backoff.Double("jitter", 0.0, 1.0, 0.5);
  backoff.Finish();
  out.blocking_threads = static_cast<std::size_t>(section.Int("blockingThreads", 1, 64, 2));
  section.Finish();
  return out;
}

}  // namespace

LoadedConfig LoadSiteConfig(const std::vector<std::string>& files, const CommandLineOverrides& overrides,
                            const std::vector<ModuleDescriptor>& manifest) {
  if (files.empty()) throw ConfigError("no config file given (--config FILE)");
  ConfigValue root = LoadYamlFile(files.front());
  for (std::size_t i = 1; i < files.size(); ++i) MergeOverlay(root, LoadYamlFile(files[i]));
  if (root.kind != ConfigValue::Kind::kMap) {
    throw ConfigError(root.where, "", "the config file must be a YAML map with `version: v1` at the top");
  }

  LoadedConfig out;
  out.site.config_file = files.front();
  ConfigMap top(root, "");
  const std::string version = top.Enum("version", {"v1"});
  (void)version;
  out.site.node_name = top.String("nodeName");
  // The Node object's name: the API server refuses anything else, every request would fail.
  if (const auto problem = DnsSubdomainProblem(out.site.node_name); !problem.empty()) {
    top.Fail("nodeName", "not a Kubernetes node name: " + problem);
  }

  auto paths = top.Section("paths");
  out.site.paths.kubelet_dir = ReadAbsolutePath(paths, "kubeletDir");
  out.site.paths.cdi_dir = ReadAbsolutePath(paths, "cdiDir");
  out.site.paths.state_dir = ReadAbsolutePath(paths, "stateDir");
  out.site.paths.host_root = ReadAbsolutePath(paths, "hostRoot");
  paths.Finish();

  auto gates = top.Section("featureGates");
  for (const auto& name : gates.Keys()) {
    if (FeatureGates::Canonical(name).empty()) {
      std::string known;
      for (const auto& spec : FeatureGates::Known()) known += (known.empty() ? "" : ", ") + std::string(spec.name);
      gates.FailKey(name, "unknown feature gate (known: " + known + ")");
    }
    out.site.gates.Set(name, gates.Bool(name));
  }
  gates.Finish();
  for (const auto& [name, value] : overrides.feature_gates) {
    if (!out.site.gates.Set(name, value)) throw ConfigError("--feature-gates: unknown feature gate \"" + name + "\"");
  }
  out.gate_overrides = out.site.gates.Resolve();

  auto logging = top.Section("logging");
  out.logging = ParseLogging(logging, manifest);
  if (overrides.log_format) {
    out.logging.format = *overrides.log_format == "json" ? LoggingConfig::Format::kJson : LoggingConfig::Format::kText;
  }
  if (overrides.log_level && !ParseLogLevel(*overrides.log_level, out.logging.level)) {
    throw ConfigError("--log-level: unknown level \"" + *overrides.log_level + "\"");
  }

  auto runtime = top.Section("runtime");
  out.runtime = ParseRuntime(runtime);

  // Every section present is parsed, enabled or not: a typo in a disabled module's section
  // is still caught before the day someone enables it.
  std::map<std::string, std::pair<bool, ModuleFactory>> parsed;
  auto modules = top.Section("modules");
  for (const auto& name : modules.Keys()) {
    const ModuleDescriptor* descriptor = FindModule(manifest, name);
    if (descriptor == nullptr) modules.FailKey(name, "unknown module (known: " + KnownModules(manifest) + ")");
    auto section = modules.Section(name);
    const bool enabled = section.Bool("enabled");
    // What will run, flags included: a disabled module's files are not opened.
    const bool will_run =
        (enabled || std::find(overrides.enable.begin(), overrides.enable.end(), name) != overrides.enable.end()) &&
        std::find(overrides.disable.begin(), overrides.disable.end(), name) == overrides.disable.end();
    section.SetModuleEnabled(will_run);
    ModuleFactory factory = descriptor->parse(section, out.site);
    section.Finish();
    parsed[name] = {enabled, std::move(factory)};
  }
  modules.Finish();
  top.Finish();

  for (const auto& name : overrides.enable) {
    const ModuleDescriptor* descriptor = FindModule(manifest, name);
    if (descriptor == nullptr) throw ConfigError("--enable: unknown module \"" + name + "\" (known: " + KnownModules(manifest) + ")");
    auto it = parsed.find(name);
    if (it == parsed.end()) {
      // Enabled on the command line without a section: its defaults, validated the same way.
      static const ConfigValue kEmpty;
      ConfigMap section(kEmpty, "modules." + name);
      it = parsed.emplace(name, std::make_pair(true, descriptor->parse(section, out.site))).first;
    }
    it->second.first = true;
  }
  for (const auto& name : overrides.disable) {
    if (FindModule(manifest, name) == nullptr) {
      throw ConfigError("--disable: unknown module \"" + name + "\" (known: " + KnownModules(manifest) + ")");
    }
    if (auto it = parsed.find(name); it != parsed.end()) it->second.first = false;
  }

  for (const auto& descriptor : manifest) {
    auto it = parsed.find(std::string(descriptor.name));
    if (it != parsed.end() && it->second.first) {
      out.modules.push_back(ModuleSpec{std::string(descriptor.name), std::move(it->second.second),
                                       std::vector<std::string>(descriptor.uses.begin(), descriptor.uses.end()),
                                       std::vector<std::string>(descriptor.follows.begin(), descriptor.follows.end())});
    }
  }
  return out;
}

}  // namespace gns
