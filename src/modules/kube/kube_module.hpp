#pragma once
// The `kube` module: owns the one API connection of the process and offers it to other
// modules as services (KubeClient, InformerRegistry, EventRecorder, and the LeaderElector when
// leader election is enabled); publishes LeaderStatus on the bus.

#include "loop/module.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/api/leader_election.hpp"
#include "modules/kube/messages.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace gns::kube {

class KubeModule final : public Module {
 public:
  static constexpr std::string_view kName = kModuleName;
  static constexpr std::string_view kSummary =
      "Kubernetes API client, shared informers, leader election and events";

  struct Config {
    std::string kubeconfig;  // empty: in-cluster
    std::string context;     // kubeconfig context; empty: current-context
    double qps = 20;
    int burst = 40;
    std::chrono::milliseconds request_timeout{30000};
    std::chrono::milliseconds watch_idle_timeout{300000};
    std::chrono::milliseconds token_refresh{60000};
    bool leader_election = false;
    LeaderElectionConfig lease;
    double events_qps = 1;
    int events_burst = 25;
    // Where the in-cluster service-account files are (tests point these at a temp dir).
    InClusterPaths in_cluster;
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  KubeModule(ModuleContext& context, const Config& config);
  ~KubeModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  ModuleContext& context_;
  Config config_;
  std::shared_ptr<KubeClient> client_;
  std::shared_ptr<InformerRegistry> informers_;
  std::shared_ptr<EventRecorder> events_;
  std::shared_ptr<LeaderElector> elector_;
};

}  // namespace gns::kube
