// The polled checks together: their settings (the module's `checks:` section), the schedule of
// their groups, and one pass's sample (gpu_inventory::HealthSample) → each GPU's findings. Each
// check is a part of its own (memory_checks, nvlink_checks, fabric_checks, pcie_checks,
// thermal_checks, presence_checks, host_checks); this file only runs the ones whose group the
// pass read. The check book and the module turn the findings into verdicts.
//
// The schedule: one interval per group (HealthGroup); the next wake-up is the earliest group
// due, and a group falling due within a tenth of its interval after that rides along, so groups
// of 30 s and 60 s share one wake-up a minute instead of drifting apart (fewer wake-ups at rest).
//
// Pure, no I/O; times are passed in. Loop thread only.
#pragma once

#include "modules/gpu_health/fabric_checks.hpp"
#include "modules/gpu_health/health_check.hpp"
#include "modules/gpu_health/host_checks.hpp"
#include "modules/gpu_health/host_services.hpp"
#include "modules/gpu_health/memory_checks.hpp"
#include "modules/gpu_health/nvlink_checks.hpp"
#include "modules/gpu_health/pcie_checks.hpp"
#include "modules/gpu_health/presence_checks.hpp"
#include "modules/gpu_health/thermal_checks.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gns::gpu_health {

struct ChecksConfig {
  bool enabled = true;          // the polled checks at all (gpu-inventory's sampler must run too)
  uint32_t clear_after = 3;     // clean passes before a non-fatal condition or warning clears
  // Per group (index: bit position of gpu_inventory::HealthGroup): the interval, 0 = off.
  // Defaults no tighter than the anchors' (README): gpud reads its NVIDIA components once a
  // minute; fabric and thermal state change faster and cost one call per GPU.
  std::array<std::chrono::milliseconds, 6> intervals{std::chrono::seconds(60), std::chrono::seconds(60),
                                                     std::chrono::seconds(30), std::chrono::seconds(60),
                                                     std::chrono::seconds(30), std::chrono::seconds(60)};
  // A pass the sampler has not answered after this is given up (the sampler answers a hung
  // NVML call itself; this covers a sampler withdrawn in the middle of a pass).
  std::chrono::milliseconds pass_timeout{std::chrono::seconds(120)};
  MemoryChecks::Settings memory;
  NvLinkChecks::Settings nvlink;
  FabricChecks::Settings fabric;
  PcieChecks::Settings pcie;
  ThermalChecks::Settings thermal;
  HostSettings host;
  HostServicesSettings host_services;  // followed over D-Bus, not polled (host_services.hpp)
  PresenceSettings presence;
};

// The name of a group as config and /debug/state spell it: memory, nvlink, fabric, pcie,
// thermal, host.
[[nodiscard]] std::string_view GroupName(std::size_t index) noexcept;

class CheckSchedule {
 public:
  using Time = std::chrono::steady_clock::time_point;
  explicit CheckSchedule(const std::array<std::chrono::milliseconds, 6>& intervals) : intervals_(intervals) {}
  // Groups (HealthGroup bits) due at `now`: never run, or their interval elapsed; with them
  // those due within a tenth of their interval. An interval of at least the loop's wake grid
  // (src/loop/wake_grid.hpp) elapses at the grid point nearest to its end.
  [[nodiscard]] uint32_t Due(Time now) const;
  void Ran(uint32_t groups, Time now);
  // When the earliest group falls due; nullopt when every group is off.
  [[nodiscard]] std::optional<Time> NextDue() const;
  // The groups switched on.
  [[nodiscard]] uint32_t Enabled() const;

 private:
  [[nodiscard]] Time DueAt(std::size_t group) const;  // of a group that ran

  std::array<std::chrono::milliseconds, 6> intervals_;
  std::array<std::optional<Time>, 6> last_{};
};

class HealthChecks {
 public:
  struct GpuFindings {
    std::string uuid;
    std::string pci;
    Findings findings;
  };
  struct PassFindings {
    std::vector<GpuFindings> gpus;
    std::optional<Finding> node;  // GpuMissingFromNvml
  };

  explicit HealthChecks(const ChecksConfig& config);

  // One pass: the checks of the groups it read, for every GPU in it. `known_gpus`: the GPUs of
  // the inventory (the sample leaves out those being reset), for GpuMissingFromNvml;
  // `known_pci`: their PCI addresses, which with the pass's name the GPUs missing from NVML.
  PassFindings Judge(const gpu_inventory::HealthSample& sample, std::size_t known_gpus,
                     const std::vector<std::string>& known_pci = {});
  // A reset or a new boot: the GPU's counters and windows start again.
  void Forget(const std::string& uuid);
  void ForgetAll();

 private:
  ChecksConfig config_;
  MemoryChecks memory_;
  NvLinkChecks nvlink_;
  FabricChecks fabric_;
  PcieChecks pcie_;
  ThermalChecks thermal_;
};

}  // namespace gns::gpu_health
