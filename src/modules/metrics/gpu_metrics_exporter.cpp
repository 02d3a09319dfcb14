// The metrics module's gpuMetrics (see gpu_metrics_exporter.hpp).
#include "modules/metrics/gpu_metrics_exporter.hpp"

#include "loop/wake_grid.hpp"

#include "modules/metrics/dcgm_series.hpp"
#include "modules/metrics/http_server.hpp"

#include <utility>

namespace gns::metrics {

namespace inv = gns::gpu_inventory;
namespace pr = gns::pod_resources;

GpuMetricsExporter::GpuMetricsExporter(ModuleContext& context, GpuMetricsSettings settings)
    : context_(context),
      settings_(std::move(settings)),
      timer_(context.GetLoop().Io()),
      passes_(&context.Metrics().Counter("gpu_node_supervisor_gpu_metrics_passes_total",
                                         "Usage passes over every GPU for the DCGM_FI_* series (gpuMetrics)")),
      failed_passes_(&context.Metrics().Counter(
          "gpu_node_supervisor_gpu_metrics_failed_passes_total",
          "Usage passes that gave nothing (NVML unavailable or hung, no gpu-inventory): the DCGM_FI_* series are dropped")),
      series_(&context.Metrics().Gauge("gpu_node_supervisor_gpu_metrics_series",
                                       "DCGM_FI_* series served now (one per device, value and holding container)")),
      pass_seconds_(&context.Metrics().Gauge("gpu_node_supervisor_gpu_metrics_pass_seconds",
                                             "Wall time of the last usage pass on the blocking pool")) {}

GpuMetricsExporter::~GpuMetricsExporter() { lifetime_.Close(); }

void GpuMetricsExporter::Start() {
  auto& bus = context_.GetBus();
  inventory_sub_ = bus.Subscribe<inv::GpuInventory>([this](const inv::GpuInventory& inventory) {
    inventory_ = inventory;
    Rebuild();
    // NVML came (back): read now rather than an interval after the pass that found it missing.
    if (inventory.available && !sample_) RequestPass();
  });
  pods_sub_ = bus.Subscribe<pr::GpuPodMap>([this](const pr::GpuPodMap& pods) {
    pods_ = pods;
    Rebuild();
  });
  xid_sub_ = bus.Subscribe<inv::XidObservation>([this](const inv::XidObservation& xid) {
    last_xid_[xid.uuid] = xid.xid;
    Rebuild();
  });
  // The scrape copies the text rendered on the last change: nothing else runs at scrape time.
  families_ = context_.Metrics().AddForeignFamilies(kDcgmPrefix, [this](std::string& out) { out += text_; });
  if (settings_.listen) {
    HttpServerOptions options;
    options.listen = *settings_.listen;
    options.read_timeout = settings_.read_timeout;
    options.max_connections = 16;
    server_ = std::make_unique<HttpServer>(
        context_.GetLoop().Io(), context_.GetClock(), options,
        [this](const HttpRequest& request) {
          HttpResponse response;
          if (request.path != "/metrics") {
            response.status = 404;
            response.body = "only /metrics is served here\n";
            return response;
          }
          response.content_type = "text/plain; version=0.0.4; charset=utf-8";
          response.body = text_;
          return response;
        },
        context_.Logger());
    const auto bound = server_->Start();  // throws if taken: the supervisor restarts the module
    const auto& a = bound.address();
    listen_address_ = (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(bound.port());
    context_.Log().info("gpuMetrics: DCGM_FI_* series also on http://{}/metrics", listen_address_);
  }
  RequestPass();
}

void GpuMetricsExporter::Stop(std::function<void()> done) {
  lifetime_.Renew();  // a pass answered after this is dropped
  timer_.cancel();
  families_.Reset();
  inventory_sub_ = {};
  pods_sub_ = {};
  xid_sub_ = {};
  if (!server_) {
    done();
    return;
  }
  server_->Stop([done = std::move(done)] { done(); });
}

void GpuMetricsExporter::RequestPass() {
  if (pass_in_flight_) return;  // gpu-inventory answers every request; never two of ours at once
  const auto sampler = context_.GetServices().Find<inv::GpuHealthSampler>();
  if (!sampler) {
    inv::HealthSample none;
    none.error = "no GpuHealthSampler: gpu-inventory is not running";
    OnPass(std::move(none));
    return;
  }
  pass_in_flight_ = true;
  sampler->Sample(kGroups, lifetime_.Guard([this](inv::HealthSample sample) {
    pass_in_flight_ = false;
    OnPass(std::move(sample));
  }));
}

void GpuMetricsExporter::ScheduleNext() {
  // On the loop's wake grid (src/loop/wake_grid.hpp): at rest the pass shares a wake-up.
  const auto now = context_.GetClock().Now();
  timer_.expires_after(SnapToWakeGrid(now + settings_.interval, settings_.interval) - now);
  timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (!ec) RequestPass();
  }));
}

void GpuMetricsExporter::OnPass(inv::HealthSample sample) {
  if (sample.ok) {
    passes_->Inc();
    pass_seconds_->Set(static_cast<double>(sample.pass_micros) / 1e6);
    last_failure_.clear();
    served_ = true;
    sample_ = std::move(sample);
  } else {
    failed_passes_->Inc();
    if (sample.error != last_failure_) {
      // Before the first good pass this is the start order (gpu-inventory opens NVML after us).
      context_.Log().log(served_ ? spdlog::level::warn : spdlog::level::info,
                         "gpuMetrics: no GPU usage this pass ({}): no DCGM_FI_* series until one works", sample.error);
      last_failure_ = sample.error;
    }
    sample_.reset();  // fail safe: no stale values under live labels
  }
  Rebuild();
  ScheduleNext();
}

void GpuMetricsExporter::Rebuild() {
  DcgmInputs inputs;
  inputs.hostname = settings_.hostname;
  inputs.sample = sample_ ? &*sample_ : nullptr;
  inputs.inventory = inventory_ ? &*inventory_ : nullptr;
  inputs.pods = pods_ ? &*pods_ : nullptr;
  inputs.last_xid = &last_xid_;
  text_ = RenderDcgmFamilies(inputs);
  series_->Set(static_cast<double>(CountSeries(text_)));
}

}  // namespace gns::metrics
