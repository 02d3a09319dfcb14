// Start order: providers before consumers; `metrics` first so health is visible early.
#include "modules/manifest.hpp"

#include "modules/metrics/metrics_module.hpp"

namespace gns {

const std::vector<ModuleDescriptor>& ModuleManifest() {
  static const std::vector<ModuleDescriptor> manifest = {
      DescribeModule<metrics::MetricsModule>(),
  };
  return manifest;
}

}  // namespace gns
