// The reactor and its process-level duties.
#include "loop/runtime.hpp"

#include "loop/atomic_file.hpp"
#include "loop/logging.hpp"
#include "loop/wake_grid.hpp"

#include <sys/stat.h>

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace gns {

void IgnoreSigpipe() {
  // Children get their default dispositions back before exec (run_command, child_process).
  std::signal(SIGPIPE, SIG_IGN);
}

std::string RaiseOpenFileLimit(unsigned long minimum) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno);
  const auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  if (limit.rlim_cur != limit.rlim_max) {
    const rlim_t was = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      limit.rlim_cur = was;  // keep going with what we have; judged below
    }
  }
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < minimum) {
    return "the open-file limit is " + text(limit.rlim_cur) + " (hard limit " + text(limit.rlim_max) +
           "); gpu-node-supervisor needs at least " + std::to_string(minimum) +
           " (sockets, gRPC, the journal, inotify): raise it (ulimit -n, LimitNOFILE=, the container runtime's "
           "nofile)";
  }
  return {};
}

Runtime::Runtime(LoadedConfig config)
    : config_(std::move(config)),
      pool_(loop_, config_.runtime.blocking_threads),
      signals_(loop_.Io(), SIGINT, SIGTERM, SIGHUP),
      heartbeat_timer_(loop_.Io()),
      watchdog_timer_(loop_.Io()) {
  // Their default action would end the process without a word.
  signals_.add(SIGUSR1);
  signals_.add(SIGUSR2);
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
  PrepareStateDirectory();
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

void Runtime::PrepareStateDirectory() {
  // Ours alone, whatever the umask: a local user must not plant files in it or replace the admin
  // sockets the root CLI talks to. Modules create what is inside with their own explicit modes.
  const auto& dir = config_.site.paths.state_dir;
  if (dir.empty()) return;
  std::string error;
  if (!EnsureDirectory(dir, 0700, error)) {
    spdlog::error("state directory: {}", error);  // the modules that need it fail and say so
    return;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0022) != 0) {
    // Made writable for others by an earlier run under a loose umask: take it back.
    const mode_t tightened = st.st_mode & 07755 & ~static_cast<mode_t>(0022);
    if (::chmod(dir.c_str(), tightened) == 0) {
      spdlog::warn("state directory {} was writable by others (mode {:o}); made it {:o}", dir, st.st_mode & 07777,
                   tightened);
    } else {
      spdlog::error("state directory {} is writable by others and chmod failed: {}", dir, std::strerror(errno));
    }
  }
}

void Runtime::RequestStop() {
  loop_.Post([this] { BeginStop("stop requested"); });
}

void Runtime::OnSignal(int signal) {
  if (signal == SIGHUP || signal == SIGUSR1 || signal == SIGUSR2) {
    // Nothing to re-read or reopen: the config is read at start (a change needs a restart, as
    // the DaemonSet's rollout does), logs go to stderr.
    spdlog::info("{} received: ignored (the config is read at start only; restart to apply a change)",
                 signal == SIGHUP ? "SIGHUP" : signal == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
    signals_.async_wait([this](const boost::system::error_code& ec, int next) {
      if (!ec) OnSignal(next);
    });
    return;
  }
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
  if (heartbeat_->next_tick_ != Clock::SteadyTime{}) {
    const auto lag = std::chrono::duration_cast<std::chrono::microseconds>(now - heartbeat_->next_tick_);
    heartbeat_->last_lag_ = std::max(lag, std::chrono::microseconds(0));
    heartbeat_->max_lag_ = std::max(heartbeat_->max_lag_, heartbeat_->last_lag_);
  }
  heartbeat_->last_tick_ = now;
  // On the wake grid: the lease renewal, the polled checks and gpu-inventory's refresh snap to the
  // same points, so at rest they share this wake-up instead of each taking one.
  heartbeat_->next_tick_ = SnapToWakeGrid(now + config_.runtime.heartbeat_interval, config_.runtime.heartbeat_interval);
  heartbeat_timer_.expires_after(heartbeat_->next_tick_ - now);
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
