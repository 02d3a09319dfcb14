#pragma once
// The `gpu-health` module: turns kernel lines (journald) and NVML XIDs (gpu-inventory) into
// per-device health. Each NVRM line is parsed (kernel_line_parser), its PCI address mapped to
// a GPU (the inventory, or "GPU at PCI:… GPU-<uuid>" lines, compared numerically), classified
// with the XID catalog and the site overrides, and rate-limited per (GPU, XID) (XidPolicy).
// A fatal XID makes the device Unhealthy (retained DeviceHealth, which the device plugin
// advertises); a reset acknowledgement for that GPU, a new boot or an operator's set-healthy
// (admin socket, or the Node annotation) makes it Healthy again.
//
// Every decision that is emitted becomes a HealthEvent (seed 003's fields) on the bus, an
// aggregated Kubernetes Event on the Node, a change of the Node condition of the check (one
// condition, not one per XID), an entry in /debug/state and metrics.
//
// The verdicts survive a restart within the same boot: every change is written (atomically,
// on the blocking pool, one write at a time so an older one never lands after a newer one) to
// <stateDir>/gpu-health/devices.json with the boot ID they belong to. At Start the file is
// loaded: the same boot (the host's /proc/sys/kernel/random/boot_id under hostRoot, or else
// the first boot journald reports) restores and republishes the Unhealthy verdicts; another
// boot restores nothing; a corrupt file is moved aside (devices.json.corrupt-<unix-ts>).

#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/gpu_health/gpu_directory.hpp"
#include "modules/gpu_health/kernel_line_parser.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_health/xid_catalog.hpp"
#include "modules/gpu_health/xid_policy.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/journald/messages.hpp"
#include "modules/journald/rate_limited_log.hpp"
#include "modules/kube/messages.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::kube {
class Informer;
class NodeConditions;
}  // namespace gns::kube

namespace gns::gpu_health {

class AdminSocket;

class GpuHealthModule final : public Module {
 public:
  static constexpr std::string_view kName = "gpu-health";
  static constexpr std::string_view kSummary = "XID classification, per-device health, recovery, Node condition and Events";
  static constexpr std::string_view kDefaultCatalog = "/etc/gpu-node-supervisor/xid-catalog.yaml";
  static constexpr std::string_view kSetHealthyAnnotation = "gpu-node-supervisor.nvidia.com/set-healthy";

  struct Config {
    std::string catalog_path{kDefaultCatalog};
    XidCatalog catalog;  // loaded from catalog_path by ParseConfig
    SiteOverrides overrides;
    std::string check_name = "SysLogsXIDError";
    std::string condition_type = "GpuXidHealthy";
    std::string agent = "gpu-node-supervisor";
    bool admin_socket = true;          // <stateDir>/admin.sock
    bool watch_annotation = true;      // the set-healthy Node annotation, when kube is there
    std::size_t recent_events = 32;    // kept for /debug/state
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GpuHealthModule(ModuleContext& context, const Config& config);
  ~GpuHealthModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  static constexpr int kStateFileVersion = 1;
  // The state file's content; parsing rejects anything but the current version.
  struct SavedVerdicts {
    std::string boot_id;  // 32 lowercase hex digits, or empty when the boot was unknown
    std::vector<DeviceHealth> devices;
  };
  static std::string SerializeVerdicts(const SavedVerdicts& saved);
  static std::optional<SavedVerdicts> ParseVerdicts(std::string_view text, std::string& error);
  // "6f1c…-…" or "6f1c…" (any case, surrounding white space) → 32 lowercase hex digits; empty if
  // it is not a boot ID.
  static std::string NormalizeBootId(std::string_view text);
  const std::string& StatePath() const { return state_path_; }

  // set-healthy <uuid>|all: what the admin socket and the annotation call. Returns the answer.
  std::string SetHealthy(std::string_view target, std::string_view who);
  // The admin request line handler.
  std::string HandleAdminLine(std::string_view line);
  const std::string& AdminSocketPath() const { return admin_path_; }

 private:
  struct Device {
    DeviceHealth health;
    bool published = false;
  };

  void OnInventory(const gpu_inventory::GpuInventory& inventory);
  void OnKernelLine(const journald::JournalLine& line, bool acknowledgement);
  void OnNvmlXid(const gpu_inventory::XidObservation& xid);
  void OnBoot(const std::string& boot_id);
  // `detail`: raw text (the kernel line's XidLine::raw_detail), sanitised if it is reported.
  void HandleXid(const XidSubject& who, uint32_t xid, Timestamp at, std::string_view source,
                 std::string_view detail);
  void HandleResetAck(const std::string& uuid, std::optional<bool> success);
  void Learn(const PciAddress& pci, const std::string& uuid);
  bool MarkUnhealthy(const std::string& uuid, const std::string& pci, const std::string& reason, uint32_t xid,
                     RecommendedAction action);
  bool MarkHealthy(const std::string& uuid, const std::string& reason);
  void Emit(HealthEvent event, bool kube_event, std::string_view k8s_type, std::string_view k8s_reason);
  HealthEvent NewEvent(std::string_view source) const;
  void Bad(std::string_view kind, std::string_view what);
  MetricsRegistry::Series& XidCounter(std::string_view gpu, uint32_t xid);
  void UpdateGauges();
  void PublishState();
  void UpdateCondition();
  void WatchAnnotation();
  void OnNodeEvent(const kube::ResourceEvent& event);
  // The kube module's client and informers are looked up, not held across its restarts: when
  // it starts again, what was built on the old instance is dropped and made anew.
  void OnModuleStates(const ModuleStates& states);
  // Persistence of the verdicts (devices.json).
  void LoadVerdicts();
  void ResolveBoot(const std::string& boot_id);
  void Restore(const SavedVerdicts& saved);
  void Persist();
  void Flush();
  void FinishStop();

  ModuleContext& context_;
  Config config_;
  XidPolicy policy_;
  journald::RateLimitedLog warn_;
  std::vector<gpu_inventory::GpuInfo> gpus_;
  GpuDirectory directory_;  // PCI → UUID: gpus_, then what the kernel log taught
  struct Pending {
    PciAddress address;
    std::string pci;
    std::string reason;
    uint32_t xid = 0;
    RecommendedAction action = RecommendedAction::kNone;
  };
  std::map<uint64_t, Pending> pending_;  // fatal XIDs on a PCI address not yet mapped to a GPU
  std::map<std::string, Device, std::less<>> devices_;
  std::deque<HealthEvent> recent_;
  // (GPU, XID) → its xid_errors_total series; looked up without building a key string.
  struct XidSeriesLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      const std::string_view ga(a.first);
      const std::string_view gb(b.first);
      if (ga != gb) return ga < gb;
      return a.second < b.second;
    }
  };
  std::map<std::pair<std::string, uint32_t>, MetricsRegistry::Series*, XidSeriesLess> xid_series_;
  std::string boot_id_;
  // The boot the persisted verdicts belong to: the host's, else the first one journald reports.
  std::string persist_boot_;
  bool boot_from_host_ = false;
  std::optional<SavedVerdicts> awaiting_boot_;  // loaded while the boot was unknown
  std::string state_path_;
  bool dirty_ = false;
  bool writing_ = false;
  bool stopping_ = false;
  std::function<void()> stop_done_;
  std::shared_ptr<bool> writer_alive_ = std::make_shared<bool>(true);
  MetricsRegistry::Series* state_writes_failed_;
  MetricsRegistry::Series* state_corrupt_;
  MetricsRegistry::Series* restored_total_;
  std::string admin_path_;
  std::unique_ptr<AdminSocket> admin_;
  std::shared_ptr<kube::NodeConditions> conditions_;
  std::shared_ptr<kube::Informer> node_informer_;
  std::string informer_key_;
  std::string last_annotation_;
  bool condition_in_flight_ = false;
  bool condition_dirty_ = false;
  std::optional<bool> kube_running_;  // as last seen in the supervisor's module states
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  MetricsRegistry::Series* healthy_gauge_;
  MetricsRegistry::Series* unhealthy_gauge_;
  MetricsRegistry::Series* events_total_;
  MetricsRegistry::Series* suppressed_total_;
  MetricsRegistry::Series* recoveries_total_;
  MetricsRegistry::Series* duplicates_total_;
  Subscription inventory_sub_;
  Subscription kernel_sub_;
  Subscription unit_sub_;
  Subscription journal_state_sub_;
  Subscription nvml_sub_;
  Subscription node_sub_;
  Subscription module_states_sub_;
};

}  // namespace gns::gpu_health
