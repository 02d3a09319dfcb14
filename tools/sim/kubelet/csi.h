// The CSI part of the fake kubelet (library gns_sim_kubelet_csi): what the kubelet's CSI volume
// plugin does for a pod's inline ephemeral CSI volume, on the node plugin the plugin watcher
// registered (type CSIPlugin). Kept apart from gns_sim_kubelet because it is built on the CSI
// spec's own csi.proto (tools/sim/csi_client, verbatim): a process that links our own text of the
// same package (the supervisor's modules) must not link these stubs too.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kubelet_sim.h"

namespace gns::sim {

// Sets options.csi_node_info: NodeGetInfo on a CSIPlugin's endpoint as it registers, as the
// kubelet's CSI handler does (a failure refuses the registration).
void EnableCsi(KubeletSimOptions& options, std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A pod's inline CSI volume (pod.spec.volumes[].csi) as the kubelet sees it.
struct CsiPodVolume {
  std::string pod_namespace;
  std::string pod_name;
  std::string pod_uid;
  std::string service_account = "default";
  std::string volume_name;  // the pod's name for the volume
  std::string driver;
  std::map<std::string, std::string> attributes;  // volumeAttributes
  bool read_only = false;                         // the volume's readOnly
  std::string fs_type;
  // The CSIDriver object's podInfoOnMount (deploy/components/gkm-agent: true): the pod's keys
  // and csi.storage.k8s.io/ephemeral join the volume context.
  bool pod_info_on_mount = true;
};

struct CsiVolumeResult {
  RpcStatus status;
  std::string volume_id;
  std::string target_path;
  nlohmann::json request;  // what was sent, protobuf's JSON mapping (field names as in the proto)
};

// csi_plugin.go makeVolumeHandle: "csi-" + hex sha256 of pod uid + volume name.
std::string CsiVolumeHandle(const std::string& pod_uid, const std::string& volume_name);
// <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount
std::filesystem::path CsiTargetPath(const std::filesystem::path& kubelet_dir, const std::string& pod_uid,
                                    const std::string& volume_name);

// The kubelet's SetUp of the volume: the driver must be registered; the volume's directory is
// made (0750) with vol_data.json; NodeGetCapabilities, then NodePublishVolume (volume handle,
// target <dir>/mount, readonly, a mount capability SINGLE_NODE_WRITER, the volume context). A
// failed publish takes vol_data.json and the directory away again (never what is mounted).
CsiVolumeResult CsiPublish(KubeletSim& sim, const CsiPodVolume& volume,
                           std::chrono::milliseconds timeout = std::chrono::seconds(30));

// TearDown: the driver and handle from vol_data.json (so it works after a kubelet restart too),
// NodeUnpublishVolume, then vol_data.json and the empty directories go. An unknown volume: OK
// (nothing to do), as the kubelet finds nothing to tear down.
CsiVolumeResult CsiUnpublish(KubeletSim& sim, const std::string& pod_uid, const std::string& volume_name,
                             std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The control-socket commands of the CSI part (kubeletctl csi-publish / csi-unpublish /
// csi-volumes); nullopt for any other command. `log` gets one line per call.
std::optional<std::string> HandleCsiCommand(KubeletSim& sim, std::string_view line,
                                            const std::function<void(std::string_view)>& log);

}  // namespace gns::sim
