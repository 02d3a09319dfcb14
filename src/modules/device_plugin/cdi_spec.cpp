// CDI spec discovery, building and validation.
#include "modules/device_plugin/cdi_spec.hpp"

#include "loop/atomic_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

namespace gns::device_plugin {

namespace {

constexpr std::string_view kLdCacheMagic = "glibc-ld.so.cache1.1";
constexpr std::size_t kLdCacheHeaderSize = 48;  // magic+version (20), nlibs, len_strings, flags+pad, ext, unused[3]
constexpr std::size_t kLdCacheEntrySize = 24;   // flags, key, value, osversion (4 each), hwcap (8)

// The entry type our own libraries have (glibc's FLAG_ELF_LIBC6 with the 64-bit ABI flag).
constexpr int32_t kFlagElfLibc6 = 0x0003;
#if defined(__x86_64__)
constexpr int32_t kFlagArch = 0x0300;  // FLAG_X8664_LIB64
#elif defined(__aarch64__)
constexpr int32_t kFlagArch = 0x0a00;  // FLAG_AARCH64_LIB64
#else
constexpr int32_t kFlagArch = 0;
#endif

// The driver's user-space libraries a CUDA container needs (the compute subset of what NVIDIA's
// container toolkit mounts).
const std::vector<std::string>& DriverLibraryPrefixes() {
  static const std::vector<std::string> prefixes = {
      "libcuda.so.",          "libcudadebugger.so.",  "libnvidia-ml.so.",        "libnvidia-ptxjitcompiler.so.",
      "libnvidia-nvvm.so.",   "libnvidia-opencl.so.", "libnvidia-gpucomp.so.",   "libnvidia-allocator.so.",
      "libnvidia-cfg.so.",    "libnvidia-pkcs11.so.", "libnvidia-opticalflow.so.", "libnvcuvid.so.",
      "libnvidia-encode.so."};
  return prefixes;
}

const std::vector<std::string>& DriverBinaries() {
  static const std::vector<std::string> binaries = {"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
                                                    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"};
  return binaries;
}

uint32_t ReadU32(const std::string& bytes, std::size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, bytes.data() + at, sizeof(v));
  return v;
}

std::string Join(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  return (root.back() == '/' ? root.substr(0, root.size() - 1) : root) + path;
}

nlohmann::json DeviceNode(const std::string& path) { return nlohmann::json{{"path", path}}; }

bool ValidVendorOrClass(const std::string& s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s.front()))) return false;
  if (!std::isalnum(static_cast<unsigned char>(s.back()))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

bool ValidDeviceName(const std::string& s) {
  if (s.empty() || !std::isalnum(static_cast<unsigned char>(s.front())) ||
      !std::isalnum(static_cast<unsigned char>(s.back()))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ':';
  });
}

// "0.5.0" → 5 (every known version is 0.x.0).
int MinorOf(const std::string& version) {
  static const std::set<std::string> known = {"0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"};
  if (known.count(version) == 0) return -1;
  return version[2] - '0';
}

}  // namespace

std::vector<std::string> LibrariesFromLdCache(const std::string& bytes, const std::vector<std::string>& prefixes,
                                              std::string& error) {
  std::vector<std::string> out;
  // The new format stands alone or follows the old one ("ld.so-1.7.0"); string offsets count
  // from the new header.
  const std::size_t base = bytes.find(kLdCacheMagic);
  if (base == std::string::npos) {
    error = "not a glibc ld.so.cache (no \"glibc-ld.so.cache1.1\" header)";
    return out;
  }
  if (bytes.size() < base + kLdCacheHeaderSize) {
    error = "ld.so.cache is truncated in its header";
    return out;
  }
  const uint32_t nlibs = ReadU32(bytes, base + 20);
  const std::size_t entries = base + kLdCacheHeaderSize;
  if (nlibs > (bytes.size() - entries) / kLdCacheEntrySize) {
    error = "ld.so.cache lists " + std::to_string(nlibs) + " libraries but is too short for them";
    return out;
  }
  auto string_at = [&](uint32_t offset, std::string& s) {
    const std::size_t at = base + offset;
    if (at >= bytes.size()) return false;
    const std::size_t end = bytes.find('\0', at);
    if (end == std::string::npos) return false;
    s.assign(bytes, at, end - at);
    return true;
  };
  std::set<std::string> seen;
  for (uint32_t i = 0; i < nlibs; ++i) {
    const std::size_t e = entries + i * kLdCacheEntrySize;
    int32_t flags = 0;
    std::memcpy(&flags, bytes.data() + e, sizeof(flags));
    if ((flags & 0xff) != kFlagElfLibc6 || (flags & 0xff00) != kFlagArch) continue;
    std::string key, value;
    if (!string_at(ReadU32(bytes, e + 4), key) || !string_at(ReadU32(bytes, e + 8), value)) {
      error = "ld.so.cache entry " + std::to_string(i) + " points outside the file";
      return {};
    }
    const bool wanted = std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return key.rfind(p, 0) == 0; });
    // One path per soname, the first the cache lists: the one the dynamic linker loads. A host
    // whose cache lists the driver twice (/usr/local/nvidia/lib64 and /lib on the real H200
    // node we checked) would otherwise mount every library twice.
    if (wanted && !value.empty() && value.front() == '/' && seen.insert(key).second) out.push_back(value);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void ParseMigMinors(const std::string& text, CdiHostFacts& facts) {
  std::istringstream in(text);
  std::string path;
  uint32_t minor = 0;
  while (in >> path >> minor) {
    unsigned gpu = 0, gi = 0, ci = 0;
    char tail[16] = {};
    if (std::sscanf(path.c_str(), "gpu%u/gi%u/ci%u/%15s", &gpu, &gi, &ci, tail) == 4 && std::strcmp(tail, "access") == 0) {
      facts.ci_caps[{gpu, gi, ci}] = minor;
    } else if (std::sscanf(path.c_str(), "gpu%u/gi%u/%15s", &gpu, &gi, tail) == 3 && std::strcmp(tail, "access") == 0) {
      facts.gi_caps[{gpu, gi}] = minor;
    }
  }
}

CdiHostFacts DiscoverCdiHostFacts(const std::string& host_root, const std::string& driver_root) {
  CdiHostFacts facts;
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}) {
    if (::access(Join(host_root, node).c_str(), F_OK) == 0) facts.control_nodes.emplace_back(node);
  }
  std::string text, error;
  const std::string minors = Join(host_root, "/proc/driver/nvidia-caps/mig-minors");
  if (ReadWholeFile(minors, text, error)) ParseMigMinors(text, facts);
  const std::string root = Join(host_root, driver_root);
  const std::string cache = Join(root, "/etc/ld.so.cache");
  std::string bytes;
  if (!ReadWholeFile(cache, bytes, error)) {
    facts.warnings.push_back("no driver libraries in the CDI spec: " + error);
  } else {
    std::string parse_error;
    for (const auto& lib : LibrariesFromLdCache(bytes, DriverLibraryPrefixes(), parse_error)) {
      if (::access(Join(root, lib).c_str(), F_OK) == 0) facts.driver_files.push_back(lib);
    }
    if (!parse_error.empty()) facts.warnings.push_back(cache + ": " + parse_error);
  }
  for (const auto& binary : DriverBinaries()) {
    const std::string path = "/usr/bin/" + binary;
    if (::access(Join(root, path).c_str(), F_OK) == 0) facts.driver_files.push_back(path);
  }
  return facts;
}

nlohmann::json BuildCdiSpec(const CdiSettings& settings, const std::vector<PhysicalDevice>& devices,
                            const CdiHostFacts& facts) {
  nlohmann::json list = nlohmann::json::array();
  std::set<uint32_t> all_minors;
  std::set<std::string> all_caps;
  for (const auto& d : devices) {
    nlohmann::json nodes = nlohmann::json::array();
    nodes.push_back(DeviceNode("/dev/nvidia" + std::to_string(d.minor)));
    all_minors.insert(d.minor);
    if (d.mig) {
      if (const auto gi = facts.gi_caps.find({d.minor, d.gpu_instance}); gi != facts.gi_caps.end()) {
        const std::string cap = "/dev/nvidia-caps/nvidia-cap" + std::to_string(gi->second);
        nodes.push_back(DeviceNode(cap));
        all_caps.insert(cap);
      }
      if (const auto ci = facts.ci_caps.find({d.minor, d.gpu_instance, d.compute_instance}); ci != facts.ci_caps.end()) {
        const std::string cap = "/dev/nvidia-caps/nvidia-cap" + std::to_string(ci->second);
        nodes.push_back(DeviceNode(cap));
        all_caps.insert(cap);
      }
    }
    list.push_back({{"name", d.id}, {"containerEdits", {{"deviceNodes", std::move(nodes)}}}});
  }
  nlohmann::json all_nodes = nlohmann::json::array();
  for (const auto minor : all_minors) all_nodes.push_back(DeviceNode("/dev/nvidia" + std::to_string(minor)));
  for (const auto& cap : all_caps) all_nodes.push_back(DeviceNode(cap));
  list.push_back({{"name", "all"}, {"containerEdits", {{"deviceNodes", std::move(all_nodes)}}}});

  nlohmann::json control = nlohmann::json::array();
  for (const auto& node : facts.control_nodes) control.push_back(DeviceNode(node));
  nlohmann::json mounts = nlohmann::json::array();
  for (const auto& file : facts.driver_files) {
    mounts.push_back({{"hostPath", Join(settings.driver_root, file)},
                      {"containerPath", file},
                      {"options", {"ro", "nosuid", "nodev", "bind"}}});
  }
  nlohmann::json edits = {{"deviceNodes", std::move(control)}, {"mounts", std::move(mounts)}};
  // The runtime hook must not inject a second time what the spec already does.
  edits["env"] = {"NVIDIA_VISIBLE_DEVICES=void"};
  // 0.5.0: device names may start with a digit (index IDs); 0.6.0 when the class has a dot.
  const auto slash = settings.kind.find('/');
  const bool dotted_class = slash != std::string::npos && settings.kind.find('.', slash) != std::string::npos;
  return {{"cdiVersion", dotted_class ? "0.6.0" : "0.5.0"},
          {"kind", settings.kind},
          {"devices", std::move(list)},
          {"containerEdits", std::move(edits)}};
}

std::string ValidateCdiSpec(const nlohmann::json& spec) {
  if (!spec.is_object()) return "a spec is a JSON object";
  if (!spec.contains("cdiVersion") || !spec["cdiVersion"].is_string()) return "cdiVersion (string) is required";
  const int minor = MinorOf(spec["cdiVersion"].get<std::string>());
  if (minor < 3) return "cdiVersion " + spec["cdiVersion"].get<std::string>() + " is unknown or below 0.3.0";
  if (!spec.contains("kind") || !spec["kind"].is_string()) return "kind (string) is required";
  const std::string kind = spec["kind"];
  const auto slash = kind.find('/');
  if (slash == std::string::npos || !ValidVendorOrClass(kind.substr(0, slash)) ||
      !ValidVendorOrClass(kind.substr(slash + 1))) {
    return "kind \"" + kind + "\" is not <vendor>/<class>";
  }
  int needed = 3;
  if (kind.find('.', slash) != std::string::npos) needed = std::max(needed, 6);
  if (spec.contains("annotations")) needed = std::max(needed, 6);
  if (!spec.contains("devices") || !spec["devices"].is_array() || spec["devices"].empty()) {
    return "devices must be a non-empty array";
  }
  auto check_edits = [&](const nlohmann::json& edits, const std::string& where) -> std::string {
    if (!edits.is_object()) return where + ": containerEdits must be one object";
    for (const auto& node : edits.value("deviceNodes", nlohmann::json::array())) {
      if (!node.contains("path") || !node["path"].is_string() || node["path"].get<std::string>().rfind('/', 0) != 0) {
        return where + ": a deviceNode needs an absolute path";
      }
      if (node.contains("hostPath")) needed = std::max(needed, 5);
    }
    for (const auto& mount : edits.value("mounts", nlohmann::json::array())) {
      if (!mount.contains("hostPath") || !mount.contains("containerPath")) return where + ": a mount needs hostPath and containerPath";
      if (mount.contains("type")) needed = std::max(needed, 4);
    }
    for (const auto& env : edits.value("env", nlohmann::json::array())) {
      if (!env.is_string() || env.get<std::string>().find('=') == std::string::npos) return where + ": env entries are K=V";
    }
    if (edits.contains("additionalGids") || edits.contains("intelRdt")) needed = std::max(needed, 7);
    return {};
  };
  std::set<std::string> names;
  for (const auto& device : spec["devices"]) {
    if (!device.contains("name") || !device["name"].is_string()) return "a device needs a name";
    const std::string name = device["name"];
    if (!ValidDeviceName(name)) return "device name \"" + name + "\" is not valid";
    if (!std::isalpha(static_cast<unsigned char>(name.front()))) needed = std::max(needed, 5);
    if (!names.insert(name).second) return "device name \"" + name + "\" is used twice";
    if (device.contains("annotations")) needed = std::max(needed, 6);
    if (!device.contains("containerEdits")) return "device " + name + " has no containerEdits";
    if (auto e = check_edits(device["containerEdits"], "device " + name); !e.empty()) return e;
  }
  if (spec.contains("containerEdits")) {
    if (auto e = check_edits(spec["containerEdits"], "spec"); !e.empty()) return e;
  }
  if (minor < needed) {
    return "cdiVersion " + spec["cdiVersion"].get<std::string>() + " is below the 0." + std::to_string(needed) +
           ".0 its content needs";
  }
  return {};
}

std::string CdiSpecFileName(const std::string& kind) {
  std::string name = kind;
  std::replace(name.begin(), name.end(), '/', '-');
  return name + ".json";
}

}  // namespace gns::device_plugin
