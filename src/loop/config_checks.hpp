#pragma once
// The bounds of the YAML reader and the checks that make a config `validate-config` accepts
// one `run` can use (issue #24): values are checked for what the system will do with them
// (a path the kernel takes, a unix socket path that fits a sockaddr_un, a Kubernetes name the
// API server takes), once, while the config is parsed, before any module starts.
//
// Kept apart from config.hpp, which every module includes through module.hpp.

#include "loop/config.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace gns {

// What the YAML reader (ParseYaml, LoadYamlFile) accepts at most; past any of them the input
// is refused with a ConfigError.
struct YamlLimits {
  std::size_t max_file_bytes = 1024 * 1024;        // the file; a site config is a few KiB
  std::size_t max_nodes = 100'000;                 // nodes produced, each alias counting what it copies
  std::size_t max_scalar_bytes = 4 * 1024 * 1024;  // text held by all scalars, aliases included
  std::size_t max_depth = 64;                      // nested maps and lists
};

// What ParseYaml throws: a ConfigError with its parts, for readers that report in their own
// format (the XID catalog).
class YamlError : public ConfigError {
 public:
  YamlError(const SourceLocation& where, std::string_view path, std::string_view what)
      : ConfigError(where, path, what), where_(where), path_(path), what_(what) {}
  const SourceLocation& Where() const { return where_; }
  const std::string& KeyPath() const { return path_; }  // "" at the top level
  const std::string& What() const { return what_; }

 private:
  SourceLocation where_;
  std::string path_;
  std::string what_;
};

// ParseYaml and LoadYamlFile (config.hpp) with other limits than the defaults.
ConfigValue ParseYaml(std::string_view text, const std::string& file_name, const YamlLimits& limits);
ConfigValue LoadYamlFile(const std::string& path, const YamlLimits& limits);

// Reads a whole config file without blocking and without unbounded memory: opened
// O_NONBLOCK, refused unless fstat says it is a regular file (a FIFO, a device such as
// /dev/zero, a directory or a socket is an error before any read), and refused past
// `max_bytes` (also when the file grows while being read). Throws ConfigError "<path>: ...".
std::string ReadConfigFile(const std::string& path, std::size_t max_bytes);

// An absolute path that the system can use: starts with '/', no NUL, at most PATH_MAX - 1
// bytes, no component over NAME_MAX. Trailing slashes are dropped ("/" stays). An empty value
// is returned as is when the key is absent (and `fallback` is "") or `allow_empty`.
std::string ReadAbsolutePath(ConfigMap& section, std::string_view key,
                             std::optional<std::string> fallback = std::nullopt, bool allow_empty = false);
// ReadAbsolutePath that a unix socket can bind or connect to: at most
// sizeof(sockaddr_un::sun_path) - 1 bytes.
std::string ReadSocketPath(ConfigMap& section, std::string_view key,
                           std::optional<std::string> fallback = std::nullopt, bool allow_empty = false);

// The checks behind them, for paths a module derives from configured ones (e.g.
// <stateDir>/admin.sock): "" when fine, else what is wrong with it.
std::string AbsolutePathProblem(std::string_view path);
std::string SocketPathProblem(std::string_view path);
// The longest path a unix socket can have: sizeof(sockaddr_un::sun_path) - 1.
std::size_t MaxSocketPathBytes();

// Kubernetes names (apimachinery's validation): "" when valid, else why not.
// RFC 1123 subdomain: at most 253 characters of lowercase [a-z0-9-.], each dot-separated label
// starting and ending with an alphanumeric (a Node's name).
std::string DnsSubdomainProblem(std::string_view name);
// An extended resource name: <domain>/<name>, "requests.<domain>" an RFC 1123 subdomain, the
// domain outside kubernetes.io, the name at most 63 characters of [A-Za-z0-9-_.] starting and
// ending with an alphanumeric, and not in the "requests." namespace (nvidia.com/gpu).
std::string ExtendedResourceNameProblem(std::string_view name);

}  // namespace gns
