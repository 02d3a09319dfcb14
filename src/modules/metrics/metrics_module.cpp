// The metrics module.
#include "modules/metrics/metrics_module.hpp"

#include "loop/runtime.hpp"
#include "modules/metrics/http_server.hpp"
#include "modules/metrics/messages.hpp"
#include "modules/metrics/process_stats.hpp"

#include <unistd.h>

#include <charconv>

namespace gns::metrics {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

std::string FormatEndpoint(const tcp::endpoint& endpoint) {
  const auto& a = endpoint.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(endpoint.port());
}

}  // namespace

std::optional<tcp::endpoint> ParseListenAddress(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) return std::nullopt;
  std::string host = text.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || ptr != last || port > 65535) return std::nullopt;
  boost::system::error_code addr_ec;
  const auto address = asio::ip::make_address(host, addr_ec);
  if (addr_ec) return std::nullopt;
  return tcp::endpoint(address, static_cast<unsigned short>(port));
}

MetricsModule::Config MetricsModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  using std::chrono::milliseconds;
  Config config;  // its members hold the defaults
  // `address` is the newer name of `listen`; one of them, not both.
  const bool has_address = section.Has("address");
  if (has_address && section.Has("listen")) section.Fail("address", "set `address` or `listen`, not both");
  const char* listen_key = has_address ? "address" : "listen";
  const std::string listen = section.String(listen_key, "0.0.0.0:9464");
  const auto endpoint = ParseListenAddress(listen);
  if (!endpoint) section.Fail(listen_key, "expected IP:PORT (e.g. 0.0.0.0:9464 or [::1]:9464), got \"" + listen + "\"");
  config.listen = *endpoint;
  const std::string debug = section.String("debugListen", "127.0.0.1:9465");
  if (!debug.empty()) {
    const auto debug_endpoint = ParseListenAddress(debug);
    if (!debug_endpoint) {
      section.Fail("debugListen", "expected IP:PORT (e.g. 127.0.0.1:9465) or \"\" for none, got \"" + debug + "\"");
    }
    config.debug_listen = *debug_endpoint;
  }
  config.read_timeout = section.Duration("readTimeout", milliseconds(100), milliseconds(300000), config.read_timeout);
  config.max_connections = static_cast<std::size_t>(
      section.Int("maxConnections", 1, 4096, static_cast<int64_t>(config.max_connections)));
  config.max_heartbeat_age =
      section.Duration("maxHeartbeatAge", milliseconds(1000), milliseconds(600000), config.max_heartbeat_age);
  {
    ConfigMap gpu = section.Section("gpuMetrics");
    GpuMetricsSettings& g = config.gpu_metrics;
    g.enabled = gpu.Bool("enabled", g.enabled);
    g.interval = gpu.Duration("interval", milliseconds(1000), milliseconds(3600000), g.interval);
    const std::string gpu_listen = gpu.String("listen", "");
    if (!gpu_listen.empty()) {
      g.listen = ParseListenAddress(gpu_listen);
      if (!g.listen) {
        gpu.Fail("listen", "expected [IP]:PORT (e.g. \":9400\", dcgm-exporter's port) or \"\" for none, got \"" +
                               gpu_listen + "\"");
      }
    }
    gpu.Finish();
    // dcgm-exporter labels with the node's name (NODE_NAME in its DaemonSet), else the hostname.
    g.hostname = site.node_name;
    if (g.hostname.empty()) {
      char name[256] = {};
      if (gethostname(name, sizeof name - 1) == 0) g.hostname = name;
    }
    g.read_timeout = config.read_timeout;
  }
  return config;
}

MetricsModule::MetricsModule(ModuleContext& context, const Config& config) : context_(context), config_(config) {}

MetricsModule::~MetricsModule() = default;

void MetricsModule::Start() {
  HttpServerOptions options;
  options.listen = config_.listen;
  options.read_timeout = config_.read_timeout;
  options.max_connections = config_.max_connections;
  server_ = std::make_unique<HttpServer>(context_.GetLoop().Io(), context_.GetClock(), options,
                                         [this](const HttpRequest& r) { return Handle(r, true); }, context_.Logger());
  const auto bound = server_->Start();  // throws if the port is taken: the supervisor retries
  debug_address_.clear();
  if (DebugOnMain()) {
    debug_address_ = FormatEndpoint(bound);
  } else if (config_.debug_listen) {
    HttpServerOptions debug_options = options;
    debug_options.listen = *config_.debug_listen;
    debug_options.max_connections = 8;
    debug_server_ = std::make_unique<HttpServer>(context_.GetLoop().Io(), context_.GetClock(), debug_options,
                                                 [this](const HttpRequest& r) { return Handle(r, false); },
                                                 context_.Logger());
    try {
      debug_address_ = FormatEndpoint(debug_server_->Start());
    } catch (const std::exception& e) {
      // A debugging aid: its port taken must not take /metrics and the probes down with it.
      context_.Log().error("cannot serve /debug/state on {}: {}; it is not served", FormatEndpoint(*config_.debug_listen),
                           e.what());
      debug_server_.reset();
    }
  }

  module_states_sub_ =
      context_.GetBus().Subscribe<ModuleStates>([this](const ModuleStates& states) { module_states_ = states; });

  process_collector_ = context_.Metrics().AddCollector([this](MetricsWriter& w) {
    const auto stats = ReadProcessStats();
    w.Sample("gpu_node_supervisor_process_resident_memory_bytes", MetricType::kGauge, "Resident set size (VmRSS)",
             {}, static_cast<double>(stats.vm_rss_bytes));
    w.Sample("gpu_node_supervisor_process_anon_memory_bytes", MetricType::kGauge,
             "Private anonymous resident memory (RssAnon)", {}, static_cast<double>(stats.rss_anon_bytes));
    w.Sample("gpu_node_supervisor_process_cpu_seconds_total", MetricType::kCounter, "User + system CPU time", {},
             stats.cpu_seconds);
    w.Sample("gpu_node_supervisor_process_open_fds", MetricType::kGauge, "Open file descriptors", {},
             static_cast<double>(stats.open_fds));
    w.Sample("gpu_node_supervisor_process_threads", MetricType::kGauge, "Threads", {},
             static_cast<double>(stats.threads));
    if (server_) {
      w.Sample("gpu_node_supervisor_http_connections_evicted_total", MetricType::kCounter,
               "Connections waiting for a request closed to make room for a new client at the cap", {},
               static_cast<double>(server_->Evicted()));
      w.Sample("gpu_node_supervisor_http_connections_refused_total", MetricType::kCounter,
               "New clients refused at the connection cap with every connection busy", {},
               static_cast<double>(server_->Refused()));
    }
  });

  if (config_.gpu_metrics.enabled) {
    gpu_metrics_ = std::make_unique<GpuMetricsExporter>(context_, config_.gpu_metrics);
    gpu_metrics_->Start();
  }

  const std::string address = FormatEndpoint(bound);
  context_.GetBus().Publish(
      MetricsEndpoint{address, debug_address_, gpu_metrics_ ? gpu_metrics_->ListenAddress() : std::string()});
  context_.Log().info("serving /metrics /healthz /readyz on http://{}; /debug/state {}", address,
                      debug_address_.empty() ? std::string("nowhere") : "on http://" + debug_address_);
}

bool MetricsModule::DebugOnMain() const { return config_.listen.address().is_loopback(); }

void MetricsModule::Stop(std::function<void()> done) {
  process_collector_.Reset();
  module_states_sub_.Reset();
  // Every listener closed and its connections gone, then `done`.
  const int parts = (server_ ? 1 : 0) + (debug_server_ ? 1 : 0) + (gpu_metrics_ ? 1 : 0);
  if (parts == 0) {
    done();
    return;
  }
  auto left = std::make_shared<int>(parts);
  auto one_stopped = [left, done = std::make_shared<std::function<void()>>(std::move(done))] {
    if (--*left == 0) (*done)();
  };
  if (gpu_metrics_) gpu_metrics_->Stop(one_stopped);
  if (debug_server_) debug_server_->Stop(one_stopped);
  if (server_) server_->Stop(one_stopped);
}

HttpResponse MetricsModule::Handle(const HttpRequest& request, bool main) {
  using Endpoint = HttpResponse (MetricsModule::*)();
  static const std::pair<std::string_view, Endpoint> kEndpoints[] = {
      {"/metrics", &MetricsModule::Metrics},
      {"/healthz", &MetricsModule::Healthz},
      {"/readyz", &MetricsModule::Readyz},
      {"/debug/state", &MetricsModule::DebugState},
  };
  const bool debug = request.path == "/debug/state";
  if (main && debug && !DebugOnMain()) {
    HttpResponse r;
    r.status = 404;
    r.body = debug_address_.empty() ? "not found: /debug/state is not served (metrics.debugListen is empty)\n"
                                    : "not found: /debug/state is served on the node's loopback only, at http://" +
                                          debug_address_ + "/debug/state\n";
    return r;
  }
  if (!main && !debug) {
    HttpResponse r;
    r.status = 404;
    r.body = "not found; this listener serves /debug/state only\n";
    return r;
  }
  for (const auto& [path, endpoint] : kEndpoints) {
    if (request.path != path) continue;
    if (request.method != "GET" && request.method != "HEAD") {
      HttpResponse r;
      r.status = 405;
      r.body = "method not allowed\n";
      r.headers["Allow"] = "GET, HEAD";
      return r;
    }
    return (this->*endpoint)();
  }
  HttpResponse r;
  r.status = 404;
  r.body = "not found; try /metrics, /healthz, /readyz or /debug/state\n";
  return r;
}

HttpResponse MetricsModule::Metrics() {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = context_.Metrics().Render();
  return r;
}

HttpResponse MetricsModule::Healthz() {
  HttpResponse r;
  const auto heartbeat = context_.GetServices().Find<LoopHeartbeat>();
  if (heartbeat && heartbeat->LastTick() != Clock::SteadyTime{}) {
    // The heartbeat ticks every Interval(): only what comes on top of that is lateness.
    const auto age = context_.GetClock().Now() - heartbeat->LastTick();
    if (age > heartbeat->Interval() + config_.max_heartbeat_age) {
      r.status = 503;
      r.body = "loop heartbeat is " +
               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(age).count()) + " ms old\n";
      return r;
    }
  }
  r.body = "ok\n";
  return r;
}

HttpResponse MetricsModule::Readyz() {
  HttpResponse r;
  if (!module_states_) {
    r.status = 503;
    r.body = "starting\n";
    return r;
  }
  const auto not_ready = module_states_->NotReady();
  if (not_ready.empty()) {
    r.body = "ok\n";
    return r;
  }
  r.status = 503;
  r.body = "not ready:\n";
  for (const auto* m : not_ready) {
    r.body += "  " + m->name + ": " + std::string(ToString(m->state)) + ", " + std::string(ToString(m->health));
    if (!m->detail.empty()) r.body += " (" + m->detail + ")";
    r.body += "\n";
  }
  return r;
}

HttpResponse MetricsModule::DebugState() {
  HttpResponse r;
  r.content_type = "application/json";
  r.body = context_.GetBus().RetainedState().dump(2) + "\n";
  return r;
}

}  // namespace gns::metrics
