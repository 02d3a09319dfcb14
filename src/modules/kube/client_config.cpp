// Where the API server is and how to authenticate: kubeconfig and in-cluster loading, plus the
// small path and metadata helpers of client.hpp (nothing here touches the network).
#include "modules/kube/api/client.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gns::kube {

namespace {

std::string ReadFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + std::string(what) + " " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Base64Decode(std::string_view in, std::string_view what) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    const int v = value(c);
    if (v < 0) throw std::runtime_error(std::string(what) + " is not valid base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// Finds the entry named `name` in a kubeconfig list (clusters, users, contexts).
YAML::Node Named(const YAML::Node& list, const std::string& name, std::string_view what) {
  if (list && list.IsSequence()) {
    for (const auto& item : list) {
      if (item["name"] && item["name"].as<std::string>() == name) return item;
    }
  }
  throw std::runtime_error(std::string(what) + " \"" + name + "\" not found in kubeconfig");
}

std::string Str(const YAML::Node& node, const char* key) {
  return node && node[key] && node[key].IsScalar() ? node[key].as<std::string>() : std::string();
}

// Relative paths in a kubeconfig are relative to the kubeconfig's own folder.
std::string Resolve(const std::string& path, const std::filesystem::path& base) {
  std::filesystem::path p(path);
  return p.is_absolute() ? path : (base / p).string();
}

}  // namespace

ClientConfig InClusterConfig(const InClusterPaths& paths) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port) {
    throw std::runtime_error("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set "
                             "(or configure modules.kube.kubeconfig)");
  }
  ClientConfig config;
  const std::string h(host);
  config.server = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + port;
  config.ca_pem = ReadFile(paths.ca, "service-account CA");
  config.token_file = paths.token;
  ReadFile(paths.token, "service-account token");  // fail the start now, not on the first request
  return config;
}

ClientConfig LoadKubeconfig(const std::string& path, const std::string& context_name) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error("kubeconfig " + path + ": " + e.what());
  }
  const auto base = std::filesystem::absolute(path).parent_path();
  try {
    const std::string current = context_name.empty() ? Str(root, "current-context") : context_name;
    if (current.empty()) throw std::runtime_error("no current-context");
    const auto context = Named(root["contexts"], current, "context")["context"];
    const auto cluster = Named(root["clusters"], Str(context, "cluster"), "cluster")["cluster"];
    const auto user_name = Str(context, "user");
    YAML::Node user;
    if (!user_name.empty()) user = Named(root["users"], user_name, "user")["user"];

    ClientConfig config;
    config.server = Str(cluster, "server");
    if (config.server.rfind("https://", 0) != 0) {
      throw std::runtime_error("cluster server must be an https:// URL, got \"" + config.server + "\"");
    }
    if (cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>()) {
      throw std::runtime_error("insecure-skip-tls-verify is not supported: give the cluster's CA");
    }
    if (auto data = Str(cluster, "certificate-authority-data"); !data.empty()) {
      config.ca_pem = Base64Decode(data, "certificate-authority-data");
    } else if (auto file = Str(cluster, "certificate-authority"); !file.empty()) {
      config.ca_pem = ReadFile(Resolve(file, base), "certificate-authority");
    } else {
      throw std::runtime_error("cluster has no certificate-authority(-data): verification cannot be disabled");
    }
    config.token = Str(user, "token");
    if (auto file = Str(user, "tokenFile"); !file.empty()) config.token_file = Resolve(file, base);
    if (auto data = Str(user, "client-certificate-data"); !data.empty()) {
      config.client_cert_pem = Base64Decode(data, "client-certificate-data");
    } else if (auto file = Str(user, "client-certificate"); !file.empty()) {
      config.client_cert_pem = ReadFile(Resolve(file, base), "client-certificate");
    }
    if (auto data = Str(user, "client-key-data"); !data.empty()) {
      config.client_key_pem = Base64Decode(data, "client-key-data");
    } else if (auto file = Str(user, "client-key"); !file.empty()) {
      config.client_key_pem = ReadFile(Resolve(file, base), "client-key");
    }
    if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
      throw std::runtime_error("a client certificate needs its key (and the other way round)");
    }
    if (user && (user["exec"] || user["auth-provider"])) {
      throw std::runtime_error("exec and auth-provider credentials are not supported");
    }
    return config;
  } catch (const YAML::Exception& e) {
    throw std::runtime_error("kubeconfig " + path + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("kubeconfig " + path + ": " + e.what());
  }
}

std::string ResourcePath::Collection() const {
  std::string out = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (!ns.empty()) out += "/namespaces/" + PathEscape(ns);
  return out + "/" + resource;
}

std::string ResourcePath::Object(std::string_view name, std::string_view subresource) const {
  std::string out = Collection() + "/" + PathEscape(name);
  if (!subresource.empty()) out += "/" + PathEscape(subresource);
  return out;
}

std::string PathEscape(std::string_view segment) {
  if (segment == "." || segment == "..") return segment == "." ? "%2E" : "%2E%2E";
  return QueryEscape(segment);
}

bool IsValidObjectName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(name.front()) || !alnum(name.back())) return false;
  for (const char c : name) {
    if (!alnum(c) && c != '-' && c != '.') return false;
  }
  return true;
}

ResourcePath ResourcePath::Core(std::string resource, std::string ns) {
  return ResourcePath{"", "v1", std::move(resource), std::move(ns)};
}

ResourcePath ResourcePath::Grouped(std::string group, std::string version, std::string resource, std::string ns) {
  return ResourcePath{std::move(group), std::move(version), std::move(resource), std::move(ns)};
}

std::string QueryEscape(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::optional<ObjectMeta> ObjectMeta::From(const nlohmann::json& object) {
  if (!object.is_object()) return std::nullopt;
  const auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return std::nullopt;
  auto str = [&](const char* key) -> std::string {
    const auto it = meta->find(key);
    return it != meta->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  ObjectMeta out{str("name"), str("namespace"), str("uid"), str("resourceVersion")};
  if (out.name.empty()) return std::nullopt;
  return out;
}

}  // namespace gns::kube
