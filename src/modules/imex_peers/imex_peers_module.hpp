#pragma once
// The `imex-peers` module (seed 000 operator guide §3.2 Option C): keeps nodes_config.cfg in
// step with the Nodes of this node's NVLink clique.
//  - labels its own Node nvidia.com/gpu.clique=<clique from NVML> (server-side apply, field
//    manager "imex-peers"), so peers find each other without GFD;
//  - watches the Nodes carrying the same label (one informer, label selector) and renders the
//    map from their InternalIPs (or Hostname addresses), sorted, one per line; written
//    atomically and only when it changes; Nodes without an address are left out and reported;
//  - restarts the IMEX unit after a change by policy: never | whenIdle (only while no channel
//    claim is prepared here, as the DRA module's retained state says; without the DRA module
//    we cannot know, so it waits like never) | always — through imex-health's ImexUnitControl;
//  - the Node condition ImexRestartPending says whether and why a restart waits.

#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/dra_compute_domain/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
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
class NodeConditions;
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
    bool label_node = true;
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
  void LabelNode();
  void OnResourceEvent(const kube::ResourceEvent& event);
  void OnSynced(const kube::InformerSynced& synced);
  void OnDraState(const dra::DraComputeDomainState& state);
  void OnModuleStates(const ModuleStates& states);
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
  std::optional<std::string> on_disk_;            // what the file holds (nullopt: not read / missing)
  bool writing_ = false;
  bool write_again_ = false;
  bool restarting_ = false;
  std::optional<std::size_t> prepared_claims_;    // nullopt: the DRA module is not running
  bool dra_enabled_ = false;
  ImexPeersState state_;
  std::string pending_message_;
  std::shared_ptr<kube::NodeConditions> conditions_;
  bool condition_in_flight_ = false;
  bool condition_dirty_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  MetricsRegistry::Series* writes_total_;
  MetricsRegistry::Series* restarts_total_;
  MetricsRegistry::Series* pending_gauge_;
  MetricsRegistry::Series* peers_gauge_;
  Subscription clique_sub_;
  Subscription resource_sub_;
  Subscription synced_sub_;
  Subscription dra_sub_;
  Subscription states_sub_;
};

}  // namespace gns::imex_peers
