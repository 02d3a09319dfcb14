#pragma once
// The pure parts of driver-managed IMEX (HostManagedIMEX off, issue #16): the ComputeDomain's
// status.nodes as upstream shapes it (k8s-dra-driver-gpu api/nvidia.com/resource/v1beta1:
// `name`, `ipAddress`, `cliqueID`, `index`, `status` Ready|NotReady; a map list keyed by name),
// this node's registration in it (a stable index: the lowest free one within its clique, kept
// once given; duplicates of concurrent registrations resolved in list order), the domain's
// clique, and the files the node's IMEX daemon reads: config.cfg, the node map (peers of this
// node's clique only, ordered by index) and, under
// IMEXDaemonsWithDNSNames, a hosts file that maps fixed names to the peers' IPs so an IP change
// rewrites only the hosts file. No I/O.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

inline constexpr std::string_view kNodeReady = "Ready";
inline constexpr std::string_view kNodeNotReady = "NotReady";
// The Node label upstream's kubelet plugin sets at channel prepare (value: the domain's UID).
inline constexpr std::string_view kComputeDomainLabel = "resource.nvidia.com/computeDomain";
// The names of the peers under IMEXDaemonsWithDNSNames, as upstream's daemon writes them.
inline constexpr std::string_view kDaemonHostnamePrefix = "compute-domain-daemon-";

struct DomainNode {
  std::string name;
  std::string ip_address;
  std::string clique_id;
  int index = 0;
  std::string status;  // "Ready" | "NotReady" | "" (an older writer)
  bool Ready() const { return status == kNodeReady; }
  bool operator==(const DomainNode&) const = default;
};

struct DomainNodesParse {
  std::vector<DomainNode> nodes;  // in list order
  std::string error;              // "status.nodes[2].index: expected an integer, got string"
  bool ok() const { return error.empty(); }
};
// status.nodes of a ComputeDomain object (missing or null: no nodes).
DomainNodesParse ParseDomainNodes(const nlohmann::json& domain);
nlohmann::json NodesToJson(const std::vector<DomainNode>& nodes);

// ComputeDomainCliques gate (upstream's api/nvidia.com/resource/v1beta1/computedomainclique.go):
// one ComputeDomainClique object per (domain, clique), named "<domainUID>.<cliqueID>", whose
// top-level `daemons` list (a list-map keyed by `nodeName`; the other fields as in status.nodes)
// holds the registrations of that clique's nodes. Upstream keeps these objects in the driver's
// namespace, owned by the daemon pods; here they live in the ComputeDomain's namespace, owned by
// the ComputeDomain (an owner must be in its dependent's namespace), and the controller deletes
// them once the domain's nodes have deregistered (see the module README).
inline constexpr std::string_view kCliqueLabel = "resource.nvidia.com/computeDomain.cliqueID";
DomainNodesParse ParseCliqueDaemons(const nlohmann::json& clique);
nlohmann::json DaemonsToJson(const std::vector<DomainNode>& nodes);
std::string CliqueObjectName(std::string_view domain_uid, std::string_view clique_id);
// The metadata every writer of a clique object applies: name, namespace, the two labels (domain
// UID, clique ID) and the owner reference to the domain.
nlohmann::json CliqueObjectMeta(std::string_view ns, std::string_view domain_name, std::string_view domain_uid,
                                std::string_view clique_id);

// The domain's clique: the clique of the first node in status.nodes (the first to register).
// The node side refuses a prepare on a node of another clique with this, and the controller
// counts only this clique's Ready nodes; both read it the same way. "" when no node registered.
std::string DomainClique(const std::vector<DomainNode>& nodes);

// The indices every reader of one list agrees on. Each node writes only its own entry (server-
// side apply), taking the lowest index free in what it last read, so two nodes that register
// at once may take the same one. Resolved per clique in list order, which is registration
// order (apply appends new entries and keeps the others in place): the first holder of an
// index keeps it; each later holder takes the lowest index no entry of its clique keeps. A
// node whose entry differs from its resolved index writes the resolved one, so the list
// converges in one more write, and maps rendered meanwhile already agree.
std::vector<DomainNode> ResolveIndices(const std::vector<DomainNode>& nodes);

// `me` placed in `nodes`: an existing entry of that name keeps its (resolved) index when its
// clique is unchanged (the stable index), else gets the lowest index not used in its clique.
// Returns the new list and whether `me` differs from the entry that was there.
struct Registration {
  std::vector<DomainNode> nodes;
  DomainNode me;  // with its index
  bool changed = false;
};
Registration RegisterNode(const std::vector<DomainNode>& nodes, DomainNode me);
// The server-side apply field manager that owns this node's entry: one per node
// ("gpu-node-supervisor/<node>"; a long node name is cut and a hash of it appended, as the
// API server takes at most 128 characters).
std::string EntryFieldManager(std::string_view node_name);
const DomainNode* FindNode(const std::vector<DomainNode>& nodes, std::string_view name);

// The peers of `clique_id` (this node included) with resolved indices, ordered by index: what
// goes in the node map.
std::vector<DomainNode> CliquePeers(const std::vector<DomainNode>& nodes, std::string_view clique_id);

struct ImexSettings {
  uint16_t server_port = 50000;
  uint16_t cmd_port = 50005;
  std::string bind_ip;          // this node's address (IMEX_CMD_BIND_INTERFACE_IP too)
  std::string node_map_file;    // absolute path of the node map this daemon reads
  std::string log_file;         // absolute path
  bool dns_names = false;       // IMEXDaemonsWithDNSNames
};

// config.cfg for one domain's daemon: KEY=VALUE lines, deterministic.
std::string RenderImexConfig(const ImexSettings& settings);
// The node map: one peer per line, by index; IPs, or compute-domain-daemon-<index> names.
std::string RenderNodeMap(const std::vector<DomainNode>& peers, bool dns_names);
// The hosts file for DNS names: "<ip>\tcompute-domain-daemon-<index>" per peer, by index.
std::string RenderHostsFile(const std::vector<DomainNode>& peers);

}  // namespace gns::dra
