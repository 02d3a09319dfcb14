// The one judge of GPU health for XIDs, whatever reported them: kernel lines (parsed by
// kernel_line_parser) and NVML XID events both come here, are folded when they are the same
// occurrence, classified with the catalog and the site overrides (XidPolicy), and turn into
// verdicts (VerdictBook) and HealthEvents. Reset acknowledgements, a new boot and the
// operator's set-healthy turn GPUs Healthy again. The device plugin and everything else follow
// the verdicts published from here; nothing else judges an XID.
//
// No I/O: what it decides goes out through Outputs (the module publishes, persists and
// reports). Loop thread only.
#pragma once

#include "modules/gpu_health/xid_boot_history.hpp"
#include "modules/gpu_health/xid_counts.hpp"
#include "modules/gpu_health/gpu_directory.hpp"
#include "modules/gpu_health/kernel_line_parser.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_health/nvswitch_map.hpp"
#include "modules/gpu_health/sxid_catalog.hpp"
#include "modules/gpu_health/verdict_book.hpp"
#include "modules/gpu_health/xid_catalog.hpp"
#include "modules/gpu_health/xid_policy.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <spdlog/logger.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

class XidJudge {
 public:
  // A Kubernetes Event to record for a HealthEvent (on the Node), when `record`.
  struct KubeEvent {
    bool record = false;
    std::string_view type;    // "Normal" | "Warning"
    std::string_view reason;  // "GpuXidFatal", "GpuReset", …
  };
  struct Outputs {
    std::function<void(const DeviceHealth&)> verdict;                 // a verdict changed
    std::function<void(HealthEvent, KubeEvent)> event;                // an event to emit
    std::function<void(std::string_view gpu, uint32_t xid, uint64_t total)> counted;  // an occurrence
    std::function<void(std::string_view kind, std::string_view what)> bad;            // unusable input
    std::function<void()> duplicate;   // a report folded into one already counted
    std::function<void()> suppressed;  // an occurrence swallowed by the rate limit
    std::function<void()> recovered;   // a device made Healthy again
    // An NVSwitch SXid report (may be empty): the metric of SXids by number, severity as judged
    // (the line's, or the SXid catalog's) and whether a GPU of ours is behind its port.
    std::function<void(uint32_t sxid, bool fatal, bool mapped)> sxid;
    // An occurrence older than its XID's lookback when read: counted, not acted on (may be empty).
    std::function<void(uint32_t xid)> beyond_lookback;
  };
  struct Settings {
    std::string agent = "gpu-node-supervisor";
    std::string check_name = "SysLogsXIDError";
    std::string node_name;
  };

  XidJudge(const XidCatalog& catalog, const SiteOverrides& overrides, Settings settings, spdlog::logger& log,
           Outputs outputs);

  // The SXid catalog (the built-in one until set); kept by reference: it must outlive the judge.
  void SetSxidCatalog(const SxidCatalog& catalog) { sxid_catalog_ = &catalog; }

  // Inputs. `now_unix_ms` stamps verdicts and events (the injected clock's wall time).
  void OnInventory(const std::vector<gpu_inventory::GpuInfo>& gpus, int64_t now_unix_ms);
  // One line of the health stream; `acknowledgement`: from the reset job's identifier, which
  // is trusted for reset acknowledgements only. `at_usec`: its __REALTIME_TIMESTAMP.
  void OnKernelLine(std::string_view message, uint64_t at_usec, bool acknowledgement, int64_t now_unix_ms);
  void OnNvmlXid(const gpu_inventory::XidObservation& xid, int64_t now_unix_ms);
  // A reboot resets every GPU: every verdict turns Healthy and the counts start again (the
  // boot history stays: it is what escalation across boots remembers).
  void OnNewBoot(const std::string& boot_id, int64_t now_unix_ms);
  // The boot the next reports belong to (the health stream's line boot, the first one
  // included), for the boot history. Without one, nothing escalates across boots.
  void SetBoot(std::string boot_id) { boot_id_ = std::move(boot_id); }
  // set-healthy <uuid>|all: returns the answer ("ok: …" or "error: …").
  std::string SetHealthy(std::string_view target, std::string_view who, int64_t now_unix_ms);

  // Called when a validated reset ("GPU reset occurred") heals a GPU, whatever its XID verdict
  // was, just before that verdict turns Healthy: the polled checks' latched conditions of the
  // GPU go with it (the module's check book).
  void OnResetHealed(std::function<void(const std::string& uuid)> healed) { reset_healed_ = std::move(healed); }

  // Restores an Unhealthy verdict of the same boot (the state file); true when it took.
  // `held_by`: what held it (VerdictBook::HeldBy as saved), when the file says.
  bool Restore(const DeviceHealth& saved, const std::vector<uint32_t>* held_by = nullptr);
  void RestoreCounts(const std::vector<XidCount>& counts) { counts_.Restore(counts); }
  // The boot history of any boot's checkpoint (it outlives boots).
  void RestoreBootHistory(std::vector<XidBootHistory::Entry> entries) { boots_.Restore(std::move(entries)); }
  const XidBootHistory& BootHistory() const { return boots_; }
  // The catalog the policy decides with (the site's `defaults` and `xids` laid over).
  const XidCatalog& Catalog() const { return policy_.catalog(); }

  const VerdictBook& Verdicts() const { return verdicts_; }
  const GpuDirectory& Directory() const { return directory_; }
  const NvSwitchPortMap& SwitchPorts() const { return switch_ports_; }
  const XidCounts& Counts() const { return counts_; }
  std::size_t KnownGpus() const { return gpus_; }

 private:
  // `gpu_instance`: the GPU instance the report names (kWholeGpu when none): a fatal verdict is
  // then about that GPU instance alone.
  void HandleXid(const XidSubject& who, uint32_t xid, Timestamp at, XidSource source, std::string_view detail,
                 int64_t now_unix_ms, uint32_t gpu_instance = kWholeGpu);
  void HandleRecoveryAction(const XidSubject& who, const XidLine& line, Timestamp at, int64_t now_unix_ms);
  void HandleResetAck(const ResetAckLine& ack, int64_t now_unix_ms);
  void HandleSxid(const SxidLine& line, int64_t now_unix_ms);
  void Learn(const PciAddress& pci, const std::string& uuid, int64_t now_unix_ms);
  void MarkUnhealthy(const std::string& uuid, const std::string& pci, const std::string& reason, uint32_t xid,
                     RecommendedAction action, int64_t now_unix_ms, uint32_t gpu_instance = kWholeGpu,
                     uint32_t sxid = 0);
  // True when the GPU or one of its GPU instances was Unhealthy.
  bool MarkHealthy(const std::string& uuid, const std::string& reason, int64_t now_unix_ms);
  void Decided(const XidSubject& who, uint32_t xid, XidDecision decision, Timestamp at, std::string_view source,
               std::string_view detail, std::string_view action_note, int64_t now_unix_ms,
               uint32_t gpu_instance = kWholeGpu);
  // True (after counting it, and keeping a fatal one in the boot history) when the occurrence
  // is older than its XID's lookback: nothing else happens to it.
  bool BeyondLookback(const XidSubject& who, uint32_t xid, Timestamp at, int64_t now_unix_ms);
  // The boot history of a fatal decision whose action is a reset or a reboot: the number of
  // boots within the XID's escalation window when that is more than its `boots`, else 0.
  uint32_t RecordBoot(const XidSubject& who, uint32_t xid, RecommendedAction action, Timestamp at,
                      std::optional<XidEscalation>& escalation);
  // The catalog's `clears` of `xid`: the verdicts those XIDs held on the GPU are released.
  void ApplyClears(const XidSubject& who, uint32_t xid, uint32_t gpu_instance, std::string_view source,
                   int64_t now_unix_ms);
  HealthEvent NewEvent(std::string_view source, int64_t now_unix_ms) const;
  void Forget(const std::string& uuid);

  const XidCatalog& catalog_;
  const SiteOverrides& overrides_;
  Settings settings_;
  spdlog::logger& log_;
  Outputs out_;
  std::function<void(const std::string&)> reset_healed_;
  XidPolicy policy_;
  GpuDirectory directory_;  // PCI → UUID: the inventory, then what the kernel log taught
  NvSwitchPortMap switch_ports_;  // (NVSwitch, port) → GPU: the inventory's NVLink wiring
  const SxidCatalog* sxid_catalog_ = &SxidCatalog::Builtin();
  VerdictBook verdicts_;
  XidCounts counts_;
  XidBootHistory boots_;
  std::string boot_id_;
  std::size_t gpus_ = 0;
  struct Pending {
    PciAddress address;
    std::string pci;
    std::string reason;
    uint32_t xid = 0;
    RecommendedAction action = RecommendedAction::kNone;
    uint32_t gpu_instance = kWholeGpu;
  };
  std::map<uint64_t, Pending> pending_;  // fatal XIDs on a PCI address not yet mapped to a GPU
};

}  // namespace gns::gpu_health
