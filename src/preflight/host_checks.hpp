#pragma once
// The host IMEX checks of the seed's operator guide (seed 000 §3.2–§3.7, §9, §13) as pure
// functions over file contents, shared by the `imex-health` module and the `preflight`
// subcommand so both judge the same way. No I/O here except ScanHost (blocking: run it on the
// pool) and ResolvePeers (DNS).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::imex_health {

inline constexpr std::string_view kChannelsDeviceName = "nvidia-caps-imex-channels";

// Where the checks look, inside host_root.
struct HostPaths {
  std::string host_root = "/";
  // The IMEX config, by the names the guide mentions (§3.3); the first that exists is used.
  std::vector<std::string> config_files{"/etc/nvidia-imex/config.cfg", "/etc/nvidia-imex/imexd.cfg"};
  // Used when the config does not name one (IMEX_NODE_CONFIG_FILE).
  std::string nodes_config = "/etc/nvidia-imex/nodes_config.cfg";
  std::string proc_devices = "/proc/devices";
  std::string channel0 = "/dev/nvidia-caps-imex-channels/channel0";
  // `path` (absolute on the host) as seen from here.
  std::string Under(std::string_view path) const;
};

// /proc/devices: the "Character devices:" section, lines "<major> <name>".
struct MajorResult {
  std::optional<uint32_t> major;
  std::string error;  // what is missing or malformed, naming `source`
};
MajorResult FindChannelMajor(std::string_view proc_devices, std::string_view source);

// The IMEX config file: KEY=VALUE lines, '#' comments, blank lines.
struct ImexConfig {
  std::map<std::string, std::string> keys;
  std::vector<std::string> errors;  // "config.cfg:3: …"
};
ImexConfig ParseImexConfig(std::string_view text, std::string_view source);

// nodes_config.cfg (§3.2): one peer per line (IPv4, IPv6 or a DNS name), no comment or blank
// lines, no duplicates, this node present. `self` lists this node's identities (its Node's
// InternalIPs, or its hostname in hostname mode); empty: the self check is not made.
struct NodesConfig {
  std::vector<std::string> peers;
  std::vector<std::string> errors;
  bool self_checked = false;
  bool self_present = false;
};
NodesConfig ParseNodesConfig(std::string_view text, std::string_view source, const std::vector<std::string>& self);

// The peers (of ParseNodesConfig) that do not resolve: IP literals always do; names go through
// getaddrinfo (blocking). Each entry: "name: why".
std::vector<std::string> ResolvePeers(const std::vector<std::string>& peers);

// One read of every file the checks need (blocking: the pool, or preflight).
struct HostScan {
  std::string proc_devices_path;
  MajorResult major;
  std::string channel0_path;
  bool channel0_present = false;
  std::string channel0_error;  // present but not a character device, or a stat error
  std::string config_path;     // the config file found ("" when none)
  std::string config_error;    // missing / unreadable / empty
  ImexConfig config;
  std::string nodes_config_path;
  std::string nodes_config_error;  // missing / unreadable / empty
  NodesConfig nodes;
  std::vector<std::string> unresolved;
  bool nodes_config_mtime_known = false;
  uint64_t nodes_config_mtime_usec = 0;  // µs since the epoch
};
HostScan ScanHost(const HostPaths& paths, const std::vector<std::string>& self, bool resolve);

// The verdict of one check, in preflight's vocabulary.
enum class CheckStatus { kPass, kWarn, kFail, kSkip };
std::string_view ToString(CheckStatus status);
struct CheckResult {
  std::string name;
  CheckStatus status = CheckStatus::kPass;
  std::string message;
  std::string fix;  // what to run (the guide's commands); empty on pass/skip
};

// The file checks of a scan as check results (channel major, channel0, config, nodes config),
// in the order preflight prints them.
std::vector<CheckResult> FileChecks(const HostScan& scan);

}  // namespace gns::imex_health

namespace gns::imex_health {
// This host's global unicast addresses (no loopback, no link-local), as the guide's self check
// uses them when the Node's InternalIP is not known (no API server).
std::vector<std::string> LocalAddresses();
}  // namespace gns::imex_health
