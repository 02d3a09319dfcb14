#pragma once
// The `dra-gpu` module: the DRA kubelet plugin for gpu.nvidia.com (issue #28 part 2), whole GPUs
// through Dynamic Resource Allocation, on the DRA plugin core (dra_plugin/kubelet_plugin.hpp).
// This module is the core's DraDriver: the ResourceSlice of the GPUs it serves (gpu-inventory's
// retained devices, the `gpus:` selection), the decision for a claim (the API's claim object,
// its GpuConfig), the per-claim CDI spec (the device plugin's builder, api/cdi.hpp).
//
// Start (throws → the supervisor retries): the kube client; on the pool, the claim state and the
// host facts of the CDI spec (control nodes, driver files, hooks); then, once gpu-health's
// verdicts are known (bounded wait), the core's reconcile and servers. A GPU is served here or by
// the device plugin, never both (loop/gpu_split.hpp).
//
// Health: gpu-health's verdicts (gpu_health_view.hpp) become a DeviceTaint on each unhealthy
// GPU's slice device, removed when the verdict turns healthy; the slice is written only when a
// taint set changes. The same view feeds the kubelet's health stream (KEP-4680), which this
// driver serves and advertises.

#include "dra_plugin/driver.hpp"
#include "dra_plugin/kubelet_plugin.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "loop/run_command.hpp"
#include "modules/device_plugin/api/mps.hpp"
#include "modules/dra_gpu/gpu_claims.hpp"
#include "modules/dra_gpu/gpu_health_view.hpp"
#include "modules/dra_gpu/time_slices.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

namespace gns::dra_gpu {

class DraGpuModule final : public Module, private dra::DraDriver {
 public:
  static constexpr std::string_view kName = "dra-gpu";
  static constexpr std::string_view kSummary = "DRA kubelet plugin for gpu.nvidia.com (GPUs, MIG devices)";
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    dra::ResourceApiVersion api_version = dra::ResourceApiVersion::kV1;
    GpuSelection gpus{true, {}};  // `gpus:` all, or a list of UUIDs / indices
    std::chrono::milliseconds prepare_timeout{20000};
    std::chrono::milliseconds slice_resync{600000};
    std::chrono::milliseconds health_resend = dra::kDefaultHealthResend;  // `healthResend`
    // `mpsRoot`: where the operator's MPS control daemons keep their pipe and shm directories.
    std::string mps_root = device_plugin::kDefaultMpsRoot;
    // `timeSliceCommand`: sets a GPU's scheduler time-slice for a claim's interval ({uuid},
    // {interval}: 0 Default … 3 Long; time_slices.hpp), with `timeSliceTimeout` per run.
    std::vector<std::string> time_slice_command{"nvidia-smi", "compute-policy", "-i",
                                                "{uuid}",     "--set-timeslice", "{interval}"};
    std::chrono::milliseconds time_slice_timeout{10000};
    bool node_events_on_corrupt_checkpoint = true;
    device_plugin::CdiSettings cdi;  // driverRoot, hookPath (kind: k8s.gpu.nvidia.com/claim)
    TaintEffect taint_effect = kDefaultTaintEffect;  // `taintEffect`: NoSchedule | NoExecute
    // `unmonitoredTaint`: while no judge watches the GPUs (gpu-health disabled or not yet up),
    // every device carries upstream's gpu.nvidia.com/unmonitored taint, effect None. Off by
    // default: an API server before Kubernetes 1.35 refuses the None effect, and with it the slice.
    bool unmonitored_taint = false;
    std::size_t claim_log_compact_at = dra::kClaimLogCompactAt;  // not a YAML key
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  DraGpuModule(ModuleContext& context, const Config& config);
  ~DraGpuModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;
  bool Loading() const { return loading_; }
  // Tests and benches: the jobs FIFO is empty.
  bool Idle() const { return plugin_->Idle(); }
  // How long the first slice waits for gpu-health's restored verdicts (its state message).
  static constexpr std::chrono::milliseconds kJudgeWait{10000};

 private:
  // DraDriver.
  dra::ClaimSpecIo SpecIo() const override;
  boost::asio::awaitable<dra::ClaimDecision> DecideClaim(dra::ClaimRef claim) override;
  nlohmann::json SliceDevices() const override;
  std::string SliceNote() const override;
  void StateChanged() override { PublishState(); }
  bool ServesDeviceHealth() const override { return true; }
  dra::DeviceHealthList DeviceHealth() const override;
  void Prepared(const dra::PreparedClaim& entry) override;
  boost::asio::awaitable<std::string> AfterUnprepare(dra::ClaimRef claim) override;
  // What keeps a container of `plan` from opening its MIG devices: the first whose capability
  // entries the host's mig-minors lacks (read again when the start's copy lacks one), or "".
  boost::asio::awaitable<std::string> MissingMigCaps(const GpuClaimPlan& plan);

  // Brings the GPUs' time-slices to `wanted` (time_slices.hpp): the book written before a set,
  // the command run, the book cleared after a GPU is back at Default. The errors by GPU UUID.
  // Only from DecideClaim and AfterUnprepare, which the core runs one at a time: nothing else
  // touches the book meanwhile.
  boost::asio::awaitable<std::map<std::string, std::string>> SettleTimeSlices(TimeSlices wanted);
  boost::asio::awaitable<std::string> WriteTimeSliceBook();
  boost::asio::awaitable<CommandResult> RunTimeSliceCommand(std::vector<std::string> argv);
  void LogTimeSliceErrors(const std::map<std::string, std::string>& errors, const std::string& after);

  struct StartFiles {
    dra::ClaimStateLoad claims;
    device_plugin::CdiHostFacts facts;
    TimeSliceBookLoad time_slices;
  };
  void Serve(StartFiles files);
  void OnInventory(const gpu_inventory::GpuInventory& inventory);
  // Serve once gpu-health (when enabled) has published its state, or after kJudgeWait: a GPU it
  // restores Unhealthy is never published untainted first (a write, then one more).
  void ServeWhenJudged(StartFiles files);
  void OnJudgeState();
  void OnVerdict(const gpu_health::DeviceHealth& verdict);
  // The taints of the devices of `gpus`, by device name (none for a healthy device).
  std::map<std::string, nlohmann::json> Taints(const std::vector<gpu_inventory::GpuInfo>& gpus) const;
  // A slice device's health: a whole GPU's verdict, or for a MIG device its GPU's and its GPU
  // instance's (GpuHealthView::OfMig).
  GpuHealth HealthOf(const ServedDevice& device) const;
  int64_t NowUnixMs() const;
  void PublishState();

  ModuleContext& context_;
  Config config_;
  dra::PluginPaths paths_;
  std::string node_name_;
  std::shared_ptr<const device_plugin::CdiHostFacts> facts_;  // read at start, on the pool
  gpu_inventory::GpuInventory inventory_;
  bool inventory_seen_ = false;
  std::vector<gpu_inventory::GpuInfo> served_;
  GpuHealthView health_;
  // timeAdded of the unmonitored taints: when this instance started serving (a restart without
  // a judge writes the slice once, with the new time).
  int64_t unmonitored_since_ms_ = 0;
  bool loading_ = false;
  bool awaiting_judge_ = false;
  std::unique_ptr<StartFiles> waiting_files_;
  boost::asio::steady_timer judge_timer_;
  Subscription inventory_sub_;
  Subscription verdict_sub_;
  Subscription judge_sub_;
  std::unique_ptr<dra::KubeletPlugin> plugin_;
  std::string time_slice_book_path_;
  TimeSlices time_slice_book_;                    // what the book on disk holds
  std::set<std::string> time_slices_confirmed_;   // GPUs this process saw set to their book value
  std::shared_ptr<RunningCommand> time_slice_child_;
  Gate lifetime_;
};

}  // namespace gns::dra_gpu
