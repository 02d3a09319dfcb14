#pragma once
// Supervision: builds and starts the enabled modules in manifest order, isolates failures (a
// module that fails to start or fails later is stopped and restarted with jittered
// exponential backoff while the others keep running), and stops everything in reverse order,
// each module within a deadline. A module that uses another's services (ModuleSpec::uses)
// waits for it to run, and goes down before it and comes back after it when it restarts. A
// module that follows another (ModuleSpec::follows) runs without it, goes down before it when
// it stops (and comes back at once), and is restarted when it starts running.

#include "loop/backoff.hpp"
#include "loop/module.hpp"
#include "loop/supervisor_messages.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gns {

struct SupervisorSettings {
  std::chrono::milliseconds stop_timeout{5000};
  BackoffPolicy restart_backoff{std::chrono::milliseconds(1000), std::chrono::milliseconds(60000), 2.0, 0.5};
  // A module that ran this long since its last start gets its backoff reset on failure.
  std::chrono::milliseconds stable_after{60000};
};

struct ModuleSpec {
  std::string name;
  ModuleFactory factory;
  // Modules whose services this one holds (ModuleDescriptor::uses); names of modules that are
  // not enabled are ignored.
  std::vector<std::string> uses = {};
  // Modules whose services this one uses when they run (ModuleDescriptor::follows).
  std::vector<std::string> follows = {};
};

class Supervisor {
 public:
  Supervisor(RuntimeParts parts, SupervisorSettings settings, std::vector<ModuleSpec> modules,
             Backoff::RandomSource random = {});
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every module once, in order; failures go to backoff. Loop thread.
  void StartAll();
  // Stops modules in reverse start order. `done(true)` when all stopped in time; `done(false)`
  // as soon as one misses its deadline (the caller then stops hard).
  void StopAll(std::function<void(bool graceful)> done);

  ModuleStates Snapshot() const;

 private:
  struct Slot;
  void StartSlot(Slot& slot);
  void OnFailure(Slot& slot, uint64_t generation, std::string why);
  void OnHealth(Slot& slot, uint64_t generation, ModuleHealth health, std::string detail);
  void StopInstance(Slot& slot, std::function<void(bool in_time)> then);
  void ScheduleRestart(Slot& slot);
  // Stops the running users of `slot` (theirs first), leaving them waiting; then `then`.
  void StopUsers(Slot& slot, std::function<void()> then);
  void StopUsersFrom(Slot& provider, std::vector<Slot*> users, std::size_t i, std::function<void()> then);
  void StartWaitingUsers(Slot& slot);
  // The followers of `slot` that run without it start again, now that it runs.
  void RestartFollowers(Slot& slot);
  // The followers that went down with `slot` start again without it, now that it is down.
  void StartWaitingFollowers(Slot& slot);
  void StopNext(std::size_t remaining, std::function<void(bool)> done);
  void Changed();

  RuntimeParts parts_;
  SupervisorSettings settings_;
  Backoff::RandomSource random_;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Instances that missed a stop deadline during a restart: kept (not destroyed) because
  // their pending handlers may still reference them; released at shutdown.
  std::vector<std::unique_ptr<Module>> abandoned_;
  bool shutting_down_ = false;
};

}  // namespace gns
