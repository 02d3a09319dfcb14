// The imex-health module: see imex_health_module.hpp and README.md.
#include "modules/imex_health/imex_health_module.hpp"

#include "loop/wake_grid.hpp"
#include "modules/imex_health/path_watcher.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/condition_writer.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"

#include <unistd.h>

#include <algorithm>
#include <ctime>

namespace gns::imex_health {
namespace {

std::string Directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string FormatUsec(uint64_t usec) {
  const std::time_t seconds = static_cast<std::time_t>(usec / 1000000u);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : "; ") + item;
  return out;
}

void Evict(std::deque<Clock::SteadyTime>& times, Clock::SteadyTime now, std::chrono::milliseconds window) {
  while (!times.empty() && times.front() + window <= now) times.pop_front();
}

}  // namespace

// The ImexUnitControl service: forwards to the running watcher; after Stop it answers errors.
class ImexHealthModule::Control final : public ImexUnitControl {
 public:
  explicit Control(SystemdUnitWatcher* watcher, std::string unit) : watcher_(watcher), unit_(std::move(unit)) {}
  void Restart(std::function<void(std::string)> done) override {
    if (!watcher_) {
      done("imex-health is stopped");
      return;
    }
    watcher_->CallManager("RestartUnit", std::move(done));
  }
  const std::string& Unit() const override { return unit_; }
  void Detach() { watcher_ = nullptr; }

 private:
  SystemdUnitWatcher* watcher_;
  std::string unit_;
};

ImexHealthModule::Config ImexHealthModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  config.unit = section.String("unit", config.unit);
  if (config.unit.find('.') == std::string::npos || config.unit.find('/') != std::string::npos ||
      UnitObjectPath(config.unit).empty()) {
    section.Fail("unit", "not a unit name (e.g. nvidia-imex.service): \"" + config.unit + "\"");
  }
  config.bus_address = section.String("busAddress", "");
  config.paths.config_files = section.StringList("configFiles", config.paths.config_files);
  if (config.paths.config_files.empty()) section.Fail("configFiles", "must name at least one file");
  config.paths.nodes_config = section.String("nodesConfig", config.paths.nodes_config);
  for (const auto& path : config.paths.config_files) {
    if (path.empty() || path.front() != '/') section.Fail("configFiles", "not an absolute path: \"" + path + "\"");
  }
  if (config.paths.nodes_config.empty() || config.paths.nodes_config.front() != '/') {
    section.Fail("nodesConfig", "not an absolute path");
  }
  config.paths.host_root = site.paths.host_root.empty() ? "/" : site.paths.host_root;
  config.self_identity = section.Enum("selfIdentity", {"internalIP", "hostname"}, config.self_identity);
  config.resolve_peers = section.Bool("resolvePeers", config.resolve_peers);
  ConfigMap loop = section.Section("restartLoop");
  config.restart_loop_count = static_cast<uint32_t>(loop.Int("count", 1, 1000, config.restart_loop_count));
  config.restart_loop_window =
      loop.Duration("window", std::chrono::seconds(10), std::chrono::hours(24), config.restart_loop_window);
  loop.Finish();
  ConfigMap logs = section.Section("logErrors");
  config.log_error_threshold = static_cast<uint32_t>(logs.Int("threshold", 0, 1000000, config.log_error_threshold));
  config.log_error_window =
      logs.Duration("window", std::chrono::seconds(10), std::chrono::hours(24), config.log_error_window);
  logs.Finish();
  config.condition_type = section.String("conditionType", config.condition_type);
  if (config.condition_type.empty()) section.Fail("conditionType", "must not be empty");
  ConfigMap domain = section.Section("domainCheck");
  auto& d = config.domain;
  d.enabled = domain.Bool("enabled", d.enabled);
  d.command = domain.String("command", d.command);
  if (d.command.empty() || d.command.front() != '/') domain.Fail("command", "not an absolute path: \"" + d.command + "\"");
  d.nodes = domain.Bool("nodes", d.nodes);
  d.interval = domain.Duration("interval", std::chrono::seconds(5), std::chrono::hours(24), d.interval);
  d.retry_interval = domain.Duration("retryInterval", std::chrono::seconds(1), std::chrono::hours(1), d.retry_interval);
  d.timeout = domain.Duration("timeout", std::chrono::milliseconds(100), std::chrono::minutes(5), d.timeout);
  domain.Finish();
  return config;
}

ImexHealthModule::ImexHealthModule(ModuleContext& context, const Config& config)
    : context_(context), config_(config), window_timer_(context.GetLoop().Io()), domain_timer_(context.GetLoop().Io()) {
  auto& m = context.Metrics();
  const MetricLabels unit{{"unit", config_.unit}};
  unit_active_ = &m.Gauge("gpu_node_supervisor_imex_unit_active", "1 while the IMEX unit's ActiveState is active", unit);
  unit_restarts_ = &m.Counter("gpu_node_supervisor_imex_unit_restarts_total",
                              "The IMEX unit's NRestarts as systemd counts them (automatic restarts)", unit);
  log_errors_total_ = &m.Counter("gpu_node_supervisor_imex_log_errors_total",
                                 "Journal lines of the IMEX unit at PRIORITY err or worse", unit);
  healthy_ = &m.Gauge("gpu_node_supervisor_imex_healthy", "1 while the ImexHealthy condition is True", unit);
  major_present_ = &m.Gauge("gpu_node_supervisor_imex_channel_major_present",
                            "1 while nvidia-caps-imex-channels is registered in /proc/devices");
  channel0_present_ = &m.Gauge("gpu_node_supervisor_imex_channel0_present",
                               "1 while /dev/nvidia-caps-imex-channels/channel0 exists on the host");
  nodes_config_peers_ = &m.Gauge("gpu_node_supervisor_imex_nodes_config_peers", "Peers listed in nodes_config.cfg");
  scans_total_ = &m.Counter("gpu_node_supervisor_imex_host_scans_total", "Reads of the host IMEX files");
  condition_ = std::make_unique<kube::NodeConditionWriter>(
      context.GetClock(), kube::NodeConditionWriter::Options{context.Site().node_name, std::string(kName)},
      [&context] { return context.GetServices().Find<kube::KubeClient>(); },
      [this](const std::string& error) { context_.Log().warn("Node condition {}: {}", config_.condition_type, error); });
}

ImexHealthModule::~ImexHealthModule() { lifetime_.Close(); }

void ImexHealthModule::Start() {
  auto& bus = context_.GetBus();
  SystemdUnitWatcher::Options options;
  options.bus_address = config_.bus_address;
  options.unit = config_.unit;
  unit_watcher_ = std::make_unique<SystemdUnitWatcher>(context_.GetLoop().Io(), options,
                                                       [this](const UnitState& state) { OnUnit(state); },
                                                       context_.Logger());
  std::vector<std::string> dirs;
  for (const auto& file : config_.paths.config_files) dirs.push_back(Directory(config_.paths.Under(file)));
  dirs.push_back(Directory(config_.paths.Under(config_.paths.nodes_config)));
  dirs.push_back(Directory(config_.paths.Under(config_.paths.channel0)));
  std::sort(dirs.begin(), dirs.end());
  dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
  path_watcher_ = std::make_unique<PathWatcher>(context_.GetLoop().Io(), dirs, [this] { Scan(); });
  path_watcher_->Start();
  wakeups_collector_ = context_.Metrics().AddCollector([this](MetricsWriter& w) {
    const char* help = "Loop wake-ups of imex-health by cause";
    if (unit_watcher_) {
      w.Sample("gpu_node_supervisor_imex_wakeups_total", MetricType::kCounter, help, {{"cause", "dbus"}},
               static_cast<double>(unit_watcher_->GetStats().wakeups));
      w.Sample("gpu_node_supervisor_imex_bus_reconnects_total", MetricType::kCounter,
               "Connections to the system bus made again after one broke", {},
               static_cast<double>(unit_watcher_->GetStats().disconnects));
    }
    if (path_watcher_) {
      w.Sample("gpu_node_supervisor_imex_wakeups_total", MetricType::kCounter, help, {{"cause", "inotify"}},
               static_cast<double>(path_watcher_->Wakeups()));
    }
    if (domain_) {  // only where nvidia-imex-ctl answered for the unit's current run
      w.Sample("gpu_node_supervisor_imex_domain_ready", MetricType::kGauge,
               "1 while nvidia-imex-ctl says READY (and Domain State UP); absent where it is not installed",
               {{"unit", config_.unit}}, domain_->ready ? 1 : 0);
    }
  });
  unit_line_sub_ = bus.Subscribe<journald::UnitLine>([this](const journald::UnitLine& line) { OnUnitLine(line); });
  module_states_sub_ = bus.Subscribe<ModuleStates>([this](const ModuleStates& states) { OnModuleStates(states); });
  WatchNode();
  unit_watcher_->Start();
  control_ = std::make_shared<Control>(unit_watcher_.get(), config_.unit);
  context_.GetServices().Provide<ImexUnitControl>(control_);
  Scan();
  context_.Log().info("following {} on {}; files under {}", config_.unit, SystemBusAddress(config_.bus_address),
                      config_.paths.host_root);
}

void ImexHealthModule::Stop(std::function<void()> done) {
  lifetime_.Close();
  if (control_) {
    context_.GetServices().Withdraw<ImexUnitControl>();
    control_->Detach();
    control_.reset();
  }
  unit_line_sub_.Reset();
  module_states_sub_.Reset();
  node_sub_.Reset();
  node_informer_.reset();
  window_timer_.cancel();
  domain_timer_.cancel();
  if (domain_check_) domain_check_->Cancel();
  domain_check_.reset();
  if (unit_watcher_) unit_watcher_->Stop();
  if (path_watcher_) path_watcher_->Stop();
  wakeups_collector_.Reset();
  done();
}

void ImexHealthModule::OnUnit(const UnitState& state) {
  const auto now = context_.GetClock().Now();
  if (state.known) {
    // NRestarts only grows while the unit stays loaded; a smaller value is a reload or a new
    // systemd, not restarts.
    if (last_n_restarts_ && state.n_restarts > *last_n_restarts_) {
      const uint32_t delta = std::min<uint32_t>(state.n_restarts - *last_n_restarts_, 1000);
      for (uint32_t i = 0; i < delta; ++i) restarts_.push_back(now);
    }
    last_n_restarts_ = state.n_restarts;
    unit_restarts_->Set(state.n_restarts);
    unit_active_->Set(state.active_state == "active" ? 1 : 0);
  }
  const bool started = state.known && state.active_state == "active" && state.active_enter_usec != last_active_enter_;
  const bool was_active = unit_.known && (unit_.active_state == "active" || unit_.active_state == "reloading");
  const bool active = state.known && (state.active_state == "active" || state.active_state == "reloading");
  unit_ = state;
  if (started || (was_active && !active)) {
    // The domain answer belonged to the run that ended: drop it (and one still in flight).
    ++domain_generation_;
    domain_.reset();
    domain_pending_ = false;
    domain_timer_.cancel();
  }
  if (started) {
    last_active_enter_ = state.active_enter_usec;
    Scan();  // /proc/devices has no inotify: read it whenever the unit (re)starts
    CheckDomain();
  }
  Evaluate();
}

void ImexHealthModule::OnUnitLine(const journald::UnitLine& line) {
  if (line.unit != config_.unit || line.priority < 0 || line.priority > 3) return;
  log_errors_total_->Inc();
  log_errors_.push_back(context_.GetClock().Now());
  Evaluate();
}

void ImexHealthModule::Scan() {
  if (scan_in_flight_) {
    scan_again_ = true;
    return;
  }
  scan_in_flight_ = true;
  scans_total_->Inc();
  context_.Pool().Run(
      [paths = config_.paths, self = SelfIdentities(), resolve = config_.resolve_peers] {
        return ScanHost(paths, self, resolve);
      },
      lifetime_.Guard([this](HostScan scan, std::exception_ptr error) {
        scan_in_flight_ = false;
        bool imex_files_changed = false;
        if (error) {
          context_.Log().error("host scan failed unexpectedly");
        } else {
          imex_files_changed = !scan_ || scan_->config_path != scan.config_path ||
                               scan_->config.keys != scan.config.keys || scan_->nodes.peers != scan.nodes.peers ||
                               scan_->nodes_config_mtime_usec != scan.nodes_config_mtime_usec;
          scan_ = std::move(scan);
        }
        if (scan_again_) {
          scan_again_ = false;
          Scan();
        }
        if (imex_files_changed) CheckDomain();  // what nvidia-imex-ctl reads changed
        Evaluate();
      }));
}

void ImexHealthModule::CheckDomain() {
  if (!config_.domain.enabled || !scan_) return;
  const bool active = unit_.known && (unit_.active_state == "active" || unit_.active_state == "reloading");
  if (!active) return;
  if (domain_in_flight_) {
    domain_again_ = true;
    return;
  }
  if (domain_check_ && domain_check_->Alive()) {
    // The last one was killed at its deadline and is still not reaped (stuck in the kernel):
    // starting more would pile them up. Say so; look again later.
    if (!domain_ || domain_->ready) {
      domain_ = DomainResult{false, "DomainCheckTimeout",
                             "an earlier nvidia-imex-ctl, killed at its deadline, has not exited yet (stuck in the "
                             "kernel?): no new check until it does",
                             "", {}};
      domain_pending_ = false;
      Evaluate();
    }
    ArmDomainTimer(config_.domain.retry_interval);
    return;
  }
  domain_check_.reset();
  const std::string command = config_.paths.Under(config_.domain.command);
  if (::access(command.c_str(), X_OK) != 0) {
    // Optional tool (guide §3.6): no verdict without it; look again in case it gets installed.
    if (domain_ || domain_pending_) {
      domain_.reset();
      domain_pending_ = false;
      Evaluate();
    }
    ArmDomainTimer(config_.domain.interval);
    return;
  }
  DomainCheckOptions options;
  options.command = command;
  options.config_file = scan_->config_path;
  options.nodes = config_.domain.nodes;
  options.timeout = config_.domain.timeout;
  domain_in_flight_ = true;
  if (!domain_) domain_pending_ = true;
  domain_timer_.cancel();
  domain_check_ = DomainCheck::Start(context_.GetLoop().Io(), std::move(options),
                                     lifetime_.Guard([this, generation = domain_generation_](DomainResult result) {
                                       OnDomain(std::move(result), generation);
                                     }));
}

void ImexHealthModule::OnDomain(DomainResult result, uint64_t generation) {
  domain_in_flight_ = false;
  const bool current = generation == domain_generation_;
  if (current) {
    const char* outcome = result.ready                              ? "ready"
                          : result.reason == "DomainCheckTimeout" ? "timeout"
                          : result.reason == "DomainCheckFailed"  ? "failed"
                                                                  : "not_ready";
    context_.Metrics()
        .Counter("gpu_node_supervisor_imex_domain_checks_total", "nvidia-imex-ctl checks by outcome",
                 {{"result", outcome}})
        .Inc();
    const bool ready = result.ready;
    domain_ = std::move(result);
    domain_pending_ = false;
    Evaluate();
    ArmDomainTimer(ready ? config_.domain.interval : config_.domain.retry_interval);
  }
  if (domain_again_ || !current) {
    domain_again_ = false;
    CheckDomain();
  }
}

void ImexHealthModule::ArmDomainTimer(std::chrono::milliseconds after) {
  // On the loop's wake grid (src/loop/wake_grid.hpp): at rest the check shares a wake-up.
  const auto now = context_.GetClock().Now();
  domain_timer_.expires_after(SnapToWakeGrid(now + after, after) - now);
  domain_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (!ec) CheckDomain();
  }));
}

std::vector<std::string> ImexHealthModule::SelfIdentities() const {
  if (!node_addresses_.empty()) return node_addresses_;
  if (config_.self_identity == "hostname") {
    return context_.Site().node_name.empty() ? std::vector<std::string>{} : std::vector{context_.Site().node_name};
  }
  return LocalAddresses();
}

ImexHealth ImexHealthModule::Judge(const Config& config, const Inputs& in) {
  ImexHealth h;
  const UnitState& u = *in.unit;
  const HostScan& s = *in.scan;
  h.unit = config.unit;
  h.load_state = u.load_state;
  h.active_state = u.active_state;
  h.sub_state = u.sub_state;
  h.n_restarts = u.n_restarts;
  h.exec_main_status = u.exec_main_status;
  h.active_enter_usec = u.active_enter_usec;
  h.bus_connected = u.bus_connected;
  h.restarts_in_window = in.restarts_in_window;
  h.log_errors_in_window = in.log_errors_in_window;
  if (in.domain) {
    h.domain_checked = true;
    h.domain_ready = in.domain->ready;
    h.domain_state = in.domain->state;
  }
  h.channel_major = s.major.major.value_or(0);
  h.channel0_present = s.channel0_present;
  h.peers = s.nodes.peers;
  h.nodes_config_path = s.nodes_config_path;
  if (s.major.major && !s.channel0_present) {
    h.warnings.push_back("Channel0Missing: " + s.channel0_error + " (CDI still makes it inside containers)");
  }
  if (u.known && !u.unit_file_state.empty() && u.unit_file_state != "enabled" && u.unit_file_state != "static") {
    h.warnings.push_back("UnitNotEnabled: " + config.unit + " is " + u.unit_file_state + " (it will not start at boot)");
  }
  auto verdict = [&](const char* status, const char* reason, std::string message) {
    h.status = status;
    h.reason = reason;
    h.message = std::move(message);
    h.ready = h.status == "True";
  };
  const auto window_minutes = [](std::chrono::milliseconds w) {
    return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(w).count()) + "s";
  };
  if (!u.known) {
    verdict("Unknown", !u.bus_connected ? "BusUnavailable" : !u.systemd_present ? "SystemdUnavailable" : "UnitUnknown",
            u.error.empty() ? "the state of " + config.unit + " is not known yet" : u.error);
  } else if (u.load_state != "loaded") {
    verdict("False", "UnitNotFound", config.unit + " is not loaded (LoadState " + u.load_state + ")");
  } else if (u.active_state == "failed") {
    verdict("False", "ServiceFailed",
            config.unit + " failed (Result " + u.result + ", ExecMainStatus " + std::to_string(u.exec_main_status) + ")");
  } else if (u.active_state != "active" && u.active_state != "reloading") {
    verdict("False", "ServiceInactive", config.unit + " is " + u.active_state + " (" + u.sub_state + ")");
  } else if (in.restarts_in_window > config.restart_loop_count) {
    verdict("False", "RestartLoop",
            config.unit + " restarted " + std::to_string(in.restarts_in_window) + " times in " +
                window_minutes(config.restart_loop_window) + " (ExecMainStatus " + std::to_string(u.exec_main_status) + ")");
  } else if (!s.major.major) {
    verdict("False", "ChannelMajorMissing", s.major.error);
  } else if (!s.config_error.empty() || !s.config.errors.empty()) {
    verdict("False", "ConfigInvalid", s.config_error.empty() ? Join(s.config.errors) : s.config_error);
  } else if (!s.nodes_config_error.empty() || !s.nodes.errors.empty() || !s.unresolved.empty()) {
    std::vector<std::string> why = s.nodes.errors;
    if (!s.nodes_config_error.empty()) why.insert(why.begin(), s.nodes_config_error);
    for (const auto& peer : s.unresolved) why.push_back("does not resolve: " + peer);
    verdict("False", "NodesConfigInvalid", Join(why));
  } else if (s.nodes_config_mtime_known && u.active_enter_usec != 0 && s.nodes_config_mtime_usec > u.active_enter_usec) {
    verdict("False", "NodesConfigStale",
            s.nodes_config_path + " changed at " + FormatUsec(s.nodes_config_mtime_usec) + ", after " + config.unit +
                " became active at " + FormatUsec(u.active_enter_usec) +
                ": IMEX runs on the old map until it restarts");
  } else if (!in.domain && in.domain_pending) {
    verdict("False", "DomainCheckPending",
            "waiting for nvidia-imex-ctl's first answer since " + config.unit + " became active");
  } else if (in.domain && !in.domain->ready) {
    verdict("False", in.domain->reason.c_str(), in.domain->message);
  } else if (config.log_error_threshold > 0 && in.log_errors_in_window >= config.log_error_threshold) {
    verdict("False", "LogErrors",
            std::to_string(in.log_errors_in_window) + " error lines from " + config.unit + " in " +
                window_minutes(config.log_error_window));
  } else {
    verdict("True", "ImexHealthy",
            config.unit + " active, channel major " + std::to_string(*s.major.major) + ", " +
                std::to_string(s.nodes.peers.size()) + " peers in the node map" +
                (in.domain ? ", nvidia-imex-ctl " + in.domain->state : std::string()));
  }
  return h;
}

void ImexHealthModule::Evaluate() {
  if (!scan_) return;  // the first verdict waits for the first read of the files
  const auto now = context_.GetClock().Now();
  Evict(restarts_, now, config_.restart_loop_window);
  Evict(log_errors_, now, config_.log_error_window);
  Inputs in;
  in.unit = &unit_;
  in.scan = &*scan_;
  in.restarts_in_window = static_cast<uint32_t>(restarts_.size());
  in.log_errors_in_window = log_errors_.size();
  in.domain = domain_ ? &*domain_ : nullptr;
  in.domain_pending = domain_pending_;
  ImexHealth h = Judge(config_, in);
  major_present_->Set(h.channel_major != 0 ? 1 : 0);
  channel0_present_->Set(h.channel0_present ? 1 : 0);
  nodes_config_peers_->Set(static_cast<double>(h.peers.size()));
  healthy_->Set(h.ready ? 1 : 0);
  ArmWindowTimer();
  const nlohmann::json now_json = h;
  if (published_ && nlohmann::json(*published_) == now_json) return;
  const bool transition = !published_ || published_->status != h.status || published_->reason != h.reason;
  if (transition) {
    context_.Log().info("{}={} ({}): {}", config_.condition_type, h.status, h.reason, h.message);
    if (published_) {
      if (h.ready) Record("Normal", "ImexHealthy", h.message);
      else if (h.reason != "DomainCheckPending") Record("Warning", h.reason, h.message);  // every start passes it
    }
  }
  for (const auto& warning : h.warnings) {
    if (std::find(published_warnings_.begin(), published_warnings_.end(), warning) != published_warnings_.end()) continue;
    context_.Log().warn("{}", warning);
    Record("Warning", warning.substr(0, warning.find(':')), warning);
  }
  published_warnings_ = h.warnings;
  context_.SetHealth(h.status == "Unknown" ? ModuleHealth::kDegraded : ModuleHealth::kOk,
                     h.status == "Unknown" ? h.message : std::string());
  const bool condition_changed =
      !published_ || published_->status != h.status || published_->reason != h.reason || published_->message != h.message;
  published_ = h;
  context_.GetBus().Publish(std::move(h));
  if (condition_changed) UpdateCondition();
}

void ImexHealthModule::ArmWindowTimer() {
  // Wake when the oldest restart or error leaves its window, so RestartLoop and LogErrors
  // clear without anything else happening (no timer while both windows are empty).
  std::optional<Clock::SteadyTime> next;
  if (!restarts_.empty()) next = restarts_.front() + config_.restart_loop_window;
  if (!log_errors_.empty()) {
    const auto t = log_errors_.front() + config_.log_error_window;
    next = next ? std::min(*next, t) : t;
  }
  if (!next) {
    window_timer_.cancel();
    return;
  }
  window_timer_.expires_after(*next - context_.GetClock().Now());
  window_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (!ec) Evaluate();
  }));
}

void ImexHealthModule::Record(std::string_view type, std::string_view reason, std::string_view note) {
  if (context_.Site().node_name.empty()) return;
  auto recorder = context_.GetServices().Find<kube::EventRecorder>();
  if (!recorder) return;
  kube::ObjectReference node;
  node.name = context_.Site().node_name;
  recorder->Record(node, type, reason, "ImexCheck", note);
}

void ImexHealthModule::UpdateCondition() {
  if (!published_) return;
  condition_->Set(kube::NodeCondition{config_.condition_type, published_->status, published_->reason, published_->message});
}

void ImexHealthModule::WatchNode() {
  if (node_informer_ || context_.Site().node_name.empty()) return;
  auto registry = context_.GetServices().Find<kube::InformerRegistry>();
  if (!registry) return;
  kube::InformerSpec spec;
  spec.path = kube::ResourcePath::Core("nodes").Collection();
  spec.field_selector = "metadata.name=" + context_.Site().node_name;
  informer_key_ = spec.Key();
  node_sub_ = context_.GetBus().Subscribe<kube::ResourceEvent>(
      [this](const kube::ResourceEvent& event) { OnNodeEvent(event); });
  node_informer_ = registry->Acquire(spec);
}

void ImexHealthModule::OnNodeEvent(const kube::ResourceEvent& event) {
  if (event.informer_key != informer_key_ || event.type == kube::ResourceEvent::Type::kDeleted || !event.object) return;
  const std::string wanted = config_.self_identity == "hostname" ? "Hostname" : "InternalIP";
  std::vector<std::string> addresses;
  const auto list = event.object->value("/status/addresses"_json_pointer, nlohmann::json::array());
  if (list.is_array()) {
    for (const auto& a : list) {
      if (a.is_object() && a.value("type", "") == wanted && a.contains("address") && a["address"].is_string()) {
        addresses.push_back(a["address"].get<std::string>());
      }
    }
  }
  if (addresses == node_addresses_) return;
  node_addresses_ = std::move(addresses);
  Scan();  // the self check depends on them
}

void ImexHealthModule::OnModuleStates(const ModuleStates& states) {
  const auto kube = std::find_if(states.modules.begin(), states.modules.end(),
                                 [](const ModuleStatus& m) { return m.name == kube::kModuleName; });
  if (kube == states.modules.end()) return;
  const bool running = kube->state == ModuleState::kRunning;
  const bool first = !kube_running_.has_value();
  if (!first && *kube_running_ == running) return;
  kube_running_ = running;
  if (first && !running) return;
  // Built on an instance that went away (or on none): drop, and if it runs, rebuild.
  node_sub_.Reset();
  node_informer_.reset();
  if (running) WatchNode();
  condition_->Reset();  // an answer from a stopped client may never come; the next one gets the latest
}

}  // namespace gns::imex_health
