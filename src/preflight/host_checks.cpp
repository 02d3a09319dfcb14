// Host IMEX checks: see host_checks.hpp.
#include "preflight/host_checks.hpp"

#include "loop/atomic_file.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <set>

namespace gns::imex_health {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Printable and short, for messages: input files may hold anything.
std::string Shown(std::string_view s) {
  std::string out;
  for (const char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 80) out += "…";
  return out;
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

bool IsIpLiteral(std::string_view s) {
  const std::string z(s);
  in6_addr v6{};
  in_addr v4{};
  return inet_pton(AF_INET, z.c_str(), &v4) == 1 || inet_pton(AF_INET6, z.c_str(), &v6) == 1;
}

// RFC 1123 host name: labels of [A-Za-z0-9-], not starting or ending with '-', ≤ 63 each.
bool IsHostName(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  if (s.back() == '.') s.remove_suffix(1);
  while (!s.empty()) {
    const auto dot = s.find('.');
    const auto label = s.substr(0, dot);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (const char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
    if (dot == std::string_view::npos) break;
    s.remove_prefix(dot + 1);
  }
  return true;
}

std::string Where(std::string_view source, std::size_t line) { return std::string(source) + ":" + std::to_string(line); }

bool ReadSmall(const std::string& path, std::string& out, std::string& error) {
  if (!ReadWholeFile(path, out, error)) return false;
  if (out.size() > 1024 * 1024) {
    error = path + ": larger than 1 MiB";
    return false;
  }
  return true;
}

}  // namespace

std::string HostPaths::Under(std::string_view path) const {
  std::string root = host_root.empty() ? "/" : host_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root == "/") return std::string(path);
  return root + std::string(path);
}

MajorResult FindChannelMajor(std::string_view text, std::string_view source) {
  MajorResult result;
  bool in_char = false;
  bool saw_char = false;
  for (const auto raw : Lines(text)) {
    const auto line = Trim(raw);
    if (line.empty()) continue;
    if (line.back() == ':') {
      in_char = line == "Character devices:";
      saw_char = saw_char || in_char;
      continue;
    }
    if (!in_char) continue;
    const auto space = line.find_first_of(" \t");
    if (space == std::string_view::npos) continue;
    if (Trim(line.substr(space)) != kChannelsDeviceName) continue;
    uint32_t major = 0;
    const auto digits = line.substr(0, space);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), major);
    if (ec != std::errc() || end != digits.data() + digits.size()) {
      result.error = std::string(source) + ": malformed line \"" + Shown(line) + "\"";
      return result;
    }
    result.major = major;
    return result;
  }
  result.error = saw_char ? std::string(kChannelsDeviceName) + " is not registered in " + std::string(source) +
                                " (the nvidia driver did not create the IMEX channel major)"
                          : std::string(source) + " has no \"Character devices:\" section";
  return result;
}

ImexConfig ParseImexConfig(std::string_view text, std::string_view source) {
  ImexConfig config;
  std::size_t n = 0;
  for (const auto raw : Lines(text)) {
    ++n;
    const auto line = Trim(raw);
    if (line.empty() || line.front() == '#') continue;
    const auto eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      config.errors.push_back(Where(source, n) + ": not KEY=VALUE: \"" + Shown(line) + "\"");
      continue;
    }
    const std::string key(Trim(line.substr(0, eq)));
    const std::string value(Trim(line.substr(eq + 1)));
    if (!std::all_of(key.begin(), key.end(), [](char c) { return std::isupper(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_'; })) {
      config.errors.push_back(Where(source, n) + ": bad key \"" + Shown(key) + "\"");
      continue;
    }
    if (!config.keys.emplace(key, value).second) {
      config.errors.push_back(Where(source, n) + ": " + key + " is set twice");
      continue;
    }
    auto number = [&](int64_t min, int64_t max) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || end != value.data() + value.size() || v < min || v > max) {
        config.errors.push_back(Where(source, n) + ": " + key + " must be a number in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "], got \"" + Shown(value) + "\"");
      }
    };
    if (key == "IMEX_CMD_PORT" || key == "IMEX_SERVER_PORT") number(1, 65535);
    else if (key == "IMEX_CONN_WAIT_TIMEOUT") number(0, 86400);
    else if (key == "IMEX_CMD_ENABLED" || key == "DAEMONIZE") number(0, 1);
    else if (key == "IMEX_NODE_CONFIG_FILE" && (value.empty() || value.front() != '/')) {
      config.errors.push_back(Where(source, n) + ": IMEX_NODE_CONFIG_FILE must be an absolute path, got \"" +
                              Shown(value) + "\"");
    }
  }
  return config;
}

NodesConfig ParseNodesConfig(std::string_view text, std::string_view source, const std::vector<std::string>& self) {
  NodesConfig nodes;
  std::set<std::string, std::less<>> seen;
  auto lines = Lines(text);
  std::size_t n = 0;
  for (const auto raw : lines) {
    ++n;
    const auto line = Trim(raw);
    if (line.empty()) {
      nodes.errors.push_back(Where(source, n) + ": blank line (IMEX reads every line as a peer)");
      continue;
    }
    if (line.front() == '#') {
      nodes.errors.push_back(Where(source, n) + ": comment line (IMEX reads every line as a peer)");
      continue;
    }
    if (line.find_first_of(" \t") != std::string_view::npos) {
      nodes.errors.push_back(Where(source, n) + ": more than one entry on a line: \"" + Shown(line) + "\"");
      continue;
    }
    if (!IsIpLiteral(line) && !IsHostName(line)) {
      nodes.errors.push_back(Where(source, n) + ": not an IP address or a DNS name: \"" + Shown(line) + "\"");
      continue;
    }
    if (!seen.emplace(line).second) {
      nodes.errors.push_back(Where(source, n) + ": duplicate peer " + std::string(line));
      continue;
    }
    nodes.peers.emplace_back(line);
  }
  if (nodes.peers.empty() && nodes.errors.empty()) nodes.errors.push_back(std::string(source) + ": no peers");
  if (!self.empty()) {
    nodes.self_checked = true;
    nodes.self_present = std::any_of(self.begin(), self.end(), [&](const std::string& s) { return seen.contains(s); });
    if (!nodes.self_present) {
      std::string list;
      for (const auto& s : self) list += (list.empty() ? "" : ", ") + s;
      nodes.errors.push_back(std::string(source) + ": this node (" + list +
                             ") is not in the map; IMEX treats itself as a peer");
    }
  }
  return nodes;
}

std::vector<std::string> ResolvePeers(const std::vector<std::string>& peers) {
  std::vector<std::string> bad;
  for (const auto& peer : peers) {
    if (IsIpLiteral(peer)) continue;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* out = nullptr;
    const int r = getaddrinfo(peer.c_str(), nullptr, &hints, &out);
    if (r != 0) bad.push_back(peer + ": " + gai_strerror(r));
    if (out) freeaddrinfo(out);
  }
  return bad;
}

HostScan ScanHost(const HostPaths& paths, const std::vector<std::string>& self, bool resolve) {
  HostScan scan;
  std::string text;
  std::string error;
  scan.proc_devices_path = paths.Under(paths.proc_devices);
  if (ReadSmall(scan.proc_devices_path, text, error)) {
    scan.major = FindChannelMajor(text, scan.proc_devices_path);
  } else {
    scan.major.error = error;
  }
  scan.channel0_path = paths.Under(paths.channel0);
  struct stat st {};
  if (::stat(scan.channel0_path.c_str(), &st) == 0) {
    scan.channel0_present = S_ISCHR(st.st_mode);
    if (!scan.channel0_present) scan.channel0_error = scan.channel0_path + " exists but is not a character device";
  } else {
    scan.channel0_error = scan.channel0_path + ": " + std::strerror(errno);
  }
  std::string nodes_path = paths.nodes_config;
  for (const auto& candidate : paths.config_files) {
    const auto full = paths.Under(candidate);
    if (::access(full.c_str(), F_OK) != 0) continue;
    scan.config_path = full;
    break;
  }
  if (scan.config_path.empty()) {
    std::string names;
    for (const auto& c : paths.config_files) names += (names.empty() ? "" : " or ") + paths.Under(c);
    scan.config_error = "no IMEX config: " + names + " missing";
  } else if (!ReadSmall(scan.config_path, text, error)) {
    scan.config_error = error;
  } else if (Trim(text).empty()) {
    scan.config_error = scan.config_path + " is empty";
  } else {
    scan.config = ParseImexConfig(text, scan.config_path);
    if (const auto it = scan.config.keys.find("IMEX_NODE_CONFIG_FILE");
        it != scan.config.keys.end() && !it->second.empty() && it->second.front() == '/') {
      nodes_path = it->second;
    }
  }
  scan.nodes_config_path = paths.Under(nodes_path);
  if (::stat(scan.nodes_config_path.c_str(), &st) == 0) {
    scan.nodes_config_mtime_known = true;
    scan.nodes_config_mtime_usec =
        static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000u + static_cast<uint64_t>(st.st_mtim.tv_nsec) / 1000u;
  }
  if (!ReadSmall(scan.nodes_config_path, text, error)) {
    scan.nodes_config_error = error;
  } else if (Trim(text).empty()) {
    scan.nodes_config_error = scan.nodes_config_path + " is empty";
  } else {
    // A single trailing newline ends the last line; it is not a blank line.
    std::string_view body(text);
    if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
    scan.nodes = ParseNodesConfig(body, scan.nodes_config_path, self);
    if (resolve) scan.unresolved = ResolvePeers(scan.nodes.peers);
  }
  return scan;
}

std::string_view ToString(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass: return "pass";
    case CheckStatus::kWarn: return "warn";
    case CheckStatus::kFail: return "fail";
    case CheckStatus::kSkip: return "skip";
  }
  return "?";
}

std::vector<CheckResult> FileChecks(const HostScan& scan) {
  std::vector<CheckResult> out;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : "; ") + e;
    return s;
  };
  if (scan.major.major) {
    out.push_back({"channel-major", CheckStatus::kPass,
                   std::string(kChannelsDeviceName) + " major " + std::to_string(*scan.major.major), ""});
  } else {
    out.push_back({"channel-major", CheckStatus::kFail, scan.major.error,
                   "load the nvidia driver with IMEX channel support; check: grep nvidia-caps-imex-channels /proc/devices"});
  }
  if (scan.channel0_present) {
    out.push_back({"channel0", CheckStatus::kPass, scan.channel0_path + " is a character device", ""});
  } else {
    // Seed 000 §13: with the major registered, CDI makes the node inside the container, so a
    // missing host node is a warning; without the major it cannot be made at all.
    const std::string fix =
        "sudo mkdir -p /dev/nvidia-caps-imex-channels && sudo mknod /dev/nvidia-caps-imex-channels/channel0 c "
        "\"$(awk '$2 == \"nvidia-caps-imex-channels\" {print $1}' /proc/devices)\" 0 && sudo chmod 0666 "
        "/dev/nvidia-caps-imex-channels/channel0 (or NVreg_CreateImexChannel0=1)";
    out.push_back({"channel0", scan.major.major ? CheckStatus::kWarn : CheckStatus::kFail, scan.channel0_error, fix});
  }
  if (!scan.config_error.empty()) {
    out.push_back({"imex-config", CheckStatus::kFail, scan.config_error,
                   "write /etc/nvidia-imex/config.cfg (guide §3.3) and point nvidia-imex.service at it"});
  } else if (!scan.config.errors.empty()) {
    out.push_back({"imex-config", CheckStatus::kFail, join(scan.config.errors), "fix the lines named in " + scan.config_path});
  } else {
    out.push_back({"imex-config", CheckStatus::kPass, scan.config_path + ": " + std::to_string(scan.config.keys.size()) + " keys", ""});
  }
  const std::string nodes_fix = "rewrite " + scan.nodes_config_path +
                                ": one peer per line, this node included, identical on every peer (guide §3.2, §3.7); then "
                                "sudo systemctl restart nvidia-imex.service after draining";
  if (!scan.nodes_config_error.empty()) {
    out.push_back({"nodes-config", CheckStatus::kFail, scan.nodes_config_error, nodes_fix});
  } else if (!scan.nodes.errors.empty()) {
    out.push_back({"nodes-config", CheckStatus::kFail, join(scan.nodes.errors), nodes_fix});
  } else {
    out.push_back({"nodes-config", CheckStatus::kPass,
                   std::to_string(scan.nodes.peers.size()) + " peers" +
                       (scan.nodes.self_checked ? ", this node included" : ", this node's address unknown (not checked)"),
                   ""});
  }
  if (scan.nodes_config_error.empty() && scan.nodes.errors.empty()) {
    if (scan.unresolved.empty()) {
      out.push_back({"nodes-config-resolve", CheckStatus::kPass, "every peer resolves", ""});
    } else {
      out.push_back({"nodes-config-resolve", CheckStatus::kFail, "unresolvable: " + join(scan.unresolved),
                     "fix the names or DNS; check: getent hosts <peer>"});
    }
  }
  return out;
}

}  // namespace gns::imex_health

#include <ifaddrs.h>

namespace gns::imex_health {

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      const uint32_t ip = ntohl(in->sin_addr.s_addr);
      if ((ip >> 24) == 127 || (ip >> 16) == 0xA9FE) continue;  // loopback, 169.254/16
      inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) || IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
      inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    } else {
      continue;
    }
    out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace gns::imex_health
