#pragma once
// The `dra-compute-domain` module: the DRA kubelet plugin for compute-domain.nvidia.com under
// HostManagedIMEX (seed 000 §5, §7, §11, §13; issue #5). It wires the core library (checkpoint,
// CDI spec, prepare decision, ResourceSlice, the two gRPC servers) to the kube services, the
// bus (NodeClique in, DraComputeDomainState out) and the supervisor.
//
// The kubelet's side (sockets, the FIFO of calls, claim state, reconcile, slice publishing) is
// the DRA plugin core's KubeletPlugin (dra_plugin/kubelet_plugin.hpp); this module is its
// DraDriver: the channel spec a record implies, the prepare decision (claim, ComputeDomain,
// clique, driver-managed attach), the slice's channel devices, driver-managed IMEX.
//
// Start (throws → the supervisor retries with backoff): the IMEX channel major from
// <hostRoot>/proc/devices, then the core's start (claim state read on the pool, reconcile,
// servers, slice) with the driver-managed domains loaded before the servers.

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_log.hpp"
#include "dra_plugin/dra_server.hpp"
#include "dra_plugin/driver.hpp"
#include "dra_plugin/kubelet_plugin.hpp"
#include "modules/dra_compute_domain/driver_managed.hpp"
#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/dra_compute_domain/prepare.hpp"
#include "modules/dra_compute_domain/resource_slice.hpp"
#include "dra_plugin/slice_publisher.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gns::kube {
class KubeClient;
class Informer;
class EventRecorder;
class InformerRegistry;
struct Result;
}  // namespace gns::kube

namespace gns::dra {

class RegistrationServer;

class DraComputeDomainModule final : public Module, private DraDriver {
 public:
  static constexpr std::string_view kName = "dra-compute-domain";
  static constexpr std::string_view kSummary =
      "DRA kubelet plugin for compute-domain.nvidia.com (IMEX channel 0, HostManagedIMEX)";
  // Holds the kube module's client and informers: waits for it, restarts after it.
  static constexpr std::array<std::string_view, 1> kUses = {"kube"};

  struct Config {
    ResourceApiVersion api_version = ResourceApiVersion::kV1;
    // How long a claim's API look-ups (ResourceClaim, ComputeDomain) are retried on transport
    // errors, 429 and 5xx before the claim is answered with a retryable error; below the
    // kubelet's 45 s call deadline so the kubelet gets an answer, not a timeout.
    std::chrono::milliseconds prepare_timeout{20000};
    // Period of the ResourceSlice check (read it back, write it if it drifted); the informer
    // catches deletions at once, this catches anything the watch missed.
    std::chrono::milliseconds slice_resync{600000};
    bool node_events_on_corrupt_checkpoint = true;
    // Upstream's host-managed parity gate: while imex-health says host IMEX is not ready (or
    // has not said anything yet), Prepare answers with a retryable error naming the reason.
    bool require_imex_ready = false;
    // HostManagedIMEX off (issue #16): the supervisor runs each domain's nvidia-imex
    // (`driverManaged:` section; node name, state dir and the DNS-names gate come from the site).
    DriverManagedSettings driver_managed;
    // allocationMode "All": channels 0..allChannels-1 go into the container (upstream's 2048).
    uint32_t all_channels = 2048;
    // Bytes of claim log after which it is compacted into the checkpoint. Not a YAML key (the
    // default suits every node); tests lower it to reach the compaction.
    std::size_t claim_log_compact_at = kClaimLogCompactAt;
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  DraComputeDomainModule(ModuleContext& context, const Config& config);
  ~DraComputeDomainModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;
  // The claim state is being read on the pool: the kubelet plugin is not served yet.
  bool Loading() const { return loading_; }

 private:
  // DraDriver (loop thread).
  ClaimSpecIo SpecIo() const override;
  boost::asio::awaitable<ClaimDecision> DecideClaim(ClaimRef claim) override;
  boost::asio::awaitable<std::string> AfterUnprepare(ClaimRef claim) override;
  nlohmann::json SliceDevices() const override;
  std::string SliceNote() const override;
  void StateChanged() override { PublishState(); }
  void Prepared(const PreparedClaim& entry) override;
  void StopBeforeServers(std::function<void()> done) override;

  // What Start reads on the pool (never on the loop): the claim state, domains.json.
  struct StartFiles {
    ClaimStateLoad claims;
    DomainRecordLoad domains;  // driver-managed only
  };
  // Start, continued once they are back: the domains, then the core reconciles and serves.
  void Serve(StartFiles files);
  void LogGates();

  PrepareDecision Decide(const ClaimRef& claim, const nlohmann::json& object, const DomainLookupFn& lookup);
  // Until OnClique says the clique is known (true), the wait runs out (false) or Stop.
  boost::asio::awaitable<bool> WaitForClique(std::chrono::milliseconds left);
  void OnClique(const gpu_inventory::NodeClique& clique);

  // Callback APIs as awaitables (plain functions, not coroutines: see dra_module.cpp). The API
  // reads with retries are the core's (KubeletPlugin::FetchWithRetry).
  boost::asio::awaitable<DomainVerdict> Attach(std::string uid, std::string claim_namespace, std::string claim_name,
                                               ComputeDomainInfo domain);
  boost::asio::awaitable<std::string> Detach(std::string uid);
  boost::asio::awaitable<boost::system::error_code> Expiry(boost::asio::steady_timer& timer);

  void PublishState();

  ModuleContext& context_;
  Config config_;
  DriverPaths paths_;
  std::string node_name_;
  bool host_managed_ = false;
  uint32_t channel_major_ = 0;
  std::string clique_id_;
  bool clique_known_ = false;  // gpu-inventory has read the fabric (NodeClique::known)
  std::string clique_reason_;
  // The prepare that waits for the clique to become known (at most one: prepares run one at a
  // time) sleeps on this timer until its deadline; OnClique wakes it early.
  boost::asio::steady_timer clique_timer_;
  bool clique_waiting_ = false;
  bool clique_arrived_ = false;  // set by OnClique for the waiting prepare
  bool loading_ = false;  // the claim state is being read on the pool: nothing is served yet

  std::unique_ptr<DriverManagedDomains> domains_;  // gate off only
  Subscription clique_sub_;
  std::unique_ptr<KubeletPlugin> plugin_;  // the kubelet's side, driven with this driver
  Gate lifetime_;  // closed first thing in the destructor: late callbacks and resumptions are dropped
};

}  // namespace gns::dra
