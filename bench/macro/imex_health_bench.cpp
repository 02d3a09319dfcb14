// Issue #13 figures: the real imex-health module on its own loop thread, sd-bus over a private
// dbus-daemon with tools/sim/systemd's fake systemd, real files under a host root, and the API
// simulator on its own threads.
//  (a) unit goes inactive → the ImexHealthy condition False at the API simulator: StopUnit is
//      sent (blocking sd-bus call from this thread, stamped before the call) and the Node is read
//      from the simulator in process until the condition says ServiceInactive; then StartUnit
//      until True again. Target p99 ≤ 100 ms;
//  (b) idle cost: loop wake-ups of the module (D-Bus fd and inotify, from its own counters) over
//      an idle period with nothing changing, per second; VmRSS / RssAnon of the process.
//
//   imex_health_bench [--rounds N] [--idle-ms N]
#include "support/api_sim.hpp"
#include "bench_util.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/module.hpp"
#include "loop/services.hpp"
#include "modules/imex_health/imex_health_module.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"
#include "support/private_bus.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/null_sink.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

namespace {

long StatusKiB(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::strtol(line.c_str() + std::strlen(key) + 1, nullptr, 10);
  }
  return -1;
}

std::string ConditionStatus(gns::sim::ApiServer& server) {
  const auto node = server.Call("GET", "/api/v1/nodes/node1").Json();
  for (const auto& c : node.value("/status/conditions"_json_pointer, nlohmann::json::array())) {
    if (c.value("type", "") == "ImexHealthy") return c.value("status", "") + "/" + c.value("reason", "");
  }
  return "";
}

// Reads the condition from the simulator until it is `want` (in-process reads, 100 µs apart).
double WaitCondition(gns::sim::ApiServer& server, const std::string& want, Steady::time_point start) {
  const auto limit = start + std::chrono::seconds(10);
  while (ConditionStatus(server) != want) {
    if (Steady::now() > limit) {
      std::fprintf(stderr, "gave up waiting for ImexHealthy %s\n", want.c_str());
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return gns::bench::Ms(Steady::now() - start);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 50;
  int idle_ms = 3000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--idle-ms") == 0) idle_ms = std::atoi(argv[i + 1]);
  }
  if (!gns::test::PrivateBus::Available()) {
    std::fprintf(stderr, "dbus-daemon or gns-fake-systemd missing (set GNS_BINARY_DIR to the build tree)\n");
    return 1;
  }
  char tmpl[] = "/tmp/gnsimexb-XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  const fs::path root = dir / "host";
  fs::create_directories(root / "proc");
  fs::create_directories(root / "etc/nvidia-imex");
  fs::create_directories(root / "dev/nvidia-caps-imex-channels");
  std::ofstream(root / "proc/devices") << "Character devices:\n234 nvidia-caps-imex-channels\n";
  std::ofstream(root / "etc/nvidia-imex/config.cfg") << "IMEX_CMD_PORT=50005\n";
  std::ofstream(root / "etc/nvidia-imex/nodes_config.cfg") << "10.0.0.1\n10.0.0.2\n";
  std::ofstream(root / "dev/nvidia-caps-imex-channels/channel0") << "";
  {
    gns::test::PrivateBus bus(dir.string());
    bus.StartBus();
    bus.StartSystemd({"nvidia-imex.service"});
    gns::test::ApiSim server(dir / "api");
    server.Seed(nlohmann::json{{"apiVersion", "v1"},
                               {"kind", "Node"},
                               {"metadata", {{"name", "node1"}}},
                               {"status", {{"addresses", {{{"type", "InternalIP"}, {"address", "10.0.0.1"}}}}}}});

    gns::Loop loop;
    gns::SystemClock clock;
    gns::Bus bus_(loop);
    gns::MetricsRegistry metrics;
    gns::Services services;
    gns::SiteConfig site;
    site.node_name = "node1";
    site.paths.host_root = root.string();
    gns::BlockingPool pool(loop, 2);
    gns::bench::LoopThread loop_thread(loop, pool);
    const gns::RuntimeParts parts{loop, bus_, pool, clock, site, metrics, services};
    auto log = std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
    std::shared_ptr<gns::kube::KubeClient> client;
    std::shared_ptr<gns::kube::InformerRegistry> informers;
    std::unique_ptr<gns::ModuleContext> context;
    std::unique_ptr<gns::imex_health::ImexHealthModule> module;
    gns::bench::OnLoop(loop, [&] {
      gns::kube::ClientConfig config = server.ClientConfig();
      client = std::make_shared<gns::kube::KubeClient>(gns::kube::KubeClient::Deps{loop, clock, metrics, log}, config);
      informers = std::make_shared<gns::kube::InformerRegistry>(client, bus_, loop.Io(), metrics, log);
      services.Provide<gns::kube::KubeClient>(client);
      services.Provide<gns::kube::InformerRegistry>(informers);
      context = std::make_unique<gns::ModuleContext>(parts, "imex-health", [](std::string) {},
                                                      [](gns::ModuleHealth, std::string) {});
      const auto yaml = gns::ParseYaml("busAddress: " + bus.Address() + "\nresolvePeers: false\n", "bench.yaml");
      gns::ConfigMap section(yaml, "modules.imex-health");
      module = std::make_unique<gns::imex_health::ImexHealthModule>(
          *context, gns::imex_health::ImexHealthModule::ParseConfig(section, site));
      module->Start();
    });
    WaitCondition(server, "True/ImexHealthy", Steady::now());

    std::vector<double> down, up;
    for (int i = 0; i < rounds; ++i) {
      auto start = Steady::now();
      if (const auto e = bus.ManagerCall("StopUnit", "nvidia-imex.service"); !e.empty()) {
        std::fprintf(stderr, "StopUnit: %s\n", e.c_str());
        return 1;
      }
      down.push_back(WaitCondition(server, "False/ServiceInactive", start));
      start = Steady::now();
      bus.ManagerCall("StartUnit", "nvidia-imex.service");
      up.push_back(WaitCondition(server, "True/ImexHealthy", start));
    }
    gns::bench::Report("unit stopped -> ImexHealthy False at the API simulator", down);
    gns::bench::Report("unit started -> ImexHealthy True at the API simulator", up);

    // Idle: nothing changes; count the module's wake-ups.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto wakeups = [&] {
      double total = 0;
      gns::bench::OnLoop(loop, [&] {
        const auto text = metrics.Render();
        std::size_t pos = 0;
        while ((pos = text.find("gpu_node_supervisor_imex_wakeups_total{", pos)) != std::string::npos) {
          const auto end = text.find('\n', pos);
          total += std::strtod(text.c_str() + text.rfind(' ', end) + 1, nullptr);
          pos = end;
        }
      });
      return total;
    };
    const double before = wakeups();
    std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
    const double after = wakeups();
    std::printf("idle: %.0f wake-ups in %d ms (%.2f/s); VmRSS %.1f MiB, RssAnon %.1f MiB (whole bench process)\n",
                after - before, idle_ms, (after - before) * 1000.0 / idle_ms, StatusKiB("VmRSS") / 1024.0,
                StatusKiB("RssAnon") / 1024.0);

    gns::bench::OnLoop(loop, [&] {
      module->Stop([] {});
      module.reset();
      context.reset();
      services.Withdraw<gns::kube::KubeClient>();
      services.Withdraw<gns::kube::InformerRegistry>();
      informers->StopAll();
      client->Shutdown();
    });
    loop_thread.Stop();
    server.Stop();
  }
  fs::remove_all(dir);
  return 0;
}
