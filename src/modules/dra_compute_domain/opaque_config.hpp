#pragma once
// Decodes our opaque device configuration from a ResourceClaim as the API returns it:
// status.allocation.devices.config[] entries with opaque.driver == "compute-domain.nvidia.com"
// and opaque.parameters = {apiVersion: resource.nvidia.com/v1beta1, kind:
// ComputeDomainChannelConfig | ComputeDomainDaemonConfig, domainID, allocationMode}. Every error
// says what is wrong, where in the object (a JSON path), and why, because it ends up in a pod
// event that a user has to act on.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

inline constexpr std::string_view kConfigApiVersion = "resource.nvidia.com/v1beta1";
inline constexpr std::string_view kChannelConfigKind = "ComputeDomainChannelConfig";
inline constexpr std::string_view kDaemonConfigKind = "ComputeDomainDaemonConfig";

enum class ConfigKind { kChannel, kDaemon };

struct OpaqueConfig {
  ConfigKind kind = ConfigKind::kChannel;
  std::string domain_id;        // the ComputeDomain's UID
  std::string allocation_mode;  // channel configs only; "" when absent (validated by prepare)
  std::string source;           // "FromClass" | "FromClaim" | "" (as the API wrote it)
  std::vector<std::string> requests;  // empty: applies to every request
  std::string where;            // JSON path of the entry, for messages

  // True when this config applies to allocation result `request` ("main" or "main/sub").
  bool AppliesTo(std::string_view request) const;
};

struct OpaqueDecodeResult {
  std::optional<OpaqueConfig> config;
  std::string error;
};

// Decodes opaque.parameters. `where` is the JSON path of the parameters, for messages.
// Unknown extra fields are ignored (a newer controller may add some); known fields must have the
// right types; domainID must be a non-empty string.
OpaqueDecodeResult DecodeOpaqueParameters(const nlohmann::json& parameters, const std::string& where);

struct ClaimConfigsResult {
  bool ok = true;
  std::string error;
  // Our entries, class configs first, then claim configs, each in API order: the last one that
  // applies to a request wins (claim overrides class, as upstream).
  std::vector<OpaqueConfig> configs;
};

// Collects and decodes our driver's entries of status.allocation.devices.config[]. Entries of
// other drivers are skipped; a missing config list is an empty result, not an error.
ClaimConfigsResult DecodeClaimConfigs(const nlohmann::json& claim);

// The config that applies to `request`, or nullptr.
const OpaqueConfig* ConfigForRequest(const std::vector<OpaqueConfig>& configs, std::string_view request);

}  // namespace gns::dra
