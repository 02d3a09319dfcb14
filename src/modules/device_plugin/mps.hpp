#pragma once
// MPS sharing (`sharing.mps`): what Allocate adds for a container that gets an MPS replica. The
// files of the operator's control daemon and its probe: api/mps.hpp (shared with dra-gpu).

#include "modules/device_plugin/allocation.hpp"
#include "modules/device_plugin/api/mps.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace gns::device_plugin {

struct MpsSettings {
  std::string root = kDefaultMpsRoot;  // on the host
  std::chrono::milliseconds check_interval{1000};  // how often the control daemon is probed
};

// Adds the MPS edits for one container to `out`: CUDA_MPS_PIPE_DIRECTORY (the container path),
// the pipe directory and the shm directory mounted read-write, and the client-side limits for
// one replica of a GPU with `memory_bytes`: 100/replicas percent of the threads, and
// memory/replicas MiB of pinned device memory on device 0 (the container sees its one GPU);
// the memory limit is left out when the memory is unknown (0).
void AddMpsEdits(const MpsSettings& settings, const std::string& resource, int replicas, uint64_t memory_bytes,
                 ContainerAllocation& out);

}  // namespace gns::device_plugin
