#pragma once
// Bus messages of the `dra-gpu` module (gpu.nvidia.com): its state (retained), shown in
// /debug/state.

#include "modules/gpu_inventory/messages.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra_gpu {

// The names of this driver's devices, here because others map a claim's devices back to GPUs
// (metrics' pod labels): one source for the scheme.
// "gpu-<minor>": upstream's name for a whole GPU (its minor, not its index).
inline std::string GpuDeviceName(uint32_t minor) { return "gpu-" + std::to_string(minor); }
// "gpu-<minor>-mig-<giProfileId>-<placementStart>-<placementSize>": upstream's name for a static
// MIG device (its parent's minor, the GPU instance's profile id and placement), as WIRE-FACTS.md
// §4.5 reads it from upstream's deviceinfo.go. Only meaningful where `mig.placement_known`.
inline std::string MigDeviceName(uint32_t parent_minor, const gpu_inventory::MigDeviceInfo& mig) {
  return GpuDeviceName(parent_minor) + "-mig-" + std::to_string(mig.gi_profile_id) + "-" +
         std::to_string(mig.placement_start) + "-" + std::to_string(mig.placement_size);
}

// A gpu.nvidia.com device name read back into its parts: the one parser of the scheme above
// (dra-gpu's records, pod-resources' holders of a GPU or MIG device).
struct DeviceNameParts {
  uint32_t minor = 0;  // the GPU's (a MIG device's parent's) minor: /dev/nvidia<minor>
  bool mig = false;    // a MIG device: the three below are set
  uint32_t gi_profile_id = 0;
  uint32_t placement_start = 0;
  uint32_t placement_size = 0;
  auto operator<=>(const DeviceNameParts&) const = default;
};

// Exactly "gpu-<minor>" or "gpu-<minor>-mig-<giProfileId>-<placementStart>-<placementSize>",
// each number decimal without sign or leading zero and within 32 bits, as the two functions above
// write them; nullopt for anything else ("gpu-3-", "gpu-03", "gpu-3-mig-1-0", "channel-0"), so a
// name this driver never makes is never taken for one of its devices.
inline std::optional<DeviceNameParts> ParseDeviceName(std::string_view name) {
  // One number at the head of `rest`, moved past it.
  const auto number = [](std::string_view& rest) -> std::optional<uint32_t> {
    uint32_t value = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    const std::size_t length = static_cast<std::size_t>(end - rest.data());
    if (ec != std::errc() || length == 0 || (rest[0] == '0' && length > 1)) return std::nullopt;
    rest.remove_prefix(length);
    return value;
  };
  // `rest` starts with `text`, moved past it.
  const auto skip = [](std::string_view& rest, std::string_view text) {
    if (!rest.starts_with(text)) return false;
    rest.remove_prefix(text.size());
    return true;
  };
  std::string_view rest = name;
  DeviceNameParts parts;
  if (!skip(rest, "gpu-")) return std::nullopt;
  const auto minor = number(rest);
  if (!minor) return std::nullopt;
  parts.minor = *minor;
  if (rest.empty()) return parts;
  if (!skip(rest, "-mig-")) return std::nullopt;
  const auto profile = number(rest);
  if (!profile || !skip(rest, "-")) return std::nullopt;
  const auto start = number(rest);
  if (!start || !skip(rest, "-")) return std::nullopt;
  const auto size = number(rest);
  if (!size || !rest.empty()) return std::nullopt;
  parts.mig = true;
  parts.gi_profile_id = *profile;
  parts.placement_start = *start;
  parts.placement_size = *size;
  return parts;
}

struct DraGpuState {
  static constexpr std::string_view kTopic = "dra-gpu.state";
  static constexpr bool kRetained = true;
  struct Claim {
    std::string uid;
    std::string namespace_name;
    std::string name;
    std::vector<std::string> devices;  // gpu-<minor>, in allocation order
  };
  bool registered = false;
  std::string registration_error;
  std::vector<std::string> served;     // the slice's devices (gpu-<minor>)
  std::vector<std::string> tainted;    // "gpu-<minor>: <key>=<value>:<effect>", from gpu-health's verdicts
  std::vector<Claim> prepared_claims;  // by claim UID
  int64_t slice_generation = 0;
  uint64_t slice_publishes = 0;
  std::string last_error;
  // GPUs this driver set to a non-default time-slice (its book: GPU UUID → 1 Short … 3 Long).
  std::map<std::string, int> time_slices;
};

inline void to_json(nlohmann::json& j, const DraGpuState& s) {
  nlohmann::json claims = nlohmann::json::object();
  for (const auto& c : s.prepared_claims) claims[c.uid] = {{"claim", c.namespace_name + "/" + c.name}, {"devices", c.devices}};
  j = {{"registered", s.registered},       {"registrationError", s.registration_error},
       {"served", s.served},               {"tainted", s.tainted},
       {"preparedClaims", std::move(claims)},
       {"sliceGeneration", s.slice_generation}, {"slicePublishes", s.slice_publishes},
       {"lastError", s.last_error},       {"timeSlices", s.time_slices}};
}

}  // namespace gns::dra_gpu
