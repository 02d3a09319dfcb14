#pragma once
// Finds the character-device major of the IMEX channels in <hostRoot>/proc/devices. The CDI spec
// needs it to make the container's /dev/nvidia-caps-imex-channels/channel0 (seed 000 §11: when it
// is missing at start the plugin fails to start, and the supervisor retries with backoff).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gns::dra {

inline constexpr std::string_view kImexChannelsDeviceName = "nvidia-caps-imex-channels";

struct DeviceMajorResult {
  std::optional<uint32_t> major;
  std::string error;  // names the file and what is missing or wrong
  bool ok() const { return major.has_value(); }
};

// Parses /proc/devices text: the "Character devices:" section, lines "<major> <name>", up to the
// next "...:" header (WIRE-FACTS §9.1). `source` names the file in errors.
DeviceMajorResult FindCharDeviceMajor(std::string_view text, std::string_view device_name, std::string_view source);

// Reads `proc_devices_path` (DriverPaths::proc_devices) and finds nvidia-caps-imex-channels.
// Blocking (a small procfs read; fine at start).
DeviceMajorResult ReadImexChannelMajor(const std::string& proc_devices_path);

}  // namespace gns::dra
