// The API simulator fixture.
#include "support/api_sim.hpp"

namespace gns::test {
namespace {

sim::ApiServerOptions WithStateDir(sim::ApiServerOptions options, const std::filesystem::path& state_dir) {
  options.state_dir = state_dir;
  return options;
}

}  // namespace

ApiSim::ApiSim(std::filesystem::path state_dir, sim::ApiServerOptions options)
    : sim::ApiServer(WithStateDir(std::move(options), state_dir)), state_dir_(std::move(state_dir)) {
  Start();
}

kube::ClientConfig ApiSim::ClientConfig() const {
  kube::ClientConfig config;
  config.server = BaseUrl();
  config.ca_pem = CaPem();
  config.token_file = TokenFile().string();
  config.qps = 1000;
  config.burst = 1000;
  return config;
}

KubeServices::KubeServices(Loop& loop, const Clock& clock, Bus& bus, MetricsRegistry& metrics, Services& services,
                           kube::ClientConfig config, std::shared_ptr<spdlog::logger> log, bool with_events)
    : services(services) {
  client = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{loop, clock, metrics, log}, std::move(config));
  informers = std::make_shared<kube::InformerRegistry>(client, bus, loop.Io(), metrics, log);
  services.Provide<kube::KubeClient>(client);
  services.Provide<kube::InformerRegistry>(informers);
  if (with_events) {
    events = std::make_shared<kube::EventRecorder>(client, clock, metrics, log, kube::EventRecorderConfig{});
    services.Provide<kube::EventRecorder>(events);
  }
}

void KubeServices::Shutdown() {
  informers->StopAll();
  client->Shutdown();
  if (events) services.Withdraw<kube::EventRecorder>();
  services.Withdraw<kube::InformerRegistry>();
  services.Withdraw<kube::KubeClient>();
  events.reset();
  informers.reset();
  client.reset();
}

SimNode::SimNode(Loop& loop, BlockingPool& pool, const Clock& clock, const ApiSim& api, std::string node_name,
                 std::string module_name, std::shared_ptr<spdlog::logger> log)
    : bus(loop) {
  site.node_name = std::move(node_name);
  client = std::make_shared<kube::KubeClient>(kube::KubeClient::Deps{loop, clock, metrics, log}, api.ClientConfig());
  informers = std::make_shared<kube::InformerRegistry>(client, bus, loop.Io(), metrics, log);
  services.Provide<kube::KubeClient>(client);
  services.Provide<kube::InformerRegistry>(informers);
  context = std::make_unique<ModuleContext>(RuntimeParts{loop, bus, pool, clock, site, metrics, services},
                                            std::move(module_name), [](std::string) {},
                                            [](ModuleHealth, std::string) {});
}

void SimNode::Shutdown() {
  informers->StopAll();
  client->Shutdown();
}

}  // namespace gns::test
