// One domain's supervised nvidia-imex.
#include "modules/dra_compute_domain/imex_daemon.hpp"

#include <boost/asio/post.hpp>

#include <signal.h>

namespace gns::dra {

using std::chrono::milliseconds;

ImexDaemon::ImexDaemon(boost::asio::io_context& io, std::shared_ptr<spdlog::logger> log, ImexDaemonSettings settings,
                       ReadyFn on_ready)
    : io_(io),
      log_(std::move(log)),
      settings_(std::move(settings)),
      on_ready_(std::move(on_ready)),
      backoff_(settings_.restart),
      restart_timer_(io),
      probe_timer_(io),
      kill_timer_(io) {}

ImexDaemon::~ImexDaemon() {
  lifetime_.Close();
  // ~ChildProcess kills a child still running.
}

void ImexDaemon::Start() {
  stopping_ = false;
  Spawn();
}

void ImexDaemon::Spawn() {
  if (stopping_) return;
  ChildSpec spec;
  spec.argv = {settings_.daemon_path, "-c", settings_.config_file};
  if (!settings_.hosts_file.empty()) spec.bind_mounts.emplace_back(settings_.hosts_file, "/etc/hosts");
  ++generation_;
  try {
    child_ = std::make_unique<ChildProcess>(
        io_, spec,
        [log = log_, label = settings_.label](const std::string& line) {
          log->info("[nvidia-imex {}] {}", label, line);
        },
        lifetime_.Guard([this](ChildExit exit) {
          OnExit(exit);
        }));
  } catch (const std::exception& e) {
    ++exits_;
    last_exit_ = e.what();
    const auto delay = backoff_.Next();
    log_->error("IMEX daemon of ComputeDomain {} cannot start: {}; retrying in {} ms", settings_.label, e.what(),
                delay.count());
    restart_timer_.expires_after(delay);
    restart_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
      if (!ec) Spawn();
    }));
    return;
  }
  ++starts_;
  log_->info("IMEX daemon of ComputeDomain {} started (pid {}, {} -c {})", settings_.label, child_->Pid(),
             settings_.daemon_path, settings_.config_file);
  ScheduleProbe(settings_.probe_interval);
}

void ImexDaemon::OnExit(ChildExit exit) {
  ++exits_;
  last_exit_ = exit.Describe();
  probe_timer_.cancel();
  kill_timer_.cancel();
  // Released after this callback: the child object delivered it.
  boost::asio::post(io_, lifetime_.Guard([this, gen = generation_] {
    if (gen == generation_ && child_ && !child_->Running()) child_.reset();
  }));
  if (stopping_) {
    log_->info("IMEX daemon of ComputeDomain {} stopped ({})", settings_.label, last_exit_);
    SetReady(false, "stopped");
    Stopped();
    return;
  }
  SetReady(false, "the daemon " + last_exit_);
  const auto delay = backoff_.Next();
  log_->warn("IMEX daemon of ComputeDomain {} {}; restarting in {} ms (restart {})", settings_.label, last_exit_,
             delay.count(), backoff_.Attempts());
  restart_timer_.expires_after(delay);
  restart_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (!ec) Spawn();
  }));
}

void ImexDaemon::Reload() {
  if (!child_ || !child_->Running() || stopping_) return;
  log_->info("IMEX daemon of ComputeDomain {}: node map changed, SIGUSR1 (re-read and reconnect)", settings_.label);
  child_->Signal(SIGUSR1);
  // Readiness is judged again against the new peer set.
  ScheduleProbe(milliseconds(0));
}

void ImexDaemon::Stop(std::function<void()> done) {
  stopping_ = true;
  restart_timer_.cancel();
  probe_timer_.cancel();
  if (done) stopped_.push_back(std::move(done));
  if (!child_ || !child_->Running()) {
    SetReady(false, "stopped");
    Stopped();
    return;
  }
  if (stop_signalled_ == generation_) return;  // a second Stop waits for the same exit
  stop_signalled_ = generation_;
  child_->Signal(SIGTERM);
  kill_timer_.expires_after(settings_.stop_grace);
  kill_timer_.async_wait([this, alive = lifetime_.Watch(), gen = generation_](const boost::system::error_code& ec) {
    // The exit may be delivered in the same loop turn as this expiry: the generation and
    // Running() say whether this child is still there to be killed.
    if (ec || !alive || gen != generation_ || !child_ || !child_->Running()) return;
    log_->warn("IMEX daemon of ComputeDomain {} ignored SIGTERM for {} ms: SIGKILL", settings_.label,
               settings_.stop_grace.count());
    // Its whole group: a helper it started would otherwise outlive it (and keep its ports).
    // The exit (and with it this Stop) follows through the child's pidfd.
    child_->SignalGroup(SIGKILL);
  });
}

void ImexDaemon::Stopped() {
  std::vector<std::function<void()>> done;
  done.swap(stopped_);
  for (auto& fn : done) fn();
}

void ImexDaemon::ScheduleProbe(milliseconds delay) {
  probe_timer_.expires_after(delay);
  probe_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (!ec) Probe();
  }));
}

void ImexDaemon::Probe() {
  if (stopping_ || !child_ || !child_->Running()) return;
  if (probing_) return;  // one query at a time; its answer schedules the next (even a stale one)
  probing_ = true;
  ChildSpec spec;
  spec.argv = {settings_.ctl_path, "-q", "-c", settings_.config_file};
  if (!settings_.hosts_file.empty()) spec.bind_mounts.emplace_back(settings_.hosts_file, "/etc/hosts");
  RunCommand(io_, spec, settings_.ctl_timeout,
             lifetime_.Guard([this, gen = generation_](ChildExit exit, std::string output) {
               probing_ = false;
               if (stopping_ || !child_ || !child_->Running()) return;  // OnExit/Spawn schedule the next
               if (gen != generation_) {
                 // About a daemon that has exited since; the current one's probe may have been
                 // skipped while this one ran: probe it now.
                 ScheduleProbe(milliseconds(0));
                 return;
               }
               // `nvidia-imex-ctl -q` prints exactly "READY" when the local daemon is ready.
               const bool ready = exit.code == 0 && (output == "READY\n" || output == "READY");
               std::string why = output;
               while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
               if (why.empty()) why = "nvidia-imex-ctl " + exit.Describe();
               SetReady(ready, ready ? "READY" : why);
               if (ready) backoff_.Reset();
               ScheduleProbe(ready ? settings_.health_interval : settings_.probe_interval);
             }));
}

void ImexDaemon::SetReady(bool ready, const std::string& why) {
  if (ready == ready_) return;
  ready_ = ready;
  log_->info("IMEX daemon of ComputeDomain {} is {} ({})", settings_.label, ready ? "ready" : "not ready", why);
  if (on_ready_) on_ready_(ready, why);
}

}  // namespace gns::dra
