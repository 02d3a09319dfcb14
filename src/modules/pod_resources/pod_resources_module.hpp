#pragma once
// The `pod-resources` module (issue #12, seed 003 §3.1): which pods hold which GPUs, from the
// kubelet's PodResourcesLister v1, kept as a retained GpuPodMap on the bus, and the
// `dgxc.nvidia.com/devices` annotation NVSentinel's node-drainer reads, written on each pod that
// holds GPUs only when it changes and removed when the pod holds none.
//
// The kubelet offers no watch, so the module re-lists when the answer can change: our device
// plugin's Allocate (DevicesAllocated; the kubelet records the allocation after the call
// returns, so a List that does not show the devices yet is repeated a few times), our DRA
// prepare/unprepare (the prepared claims in DraComputeDomainState), a change of a pod bound to
// this node (an informer on `spec.nodeName=<node>`), the socket appearing (inotify on its
// directory), and a slow safety resync. Lists are coalesced: one in flight, one more queued.
//
// Holders of a GPU under other names (GpuPodMap::via / pending / unplaced): pods on its MIG devices,
// pods with a gpu.nvidia.com claim on it (by /dev/nvidia minor, from gpu-inventory), and claims
// dra-gpu has prepared on it that the kubelet lists no pod for yet.
// At steady state the module makes no API request beyond the open pod watch.

#include "loop/backoff.hpp"
#include "loop/dir_watcher.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/pod_resources/lister_client.hpp"
#include "modules/pod_resources/messages.hpp"
#include "modules/pod_resources/pod_map.hpp"

#include <utility>  // before awaitable.hpp: Boost 1.74's uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gns::kube {
class KubeClient;
class Informer;
struct ResourceEvent;
struct Result;
}  // namespace gns::kube

namespace gns::pod_resources {

class PodResourcesModule final : public Module {
 public:
  static constexpr std::string_view kName = "pod-resources";
  static constexpr std::string_view kSummary =
      "GPU -> pod map from the kubelet's PodResourcesLister; dgxc.nvidia.com/devices pod annotations";
  // Holds the kube module's client and pod informer.
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    std::string socket;  // "": <kubeletDir>/pod-resources/kubelet.sock
    std::vector<std::string> resource_names{"nvidia.com/gpu"};
    std::chrono::milliseconds call_timeout{5000};
    // A trigger waits this long for others before the List goes out.
    std::chrono::milliseconds coalesce{100};
    // A List even without a trigger, in case one was missed.
    std::chrono::milliseconds resync{300000};
    // Longest wait between attempts while the socket does not answer (or a write fails).
    std::chrono::milliseconds retry_max{10000};
    bool annotate = true;
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  PodResourcesModule(ModuleContext& context, const Config& config);
  ~PodResourcesModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  // Listing.
  void RequestList(std::string_view why);
  // Moves the next List to `delay` from now at the latest.
  void ArmListTimer(std::chrono::milliseconds delay);
  // One run per Start (a ticket of lifetime_, which Stop renews): waits until the list timer is
  // due, lists, and waits again; one List in flight at most.
  boost::asio::awaitable<void> ListLoop(Gate::Ticket ticket);
  boost::asio::awaitable<void> ListDue(Gate::Ticket ticket);
  boost::asio::awaitable<void> ListOnce(Gate::Ticket ticket);
  void OnList(CallOutcome<v1::ListPodResourcesResponse> outcome);
  void OnListFailed(const std::string& error);
  void OnAllocatable(CallOutcome<v1::AllocatableResourcesResponse> outcome);
  void RebuildView();
  void CheckExpected();
  void WatchSocketDirectory();
  void ScheduleResync();

  // Inputs.
  void OnPodEvent(const kube::ResourceEvent& event);
  // A DRA driver's prepared claims (`held`: the last set seen from that driver) changed: the
  // kubelet's dynamic_resources have too.
  void OnPreparedClaims(std::set<std::string>& held, std::set<std::string> claims);

  // Outputs.
  void PublishMap();
  void Reconcile();
  void Write(const AnnotationWrite& write);
  void OnWritten(const AnnotationWrite& write, const kube::Result& result);
  std::string PodUid(const std::string& namespace_name, const std::string& name) const;

  ModuleContext& context_;
  Config config_;
  std::string socket_;
  std::set<std::string> resources_;
  std::string node_name_;

  std::shared_ptr<kube::KubeClient> kube_;
  std::shared_ptr<kube::Informer> pods_;
  std::string pods_key_;
  std::unique_ptr<ListerClient> lister_;
  std::unique_ptr<DirWatcher> socket_watcher_;

  // Listing state.
  bool list_in_flight_ = false;
  bool list_again_ = false;
  bool timer_armed_ = false;
  std::chrono::steady_clock::time_point timer_due_{};
  boost::asio::steady_timer list_timer_;
  boost::asio::steady_timer resync_timer_;
  Backoff list_backoff_;
  bool need_allocatable_ = true;
  std::size_t allocatable_ = 0;
  std::optional<v1::ListPodResourcesResponse> last_response_;
  ListView view_;
  std::set<std::string> logged_problems_;
  std::string last_error_;
  uint64_t failures_in_row_ = 0;
  uint64_t lists_ = 0;
  int64_t listed_at_ms_ = 0;
  // Devices our plugin allocated that no List has shown yet -> Lists tried since.
  std::map<std::string, int> expected_;
  // Pods deleted in the API that the last List still showed -> Lists tried since.
  std::map<std::string, int> departing_;
  std::set<std::string> known_gpus_;  // from the inventory; empty: every ID accepted
  GpuTopology topology_;              // from the inventory: minors and MIG parents
  std::set<std::string> prepared_claims_;      // compute-domain.nvidia.com
  std::set<std::string> prepared_gpu_claims_;  // gpu.nvidia.com
  std::vector<PreparedGpuClaim> prepared_gpus_;  // gpu.nvidia.com, with their devices
  std::set<std::string> logged_unplaced_;
  std::optional<GpuPodMap> published_;

  // Annotation writes.
  struct Acked {
    std::string uid;
    std::optional<std::string> value;
    std::string resource_version;  // of the write; the watch echo with it clears the entry
  };
  std::map<std::string, Acked> acked_;
  std::set<std::string> writing_;
  bool writes_paused_ = false;
  Backoff write_backoff_;
  boost::asio::steady_timer write_timer_;

  Gate lifetime_;

  MetricsRegistry::Series* lists_ok_;
  MetricsRegistry::Series* lists_failed_;
  MetricsRegistry::Series* problems_;
  MetricsRegistry::Series* writes_set_;
  MetricsRegistry::Series* writes_removed_;
  MetricsRegistry::Series* writes_gone_;
  MetricsRegistry::Series* writes_failed_;
  MetricsRegistry::Series* pods_with_gpus_;

  Subscription allocated_sub_;
  Subscription dra_sub_;
  Subscription dra_gpu_sub_;
  Subscription inventory_sub_;
  Subscription pod_sub_;
  Subscription synced_sub_;
};

}  // namespace gns::pod_resources
