#pragma once
// Logging of repeated warnings for every module: "logged once per kind, with rate limiting": the first occurrence of each kind of bad input
// is logged, later ones at most once per interval with the number swallowed in between. The
// number of kinds is small and fixed by the caller (string literals), so memory is bounded.

#include "loop/clock.hpp"

#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace gns {

class RateLimitedLog {
 public:
  RateLimitedLog(const Clock& clock, std::chrono::milliseconds interval = std::chrono::minutes(1))
      : clock_(clock), interval_(interval) {}

  // Logs `what` at warn level unless `kind` was logged less than `interval` ago.
  void Warn(spdlog::logger& log, std::string_view kind, std::string_view what) {
    Log(log, spdlog::level::warn, kind, what);
  }
  // The same at any level. Kinds may also be keys of the caller's (a GPU and an XID): their
  // number must be bounded by the caller.
  void Log(spdlog::logger& log, spdlog::level::level_enum level, std::string_view kind, std::string_view what) {
    auto [it, fresh] = kinds_.try_emplace(std::string(kind));
    Entry& e = it->second;
    const auto now = clock_.Now();
    if (!fresh && now - e.last < interval_) {
      ++e.suppressed;
      return;
    }
    if (e.suppressed > 0) {
      log.log(level, "{}: {} ({} more like this not logged)", kind, what, e.suppressed);
    } else {
      log.log(level, "{}: {}", kind, what);
    }
    e.last = now;
    e.suppressed = 0;
  }

 private:
  struct Entry {
    Clock::SteadyTime last{};
    uint64_t suppressed = 0;
  };
  const Clock& clock_;
  std::chrono::milliseconds interval_;
  std::map<std::string, Entry, std::less<>> kinds_;
};

}  // namespace gns
