// Test loggers (quiet_logger.hpp).
#include "support/quiet_logger.hpp"

#include <spdlog/sinks/null_sink.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace gns::test {

std::shared_ptr<spdlog::logger> QuietLogger(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  const std::lock_guard lock(mutex);
  auto& logger = loggers[name];
  if (logger) return logger;
  if (std::getenv("GNS_TEST_LOG") != nullptr) {
    logger = spdlog::default_logger()->clone(name);
    logger->set_level(spdlog::level::debug);
  } else {
    logger = std::make_shared<spdlog::logger>(name, std::make_shared<spdlog::sinks::null_sink_mt>());
  }
  return logger;
}

}  // namespace gns::test
