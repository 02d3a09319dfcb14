// Module supervision.
#include "loop/supervisor.hpp"

#include "loop/logging.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>

namespace gns {

std::string_view ToString(ModuleState state) {
  switch (state) {
    case ModuleState::kStarting: return "starting";
    case ModuleState::kRunning: return "running";
    case ModuleState::kStopping: return "stopping";
    case ModuleState::kBackoff: return "backoff";
    case ModuleState::kWaiting: return "waiting";
    case ModuleState::kStopped: return "stopped";
  }
  return "?";
}

std::vector<const ModuleStatus*> ModuleStates::NotReady() const {
  std::vector<const ModuleStatus*> out;
  for (const auto& m : modules)
    if (!m.Ready()) out.push_back(&m);
  return out;
}

void to_json(nlohmann::json& j, const ModuleStatus& s) {
  j = nlohmann::json{{"state", ToString(s.state)},
                     {"health", ToString(s.health)},
                     {"ready", s.Ready()},
                     {"restarts", s.restarts}};
  if (!s.detail.empty()) j["detail"] = s.detail;
}

void to_json(nlohmann::json& j, const ModuleStates& s) {
  j = nlohmann::json::object();
  for (const auto& m : s.modules) j[m.name] = m;
}

struct Supervisor::Slot {
  Slot(boost::asio::io_context& io, ModuleSpec spec, const BackoffPolicy& policy, Backoff::RandomSource random)
      : name(std::move(spec.name)),
        factory(std::move(spec.factory)),
        uses(std::move(spec.uses)),
        follows(std::move(spec.follows)),
        backoff(policy, std::move(random)),
        timer(io) {}

  std::string name;
  ModuleFactory factory;
  std::vector<std::string> uses;
  std::vector<Slot*> providers;  // the enabled modules among `uses`, all earlier in the order
  std::vector<Slot*> users;      // the modules that use this one, in start order
  std::vector<std::string> follows;
  std::vector<Slot*> followers;  // the modules that follow this one, in start order
  std::vector<Slot*> followed;
  // The followed modules that ran when this instance started (a follower started without one
  // is restarted when it comes).
  std::vector<Slot*> started_with;
  bool failing = false;          // a failure is being handled (users stopping, then this one)
  std::unique_ptr<ModuleContext> context;
  std::unique_ptr<Module> instance;
  ModuleStatus status;
  Backoff backoff;
  boost::asio::steady_timer timer;
  uint64_t generation = 0;
  Clock::SteadyTime started_at{};
  std::vector<std::function<void(bool)>> stop_waiters;
  MetricsRegistry::Series* up = nullptr;
  MetricsRegistry::Series* restarts = nullptr;
};

Supervisor::Supervisor(RuntimeParts parts, SupervisorSettings settings, std::vector<ModuleSpec> modules,
                       Backoff::RandomSource random)
    : parts_(parts), settings_(settings), random_(std::move(random)) {
  for (auto& spec : modules) {
    auto slot = std::make_unique<Slot>(parts_.loop.Io(), std::move(spec), settings_.restart_backoff, random_);
    slot->status.name = slot->name;
    slot->up = &parts_.metrics.Gauge("gpu_node_supervisor_module_up",
                                     "1 when the module is running and not unhealthy", {{"module", slot->name}});
    slot->restarts = &parts_.metrics.Counter("gpu_node_supervisor_module_restarts_total",
                                             "Restarts of the module by the supervisor", {{"module", slot->name}});
    slots_.push_back(std::move(slot));
  }
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& user = *slots_[i];
    for (const auto& name : user.uses) {
      const auto provider = std::find_if(slots_.begin(), slots_.end(), [&](const auto& s) { return s->name == name; });
      if (provider == slots_.end()) continue;  // not enabled: the module copes without it
      // Providers start first and stop last; that order also rules out cycles.
      if (provider - slots_.begin() >= static_cast<std::ptrdiff_t>(i)) {
        throw std::logic_error("module " + user.name + " uses " + name + ", which does not start before it");
      }
      user.providers.push_back(provider->get());
      (*provider)->users.push_back(&user);
    }
    for (const auto& name : user.follows) {
      const auto followed = std::find_if(slots_.begin(), slots_.end(), [&](const auto& s) { return s->name == name; });
      if (followed == slots_.end()) continue;
      if (followed - slots_.begin() >= static_cast<std::ptrdiff_t>(i)) {
        throw std::logic_error("module " + user.name + " follows " + name + ", which does not start before it");
      }
      user.followed.push_back(followed->get());
      // A follower goes down before the module it follows, like a user.
      (*followed)->users.push_back(&user);
      (*followed)->followers.push_back(&user);
    }
  }
}

Supervisor::~Supervisor() {
  // Destroy instances in reverse start order; their contexts after them.
  for (auto it = slots_.rbegin(); it != slots_.rend(); ++it) {
    (*it)->timer.cancel();
    (*it)->instance.reset();
    (*it)->context.reset();
  }
  abandoned_.clear();
}

void Supervisor::StartAll() {
  GNS_ASSERT_ON_LOOP(parts_.loop);
  for (auto& slot : slots_) StartSlot(*slot);
}

void Supervisor::StartSlot(Slot& slot) {
  if (shutting_down_) return;
  std::string missing;
  for (const Slot* provider : slot.providers) {
    if (provider->status.state != ModuleState::kRunning) missing += (missing.empty() ? "" : ", ") + provider->name;
  }
  if (!missing.empty()) {
    // Started by StartWaitingUsers once they all run.
    slot.status.state = ModuleState::kWaiting;
    slot.status.health = ModuleHealth::kOk;
    slot.status.detail = "waiting for " + missing;
    Changed();
    return;
  }
  slot.failing = false;
  slot.started_with.clear();
  for (Slot* followed : slot.followed) {
    if (followed->status.state == ModuleState::kRunning) slot.started_with.push_back(followed);
  }
  const uint64_t generation = ++slot.generation;
  slot.status.state = ModuleState::kStarting;
  slot.status.health = ModuleHealth::kOk;
  Changed();
  slot.context = std::make_unique<ModuleContext>(
      parts_, slot.name,
      [this, &slot, generation](std::string why) {
        // Always deferred: a module may report failure from inside its own call stack.
        parts_.loop.Post([this, &slot, generation, why = std::move(why)]() mutable {
          OnFailure(slot, generation, std::move(why));
        });
      },
      [this, &slot, generation](ModuleHealth health, std::string detail) {
        OnHealth(slot, generation, health, std::move(detail));
      });
  // What the module says about itself from now on stands: a module that reports its health
  // from inside Start (still loading its state: not ready) keeps that detail once running.
  slot.status.detail.clear();
  try {
    slot.instance = slot.factory(*slot.context);
    slot.instance->Start();
  } catch (const std::exception& e) {
    OnFailure(slot, generation, std::string("start failed: ") + e.what());
    return;
  }
  slot.status.state = ModuleState::kRunning;
  slot.started_at = parts_.clock.Now();
  slot.context->Log().info("running");
  Changed();
  StartWaitingUsers(slot);
  RestartFollowers(slot);
}

void Supervisor::StartWaitingUsers(Slot& slot) {
  for (Slot* user : slot.users) {
    if (user->status.state == ModuleState::kWaiting) StartSlot(*user);
  }
}

void Supervisor::StartWaitingFollowers(Slot& slot) {
  // They do without it: back at once, now that it is down.
  for (Slot* follower : slot.followers) {
    if (follower->status.state == ModuleState::kWaiting) StartSlot(*follower);
  }
}

void Supervisor::RestartFollowers(Slot& slot) {
  for (Slot* follower : slot.followers) {
    if (follower->status.state != ModuleState::kRunning) continue;
    const auto& with = follower->started_with;
    if (std::find(with.begin(), with.end(), &slot) != with.end()) continue;
    GetLogger(follower->name)->info("restarting: {} runs now", slot.name);
    ++follower->status.restarts;
    follower->restarts->Inc();
    StopUsers(*follower, [this, follower] {
      StopInstance(*follower, [this, follower](bool) { StartSlot(*follower); });
    });
  }
}

void Supervisor::OnHealth(Slot& slot, uint64_t generation, ModuleHealth health, std::string detail) {
  if (generation != slot.generation) return;  // a stale instance
  if (slot.status.health == health && slot.status.detail == detail) return;
  slot.status.health = health;
  slot.status.detail = std::move(detail);
  Changed();
}

void Supervisor::OnFailure(Slot& slot, uint64_t generation, std::string why) {
  if (generation != slot.generation || shutting_down_ || slot.failing) return;
  if (slot.status.state != ModuleState::kRunning && slot.status.state != ModuleState::kStarting) return;
  GetLogger(slot.name)->error("failed: {}; restarting", why);
  slot.failing = true;
  slot.status.detail = std::move(why);
  // Users first: they may still call this module's services while they stop.
  StopUsers(slot, [this, &slot] {
    StopInstance(slot, [this, &slot](bool) {
      StartWaitingFollowers(slot);
      ScheduleRestart(slot);
    });
  });
}

void Supervisor::StopUsers(Slot& slot, std::function<void()> then) {
  StopUsersFrom(slot, std::vector<Slot*>(slot.users.rbegin(), slot.users.rend()), 0, std::move(then));
}

void Supervisor::StopUsersFrom(Slot& provider, std::vector<Slot*> users, std::size_t i, std::function<void()> then) {
  if (i == users.size()) {
    then();
    return;
  }
  Slot& user = *users[i];
  auto next = [this, &provider, users, i, then = std::move(then)] { StopUsersFrom(provider, users, i + 1, then); };
  const bool follower =
      std::find(provider.followers.begin(), provider.followers.end(), &user) != provider.followers.end();
  if (follower && std::find(user.started_with.begin(), user.started_with.end(), &provider) == user.started_with.end()) {
    next();  // it started without the provider: it holds nothing of it
    return;
  }
  auto wait = [this, &user, why = "waiting for " + provider.name + " (restarting)"] {
    if (shutting_down_) return;
    user.timer.cancel();  // a restart of its own may have been scheduled meanwhile
    user.status.state = ModuleState::kWaiting;
    user.status.detail = why;
    Changed();
  };
  switch (user.status.state) {
    case ModuleState::kBackoff:
      wait();
      next();
      return;
    case ModuleState::kRunning:
    case ModuleState::kStarting:
    case ModuleState::kStopping:
      GetLogger(user.name)->warn("stopping: {} restarts", provider.name);
      ++user.status.restarts;
      user.restarts->Inc();
      StopUsers(user, [this, &user, wait, next] {
        StopInstance(user, [this, &user, wait, next](bool) {
          StartWaitingFollowers(user);
          wait();
          next();
        });
      });
      return;
    case ModuleState::kWaiting:
    case ModuleState::kStopped:
      next();
      return;
  }
}

void Supervisor::StopInstance(Slot& slot, std::function<void(bool in_time)> then) {
  slot.stop_waiters.push_back(std::move(then));
  if (slot.status.state == ModuleState::kStopping) return;  // already on its way down
  slot.status.state = ModuleState::kStopping;
  Changed();

  auto finished = std::make_shared<bool>(false);
  auto finish = [this, &slot, finished](bool in_time) {
    if (*finished) return;
    *finished = true;
    slot.timer.cancel();
    if (in_time) {
      slot.instance.reset();
    } else {
      abandoned_.push_back(std::move(slot.instance));
    }
    slot.context.reset();
    ++slot.generation;  // reports from the old instance are stale from here on
    slot.status.state = ModuleState::kStopped;
    Changed();
    auto waiters = std::move(slot.stop_waiters);
    slot.stop_waiters.clear();
    for (auto& waiter : waiters) waiter(in_time);
  };

  if (!slot.instance) {
    finish(true);
    return;
  }
  slot.timer.expires_after(settings_.stop_timeout);
  slot.timer.async_wait([this, &slot, finish, finished](const boost::system::error_code& ec) {
    if (ec || *finished) return;  // cancelled: the module stopped in time
    spdlog::error("module {} did not stop within {} ms", slot.name, settings_.stop_timeout.count());
    finish(false);
  });
  try {
    slot.instance->Stop([this, finish] { parts_.loop.Post([finish] { finish(true); }); });
  } catch (const std::exception& e) {
    spdlog::error("module {} threw while stopping: {}", slot.name, e.what());
    finish(true);
  }
}

void Supervisor::ScheduleRestart(Slot& slot) {
  if (shutting_down_) return;
  if (slot.started_at != Clock::SteadyTime{} && parts_.clock.Now() - slot.started_at >= settings_.stable_after &&
      slot.status.state != ModuleState::kStarting) {
    slot.backoff.Reset();
  }
  const auto delay = slot.backoff.Next();
  slot.status.state = ModuleState::kBackoff;
  ++slot.status.restarts;
  slot.restarts->Inc();
  spdlog::warn("module {} restarts in {} ms (attempt {})", slot.name, delay.count(), slot.backoff.Attempts());
  Changed();
  slot.timer.expires_after(delay);
  slot.timer.async_wait([this, &slot](const boost::system::error_code& ec) {
    if (ec || shutting_down_) return;
    StartSlot(slot);
  });
}

void Supervisor::StopAll(std::function<void(bool graceful)> done) {
  GNS_ASSERT_ON_LOOP(parts_.loop);
  shutting_down_ = true;
  for (auto& slot : slots_) {
    if (slot->status.state == ModuleState::kBackoff || slot->status.state == ModuleState::kWaiting) {
      slot->timer.cancel();
      slot->status.state = ModuleState::kStopped;
    }
  }
  Changed();
  StopNext(slots_.size(), std::move(done));
}

void Supervisor::StopNext(std::size_t remaining, std::function<void(bool)> done) {
  if (remaining == 0) {
    done(true);
    return;
  }
  Slot& slot = *slots_[remaining - 1];
  if (!slot.instance && slot.status.state != ModuleState::kStopping) {
    slot.status.state = ModuleState::kStopped;
    StopNext(remaining - 1, std::move(done));
    return;
  }
  spdlog::info("stopping module {}", slot.name);
  StopInstance(slot, [this, remaining, done = std::move(done)](bool in_time) mutable {
    if (!in_time) {
      done(false);
      return;
    }
    StopNext(remaining - 1, std::move(done));
  });
}

ModuleStates Supervisor::Snapshot() const {
  ModuleStates states;
  for (const auto& slot : slots_) states.modules.push_back(slot->status);
  return states;
}

void Supervisor::Changed() {
  for (auto& slot : slots_) slot->up->Set(slot->status.Ready() ? 1.0 : 0.0);
  parts_.bus.Publish(Snapshot());
}

}  // namespace gns
