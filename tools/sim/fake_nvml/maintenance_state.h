// The fake NVML's per-GPU maintenance state, kept by UUID for the life of the process (the
// hardware's state survives nvmlShutdown/nvmlInit, unlike the GPU description, which nvmlInit
// reads again): persistence mode, the compute processes holding the GPU, pending page retirement
// and row remapping, and how the next reset behaves. The fake `nvidia-smi` (nvidia-smi.py here)
// resets a GPU through the control socket's `resetGpu` command, which checks what a real reset
// refuses: a process or an NVML event set still holding the GPU, persistence mode on. It also
// sets a GPU's time-slice (`nvidia-smi compute-policy --set-timeslice`) through `setTimeSlice`.
#pragma once

#include "modules/gpu_inventory/api/nvml_abi.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace gns::sim::fake_nvml {

struct GpuMaintenance {
  bool persistence = false;
  std::vector<gns::nvml::ProcessInfo> processes;
  bool retired_pages_pending = false;
  bool remap_pending = false;
  bool remap_failure = false;
  // What the next reset does: "ok", "fail" (refused with an error), "hang" (the caller never
  // returns), "leavePendingRemap" (succeeds but a row remap stays pending).
  std::string reset_mode = "ok";
  uint64_t resets = 0;
  // The scheduler's time-slice (nvidia-smi compute-policy: 0 default, 1 short, 2 medium, 3 long),
  // how many times it was set, and whether setting it fails ("ok", "fail").
  int time_slice = 0;
  uint64_t time_slice_sets = 0;
  std::string time_slice_mode = "ok";
};

class MaintenanceState {
 public:
  template <typename Body>
  auto With(const std::string& uuid, Body&& body) {
    std::lock_guard lock(mu_);
    return body(gpus_[uuid]);
  }

  // {"uuid":…, "persistence":bool, "processes":[pid…], "retiredPagesPending":bool,
  //  "remapPending":bool, "remapFailure":bool, "resetMode":"ok|fail|hang|leavePendingRemap",
  //  "timeSliceMode":"ok|fail"}
  void Set(const nlohmann::json& value) {
    const auto uuid = value.at("uuid").get<std::string>();
    for (const auto& [key, v] : value.items()) {
      if (key != "uuid" && key != "persistence" && key != "processes" && key != "retiredPagesPending" &&
          key != "remapPending" && key != "remapFailure" && key != "resetMode" && key != "timeSliceMode") {
        throw std::runtime_error("setGpuState: unknown key \"" + key + "\"");
      }
    }
    std::lock_guard lock(mu_);
    GpuMaintenance& gpu = gpus_[uuid];
    if (value.contains("persistence")) gpu.persistence = value.at("persistence").get<bool>();
    if (value.contains("processes")) {
      gpu.processes.clear();
      for (const auto& pid : value.at("processes")) {
        gpu.processes.push_back({pid.get<unsigned int>(), 1ULL << 30, 0xFFFFFFFFu, 0xFFFFFFFFu});
      }
    }
    if (value.contains("retiredPagesPending")) gpu.retired_pages_pending = value.at("retiredPagesPending").get<bool>();
    if (value.contains("remapPending")) gpu.remap_pending = value.at("remapPending").get<bool>();
    if (value.contains("remapFailure")) gpu.remap_failure = value.at("remapFailure").get<bool>();
    if (value.contains("resetMode")) {
      const auto mode = value.at("resetMode").get<std::string>();
      if (mode != "ok" && mode != "fail" && mode != "hang" && mode != "leavePendingRemap") {
        throw std::runtime_error("setGpuState: resetMode must be ok, fail, hang or leavePendingRemap");
      }
      gpu.reset_mode = mode;
    }
    if (value.contains("timeSliceMode")) {
      const auto mode = value.at("timeSliceMode").get<std::string>();
      if (mode != "ok" && mode != "fail") throw std::runtime_error("setGpuState: timeSliceMode must be ok or fail");
      gpu.time_slice_mode = mode;
    }
  }

  // `nvidia-smi compute-policy -i <uuid> --set-timeslice <value>` after the caller checked that
  // the GPU exists: "" or the error nvidia-smi would print.
  std::string SetTimeSlice(const std::string& uuid, int value) {
    if (value < 0 || value > 3) return "Invalid timeslice value " + std::to_string(value) + " (0-3)";
    std::lock_guard lock(mu_);
    GpuMaintenance& gpu = gpus_[uuid];
    if (gpu.time_slice_mode == "fail") return "Failed to set timeslice for GPU " + uuid + ": Not Supported (simulated)";
    gpu.time_slice = value;
    ++gpu.time_slice_sets;
    return "";
  }

  nlohmann::json Get(const std::string& uuid) {
    std::lock_guard lock(mu_);
    const GpuMaintenance& gpu = gpus_[uuid];
    nlohmann::json pids = nlohmann::json::array();
    for (const auto& p : gpu.processes) pids.push_back(p.pid);
    return {{"persistence", gpu.persistence},     {"processes", pids},
            {"retiredPagesPending", gpu.retired_pages_pending}, {"remapPending", gpu.remap_pending},
            {"remapFailure", gpu.remap_failure},  {"resetMode", gpu.reset_mode},
            {"resets", gpu.resets},       {"timeSlice", gpu.time_slice},
            {"timeSliceSets", gpu.time_slice_sets}, {"timeSliceMode", gpu.time_slice_mode}};
  }

  // One reset as the driver does it, after the caller checked that the GPU exists and that no
  // NVML event set holds it. Returns "" and sets `hang` for a reset that never returns, or the
  // error a real nvidia-smi would print.
  std::string Reset(const std::string& uuid, bool& hang) {
    std::lock_guard lock(mu_);
    GpuMaintenance& gpu = gpus_[uuid];
    hang = false;
    if (!gpu.processes.empty()) {
      return "GPU " + uuid + " is in use by " + std::to_string(gpu.processes.size()) + " process(es), first pid " +
             std::to_string(gpu.processes.front().pid);
    }
    if (gpu.persistence) return "persistence mode is enabled on GPU " + uuid + "; disable it before a reset";
    if (gpu.reset_mode == "fail") return "Unable to reset GPU " + uuid + ": Unknown Error (simulated)";
    if (gpu.reset_mode == "hang") {
      hang = true;
      return "";
    }
    ++gpu.resets;
    gpu.retired_pages_pending = false;
    gpu.remap_pending = gpu.reset_mode == "leavePendingRemap";
    return "";
  }

 private:
  std::mutex mu_;
  std::map<std::string, GpuMaintenance> gpus_;
};

inline MaintenanceState& Maintenance() {
  static MaintenanceState state;
  return state;
}

}  // namespace gns::sim::fake_nvml
