#pragma once
// The `nvml-events` subcommand: gpu-inventory's NVML event waiter, run as a child process of the
// supervisor (event_waiter.hpp says why and what it prints). main() only needs these two names,
// so they stand on gpu-inventory's public surface.

#include <cstdint>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

// The child's side: what `gpu-node-supervisor nvml-events` runs.
struct EventWaiterOptions {
  std::string library;                     // soname or path to dlopen
  unsigned int wait_ms = 60000;            // each nvmlEventSetWait_v2 at rest
  std::vector<uint32_t> excluded_indices;  // GPUs released for their reset: never touched
  std::vector<std::string> excluded_uuids;
};
// Runs until killed (or its stdout is closed); returns 1 after an `error` line.
int RunEventWaiter(const EventWaiterOptions& options);

}  // namespace gns::gpu_inventory
