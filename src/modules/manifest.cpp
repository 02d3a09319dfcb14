// Start order: providers before consumers; `metrics` first so health is visible early.
#include "modules/manifest.hpp"

#include "modules/compute_domain_controller/compute_domain_controller_module.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/dra_compute_domain/dra_module.hpp"
#include "modules/dra_gpu/dra_gpu_module.hpp"
#include "modules/gkm_agent/gkm_agent_module.hpp"
#include "modules/gkm_controller/gkm_controller_module.hpp"
#include "modules/gkm_csi/gkm_csi_module.hpp"
#include "modules/gpu_health/gpu_health_module.hpp"
#include "modules/gpu_inventory/gpu_inventory_module.hpp"
#include "modules/imex_health/imex_health_module.hpp"
#include "modules/imex_peers/imex_peers_module.hpp"
#include "modules/journald/journald_module.hpp"
#include "modules/kube/kube_module.hpp"
#include "modules/metrics/metrics_module.hpp"
#include "modules/gpu_reset/gpu_reset_module.hpp"
#include "modules/node_labels/node_labels_module.hpp"
#include "modules/nvsentinel_export/nvsentinel_export_module.hpp"
#include "modules/pod_resources/pod_resources_module.hpp"

namespace gns {

const std::vector<ModuleDescriptor>& ModuleManifest() {
  static const std::vector<ModuleDescriptor> manifest = {
      DescribeModule<metrics::MetricsModule>(),
      DescribeModule<kube::KubeModule>(),
      DescribeModule<cd_controller::ComputeDomainControllerModule>(),
      DescribeModule<gpu_inventory::GpuInventoryModule>(),
      DescribeModule<journald::JournaldModule>(),
      DescribeModule<gpu_health::GpuHealthModule>(),
      DescribeModule<imex_health::ImexHealthModule>(),
      DescribeModule<device_plugin::DevicePluginModule>(),
      DescribeModule<dra::DraComputeDomainModule>(),
      DescribeModule<dra_gpu::DraGpuModule>(),
      DescribeModule<pod_resources::PodResourcesModule>(),
      DescribeModule<gpu_reset::GpuResetModule>(),
      DescribeModule<imex_peers::ImexPeersModule>(),
      DescribeModule<gkm::GkmAgentModule>(),
      // After gkm-agent, whose cache verdicts it follows.
      DescribeModule<gkm_csi::GkmCsiModule>(),
      // Leader-elected: rolls the agents' per-node status up into each cache's status.
      DescribeModule<gkm_controller::GkmControllerModule>(),
      DescribeModule<node_labels::NodeLabelsModule>(),
      // After every source it exports (gpu-health, imex-health, gpu-reset).
      DescribeModule<nvsentinel_export::NvsentinelExportModule>(),
  };
  return manifest;
}

}  // namespace gns
