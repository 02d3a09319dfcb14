// The kube module: config, wiring and the services it offers.
#include "modules/kube/kube_module.hpp"

#include <map>

namespace gns::kube {

using std::chrono::milliseconds;

KubeModule::Config KubeModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  config.kubeconfig = section.OptionalString("kubeconfig").value_or("");
  config.context = section.OptionalString("context").value_or("");
  if (!config.kubeconfig.empty() && config.kubeconfig.front() != '/') {
    section.Fail("kubeconfig", "must be an absolute path, got \"" + config.kubeconfig + "\"");
  }
  if (config.kubeconfig.empty() && !config.context.empty()) {
    section.Fail("context", "only meaningful with kubeconfig");
  }
  config.qps = section.Double("qps", 0.1, 10000, 20);
  config.burst = static_cast<int>(section.Int("burst", 1, 100000, 40));
  if (config.burst < config.qps) section.Fail("burst", "must be at least qps");
  config.request_timeout = section.Duration("requestTimeout", milliseconds(100), milliseconds(600000), milliseconds(30000));
  config.watch_idle_timeout =
      section.Duration("watchIdleTimeout", milliseconds(1000), milliseconds(3600000), milliseconds(300000));
  config.token_refresh = section.Duration("tokenRefresh", milliseconds(1000), milliseconds(60000), milliseconds(60000));

  auto le = section.Section("leaderElection");
  config.leader_election = le.Bool("enabled", false);
  config.lease = ParseLeaderElectionConfig(le, "gpu-node-supervisor");
  le.Finish();

  auto events = section.Section("events");
  config.events_qps = events.Double("qps", 0.01, 1000, 1);
  config.events_burst = static_cast<int>(events.Int("burst", 1, 10000, 25));
  events.Finish();

  // Not in the production docs: lets tests run the in-cluster path against temp files.
  auto paths = section.Section("inClusterPaths");
  config.in_cluster.token = paths.String("token", config.in_cluster.token);
  config.in_cluster.ca = paths.String("ca", config.in_cluster.ca);
  paths.Finish();
  (void)site;
  return config;
}

KubeModule::KubeModule(ModuleContext& context, const Config& config) : context_(context), config_(config) {}

KubeModule::~KubeModule() = default;

void KubeModule::Start() {
  ClientConfig client_config =
      config_.kubeconfig.empty() ? InClusterConfig(config_.in_cluster) : LoadKubeconfig(config_.kubeconfig, config_.context);
  client_config.qps = config_.qps;
  client_config.burst = config_.burst;
  client_config.request_timeout = config_.request_timeout;
  client_config.token_refresh = config_.token_refresh;
  client_ = std::make_shared<KubeClient>(
      KubeClient::Deps{context_.GetLoop(), context_.GetClock(), context_.Metrics(), context_.Logger()}, client_config);

  InformerOptions options;
  options.idle_timeout = config_.watch_idle_timeout;
  informers_ = std::make_shared<InformerRegistry>(client_, context_.GetBus(), context_.GetLoop().Io(),
                                                  context_.Metrics(), context_.Logger(), options);
  EventRecorderConfig events;
  events.qps = config_.events_qps;
  events.burst = config_.events_burst;
  events.reporting_instance = context_.Site().node_name;
  // The Event recorder (one token bucket for every module's Events) and kube's own lease make
  // their calls as kube's.
  const auto own = client_->ForModule(context_.Name());
  events_ = std::make_shared<EventRecorder>(own, context_.GetClock(), context_.Metrics(), context_.Logger(), events);

  // Each module finds its own view of the client and of the informers (loop/services.hpp), so
  // its requests name it (KubeClient::ModuleAgent); one view per module while this instance runs.
  auto& services = context_.GetServices();
  services.Provide<KubeClient>(client_, [client = client_, views = std::make_shared<std::map<std::string, std::shared_ptr<KubeClient>>>()](
                                            const std::string& module) {
    auto& view = (*views)[module];
    if (!view) view = client->ForModule(module);
    return view;
  });
  services.Provide<InformerRegistry>(
      informers_, [informers = informers_, views = std::make_shared<std::map<std::string, std::shared_ptr<InformerRegistry>>>()](
                      const std::string& module) {
        auto& view = (*views)[module];
        if (!view) view = InformerRegistry::View(informers, module);
        return view;
      });
  services.Provide<EventRecorder>(events_);
  if (config_.leader_election) {
    elector_ = std::make_shared<LeaderElector>(own, context_.GetLoop().Io(), context_.GetClock(), &context_.GetBus(),
                                               context_.Metrics(), context_.Logger(), config_.lease,
                                               LeaderElector::Callbacks{});
    services.Provide<LeaderElector>(elector_);
    elector_->Start();
  }
  context_.Log().info("API server {} ({}), {} qps / burst {}", client_config.server,
                      config_.kubeconfig.empty() ? "in-cluster" : "kubeconfig", config_.qps, config_.burst);
}

void KubeModule::Stop(std::function<void()> done) {
  auto& services = context_.GetServices();
  services.Withdraw<KubeClient>();
  services.Withdraw<InformerRegistry>();
  services.Withdraw<EventRecorder>();
  auto finish = [this, done = std::move(done)] {
    context_.GetServices().Withdraw<LeaderElector>();
    if (informers_) informers_->StopAll();
    if (client_) client_->Shutdown();
    done();
  };
  if (elector_) {
    elector_->Stop(std::move(finish), true);
  } else {
    finish();
  }
}

}  // namespace gns::kube
