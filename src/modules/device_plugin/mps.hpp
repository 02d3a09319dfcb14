#pragma once
// MPS sharing (`sharing.mps`): where a resource's MPS files are, what Allocate adds for a
// container that gets an MPS replica, and the readiness probe of the operator's control daemon.
// The control daemon is not ours: the operator runs `nvidia-cuda-mps-control -d` per resource
// with CUDA_MPS_PIPE_DIRECTORY=<mpsRoot>/<resource>/pipe and a /dev/shm on <mpsRoot>/shm, as
// NVIDIA's mps-control-daemon does. Pure except ProbeMpsControl (a non-blocking connect/open).

#include "modules/device_plugin/allocation.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace gns::device_plugin {

struct MpsSettings {
  std::string root = "/run/nvidia/mps";  // on the host (upstream's helm default for mps.root)
  std::chrono::milliseconds check_interval{1000};  // how often the control daemon is probed
};

// Where the container sees the MPS root (upstream's ContainerRoot), and the container's /dev/shm.
inline constexpr const char* kMpsContainerRoot = "/mps";
inline constexpr const char* kMpsContainerShm = "/dev/shm";
inline constexpr const char* kMpsPipeEnv = "CUDA_MPS_PIPE_DIRECTORY";
inline constexpr const char* kMpsThreadPercentageEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
inline constexpr const char* kMpsPinnedMemEnv = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

// "<root>/<resource>/pipe" (the resource name keeps its slash: /run/nvidia/mps/nvidia.com/gpu/pipe).
std::string MpsPipeDir(const std::string& root, const std::string& resource);
// "<root>/shm": one for every resource, as upstream.
std::string MpsShmDir(const std::string& root);
// The control daemon's endpoint in the pipe directory.
std::string MpsControlPath(const std::string& pipe_dir);

// Adds the MPS edits for one container to `out`: CUDA_MPS_PIPE_DIRECTORY (the container path),
// the pipe directory and the shm directory mounted read-write, and the client-side limits for
// one replica of a GPU with `memory_bytes`: 100/replicas percent of the threads, and
// memory/replicas MiB of pinned device memory on device 0 (the container sees its one GPU);
// the memory limit is left out when the memory is unknown (0).
void AddMpsEdits(const MpsSettings& settings, const std::string& resource, int replicas, uint64_t memory_bytes,
                 ContainerAllocation& out);

// A non-blocking connect() to the unix socket at `socket_path`, closed at once: 0 when something
// listens there (or its backlog is full), else the errno (ENOENT: no file; ECONNREFUSED: a socket
// nobody listens on, e.g. its server between bind() and listen(), or dead; ENAMETOOLONG: the
// path does not fit a unix address). Used for the MPS control daemon and kubelet.sock.
int ProbeUnixListener(const std::string& socket_path);

// Whether the control daemon answers at `control_path`: a unix socket that accepts a
// connection, or a FIFO with a reader (an open for writing that does not fail with ENXIO).
// Returns why not (empty when it answers). Never blocks.
std::string ProbeMpsControl(const std::string& control_path);

}  // namespace gns::device_plugin
