// /proc/devices parsing for the IMEX channel major.
#include "modules/dra_compute_domain/proc_devices.hpp"

#include "loop/atomic_file.hpp"

#include <charconv>
#include <vector>

namespace gns::dra {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

// Linux majors are 12 bits (MINORBITS 20 of a 32-bit dev_t); anything above is not a major.
constexpr uint32_t kMaxMajor = 4095;

}  // namespace

DeviceMajorResult FindCharDeviceMajor(std::string_view text, std::string_view device_name, std::string_view source) {
  DeviceMajorResult result;
  const std::string where(source);
  bool in_char_section = false;
  bool saw_char_section = false;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = Trim(text.substr(start, end - start));
    start = end + 1;
    if (line.empty()) continue;
    if (line.back() == ':') {
      // A section header: "Character devices:" opens ours, any other closes it.
      if (in_char_section) break;
      if (line == "Character devices:") in_char_section = saw_char_section = true;
      continue;
    }
    if (!in_char_section) continue;
    const auto fields = Fields(line);
    if (fields.size() < 2 || fields[1] != device_name) continue;
    uint32_t major = 0;
    const auto [ptr, ec] = std::from_chars(fields[0].data(), fields[0].data() + fields[0].size(), major);
    if (ec != std::errc{} || ptr != fields[0].data() + fields[0].size() || major > kMaxMajor) {
      result.error = where + ": the line for " + std::string(device_name) + " has no valid major: \"" +
                     std::string(line) + "\"";
      return result;
    }
    result.major = major;
    return result;
  }
  if (!saw_char_section) {
    result.error = where + ": no \"Character devices:\" section (is this /proc/devices?)";
  } else {
    result.error = where + ": no character device named " + std::string(device_name) +
                   " (is the NVIDIA driver loaded with IMEX channels? see seed 000 §11)";
  }
  return result;
}

DeviceMajorResult ReadImexChannelMajor(const std::string& proc_devices_path) {
  std::string text;
  std::string error;
  if (!ReadWholeFile(proc_devices_path, text, error)) {
    DeviceMajorResult result;
    result.error = error + " (needed for the " + std::string(kImexChannelsDeviceName) + " major)";
    return result;
  }
  return FindCharDeviceMajor(text, kImexChannelsDeviceName, proc_devices_path);
}

}  // namespace gns::dra
