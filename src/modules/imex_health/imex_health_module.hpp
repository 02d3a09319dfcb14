#pragma once
// The `imex-health` module (host-managed IMEX, seed 000 operator guide §3, §9, §13): follows
// the IMEX unit over sd-bus (unit_watcher), the host files with inotify (path_watcher) and the
// unit's journal lines (journald's UnitLine), and judges host IMEX once: the retained
// ImexHealth on the bus, the Node condition ImexHealthy with a precise reason, Events on its
// transitions and on warnings, and metrics the guide's alerts use (deploy/alerts-imex.yaml).

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/imex_health/messages.hpp"
#include "modules/imex_health/api/unit_control.hpp"
#include "modules/journald/messages.hpp"
#include "modules/kube/messages.hpp"
#include "preflight/domain_check.hpp"
#include "preflight/host_checks.hpp"
#include "preflight/unit_watcher.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gns::kube {
class Informer;
class NodeConditionWriter;
}  // namespace gns::kube

namespace gns::imex_health {

class PathWatcher;

class ImexHealthModule final : public Module {
 public:
  static constexpr std::string_view kName = "imex-health";
  static constexpr std::string_view kSummary =
      "host IMEX: unit state over sd-bus, channel major and channel0, config and node map, unit log errors";

  struct Config {
    std::string unit = "nvidia-imex.service";
    std::string bus_address;  // "" → $DBUS_SYSTEM_BUS_ADDRESS, else the system bus socket
    HostPaths paths;          // host_root comes from the site
    std::string self_identity = "internalIP";  // or "hostname": what the node map lists for this node
    bool resolve_peers = true;
    uint32_t restart_loop_count = 3;  // more restarts than this within the window: RestartLoop
    std::chrono::milliseconds restart_loop_window{std::chrono::minutes(15)};
    uint32_t log_error_threshold = 10;  // unit lines at PRIORITY ≤ 3 within the window; 0: off
    std::chrono::milliseconds log_error_window{std::chrono::minutes(5)};
    std::string condition_type = "ImexHealthy";
    // nvidia-imex-ctl -q / -N while the unit is active: at start, when the unit (re)starts or
    // the files change, every `interval` (every `retry_interval` while not ready); skipped
    // while the binary is absent.
    struct DomainCheckSettings {
      bool enabled = true;
      std::string command = "/usr/bin/nvidia-imex-ctl";  // on the host (under hostRoot)
      bool nodes = true;                                  // also -N: Domain State UP
      std::chrono::milliseconds interval{std::chrono::seconds(60)};
      std::chrono::milliseconds retry_interval{std::chrono::seconds(10)};
      std::chrono::milliseconds timeout{std::chrono::seconds(5)};
    } domain;
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  ImexHealthModule(ModuleContext& context, const Config& config);
  ~ImexHealthModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  // The verdict of a unit state and a host scan at `now` (also used by preflight's wording).
  struct Inputs {
    const UnitState* unit = nullptr;
    const HostScan* scan = nullptr;
    uint32_t restarts_in_window = 0;
    uint64_t log_errors_in_window = 0;
    const DomainResult* domain = nullptr;  // null: not checked (off, binary absent, unit not active)
    bool domain_pending = false;  // the first check of the unit's current run has not answered yet
  };
  static ImexHealth Judge(const Config& config, const Inputs& in);

 private:
  void OnUnit(const UnitState& state);
  void OnUnitLine(const journald::UnitLine& line);
  void Scan();
  void Evaluate();
  void ArmWindowTimer();
  std::vector<std::string> SelfIdentities() const;
  void UpdateCondition();
  void Record(std::string_view type, std::string_view reason, std::string_view note);
  void WatchNode();
  void OnNodeEvent(const kube::ResourceEvent& event);
  void OnModuleStates(const ModuleStates& states);
  void CheckDomain();
  void OnDomain(DomainResult result, uint64_t generation);
  void ArmDomainTimer(std::chrono::milliseconds after);

  ModuleContext& context_;
  Config config_;
  std::unique_ptr<SystemdUnitWatcher> unit_watcher_;
  class Control;
  std::shared_ptr<Control> control_;  // offered as ImexUnitControl while running
  std::unique_ptr<PathWatcher> path_watcher_;
  boost::asio::steady_timer window_timer_;
  UnitState unit_;
  std::optional<uint32_t> last_n_restarts_;
  uint64_t last_active_enter_ = 0;
  std::deque<Clock::SteadyTime> restarts_;
  std::deque<Clock::SteadyTime> log_errors_;
  std::optional<HostScan> scan_;
  std::shared_ptr<DomainCheck> domain_check_;  // in flight (or its child not reaped yet)
  std::optional<DomainResult> domain_;  // for the current run of the unit
  uint64_t domain_generation_ = 0;      // bumped when the unit (re)starts or stops: older answers are dropped
  bool domain_in_flight_ = false;
  bool domain_pending_ = false;  // no answer yet for the current run (a verdict waits for it)
  bool domain_again_ = false;
  boost::asio::steady_timer domain_timer_;
  bool scan_in_flight_ = false;
  bool scan_again_ = false;
  std::optional<ImexHealth> published_;
  std::vector<std::string> published_warnings_;
  std::vector<std::string> node_addresses_;  // the Node's InternalIPs (or Hostname)
  std::unique_ptr<kube::NodeConditionWriter> condition_;
  std::shared_ptr<kube::Informer> node_informer_;
  std::string informer_key_;
  std::optional<bool> kube_running_;
  Gate lifetime_;
  MetricsRegistry::Series* unit_active_;
  MetricsRegistry::Series* unit_restarts_;
  MetricsRegistry::Series* log_errors_total_;
  MetricsRegistry::Series* healthy_;
  MetricsRegistry::Series* major_present_;
  MetricsRegistry::Series* channel0_present_;
  MetricsRegistry::Series* nodes_config_peers_;
  MetricsRegistry::Series* scans_total_;
  MetricsRegistry::CollectorHandle wakeups_collector_;
  Subscription unit_line_sub_;
  Subscription node_sub_;
  Subscription module_states_sub_;
};

}  // namespace gns::imex_health
