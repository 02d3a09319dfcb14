#pragma once
// One ComputeDomain's nvidia-imex, run by the supervisor as a child process (driver-managed
// IMEX, issue #16): started with the domain's own config, its output logged under the domain's
// name, restarted with backoff when it exits, asked to re-read its node map (SIGUSR1, as the
// upstream daemon does) or restarted when the map changes, and probed with `nvidia-imex-ctl -q`
// (READY means ready) while not ready and at a slow interval once ready. The readiness verdict
// of this node's daemon is this class's; it tells its owner on change.

#include "loop/backoff.hpp"
#include "loop/gate.hpp"
#include "modules/dra_compute_domain/child_process.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gns::dra {

struct ImexDaemonSettings {
  std::string label;         // "namespace/name" of the domain, in every log line
  std::string daemon_path;   // nvidia-imex
  std::string ctl_path;      // nvidia-imex-ctl
  std::string config_file;   // the domain's config.cfg
  std::string hosts_file;    // bind-mounted over /etc/hosts when set (IMEXDaemonsWithDNSNames)
  BackoffPolicy restart{std::chrono::milliseconds(1000), std::chrono::milliseconds(60000), 2.0, 0.5};
  std::chrono::milliseconds probe_interval{1000};    // while not ready
  std::chrono::milliseconds health_interval{30000};  // once ready
  std::chrono::milliseconds ctl_timeout{5000};
  std::chrono::milliseconds stop_grace{5000};        // SIGTERM → SIGKILL
};

class ImexDaemon {
 public:
  using ReadyFn = std::function<void(bool ready, const std::string& why)>;
  ImexDaemon(boost::asio::io_context& io, std::shared_ptr<spdlog::logger> log, ImexDaemonSettings settings,
             ReadyFn on_ready);
  ~ImexDaemon();
  ImexDaemon(const ImexDaemon&) = delete;
  ImexDaemon& operator=(const ImexDaemon&) = delete;

  void Start();
  // The node map changed: SIGUSR1 (re-read config and reconnect); a daemon not running yet
  // reads the new map when it starts.
  void Reload();
  // Stops (SIGTERM, SIGKILL to its process group after the grace time) and calls `done` once
  // it has exited and been reaped; every Stop's `done` is called, a second Stop waits for the
  // same exit.
  void Stop(std::function<void()> done);

  bool Ready() const { return ready_; }
  bool Running() const { return child_ && child_->Running(); }
  int Pid() const { return child_ ? child_->Pid() : -1; }
  uint64_t Starts() const { return starts_; }
  uint64_t Exits() const { return exits_; }
  const std::string& LastExit() const { return last_exit_; }

 private:
  void Spawn();
  void OnExit(ChildExit exit);
  void Probe();
  void ScheduleProbe(std::chrono::milliseconds delay);
  void SetReady(bool ready, const std::string& why);
  void Stopped();  // calls the Stops' callbacks

  boost::asio::io_context& io_;
  std::shared_ptr<spdlog::logger> log_;
  ImexDaemonSettings settings_;
  ReadyFn on_ready_;
  Backoff backoff_;
  std::unique_ptr<ChildProcess> child_;
  boost::asio::steady_timer restart_timer_;
  boost::asio::steady_timer probe_timer_;
  boost::asio::steady_timer kill_timer_;
  bool ready_ = false;
  bool stopping_ = false;
  bool probing_ = false;
  uint64_t generation_ = 0;  // of the child; a probe of an older child is ignored
  uint64_t starts_ = 0;
  uint64_t exits_ = 0;
  std::string last_exit_;
  std::vector<std::function<void()>> stopped_;
  uint64_t stop_signalled_ = 0;  // the generation a Stop sent SIGTERM to
  Gate lifetime_;
};

}  // namespace gns::dra
