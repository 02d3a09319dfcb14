#pragma once
// Process logging: one spdlog sink (stderr), text or JSON lines, one logger per module named
// after it, and a level per logger.

#include <spdlog/logger.h>

#include <map>
#include <memory>
#include <string>

namespace gns {

struct LoggingConfig {
  enum class Format { kText, kJson };
  Format format = Format::kText;
  spdlog::level::level_enum level = spdlog::level::info;
  std::map<std::string, spdlog::level::level_enum> levels;  // per logger name
};

// Installs the sink and the default ("supervisor") logger. Safe to call again (tests).
void SetupLogging(const LoggingConfig& config);

// The logger for a module or subsystem; created on first use with its configured level.
std::shared_ptr<spdlog::logger> GetLogger(const std::string& name);

// "trace".."critical", "off"; false if unknown.
bool ParseLogLevel(const std::string& text, spdlog::level::level_enum& out);

}  // namespace gns
