#pragma once
// Bus messages of the `dra-gpu` module (gpu.nvidia.com): its state (retained), shown in
// /debug/state.

#include "modules/gpu_inventory/messages.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
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
};

inline void to_json(nlohmann::json& j, const DraGpuState& s) {
  nlohmann::json claims = nlohmann::json::object();
  for (const auto& c : s.prepared_claims) claims[c.uid] = {{"claim", c.namespace_name + "/" + c.name}, {"devices", c.devices}};
  j = {{"registered", s.registered},       {"registrationError", s.registration_error},
       {"served", s.served},               {"tainted", s.tainted},
       {"preparedClaims", std::move(claims)},
       {"sliceGeneration", s.slice_generation}, {"slicePublishes", s.slice_publishes},
       {"lastError", s.last_error}};
}

}  // namespace gns::dra_gpu
