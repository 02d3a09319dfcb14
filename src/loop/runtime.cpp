// The reactor and its process-level duties.
#include "loop/runtime.hpp"

#include "loop/atomic_file.hpp"
#include "loop/logging.hpp"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <csignal>
#include <cstdlib>
#include <unistd.h>

namespace gns {

Runtime::Runtime(LoadedConfig config)
    : config_(std::move(config)),
      pool_(loop_, config_.runtime.blocking_threads),
      signals_(loop_.Io(), SIGINT, SIGTERM),
      heartbeat_timer_(loop_.Io()),
      watchdog_timer_(loop_.Io()) {
  services_.Provide<LoopHeartbeat>(heartbeat_);
  supervisor_ = std::make_unique<Supervisor>(
      RuntimeParts{loop_, bus_, pool_, clock_, config_.site, metrics_, services_}, config_.runtime.supervisor,
      std::move(config_.modules));
  RegisterRuntimeMetrics();
}

Runtime::~Runtime() {
  supervisor_.reset();
  pool_.Join();
}

void Runtime::RegisterRuntimeMetrics() {
  loop_exceptions_ = &metrics_.Counter("gpu_node_supervisor_loop_exceptions_total",
                                       "Exceptions that escaped a handler on the loop");
  runtime_collector_ = metrics_.AddCollector([this](MetricsWriter& w) {
    for (const auto& topic : bus_.Topics()) {
      const MetricLabels labels{{"topic", std::string(topic.name)}};
      w.Sample("gpu_node_supervisor_bus_published_total", MetricType::kCounter, "Messages published on the bus",
               labels, static_cast<double>(topic.counters.published));
      w.Sample("gpu_node_supervisor_bus_delivered_total", MetricType::kCounter,
               "Handler invocations that completed", labels, static_cast<double>(topic.counters.delivered));
      w.Sample("gpu_node_supervisor_bus_handler_errors_total", MetricType::kCounter, "Handlers that threw",
               labels, static_cast<double>(topic.counters.handler_errors));
      w.Sample("gpu_node_supervisor_bus_subscribers", MetricType::kGauge, "Active subscriptions", labels,
               static_cast<double>(topic.subscribers));
    }
    w.Sample("gpu_node_supervisor_loop_lag_seconds", MetricType::kGauge,
             "How late the last heartbeat timer fired", {},
             static_cast<double>(heartbeat_->LastLag().count()) / 1e6);
    w.Sample("gpu_node_supervisor_loop_lag_max_seconds", MetricType::kGauge,
             "Largest heartbeat lag since start", {}, static_cast<double>(heartbeat_->MaxLag().count()) / 1e6);
  });
}

int Runtime::Run() {
  loop_.BindToCurrentThread();
  heartbeat_->started_at_ = clock_.WallNow();
  heartbeat_->interval_ = config_.runtime.heartbeat_interval;
  for (const auto& line : config_.gate_overrides) spdlog::info("{}", line);
  for (const auto& [name, value] : config_.site.gates.Values()) {
    spdlog::info("feature gate {}={}", name, value ? "true" : "false");
  }
  RemoveInterruptedStateWrites();

  signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (!ec) OnSignal(signal);
  });
  loop_.Post([this] {
    supervisor_->StartAll();
    // READY once every module had its first start (failed ones are retrying in backoff).
    sd_notify(0, "READY=1");
    spdlog::info("supervisor ready on node {}", config_.site.node_name);
  });
  Heartbeat();
  ArmWatchdog();

  for (;;) {
    try {
      loop_.Io().run();
      break;
    } catch (const std::exception& e) {
      loop_exceptions_->Inc();
      spdlog::error("exception escaped a loop handler: {}", e.what());
    }
  }
  return exit_code_;
}

void Runtime::RemoveInterruptedStateWrites() {
  // stateDir is ours alone: every "<name>.tmp.<pid>.<n>" there is a write of an earlier run that
  // a crash interrupted. Before any module starts, so no write of this run is in flight. (The
  // shared CDI directory is swept by the module that owns its files, for its own names only.)
  const auto& dir = config_.site.paths.state_dir;
  if (dir.empty()) return;
  const auto sweep = RemoveInterruptedWrites(dir, true, [](std::string_view) { return true; });
  for (const auto& path : sweep.removed) spdlog::info("removed {}, left by an interrupted write", path);
  for (const auto& error : sweep.errors) spdlog::warn("cleaning {}: {}", dir, error);
}

void Runtime::RequestStop() {
  loop_.Post([this] { BeginStop("stop requested"); });
}

void Runtime::OnSignal(int signal) {
  if (stopping_) {
    spdlog::error("second signal ({}): stopping hard", signal);
    spdlog::default_logger()->flush();
    std::_Exit(kExitHardStop);
  }
  BeginStop(signal == SIGTERM ? "SIGTERM" : "SIGINT");
  signals_.async_wait([this](const boost::system::error_code& ec, int next) {
    if (!ec) OnSignal(next);
  });
}

void Runtime::BeginStop(const char* why) {
  if (stopping_) return;
  stopping_ = true;
  spdlog::info("{}: stopping modules in reverse start order", why);
  sd_notify(0, "STOPPING=1");
  supervisor_->StopAll([this](bool graceful) {
    if (!graceful) {
      spdlog::error("a module missed its stop deadline: stopping hard");
      spdlog::default_logger()->flush();
      std::_Exit(kExitHardStop);
    }
    spdlog::info("all modules stopped");
    heartbeat_timer_.cancel();
    watchdog_timer_.cancel();
    signals_.cancel();
    loop_.Io().stop();
  });
}

void Runtime::Heartbeat() {
  const auto now = clock_.Now();
  if (heartbeat_->last_tick_ != Clock::SteadyTime{}) {
    const auto expected = heartbeat_->last_tick_ + config_.runtime.heartbeat_interval;
    const auto lag = std::chrono::duration_cast<std::chrono::microseconds>(now - expected);
    heartbeat_->last_lag_ = std::max(lag, std::chrono::microseconds(0));
    heartbeat_->max_lag_ = std::max(heartbeat_->max_lag_, heartbeat_->last_lag_);
  }
  heartbeat_->last_tick_ = now;
  heartbeat_timer_.expires_after(config_.runtime.heartbeat_interval);
  heartbeat_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Heartbeat();
  });
}

void Runtime::ArmWatchdog() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  // Ping at half the interval, from the loop itself: a stuck loop stops the pings.
  watchdog_interval_ = std::chrono::microseconds(usec / 2);
  sd_notify(0, "WATCHDOG=1");
  watchdog_timer_.expires_after(watchdog_interval_);
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) ArmWatchdog();
  });
}

}  // namespace gns
