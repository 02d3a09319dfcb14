#pragma once
// The `node-labels` module: the one writer of this node's GPU labels (labels.hpp lists them,
// nvidia.com/gpu.clique included). One server-side apply of all of them with our field manager,
// only when the set changes, and not before every input whose module is enabled is known (an
// apply is the whole set: what it leaves out, the API server removes); a label we no longer
// compute is left out of the apply, so the API server removes it (it is ours alone). Force: we
// take the labels over from an earlier writer (GFD, or imex-peers before it stopped writing the
// clique label). A failed apply is retried with backoff; nothing is sent at steady state.

#include "loop/backoff.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/device_plugin/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/node_labels/labels.hpp"
#include "modules/node_labels/messages.hpp"

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <memory>
#include <optional>
#include <string>

namespace gns::node_labels {

class NodeLabelsModule final : public Module {
 public:
  static constexpr std::string_view kName = "node-labels";
  static constexpr std::string_view kSummary =
      "GPU node labels (product, count, memory, family, driver, MIG strategy, sharing, clique) by server-side apply";
  static constexpr std::array<std::string_view, 1> kUses{"kube"};

  struct Config {
    std::string field_manager = "gpu-node-supervisor-labels";
    BackoffPolicy retry{std::chrono::milliseconds(500), std::chrono::milliseconds(60000), 2.0, 0.2};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  NodeLabelsModule(ModuleContext& context, const Config& config);
  ~NodeLabelsModule() override;
  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  void Recompute();
  void Apply();
  // The awaited inputs not known yet, as words for the log and state (empty: all known).
  std::string Unknown() const;

  ModuleContext& context_;
  Config config_;
  std::optional<gpu_inventory::GpuInventory> inventory_;  // the last one read while available
  std::optional<gpu_inventory::NodeClique> clique_;
  std::optional<device_plugin::DevicePluginState> plugin_;
  // Inputs awaited before the first apply: their producers are enabled.
  bool await_inventory_ = false;  // the inventory and the clique (gpu-inventory)
  bool await_plugin_ = false;     // the device plugin's state (device-plugin)
  Labels wanted_;
  std::optional<Labels> applied_;  // what the API server has from us, once an apply succeeded
  bool in_flight_ = false;
  bool apply_posted_ = false;
  bool stopping_ = false;
  NodeLabelsState state_;
  Backoff backoff_;
  boost::asio::steady_timer retry_timer_;
  Gate lifetime_;
  MetricsRegistry::Series* applies_total_;
  MetricsRegistry::Series* failures_total_;
  Subscription inventory_sub_;
  Subscription clique_sub_;
  Subscription plugin_sub_;
};

}  // namespace gns::node_labels
