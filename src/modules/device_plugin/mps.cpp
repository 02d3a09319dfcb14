// MPS Allocate edits.
#include "modules/device_plugin/mps.hpp"

namespace gns::device_plugin {

void AddMpsEdits(const MpsSettings& settings, const std::string& resource, int replicas, uint64_t memory_bytes,
                 ContainerAllocation& out) {
  const std::string container_pipe = MpsPipeDir(kMpsContainerRoot, resource);
  out.envs[kMpsPipeEnv] = container_pipe;
  // Clients create their sockets and shared memory there: read-write, as upstream mounts them.
  out.mounts.push_back({container_pipe, MpsPipeDir(settings.root, resource), false});
  out.mounts.push_back({kMpsContainerShm, MpsShmDir(settings.root), false});
  if (replicas < 1) replicas = 1;
  out.envs[kMpsThreadPercentageEnv] = std::to_string(100 / replicas);
  const uint64_t mib = memory_bytes / static_cast<uint64_t>(replicas) / (1024 * 1024);
  if (mib > 0) out.envs[kMpsPinnedMemEnv] = "0=" + std::to_string(mib) + "M";
}

}  // namespace gns::device_plugin
