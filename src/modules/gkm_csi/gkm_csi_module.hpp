#pragma once
// The `gkm-csi` module: the CSI node plugin of seed 002 (driver csi.gkm.io). A pod's inline CSI
// volume names a GKMCache (cacheName, cacheNamespace) or a ClusterGKMCache (cacheName alone); the
// kubelet calls NodePublishVolume and we bind-mount the cache's directory at the pod's target,
// read-only unless the volume says readOnly: "false", and only while gkm-agent (the one judge,
// gkm_agent/messages.hpp) holds the cache Ready with a GPU here that can use it. Each volume is
// recorded in the cache's usage.json, which the agent reports and honours (a cache in use is not
// removed). After a crash the records and /proc/self/mountinfo give the volumes back.

#include "loop/bus.hpp"
#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/gkm_agent/api/usage.hpp"
#include "modules/gkm_agent/messages.hpp"
#include "modules/gkm_csi/volume_ops.hpp"
#include "modules/gkm_csi/volume_request.hpp"

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace gns::dra {
class RegistrationServer;
}

namespace gns::gkm_csi {

class CsiService;

inline constexpr std::string_view kDriverName = "csi.gkm.io";

class GkmCsiModule final : public Module {
 public:
  static constexpr std::string_view kName = "gkm-csi";
  static constexpr std::string_view kSummary =
      "CSI node plugin csi.gkm.io: Ready kernel caches bind-mounted into pods, read-only by default";
  // Its verdicts decide what may be mounted: no agent, no plugin.
  static constexpr std::array<std::string_view, 1> kUses = {"gkm-agent"};

  struct Config {
    std::string plugin_dir;        // the CSI socket's directory; default <kubeletDir>/plugins/csi.gkm.io
    std::string registration_dir;  // default <kubeletDir>/plugins_registry
    bool register_plugin = true;   // with the kubelet's plugin watcher
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GkmCsiModule(ModuleContext& context, const Config& config);
  ~GkmCsiModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

  std::string SocketPath() const { return config_.plugin_dir + "/csi.sock"; }

  struct Volume {
    enum class Phase { kPublishing, kPublished, kUnpublishing };
    std::string key;  // the cache
    std::string usage_dir;
    gkm::UsageRecord record;  // target, pod, read-only
    Phase phase = Phase::kPublishing;
  };
  const std::map<std::string, Volume>& Volumes() const { return volumes_; }

 private:
  void OnStates(const gkm::CacheStates& states);
  void Serve();
  using Reply = std::function<void(std::optional<CsiError>)>;
  void Publish(PublishRequest request, Reply reply);
  void Unpublish(std::string volume_id, std::string target, Reply reply);
  void Stats(std::string volume_id, std::string path, std::function<void(std::optional<CsiError>, VolumeStats)> reply);
  void Count(std::string_view method, const std::optional<CsiError>& error);
  void UpdateGauge();

  ModuleContext& context_;
  Config config_;
  std::string node_;
  std::optional<gkm::CacheStates> states_;
  bool recovering_ = false;
  bool serving_ = false;
  std::map<std::string, Volume> volumes_;  // by volume id
  std::unique_ptr<CsiService> service_;
  std::unique_ptr<dra::RegistrationServer> registration_;
  Gate lifetime_;
  Subscription states_sub_;
};

}  // namespace gns::gkm_csi
