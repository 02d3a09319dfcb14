#pragma once
// The `metrics` module: serves /metrics (Prometheus text), /healthz (the loop is turning),
// /readyz (every enabled module running) and /debug/state (every retained bus topic as JSON).

#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"

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
    std::chrono::milliseconds read_timeout{10000};
    std::size_t max_connections = 64;
    // /healthz fails when the loop's heartbeat is this late: older than its interval plus this.
    std::chrono::milliseconds max_heartbeat_age{10000};
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  MetricsModule(ModuleContext& context, const Config& config);
  ~MetricsModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  HttpResponse Handle(const HttpRequest& request);
  HttpResponse Metrics();
  HttpResponse Healthz();
  HttpResponse Readyz();
  HttpResponse DebugState();

  ModuleContext& context_;
  Config config_;
  std::unique_ptr<HttpServer> server_;
  std::optional<ModuleStates> module_states_;
  MetricsRegistry::CollectorHandle process_collector_;
  Subscription module_states_sub_;
};

// "127.0.0.1:9464", "[::1]:9464", "0.0.0.0:0"; nullopt if malformed.
std::optional<boost::asio::ip::tcp::endpoint> ParseListenAddress(const std::string& text);

}  // namespace gns::metrics
