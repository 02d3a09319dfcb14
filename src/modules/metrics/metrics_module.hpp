#pragma once
// The `metrics` module: serves /metrics (Prometheus text), /healthz (the loop is turning),
// /readyz (every enabled module running) and /debug/state (every retained bus topic as JSON).
// /debug/state shows GPU UUIDs, claims and pods: it never leaves the node by default. It is
// served on `listen` only when that is a loopback address; otherwise on `debugListen`
// (default 127.0.0.1:9465; "" turns it off), as node exporters keep their debug pages.
// `gpuMetrics` adds the per-pod GPU series under dcgm-exporter's names (gpu_metrics_exporter.hpp)
// to /metrics, and optionally serves them on a listener of their own.

#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"
#include "modules/metrics/gpu_metrics_exporter.hpp"

#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace gns::metrics {

class HttpServer;
struct HttpRequest;
struct HttpResponse;

class MetricsModule final : public Module {
 public:
  static constexpr std::string_view kName = "metrics";
  static constexpr std::string_view kSummary = "HTTP /metrics, /healthz, /readyz and /debug/state";

  struct Config {
    boost::asio::ip::tcp::endpoint listen;
    // /debug/state's own listener, used when `listen` is not a loopback address; nullopt: none.
    std::optional<boost::asio::ip::tcp::endpoint> debug_listen;
    std::chrono::milliseconds read_timeout{10000};
    std::size_t max_connections = 64;
    // /healthz fails when the loop's heartbeat is this late: older than its interval plus this.
    std::chrono::milliseconds max_heartbeat_age{10000};
    GpuMetricsSettings gpu_metrics;
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  MetricsModule(ModuleContext& context, const Config& config);
  ~MetricsModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  HttpResponse Handle(const HttpRequest& request, bool main);
  bool DebugOnMain() const;
  HttpResponse Metrics();
  HttpResponse Healthz();
  HttpResponse Readyz();
  HttpResponse DebugState();

  ModuleContext& context_;
  Config config_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<HttpServer> debug_server_;  // /debug/state on loopback, when `listen` is not
  std::string debug_address_;                 // where /debug/state is served ("" nowhere)
  std::optional<ModuleStates> module_states_;
  std::unique_ptr<GpuMetricsExporter> gpu_metrics_;
  MetricsRegistry::CollectorHandle process_collector_;
  Subscription module_states_sub_;
};

// "127.0.0.1:9464", "[::1]:9464", "0.0.0.0:0", ":9400" (every IPv4 address); nullopt if malformed.
std::optional<boost::asio::ip::tcp::endpoint> ParseListenAddress(const std::string& text);

}  // namespace gns::metrics
