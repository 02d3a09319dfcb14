#pragma once
// The API simulator (tools/sim/apiserver) as tests set it up: on its own thread, on a port the
// kernel picks (read back through Port()/BaseUrl()), its CA, token and kubeconfig written to a
// directory of the test's; the client settings that reach it; and one simulated node's runtime
// (its own bus, metrics, services, KubeClient and informers) for tests and benches that run
// several nodes on one loop.

#include "apiserver.h"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/module.hpp"
#include "loop/services.hpp"
#include "loop/site.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <memory>
#include <string>

namespace gns::test {

// A started simulator; everything of sim::ApiServer (Seed, Call, faults, counters) is at hand.
class ApiSim : public sim::ApiServer {
 public:
  // Starts at once; ca.crt, token, kubeconfig (options.state_dir) go to `state_dir`.
  explicit ApiSim(std::filesystem::path state_dir, sim::ApiServerOptions options = {});

  const std::filesystem::path& StateDir() const { return state_dir_; }
  std::filesystem::path Kubeconfig() const { return state_dir_ / "kubeconfig"; }
  std::filesystem::path TokenFile() const { return state_dir_ / "token"; }

  // What a KubeClient needs to reach it: the URL, the CA, the token file (re-read after a
  // rotation), and rate limits high enough that the client never paces a test.
  kube::ClientConfig ClientConfig() const;

 private:
  std::filesystem::path state_dir_;
};

// The kube services as the kube module provides them (a KubeClient to `config`'s server, the
// informers and, when asked, an EventRecorder), provided in `services`, for a module under a
// whole-module benchmark. Made and shut down on the loop thread.
struct KubeServices {
  KubeServices(Loop& loop, const Clock& clock, Bus& bus, MetricsRegistry& metrics, Services& services,
               kube::ClientConfig config, std::shared_ptr<spdlog::logger> log, bool with_events);
  // Once the module that used them is gone: the informers stopped, the client shut down, all
  // three withdrawn from `services` and released.
  void Shutdown();

  Services& services;
  std::shared_ptr<kube::KubeClient> client;
  std::shared_ptr<kube::InformerRegistry> informers;
  std::shared_ptr<kube::EventRecorder> events;  // null unless `with_events`
};

// One simulated node on a shared loop and pool: its own bus, metrics, services and site, a
// KubeClient and informers to `api` provided as services, and a module context over them.
// The owner stops what it built on the context, then calls Shutdown, on the loop thread.
struct SimNode {
  SimNode(Loop& loop, BlockingPool& pool, const Clock& clock, const ApiSim& api, std::string node_name,
          std::string module_name, std::shared_ptr<spdlog::logger> log);
  void Shutdown();  // stops the informers and the client

  Bus bus;
  MetricsRegistry metrics;
  Services services;
  SiteConfig site;
  std::shared_ptr<kube::KubeClient> client;
  std::shared_ptr<kube::InformerRegistry> informers;
  std::unique_ptr<ModuleContext> context;
};

}  // namespace gns::test
