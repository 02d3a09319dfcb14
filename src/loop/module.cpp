// Module context.
#include "loop/module.hpp"

#include "loop/logging.hpp"

namespace gns {

std::string_view ToString(ModuleHealth health) {
  switch (health) {
    case ModuleHealth::kOk: return "ok";
    case ModuleHealth::kDegraded: return "degraded";
    case ModuleHealth::kUnhealthy: return "unhealthy";
  }
  return "?";
}

ModuleContext::ModuleContext(RuntimeParts parts, std::string name, FailureSink on_failure, HealthSink on_health)
    : parts_(parts),
      name_(std::move(name)),
      services_(parts.services, name_),
      logger_(GetLogger(name_)),
      on_failure_(std::move(on_failure)),
      on_health_(std::move(on_health)) {}

}  // namespace gns
