// Start order: providers before consumers; `metrics` first so health is visible early.
#include "modules/manifest.hpp"

#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/metrics/metrics_module.hpp"

namespace gns {

const std::vector<ModuleDescriptor>& ModuleManifest() {
  static const std::vector<ModuleDescriptor> manifest = {
      DescribeModule<metrics::MetricsModule>(),
      DescribeModule<gpu_inventory::GpuInventoryModule>(),
      DescribeModule<device_plugin::DevicePluginModule>(),
  };
  return manifest;
}

}  // namespace gns
