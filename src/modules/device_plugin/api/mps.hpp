#pragma once
// Where the operator's MPS control daemons keep their files, and the probe of a daemon: shared by
// the device plugin's MPS sharing (mps.hpp) and the DRA gpu.nvidia.com driver's (dra_gpu). The
// control daemon is not ours: the operator runs `nvidia-cuda-mps-control -d` with
// CUDA_MPS_PIPE_DIRECTORY=<pipe dir> and a /dev/shm on <mpsRoot>/shm, as NVIDIA's
// mps-control-daemon does. Library gns_device_plugin_cdi.

#include <string>

namespace gns::device_plugin {

// The one source of the default of both modules' `mpsRoot` (upstream's helm default for mps.root).
inline constexpr const char* kDefaultMpsRoot = "/run/nvidia/mps";
// Where the container sees the MPS root (upstream's ContainerRoot), and the container's /dev/shm.
inline constexpr const char* kMpsContainerRoot = "/mps";
inline constexpr const char* kMpsContainerShm = "/dev/shm";
inline constexpr const char* kMpsPipeEnv = "CUDA_MPS_PIPE_DIRECTORY";
inline constexpr const char* kMpsThreadPercentageEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
inline constexpr const char* kMpsPinnedMemEnv = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

// "<root>/<name>/pipe" (the name keeps its slashes: /run/nvidia/mps/nvidia.com/gpu/pipe).
std::string MpsPipeDir(const std::string& root, const std::string& name);
// "<root>/shm": one for every daemon, as upstream.
std::string MpsShmDir(const std::string& root);
// The control daemon's endpoint in the pipe directory.
std::string MpsControlPath(const std::string& pipe_dir);

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
