#pragma once
// Bus messages of the `device-plugin` module.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace gns::device_plugin {

// What the kubelet is being told (retained): shown in /debug/state.
struct DevicePluginState {
  static constexpr std::string_view kTopic = "device-plugin.state";
  static constexpr bool kRetained = true;
  struct Device {
    std::string id;
    bool healthy = false;
    int numa_node = -1;
    std::string reason;
  };
  // One registered resource (nvidia.com/gpu, nvidia.com/mig-<profile>, a time-sliced one).
  struct Resource {
    std::string name;
    std::string socket;
    int replicas = 1;
    std::string sharing;       // "", time-slicing or mps
    std::string mps_pipe_dir;  // on the host, for an MPS resource
    std::string mps_daemon;    // "answers", or why the control daemon does not
    bool serving = false;
    bool registered = false;
    int registrations = 0;
    int healthy = 0;
    std::vector<std::string> device_ids;  // as the kubelet sees them
  };
  std::string resource_name;  // the whole-GPU resource
  std::string socket;         // its socket
  bool serving = false;       // every resource serves
  bool registered = false;    // every resource is registered
  int registrations = 0;      // over all resources
  std::size_t open_streams = 0;
  std::string error;          // the inventory does not fit the MIG strategy
  std::vector<Device> devices;  // physical devices (GPUs, MIG devices) with their health
  std::vector<Resource> resources;
  // What the plugin is configured to do, for the node labels.
  std::string mig_strategy;                // none | single | mixed
  int gpu_replicas = 1;                    // time-slicing replicas of the whole-GPU resource
  bool gpu_shared_renamed = false;         // ... advertised under another name (.shared or rename)
  std::string sharing_strategy = "none";   // time-slicing or mps when a resource is shared
  // The plan was made from an available GPU inventory: the resources, their devices and
  // sharing are facts about the node (before that, only the configuration is).
  bool inventory_read = false;
  std::string cdi_spec;  // our CDI spec's path when enabled
  int cdi_writes = 0;
  std::string cdi_error;
};

inline void to_json(nlohmann::json& j, const DevicePluginState& s) {
  nlohmann::json devices = nlohmann::json::object();
  for (const auto& d : s.devices) {
    nlohmann::json dj{{"health", d.healthy ? "Healthy" : "Unhealthy"}, {"numa", d.numa_node}};
    if (!d.reason.empty()) dj["reason"] = d.reason;
    devices[d.id] = std::move(dj);
  }
  j = nlohmann::json{{"resourceName", s.resource_name}, {"socket", s.socket},
                     {"serving", s.serving},            {"registered", s.registered},
                     {"registrations", s.registrations}, {"openStreams", s.open_streams},
                     {"devices", std::move(devices)}};
  nlohmann::json resources = nlohmann::json::object();
  for (const auto& r : s.resources) {
    resources[r.name] = nlohmann::json{{"socket", r.socket},         {"replicas", r.replicas},
                                       {"serving", r.serving},       {"registered", r.registered},
                                       {"registrations", r.registrations}, {"healthy", r.healthy},
                                       {"devices", r.device_ids.size()}};
    if (!r.sharing.empty()) resources[r.name]["sharing"] = r.sharing;
    if (!r.mps_pipe_dir.empty()) {
      resources[r.name]["mps"] = nlohmann::json{{"pipeDirectory", r.mps_pipe_dir}, {"controlDaemon", r.mps_daemon}};
    }
  }
  j["resources"] = std::move(resources);
  j["migStrategy"] = s.mig_strategy;
  j["sharingStrategy"] = s.sharing_strategy;
  if (!s.error.empty()) j["error"] = s.error;
  if (!s.cdi_spec.empty()) {
    j["cdiSpec"] = nlohmann::json{{"path", s.cdi_spec}, {"writes", s.cdi_writes}};
    if (!s.cdi_error.empty()) j["cdiSpec"]["error"] = s.cdi_error;
  }
}

// Each Allocate the plugin answers is published as pod_resources::DevicesAllocated
// (modules/pod_resources/messages.hpp): the event pod-resources re-lists on is declared there.

}  // namespace gns::device_plugin
