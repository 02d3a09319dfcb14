// Issue #16 figures: a driver-managed ComputeDomain of N simulated nodes, in one process. Each
// node is the real DriverManagedDomains of the dra-compute-domain module with its own bus,
// KubeClient and informers (all on one loop thread), running tools/sim/imex's fake nvidia-imex
// on its own loopback address; the real compute-domain-controller judges the domain (rows
// "supervisor": ComputeDomainCliques off; "sup+cliques": on, as by default);
// the API simulator serves them over HTTPS on its own thread.
//  - supervisor: every node's first prepare at t0 (as when the scheduler places all pods at
//    once) → status.status Ready; then every node's last unprepare → status.nodes empty;
//  - DaemonSet (upstream's flow, simulated on the same API server and nodes): the DaemonSet is
//    created, its pods in slow-start batches (1, 2, 4, … POSTs, as the DaemonSet controller),
//    each pod Running/Ready after --pod-start-ms (scheduling, the daemon claim, image, start:
//    a parameter, not a measurement) with its two status writes, then the same node-side work
//    as above starts in the pod;
//  - API requests per node per domain: counted by each node and by the server; the server's
//    409 answers (write conflicts, any writer).
//
//   driver_managed_bench [--nodes 2,8,32] [--pod-start-ms 2000]
#include "bench_util.hpp"
#include "support/api_sim.hpp"
#include "support/eventually.hpp"
#include "support/held_port.hpp"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/feature_gates.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/module.hpp"
#include "loop/services.hpp"
#include "modules/compute_domain_controller/compute_domain_controller_module.hpp"
#include "modules/dra_compute_domain/driver_managed.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

constexpr const char* kNs = "bench";
const std::string kDomains = std::string("/apis/resource.nvidia.com/v1beta1/namespaces/") + kNs + "/computedomains";

std::shared_ptr<spdlog::logger> Quiet() {
  return std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
}

// One simulated node's runtime pieces (the loop and pool are shared), and what runs on it.
struct Node : gns::test::SimNode {
  using SimNode::SimNode;
  std::unique_ptr<gns::dra::DriverManagedDomains> domains;
  std::unique_ptr<gns::cd_controller::ComputeDomainControllerModule> controller;
};

// Waits poll often: the time to a state is what is measured.
constexpr milliseconds kPoll{5};

struct RunResult {
  double ready_ms = 0;
  double teardown_ms = 0;
  double node_requests = 0;    // per node, counted by the nodes
  double server_requests = 0;  // per node, counted by the API server (nodes + controller + pods)
  uint64_t conflicts = 0;      // 409 answers of the API server (any writer), whole run
};

// kSupervisorCliques: the same with ComputeDomainCliques on (the gate's default): nodes register
// in their clique's ComputeDomainClique object and the controller mirrors those into status.nodes.
enum class Mode { kSupervisor, kSupervisorCliques, kDaemonSet };

RunResult RunOnce(std::size_t n, Mode mode, milliseconds pod_start, const std::string& source_dir, int round) {
  const fs::path dir = fs::temp_directory_path() / ("gns-dm-bench-" + std::to_string(::getpid()) + "-" + std::to_string(round));
  fs::create_directories(dir);
  gns::test::ApiSim api(dir / "api");
  api.SeedFile(source_dir + "/deploy/crd-computedomains.yaml");  // status.nodes: a list-map keyed by name
  api.SeedFile(source_dir + "/deploy/crd-computedomaincliques.yaml");  // daemons: a list-map keyed by nodeName
  const bool cliques = mode == Mode::kSupervisorCliques;
  api.Seed(json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNs}}}});
  for (std::size_t i = 0; i < n; ++i) {
    api.Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-" + std::to_string(i)}}}});
  }
  api.Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                {"kind", "ComputeDomain"},
                {"metadata", {{"name", "train"}, {"namespace", kNs}}},
                {"spec", {{"numNodes", n}, {"channel", {{"resourceClaimTemplate", {{"name", "train-channel"}}}}}}},
                {"_resource", kDomains}});
  const std::string uid = api.Call("GET", kDomains + "/train").Json()["metadata"]["uid"];

  gns::Loop loop;
  gns::SystemClock clock;
  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread thread(loop, pool);
  // The IMEX ports of the domain, held for the run (the daemons bind them with SO_REUSEPORT).
  const gns::test::HeldPort server_port_held;
  const gns::test::HeldPort cmd_port_held;
  const uint16_t server_port = server_port_held.Port();
  const uint16_t cmd_port = cmd_port_held.Port();
  std::vector<std::unique_ptr<Node>> nodes;
  gns::bench::OnLoop(loop, [&] {
    for (std::size_t i = 0; i < n + 1; ++i) {  // the last one runs only the controller
      auto node = std::make_unique<Node>(loop, pool, clock, api, i < n ? "node-" + std::to_string(i) : "controller",
                                         "bench", Quiet());
      node->site.gates.Set(gns::gates::kHostManagedIMEX, false);
      // Nodes and controller agree on where nodes register: status.nodes, or clique objects.
      node->site.gates.Set(gns::gates::kComputeDomainCliques, cliques);
      if (i == n) {
        gns::cd_controller::ComputeDomainControllerModule::Config cc;
        cc.lease.ns = "default";
        cc.lease.lease_name = "bench";
        cc.lease.identity = "controller";
        cc.lease.lease_duration = milliseconds(3000);
        cc.lease.renew_deadline = milliseconds(2000);
        cc.lease.retry_period = milliseconds(500);
        cc.retry.initial = milliseconds(20);
        cc.retry.max = milliseconds(500);
        node->controller = std::make_unique<gns::cd_controller::ComputeDomainControllerModule>(*node->context, cc);
        node->controller->Start();
      } else {
        gns::dra::DriverManagedSettings s;
        s.node_name = node->site.node_name;
        s.state_dir = (dir / node->site.node_name).string();
        s.node_address = "127.0.91." + std::to_string(i + 1);
        s.server_port = server_port;
        s.cmd_port = cmd_port;
        s.ready_wait = milliseconds(0);
        s.cliques = cliques;
        s.daemon.daemon_path = source_dir + "/tools/sim/imex/nvidia-imex";
        s.daemon.ctl_path = source_dir + "/tools/sim/imex/nvidia-imex-ctl";
        s.daemon.probe_interval = milliseconds(100);
        s.daemon.restart.initial = milliseconds(100);
        node->domains = std::make_unique<gns::dra::DriverManagedDomains>(*node->context, s, node->client, node->informers);
        node->domains->SetClique("c0a8f3d2-41b7-4e6a-9d58-2f1e7b3c8a64.1");
      }
      nodes.push_back(std::move(node));
    }
  });
  // The controller leads and has made the workload template before t0.
  gns::test::Eventually([&] { return api.Call("GET", std::string("/apis/resource.k8s.io/v1/namespaces/") + kNs +
                                           "/resourceclaimtemplates/train-channel").status == 200; },
          milliseconds(30000), kPoll);
  const auto ready = [&] {
    const auto d = api.Call("GET", kDomains + "/train").Json();
    return d.value(json::json_pointer("/status/status"), std::string()) == "Ready";
  };
  const gns::dra::ComputeDomainInfo info{uid, kNs, "train"};
  const auto attach = [&](std::size_t i) {
    loop.Post([&, i] {
      nodes[i]->domains->Attach("claim-" + std::to_string(i), kNs, "pod-" + std::to_string(i) + "-channel", info,
                                [](gns::dra::DomainVerdict) {});
    });
  };
  api.ResetRequestCounts();
  RunResult result;
  const auto t0 = Clock::now();
  if (mode != Mode::kDaemonSet) {
    for (std::size_t i = 0; i < n; ++i) attach(i);
  } else {
    // The DaemonSet controller: the DaemonSet, then its pods in slow-start batches; each pod
    // becomes Running and Ready after pod_start (two pod status writes by "its kubelet"), and
    // then does the node-side work.
    api.Call("POST", std::string("/apis/apps/v1/namespaces/") + kNs + "/daemonsets",
             json{{"apiVersion", "apps/v1"}, {"kind", "DaemonSet"}, {"metadata", {{"name", "imex-" + uid}}}}.dump());
    std::vector<std::thread> pods;
    std::size_t created = 0;
    for (std::size_t batch = 1; created < n; batch *= 2) {
      // A batch's creates all answered before the next batch (the controller's slowStartBatch).
      const std::size_t first = created;
      const std::size_t count = std::min(batch, n - created);
      std::atomic<std::size_t> answered{0};
      gns::bench::OnLoop(loop, [&] {
        for (std::size_t k = first; k < first + count; ++k) {
          nodes[n]->client->Create(std::string("/api/v1/namespaces/") + kNs + "/pods",
                                   json{{"apiVersion", "v1"}, {"kind", "Pod"},
                                        {"metadata", {{"name", "imex-" + std::to_string(k)}}}},
                                   [&answered](gns::kube::Result) { ++answered; });
        }
      });
      gns::test::Eventually([&] { return answered.load() == count; }, milliseconds(30000), kPoll);
      for (std::size_t k = 0; k < count; ++k, ++created) {
        const std::string name = "imex-" + std::to_string(created);
        pods.emplace_back([&, created, name] {
          std::this_thread::sleep_for(pod_start);
          for (const char* phase : {"Running", "Ready"}) {
            gns::bench::OnLoop(loop, [&] {
              nodes[n]->client->UpdateStatus(
                  std::string("/api/v1/namespaces/") + kNs + "/pods/" + name,
                  json{{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", name}}},
                       {"status", {{"phase", phase}}}},
                  [](gns::kube::Result) {});
            });
          }
          attach(created);
        });
      }
    }
    for (auto& t : pods) t.join();
  }
  gns::test::Eventually(ready, milliseconds(600000), kPoll);
  result.ready_ms = gns::bench::Ms(Clock::now() - t0);
  uint64_t node_requests = 0;
  gns::bench::OnLoop(loop, [&] {
    for (std::size_t i = 0; i < n; ++i) node_requests += nodes[i]->domains->ApiRequests();
  });
  const auto t1 = Clock::now();
  gns::bench::OnLoop(loop, [&] {
    for (std::size_t i = 0; i < n; ++i) nodes[i]->domains->Detach("claim-" + std::to_string(i), [](std::string) {});
  });
  gns::test::Eventually([&] {
    const auto d = api.Call("GET", kDomains + "/train").Json();
    return d.value(json::json_pointer("/status/nodes"), json::array()).empty();
  }, milliseconds(600000), kPoll);
  result.teardown_ms = gns::bench::Ms(Clock::now() - t1);
  uint64_t all_node_requests = 0;
  gns::bench::OnLoop(loop, [&] {
    for (std::size_t i = 0; i < n; ++i) all_node_requests += nodes[i]->domains->ApiRequests();
  });
  result.node_requests = static_cast<double>(all_node_requests) / static_cast<double>(n);
  result.server_requests = static_cast<double>(api.TotalRequests()) / static_cast<double>(n);
  const auto codes = api.ResponseCounts();
  result.conflicts = codes.count(409) != 0 ? codes.at(409) : 0;
  (void)node_requests;

  bool stopped = false;
  gns::bench::OnLoop(loop, [&] {
    auto left = std::make_shared<std::size_t>(n + 1);
    for (auto& node : nodes) {
      auto done = [&stopped, left] {
        if (--*left == 0) stopped = true;
      };
      if (node->domains) node->domains->Stop(done);
      if (node->controller) node->controller->Stop(done);
    }
  });
  gns::test::Eventually([&] { return stopped; }, milliseconds(30000), kPoll);
  gns::bench::OnLoop(loop, [&] {
    for (auto& node : nodes) {
      node->domains.reset();
      node->controller.reset();
      node->Shutdown();
    }
  });
  thread.Stop();
  nodes.clear();
  api.Stop();
  std::error_code ignored;  // best effort
  fs::remove_all(dir, ignored);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes{2, 8, 32};
  milliseconds pod_start{2000};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--nodes") {
      sizes.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoul(item));
    } else if (flag == "--pod-start-ms") {
      pod_start = milliseconds(std::stol(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: driver_managed_bench [--nodes 2,8,32] [--pod-start-ms 2000]\n");
      return 2;
    }
  }
  const char* source = std::getenv("GNS_SOURCE_DIR");
  const std::string source_dir = source ? source : ".";
  int round = 0;
  std::printf("%-6s %-11s %12s %14s %22s %24s %6s\n", "nodes", "mode", "ready (ms)", "teardown (ms)",
              "API req/node (node)", "API req/node (server)", "409s");
  for (const std::size_t n : sizes) {
    for (const Mode mode : {Mode::kSupervisor, Mode::kSupervisorCliques, Mode::kDaemonSet}) {
      const RunResult r = RunOnce(n, mode, pod_start, source_dir, ++round);
      std::printf("%-6zu %-11s %12.0f %14.0f %22.1f %24.1f %6llu\n", n,
                  mode == Mode::kSupervisor ? "supervisor" : mode == Mode::kSupervisorCliques ? "sup+cliques" : "daemonset",
                  r.ready_ms, r.teardown_ms, r.node_requests,
                  r.server_requests, static_cast<unsigned long long>(r.conflicts));
      std::fflush(stdout);
    }
  }
  return 0;
}
