// Driver-managed IMEX: status.nodes, registration, clique, rendered files.
#include "modules/dra_compute_domain/imex_domain.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>

namespace gns::dra {

using nlohmann::json;

namespace {

bool ReadString(const json& entry, const char* key, const std::string& where, bool required, std::string& out,
                std::string& error) {
  const auto it = entry.find(key);
  if (it == entry.end() || it->is_null()) {
    if (required) error = where + "." + key + ": missing";
    return !required;
  }
  if (!it->is_string()) {
    error = where + "." + key + ": expected a string, got " + std::string(it->type_name());
    return false;
  }
  out = it->get<std::string>();
  return true;
}

int LowestFreeIndex(const std::vector<DomainNode>& nodes, std::string_view clique, std::string_view except) {
  std::set<int> used;
  for (const auto& n : nodes) {
    if (n.clique_id == clique && n.name != except) used.insert(n.index);
  }
  int index = 0;
  while (used.count(index) != 0) ++index;
  return index;
}

// A list of node entries at `pointer` ("/status/nodes" of a ComputeDomain, "/daemons" of a
// ComputeDomainClique): the same fields, the node's name under `name_key`.
DomainNodesParse ParseNodeList(const json& object, const char* pointer, const std::string& field,
                               const char* name_key) {
  DomainNodesParse out;
  const json::json_pointer ptr(pointer);
  if (!object.is_object() || !object.contains(ptr) || object.at(ptr).is_null()) return out;
  const json& nodes = object.at(ptr);
  if (!nodes.is_array()) {
    out.error = field + ": expected an array, got " + std::string(nodes.type_name());
    return out;
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const json& entry = nodes[i];
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (!entry.is_object()) {
      out.error = where + ": expected an object, got " + std::string(entry.type_name());
      return out;
    }
    DomainNode node;
    if (!ReadString(entry, name_key, where, true, node.name, out.error) ||
        !ReadString(entry, "ipAddress", where, false, node.ip_address, out.error) ||
        !ReadString(entry, "cliqueID", where, false, node.clique_id, out.error) ||
        !ReadString(entry, "status", where, false, node.status, out.error)) {
      return out;
    }
    if (const auto it = entry.find("index"); it != entry.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1000000) {
        out.error = where + ".index: expected a non-negative integer, got " + it->dump();
        return out;
      }
      node.index = it->get<int>();
    }
    out.nodes.push_back(std::move(node));
  }
  return out;
}

json EntriesToJson(const std::vector<DomainNode>& nodes, const char* name_key) {
  json out = json::array();
  for (const auto& n : nodes) {
    json entry{{name_key, n.name}, {"ipAddress", n.ip_address}, {"cliqueID", n.clique_id}, {"index", n.index}};
    if (!n.status.empty()) entry["status"] = n.status;
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace

DomainNodesParse ParseDomainNodes(const json& domain) {
  return ParseNodeList(domain, "/status/nodes", "status.nodes", "name");
}

DomainNodesParse ParseCliqueDaemons(const json& clique) {
  return ParseNodeList(clique, "/daemons", "daemons", "nodeName");
}

json DaemonsToJson(const std::vector<DomainNode>& nodes) { return EntriesToJson(nodes, "nodeName"); }

std::string CliqueObjectName(std::string_view domain_uid, std::string_view clique_id) {
  std::string name = std::string(domain_uid) + "." + std::string(clique_id);
  // Object names are lower-case DNS subdomains; NVML's cluster UUIDs are printed lower-case
  // already, so this only matters for a clique ID written by hand.
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

json CliqueObjectMeta(std::string_view ns, std::string_view domain_name, std::string_view domain_uid,
                      std::string_view clique_id) {
  return json{{"name", CliqueObjectName(domain_uid, clique_id)},
              {"namespace", ns},
              {"labels", {{std::string(kComputeDomainLabel), domain_uid}, {std::string(kCliqueLabel), clique_id}}},
              {"ownerReferences", json::array({{{"apiVersion", "resource.nvidia.com/v1beta1"},
                                                {"kind", "ComputeDomain"},
                                                {"name", domain_name},
                                                {"uid", domain_uid}}})}};
}

json NodesToJson(const std::vector<DomainNode>& nodes) { return EntriesToJson(nodes, "name"); }

std::string DomainClique(const std::vector<DomainNode>& nodes) {
  return nodes.empty() ? std::string{} : nodes.front().clique_id;
}

std::string EntryFieldManager(std::string_view node_name) {
  constexpr std::size_t kMax = 128;  // the API server's limit on fieldManager
  std::string out = "gpu-node-supervisor/" + std::string(node_name);
  if (out.size() <= kMax) return out;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a: distinct long names stay distinct
  for (const char c : node_name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char suffix[18];
  std::snprintf(suffix, sizeof suffix, "-%016llx", static_cast<unsigned long long>(hash));
  out.resize(kMax - 17);
  return out + suffix;
}

const DomainNode* FindNode(const std::vector<DomainNode>& nodes, std::string_view name) {
  for (const auto& n : nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

std::vector<DomainNode> ResolveIndices(const std::vector<DomainNode>& nodes) {
  std::vector<DomainNode> out = nodes;
  // Per clique: the first holder of each index (in list order) keeps it.
  std::map<std::string, std::set<int>> kept;
  std::vector<bool> duplicate(out.size(), false);
  for (std::size_t i = 0; i < out.size(); ++i) {
    duplicate[i] = !kept[out[i].clique_id].insert(out[i].index).second;
  }
  // The duplicates, in list order, take the lowest indices nobody of their clique keeps.
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!duplicate[i]) continue;
    auto& used = kept[out[i].clique_id];
    int index = 0;
    while (used.count(index) != 0) ++index;
    used.insert(index);
    out[i].index = index;
  }
  return out;
}

Registration RegisterNode(const std::vector<DomainNode>& nodes, DomainNode me) {
  const std::vector<DomainNode> resolved = ResolveIndices(nodes);
  Registration out;
  out.nodes = nodes;
  for (std::size_t i = 0; i < out.nodes.size(); ++i) {
    auto& n = out.nodes[i];
    if (n.name != me.name) continue;
    me.index = n.clique_id == me.clique_id ? resolved[i].index : LowestFreeIndex(resolved, me.clique_id, me.name);
    out.changed = !(n == me);
    n = me;
    out.me = me;
    return out;
  }
  me.index = LowestFreeIndex(resolved, me.clique_id, me.name);
  out.nodes.push_back(me);
  out.me = me;
  out.changed = true;
  return out;
}

std::vector<DomainNode> CliquePeers(const std::vector<DomainNode>& nodes, std::string_view clique_id) {
  std::vector<DomainNode> peers;
  for (const auto& n : ResolveIndices(nodes)) {
    if (n.clique_id == clique_id) peers.push_back(n);
  }
  std::stable_sort(peers.begin(), peers.end(), [](const DomainNode& a, const DomainNode& b) { return a.index < b.index; });
  return peers;
}

std::string RenderImexConfig(const ImexSettings& s) {
  std::string out;
  out += "# Written by gpu-node-supervisor (dra-compute-domain, driver-managed IMEX); do not edit.\n";
  out += "LOG_LEVEL=4\n";
  out += "LOG_FILE_NAME=" + s.log_file + "\n";
  out += "LOG_APPEND_TO_LOG=1\n";
  out += "LOG_USE_SYSLOG=0\n";
  // In the foreground: the supervisor owns the process (exit, restart, logs).
  out += "DAEMONIZE=0\n";
  out += "BIND_INTERFACE_IP=" + s.bind_ip + "\n";
  out += "SERVER_PORT=" + std::to_string(s.server_port) + "\n";
  out += "IMEX_NODE_CONFIG_FILE=" + s.node_map_file + "\n";
  out += "IMEX_WAIT_FOR_QUORUM=RECOVERY\n";
  out += "IMEX_CMD_ENABLED=1\n";
  out += "IMEX_CMD_BIND_INTERFACE_IP=" + s.bind_ip + "\n";
  out += "IMEX_CMD_PORT=" + std::to_string(s.cmd_port) + "\n";
  out += "IMEX_ENABLE_AUTH_ENCRYPTION=0\n";
  return out;
}

std::string RenderNodeMap(const std::vector<DomainNode>& peers, bool dns_names) {
  std::string out;
  for (const auto& p : peers) {
    out += dns_names ? std::string(kDaemonHostnamePrefix) + std::to_string(p.index) : p.ip_address;
    out += "\n";
  }
  return out;
}

std::string RenderHostsFile(const std::vector<DomainNode>& peers) {
  // Bind-mounted over the daemon's /etc/hosts: localhost stays resolvable.
  std::string out = "# Written by gpu-node-supervisor: the IMEX peers of this ComputeDomain's clique.\n"
                    "127.0.0.1\tlocalhost\n::1\tlocalhost\n";
  for (const auto& p : peers) {
    out += p.ip_address + "\t" + std::string(kDaemonHostnamePrefix) + std::to_string(p.index) + "\n";
  }
  return out;
}

}  // namespace gns::dra
