#pragma once
// The `imex-peers` module (seed 000 operator guide §3.2 Option C): keeps nodes_config.cfg in
// step with the Nodes of this node's NVLink clique.
//  - finds its peers by the nvidia.com/gpu.clique label, which the node-labels module writes
//    (its one writer) on every node from NVML's clique;
//  - this node is in its own clique by construction (NVML says so), whatever the API shows
//    yet: its own entry comes from its own Node (one informer, field selector), not from the
//    label, so no map without it is ever written; until its own address is known, none is;
//  - watches the Nodes carrying the same label (one informer, label selector) and renders the
//    map from their InternalIPs (or Hostname addresses), sorted, one per line; written
//    atomically and only when it changes; Nodes without an address are left out and reported;
//  - restarts the IMEX unit after a change by policy: never | whenIdle (only while no channel
//    claim is prepared here, as the DRA module's retained state says; without the DRA module
//    we cannot know, so it waits like never) | always — through imex-health's ImexUnitControl;
//  - the Node condition ImexRestartPending says whether and why a restart waits;
//  - consistency: the map the running IMEX loaded (the file as it was when the unit last
//    entered active, from imex-health's ActiveEnterTimestamp) against the clique's map from
//    the API; a difference nobody is about to fix (after a supervisor restart between a write
//    and the IMEX restart, a hand edit, a restart outside us) is the reason LoadedMapDiverges,
//    and is restarted away by the same policy.

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/dra_compute_domain/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/imex_health/messages.hpp"
#include "modules/imex_peers/messages.hpp"
#include "modules/kube/messages.hpp"

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gns::kube {
class Informer;
class NodeConditionWriter;
}  // namespace gns::kube

namespace gns::imex_peers {

class ImexPeersModule final : public Module {
 public:
  static constexpr std::string_view kName = "imex-peers";
  static constexpr std::string_view kSummary =
      "nodes_config.cfg from the Nodes of this clique; IMEX restarts only while no channel claim is prepared";
  static constexpr std::array<std::string_view, 2> kUses{"kube", "imex-health"};

  struct Config {
    std::string clique_label = "nvidia.com/gpu.clique";
    std::string nodes_config = "/etc/nvidia-imex/nodes_config.cfg";  // under hostRoot
    std::string address_type = "InternalIP";  // or Hostname
    std::string restart_policy = "whenIdle";  // never | whenIdle | always
    std::string condition_type = "ImexRestartPending";
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  ImexPeersModule(ModuleContext& context, const Config& config);
  ~ImexPeersModule() override;
  void Start() override;
  void Stop(std::function<void()> done) override;

  // The file content for a set of addresses: sorted, unique, one per line.
  static std::string Render(std::vector<std::string> addresses);

 private:
  void OnClique(const gpu_inventory::NodeClique& clique);
  void OnResourceEvent(const kube::ResourceEvent& event);
  void OnSynced(const kube::InformerSynced& synced);
  void WatchSelf();
  void ReadSelf();
  void OnDraState(const dra::DraComputeDomainState& state);
  void OnModuleStates(const ModuleStates& states);
  void OnImexHealth(const imex_health::ImexHealth& health);
  void ReadLoaded();
  void CheckConsistency();
  void Reconcile();
  void TryRestart();
  void SetPending(bool pending, std::string reason, std::string message);
  void UpdateCondition();
  void Publish();

  ModuleContext& context_;
  Config config_;
  std::string path_;
  std::string clique_;
  std::shared_ptr<kube::Informer> informer_;
  std::string informer_key_;
  bool synced_ = false;
  std::map<std::string, std::string> addresses_;  // Node name → address ("" when it has none)
  // This node's own Node (field selector metadata.name): its address is the map's own entry.
  std::shared_ptr<kube::Informer> self_informer_;
  std::string self_key_;
  std::optional<std::string> self_address_;  // nullopt: own Node not listed yet; "": no address
  std::string self_error_;                   // why the map waits for this node's own entry
  std::optional<std::string> on_disk_;            // what the file holds (nullopt: not read / missing)
  bool writing_ = false;
  bool write_again_ = false;
  bool restarting_ = false;
  std::optional<std::size_t> prepared_claims_;    // nullopt: the DRA module is not running
  // The running IMEX's map: known for run `loaded_run_` (its ActiveEnterTimestamp, µs).
  uint64_t run_ = 0;          // the unit's current run (0: not active)
  uint64_t loaded_run_ = 0;   // the run loaded_ belongs to
  bool loaded_known_ = false; // false with loaded_run_ == run_: the file changed after the run began, unseen before
  std::vector<std::string> loaded_;
  bool reading_loaded_ = false;
  uint64_t restarted_run_ = 0;  // the run our last restart replaced: consistency waits for the next one
  bool pending_for_divergence_ = false;
  std::string divergence_message_;
  bool dra_enabled_ = false;
  ImexPeersState state_;
  std::string pending_message_;
  std::unique_ptr<kube::NodeConditionWriter> condition_;
  Gate lifetime_;
  MetricsRegistry::Series* writes_total_;
  MetricsRegistry::Series* restarts_total_;
  MetricsRegistry::Series* pending_gauge_;
  MetricsRegistry::Series* peers_gauge_;
  MetricsRegistry::Series* diverged_gauge_;
  Subscription clique_sub_;
  Subscription resource_sub_;
  Subscription synced_sub_;
  Subscription dra_sub_;
  Subscription states_sub_;
  Subscription health_sub_;
};

}  // namespace gns::imex_peers
