#pragma once
// The reactor: one io_context on the calling thread, the bus, the blocking pool, the metrics
// registry and the supervisor. At start it removes the temp files that interrupted atomic writes
// left in stateDir and creates stateDir 0700 (whatever the umask). Handles SIGTERM/SIGINT
// (graceful stop in reverse start order; a second signal or a missed stop deadline stops hard);
// SIGHUP, SIGUSR1 and SIGUSR2 are logged and otherwise ignored (the config is read at start
// only; logs go to stderr, nothing to reopen). Speaks sd_notify (READY=1, STOPPING=1,
// WATCHDOG=1) when NOTIFY_SOCKET is set.

#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "loop/site_loader.hpp"
#include "loop/supervisor.hpp"

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

namespace gns {

// Process set-up before any thread starts (main): SIGPIPE ignored (a log reader or a peer that
// went away is an EPIPE where it happens, not the end of the process).
void IgnoreSigpipe();

// The descriptor limit: the soft limit raised to the hard one; "" when at least `minimum` is
// then open-able, else a message saying what the limits are and what to do.
inline constexpr unsigned long kMinOpenFiles = 1024;
std::string RaiseOpenFileLimit(unsigned long minimum = kMinOpenFiles);

// Offered to modules as a service: is the loop turning, and how late do timers fire.
class LoopHeartbeat {
 public:
  Clock::SteadyTime LastTick() const { return last_tick_; }
  std::chrono::microseconds LastLag() const { return last_lag_; }
  std::chrono::microseconds MaxLag() const { return max_lag_; }
  Clock::WallTime StartedAt() const { return started_at_; }
  // How often it ticks: LastTick() is up to this old on a loop that turns (the first tick, which
  // moves onto the wake grid, up to half an interval more: src/loop/wake_grid.hpp).
  std::chrono::milliseconds Interval() const { return interval_; }

 private:
  friend class Runtime;
  std::chrono::milliseconds interval_{0};
  Clock::SteadyTime last_tick_{};
  Clock::SteadyTime next_tick_{};  // when the armed tick is due: its lag is measured from this
  std::chrono::microseconds last_lag_{0};
  std::chrono::microseconds max_lag_{0};
  Clock::WallTime started_at_{};
};

class Runtime {
 public:
  enum ExitCode { kExitOk = 0, kExitHardStop = 1 };

  explicit Runtime(LoadedConfig config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Runs until stopped; returns the process exit code.
  int Run();
  // Thread-safe: begin a graceful stop as if SIGTERM arrived.
  void RequestStop();

  Loop& GetLoop() { return loop_; }
  Bus& GetBus() { return bus_; }
  MetricsRegistry& Metrics() { return metrics_; }

 private:
  void OnSignal(int signal);
  void BeginStop(const char* why);
  void Heartbeat();
  void ArmWatchdog();
  void RegisterRuntimeMetrics();
  void RemoveInterruptedStateWrites();
  void PrepareStateDirectory();

  LoadedConfig config_;
  Loop loop_;
  SystemClock clock_;
  Bus bus_{loop_};
  MetricsRegistry metrics_;
  Services services_;
  BlockingPool pool_;
  std::shared_ptr<LoopHeartbeat> heartbeat_ = std::make_shared<LoopHeartbeat>();
  std::unique_ptr<Supervisor> supervisor_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer heartbeat_timer_;
  boost::asio::steady_timer watchdog_timer_;
  std::chrono::microseconds watchdog_interval_{0};
  MetricsRegistry::CollectorHandle runtime_collector_;
  MetricsRegistry::Series* loop_exceptions_ = nullptr;
  bool stopping_ = false;
  int exit_code_ = kExitOk;
};

}  // namespace gns
