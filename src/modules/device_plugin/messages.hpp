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
  std::string resource_name;
  std::string socket;
  bool serving = false;
  bool registered = false;
  int registrations = 0;
  std::size_t open_streams = 0;
  std::vector<Device> devices;
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
}

// One Allocate the kubelet made (an event): the devices now belong to a container being admitted.
// pod-resources re-lists the kubelet's PodResourcesLister on it.
struct DevicesAllocated {
  static constexpr std::string_view kTopic = "device-plugin.allocated";
  std::string resource_name;
  std::vector<std::string> device_ids;  // every container's, in request order
};

}  // namespace gns::device_plugin
