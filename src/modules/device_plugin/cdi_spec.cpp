// CDI spec discovery, building and validation.
#include "modules/device_plugin/cdi_spec.hpp"

#include "loop/atomic_file.hpp"

#include <sys/stat.h>
#include <sys/utsname.h>
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

// The directory and the name of an absolute path, and the two joined again.
std::string Dir(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
std::string Base(const std::string& path) { return path.substr(path.rfind('/') + 1); }
std::string InDir(const std::string& dir, const std::string& name) { return dir == "/" ? "/" + name : dir + "/" + name; }

// A shared library's name ("libcuda.so.1", "libnvidia-ml.so"), as the toolkit's isLibName.
bool IsLibrary(const std::string& path) {
  const std::string name = Base(path);
  const auto so = name.rfind(".so");
  if (name.size() < 7 || name.rfind("lib", 0) != 0 || so == std::string::npos || so < 4) return false;
  return so + 3 == name.size() || name[so + 3] == '.';
}

// "libcuda.so.1" → "libcuda.so" (the toolkit's getSoLink); empty without ".so".
std::string SoLink(const std::string& name) {
  const auto so = name.find(".so");
  if (so == std::string::npos) return {};
  return name.substr(0, so + 3);
}

// The file a library path leads to under `root` (symlinks followed, at most 8), its name.
std::string ResolvedName(const std::string& root, const std::string& path) {
  std::string current = path;
  for (int i = 0; i < 8; ++i) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(Join(root, current), ec);
    if (ec) break;
    current = target.is_absolute() ? target.string() : InDir(Dir(current), target.string());
  }
  return Base(current);
}

// The toolkit infers the version from libcuda.so.<version> (then libnvidia-ml's); the kernel
// module's version is the last resort.
std::string DriverVersion(const std::string& host_root, const std::string& root, const std::vector<std::string>& libs) {
  for (const char* lib_prefix : {"libcuda.so.", "libnvidia-ml.so."}) {
    const std::string prefix = lib_prefix;
    for (const auto& lib : libs) {
      if (Base(lib).rfind(prefix, 0) != 0) continue;
      const std::string name = ResolvedName(root, lib);
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string version = name.substr(prefix.size());
      if (version.find('.') != std::string::npos) return version;  // "1" is a soname, not a version
    }
  }
  std::string text, error;
  if (ReadWholeFile(Join(host_root, "/sys/module/nvidia/version"), text, error)) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    return text;
  }
  return {};
}

std::string HookPath(const std::string& host_root, const std::string& configured, std::vector<std::string>& warnings) {
  if (configured.empty()) return {};
  auto usable = [&](const std::string& path) { return ::access(Join(host_root, path).c_str(), X_OK) == 0; };
  if (configured == "auto") {
    for (const char* candidate : kCdiHookCandidates) {
      if (usable(candidate)) return candidate;
    }
    return {};
  }
  if (usable(configured)) return configured;
  warnings.push_back("no CDI hooks: " + configured + " is not an executable under the host root");
  return {};
}

// The hook as the toolkit writes it: argv[0] is the binary's name, nvidia-ctk needs "hook".
nlohmann::json Hook(const std::string& path, const std::string& name, const std::vector<std::string>& args) {
  nlohmann::json argv = nlohmann::json::array({Base(path)});
  if (Base(path) == "nvidia-ctk") argv.push_back("hook");
  argv.push_back(name);
  for (const auto& a : args) argv.push_back(a);
  return {{"hookName", "createContainer"},
          {"path", path},
          {"args", std::move(argv)},
          {"env", nlohmann::json::array({"NVIDIA_CTK_DEBUG=false"})}};
}

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

std::vector<std::string> DriverSymlinks(const std::string& root, const std::vector<std::string>& libraries) {
  std::vector<std::string> links;
  std::set<std::string> seen;
  for (const auto& lib : libraries) {
    if (!IsLibrary(lib)) continue;
    const std::string name = Base(lib);
    const std::string so = SoLink(name);
    if (so.empty() || so == name) continue;
    const bool always = name.rfind("libcuda.so.", 0) == 0 || name.rfind("libnvidia-opticalflow.so.", 0) == 0;
    struct stat st {};
    const std::string link = InDir(Dir(lib), so);
    const bool on_host = ::lstat(Join(root, link).c_str(), &st) == 0 && S_ISLNK(st.st_mode);
    if ((always || on_host) && seen.insert(link).second) links.push_back(name + "::" + link);
  }
  return links;
}

std::vector<std::string> FirmwareFiles(const std::string& root, const std::string& version, const std::string& release,
                                       const std::string& custom_path) {
  std::vector<std::string> dirs;
  if (!custom_path.empty()) dirs.push_back(custom_path);
  for (const std::string& d : {"/lib/firmware/updates/" + release, std::string("/lib/firmware/updates"),
                               "/lib/firmware/" + release, std::string("/lib/firmware")}) {
    dirs.push_back(d);
  }
  std::vector<std::string> files;
  std::set<std::string> seen;
  if (version.empty()) return files;
  for (auto dir : dirs) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const std::string in = dir + "/nvidia/" + version;
    std::error_code ec;
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(Join(root, in), ec)) {
      const std::string name = entry.path().filename().string();
      std::error_code type_ec;
      if (name.rfind("gsp", 0) != 0 || name.size() < 7 || name.compare(name.size() - 4, 4, ".bin") != 0) continue;
      if (!std::filesystem::is_regular_file(entry.path(), type_ec)) continue;  // follows links, as the toolkit's stat
      found.push_back(in + "/" + name);
    }
    std::sort(found.begin(), found.end());
    for (auto& f : found) {
      if (seen.insert(f).second) files.push_back(std::move(f));
    }
  }
  return files;
}

CdiHostFacts DiscoverCdiHostFacts(const std::string& host_root, const CdiSettings& settings) {
  CdiHostFacts facts;
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}) {
    if (::access(Join(host_root, node).c_str(), F_OK) == 0) facts.control_nodes.emplace_back(node);
  }
  std::string text, error;
  const std::string minors = MigMinorsPath(host_root);
  if (ReadWholeFile(minors, text, error)) ParseMigMinors(text, facts);
  const std::string root = Join(host_root, settings.driver_root);
  const std::string cache = Join(root, "/etc/ld.so.cache");
  std::string bytes;
  std::vector<std::string> libraries;
  if (!ReadWholeFile(cache, bytes, error)) {
    facts.warnings.push_back("no driver libraries in the CDI spec: " + error);
  } else {
    std::string parse_error;
    for (const auto& lib : LibrariesFromLdCache(bytes, DriverLibraryPrefixes(), parse_error)) {
      if (::access(Join(root, lib).c_str(), F_OK) == 0) libraries.push_back(lib);
    }
    if (!parse_error.empty()) facts.warnings.push_back(cache + ": " + parse_error);
  }
  facts.driver_files = libraries;
  for (const auto& binary : DriverBinaries()) {
    const std::string path = "/usr/bin/" + binary;
    if (::access(Join(root, path).c_str(), F_OK) == 0) facts.driver_files.push_back(path);
  }
  facts.driver_version = DriverVersion(host_root, root, libraries);
  struct utsname uts {};
  std::string custom;
  if (ReadWholeFile(Join(host_root, "/sys/module/firmware_class/parameters/path"), custom, error)) {
    while (!custom.empty() && std::isspace(static_cast<unsigned char>(custom.back()))) custom.pop_back();
  }
  if (::uname(&uts) == 0) facts.firmware_files = FirmwareFiles(root, facts.driver_version, uts.release, custom);
  facts.hook_path = HookPath(host_root, settings.hook_path, facts.warnings);
  if (!facts.hook_path.empty()) facts.symlinks = DriverSymlinks(root, libraries);
  return facts;
}

std::string MigMinorsPath(const std::string& host_root) {
  return Join(host_root, "/proc/driver/nvidia-caps/mig-minors");
}

std::vector<std::string> MigCapNodes(const PhysicalDevice& device, const CdiHostFacts& facts, std::string& error) {
  const std::string gpu = "gpu" + std::to_string(device.minor) + "/gi" + std::to_string(device.gpu_instance);
  const auto gi = facts.gi_caps.find({device.minor, device.gpu_instance});
  const auto ci = facts.ci_caps.find({device.minor, device.gpu_instance, device.compute_instance});
  if (gi == facts.gi_caps.end() || ci == facts.ci_caps.end()) {
    error = "no " + (gi == facts.gi_caps.end() ? gpu + "/access" : gpu + "/ci" + std::to_string(device.compute_instance) + "/access") +
            " in /proc/driver/nvidia-caps/mig-minors";
    return {};
  }
  return {"/dev/nvidia-caps/nvidia-cap" + std::to_string(gi->second),
          "/dev/nvidia-caps/nvidia-cap" + std::to_string(ci->second)};
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
  std::vector<std::string> files = facts.driver_files;
  files.insert(files.end(), facts.firmware_files.begin(), facts.firmware_files.end());
  for (const auto& file : files) {
    mounts.push_back({{"hostPath", Join(settings.driver_root, file)},
                      {"containerPath", file},
                      {"options", {"ro", "nosuid", "nodev", "bind"}}});
  }
  nlohmann::json edits = {{"deviceNodes", std::move(control)}, {"mounts", std::move(mounts)}};
  // The toolkit's hooks for the mounted libraries, run by the runtime in the container's mount
  // namespace before pivot_root: the links programs dlopen, then the linker cache.
  if (!facts.hook_path.empty()) {
    nlohmann::json hooks = nlohmann::json::array();
    if (!facts.symlinks.empty()) {
      std::vector<std::string> args;
      for (const auto& link : facts.symlinks) {
        args.push_back("--link");
        args.push_back(link);
      }
      hooks.push_back(Hook(facts.hook_path, "create-symlinks", args));
    }
    std::vector<std::string> folders;
    for (const auto& file : facts.driver_files) {
      if (!IsLibrary(file)) continue;
      if (const auto dir = Dir(file); std::find(folders.begin(), folders.end(), dir) == folders.end()) folders.push_back(dir);
    }
    if (!folders.empty()) {
      std::vector<std::string> args;
      for (const auto& folder : folders) {
        args.push_back("--folder");
        args.push_back(folder);
      }
      hooks.push_back(Hook(facts.hook_path, "update-ldcache", args));
    }
    if (!hooks.empty()) edits["hooks"] = std::move(hooks);
  }
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
    for (const auto& hook : edits.value("hooks", nlohmann::json::array())) {
      // The OCI hook points CDI knows (its validHookNames, prestart included).
      static const std::set<std::string> kHookNames = {"prestart",  "createRuntime", "createContainer",
                                                       "startContainer", "poststart", "poststop"};
      if (!hook.contains("hookName") || !hook["hookName"].is_string() || kHookNames.count(hook["hookName"]) == 0) {
        return where + ": a hook needs a known hookName";
      }
      if (!hook.contains("path") || !hook["path"].is_string() || hook["path"].get<std::string>().rfind('/', 0) != 0) {
        return where + ": a hook needs an absolute path";
      }
      for (const auto& env : hook.value("env", nlohmann::json::array())) {
        if (!env.is_string() || env.get<std::string>().find('=') == std::string::npos) return where + ": hook env entries are K=V";
      }
      if (hook.contains("timeout") && (!hook["timeout"].is_number_integer() || hook["timeout"].get<int64_t>() <= 0)) {
        return where + ": a hook's timeout must be positive";
      }
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
