#pragma once
// What every module may know about the node and the install: the node's name, the host paths
// (every path the supervisor touches comes from here, so tests and `make run` use sandboxes)
// and the resolved feature gates.

#include "loop/feature_gates.hpp"
#include "loop/gpu_split.hpp"

#include <memory>
#include <string>

namespace gns {

struct SitePaths {
  std::string kubelet_dir;  // /var/lib/kubelet
  std::string cdi_dir;      // /var/run/cdi
  std::string state_dir;    // /var/lib/gpu-node-supervisor
  std::string host_root;    // "/" or the host mounted into the container, e.g. /host
};

struct SiteConfig {
  std::string node_name;
  SitePaths paths;
  FeatureGates gates;
  std::string config_file;  // for messages
  // The GPUs DRA and the device plugin each serve (loop/gpu_split.hpp): written by their
  // sections while the config is parsed, read by the device plugin when it plans.
  std::shared_ptr<GpuSplit> gpu_split = std::make_shared<GpuSplit>();
};

}  // namespace gns
