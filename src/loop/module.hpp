#pragma once
// The module API, in the spirit of userver components:
//  - a module type has `static constexpr std::string_view kName` (its YAML key under
//    `modules:`, its logger name and its --enable/--disable token) and `kSummary`;
//  - `struct Config` parsed and validated by `static Config ParseConfig(ConfigMap&, const
//    SiteConfig&)` before anything is constructed (unknown keys are rejected for it);
//  - a constructor `(ModuleContext&, const Config&)` that only wires (no I/O);
//  - Start() begins serving/watching; throwing means the start failed;
//  - Stop(done) stops gracefully and calls done() on the loop when finished;
//  - optional `static constexpr std::array<std::string_view, N> kUses`: the modules whose
//    services it holds (Services::Find). It starts only while they run, and is stopped before
//    them and started again after them when they restart, so it never keeps a stopped service.
//  - optional `static constexpr std::array<std::string_view, N> kFollows`: modules whose
//    services it uses when they run but does without (gpu-health without kube). It starts
//    whether they run or not; it is stopped before them when they stop or fail (then started
//    again at once, without them), and restarted when they start running after it, so that
//    it picks their services up.
// The supervisor restarts a module that fails (ReportFailure, or a failed Start) with backoff.

#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/config.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "loop/site.hpp"

#include <spdlog/logger.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns {

enum class ModuleHealth { kOk, kDegraded, kUnhealthy };
std::string_view ToString(ModuleHealth health);

// The shared runtime pieces a module can reach.
struct RuntimeParts {
  Loop& loop;
  Bus& bus;
  BlockingPool& pool;
  const Clock& clock;
  const SiteConfig& site;
  MetricsRegistry& metrics;
  Services& services;
};

class ModuleContext {
 public:
  using FailureSink = std::function<void(std::string)>;
  using HealthSink = std::function<void(ModuleHealth, std::string)>;

  ModuleContext(RuntimeParts parts, std::string name, FailureSink on_failure, HealthSink on_health);

  const std::string& Name() const { return name_; }
  Loop& GetLoop() { return parts_.loop; }
  Bus& GetBus() { return parts_.bus; }
  BlockingPool& Pool() { return parts_.pool; }
  const Clock& GetClock() const { return parts_.clock; }
  const SiteConfig& Site() const { return parts_.site; }
  MetricsRegistry& Metrics() { return parts_.metrics; }
  // This module's view of the services (loop/services.hpp): what it finds names it.
  Services& GetServices() { return services_; }
  spdlog::logger& Log() { return *logger_; }
  const std::shared_ptr<spdlog::logger>& Logger() const { return logger_; }

  // Asks the supervisor to stop this instance and start a fresh one after backoff.
  void ReportFailure(std::string why) { on_failure_(std::move(why)); }
  // Running but not fully well (kDegraded), or not usable (kUnhealthy: not ready).
  void SetHealth(ModuleHealth health, std::string detail = {}) { on_health_(health, std::move(detail)); }

 private:
  RuntimeParts parts_;
  std::string name_;
  Services services_;
  std::shared_ptr<spdlog::logger> logger_;
  FailureSink on_failure_;
  HealthSink on_health_;
};

class Module {
 public:
  virtual ~Module() = default;
  virtual void Start() = 0;
  virtual void Stop(std::function<void()> done) { done(); }
};

using ModuleFactory = std::function<std::unique_ptr<Module>(ModuleContext&)>;

struct ModuleDescriptor {
  std::string_view name;
  std::string_view summary;
  std::vector<std::string_view> uses;     // M::kUses
  std::vector<std::string_view> follows;  // M::kFollows
  // Parses and validates the module's section (without `enabled`) into a factory.
  std::function<ModuleFactory(ConfigMap& section, const SiteConfig& site)> parse;
};

template <typename M>
ModuleDescriptor DescribeModule() {
  std::vector<std::string_view> uses;
  if constexpr (requires { M::kUses; }) uses.assign(M::kUses.begin(), M::kUses.end());
  std::vector<std::string_view> follows;
  if constexpr (requires { M::kFollows; }) follows.assign(M::kFollows.begin(), M::kFollows.end());
  return ModuleDescriptor{
      M::kName, M::kSummary, std::move(uses), std::move(follows),
      [](ConfigMap& section, const SiteConfig& site) -> ModuleFactory {
        auto config = std::make_shared<const typename M::Config>(M::ParseConfig(section, site));
        return [config](ModuleContext& context) -> std::unique_ptr<Module> {
          return std::make_unique<M>(context, *config);
        };
      }};
}

}  // namespace gns
