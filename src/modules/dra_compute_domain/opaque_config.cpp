// Opaque device configuration of compute-domain claims.
#include "modules/dra_compute_domain/opaque_config.hpp"

#include "modules/dra_compute_domain/driver_paths.hpp"

namespace gns::dra {

namespace {

using nlohmann::json;

std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

// The main request of a firstAvailable pick ("main/sub" → "main"): configs name main requests.
std::string_view MainRequest(std::string_view request) {
  const auto slash = request.find('/');
  return slash == std::string_view::npos ? request : request.substr(0, slash);
}

}  // namespace

bool OpaqueConfig::AppliesTo(std::string_view request) const {
  if (requests.empty()) return true;
  for (const auto& name : requests) {
    if (name == request || name == MainRequest(request)) return true;
  }
  return false;
}

OpaqueDecodeResult DecodeOpaqueParameters(const json& parameters, const std::string& where) {
  OpaqueDecodeResult result;
  if (!parameters.is_object()) {
    result.error = where + ": expected an object, got " + std::string(parameters.type_name());
    return result;
  }
  auto string_field = [&](const char* key, std::string& out, bool required) -> bool {
    const auto it = parameters.find(key);
    if (it == parameters.end() || it->is_null()) {
      if (required) result.error = where + "." + key + ": missing";
      return !required;
    }
    if (!it->is_string()) {
      result.error = where + "." + key + ": expected a string, got " + std::string(it->type_name());
      return false;
    }
    out = it->get<std::string>();
    return true;
  };

  std::string api_version;
  std::string kind;
  if (!string_field("apiVersion", api_version, true)) return result;
  if (api_version != kConfigApiVersion) {
    result.error = where + ".apiVersion: " + Quoted(api_version) + " is not supported (expected " +
                   Quoted(kConfigApiVersion) + ")";
    return result;
  }
  if (!string_field("kind", kind, true)) return result;
  OpaqueConfig config;
  if (kind == kChannelConfigKind) {
    config.kind = ConfigKind::kChannel;
  } else if (kind == kDaemonConfigKind) {
    config.kind = ConfigKind::kDaemon;
  } else {
    result.error = where + ".kind: unknown kind " + Quoted(kind) + " (expected " + Quoted(kChannelConfigKind) +
                   " or " + Quoted(kDaemonConfigKind) + ")";
    return result;
  }
  if (!string_field("domainID", config.domain_id, true)) return result;
  if (config.domain_id.empty()) {
    result.error = where + ".domainID: empty (it must be the ComputeDomain's UID)";
    return result;
  }
  if (config.kind == ConfigKind::kChannel && !string_field("allocationMode", config.allocation_mode, false)) {
    return result;
  }
  config.where = where;
  result.config = std::move(config);
  return result;
}

ClaimConfigsResult DecodeClaimConfigs(const json& claim) {
  ClaimConfigsResult result;
  const json* list = nullptr;
  if (claim.is_object()) {
    const auto status = claim.find("status");
    if (status != claim.end() && status->is_object()) {
      const auto allocation = status->find("allocation");
      if (allocation != status->end() && allocation->is_object()) {
        const auto devices = allocation->find("devices");
        if (devices != allocation->end() && devices->is_object()) {
          const auto config = devices->find("config");
          if (config != devices->end() && !config->is_null()) list = &*config;
        }
      }
    }
  }
  if (list == nullptr) return result;
  const std::string base = "status.allocation.devices.config";
  if (!list->is_array()) {
    result.ok = false;
    result.error = base + ": expected an array, got " + std::string(list->type_name());
    return result;
  }
  std::vector<OpaqueConfig> from_class;
  std::vector<OpaqueConfig> from_claim;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& entry = (*list)[i];
    const std::string where = base + "[" + std::to_string(i) + "]";
    if (!entry.is_object()) {
      result.ok = false;
      result.error = where + ": expected an object, got " + std::string(entry.type_name());
      return result;
    }
    const auto opaque = entry.find("opaque");
    if (opaque == entry.end() || opaque->is_null()) continue;  // not an opaque config: not ours
    if (!opaque->is_object()) {
      result.ok = false;
      result.error = where + ".opaque: expected an object, got " + std::string(opaque->type_name());
      return result;
    }
    const auto driver = opaque->find("driver");
    if (driver == opaque->end() || !driver->is_string() || driver->get<std::string>() != kDriverName) continue;
    const auto parameters = opaque->find("parameters");
    if (parameters == opaque->end()) {
      result.ok = false;
      result.error = where + ".opaque.parameters: missing";
      return result;
    }
    auto decoded = DecodeOpaqueParameters(*parameters, where + ".opaque.parameters");
    if (!decoded.config) {
      result.ok = false;
      result.error = decoded.error;
      return result;
    }
    OpaqueConfig config = std::move(*decoded.config);
    config.where = where;
    if (const auto source = entry.find("source"); source != entry.end() && source->is_string()) {
      config.source = source->get<std::string>();
    }
    if (const auto requests = entry.find("requests"); requests != entry.end() && !requests->is_null()) {
      if (!requests->is_array()) {
        result.ok = false;
        result.error = where + ".requests: expected an array, got " + std::string(requests->type_name());
        return result;
      }
      for (const json& request : *requests) {
        if (!request.is_string()) {
          result.ok = false;
          result.error = where + ".requests[]: expected strings";
          return result;
        }
        config.requests.push_back(request.get<std::string>());
      }
    }
    (config.source == "FromClass" ? from_class : from_claim).push_back(std::move(config));
  }
  result.configs = std::move(from_class);
  for (auto& config : from_claim) result.configs.push_back(std::move(config));
  return result;
}

const OpaqueConfig* ConfigForRequest(const std::vector<OpaqueConfig>& configs, std::string_view request) {
  const OpaqueConfig* found = nullptr;
  for (const auto& config : configs) {
    if (config.AppliesTo(request)) found = &config;
  }
  return found;
}

}  // namespace gns::dra
