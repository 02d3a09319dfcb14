#include "support/module_calls.hpp"

#include <nlohmann/json.hpp>

#include <regex>

namespace gns::test {

std::string Describe(const Grant& g) {
  return g.scope + " " + (g.group.empty() ? "core" : g.group) + "/" + g.resource + " " + g.verb +
         (g.name.empty() ? "" : " (" + g.name + ")");
}

YAML::Node MergeConfig(const YAML::Node& base, const YAML::Node& overlay) {
  if (!base.IsMap() || !overlay.IsMap()) return YAML::Clone(overlay);
  YAML::Node out = YAML::Clone(base);
  for (const auto& kv : overlay) {
    const auto key = kv.first.as<std::string>();
    out[key] = out[key] ? MergeConfig(out[key], kv.second) : YAML::Clone(kv.second);
  }
  return out;
}

// (yaml-cpp: indexing a missing key of a const node gives an invalid node, and indexing that
// throws: every level is checked.)
YAML::Node SiteView::Module(const std::string& name) const {
  const auto modules = config["modules"];
  return modules && modules.IsMap() ? modules[name] : YAML::Node();
}

bool SiteView::Enabled(const std::string& name) const {
  const auto m = Module(name);
  return m && m["enabled"] && m["enabled"].as<bool>();
}

bool SiteView::Gate(const std::string& name, bool fallback) const {
  if (auto it = gates.find(name); it != gates.end()) return it->second;
  const auto file_gates = config["featureGates"];
  if (!file_gates || !file_gates.IsMap() || !file_gates[name]) return fallback;
  return file_gates[name].as<bool>();
}

std::string SiteView::Expand(const std::string& value) const {  // ${POD_NAMESPACE:-default}
  static const std::regex var(R"(\$\{POD_NAMESPACE(:-[^}]*)?\})");
  return std::regex_replace(value, var, pod_namespace);
}

// Keep in step with the code: a grant no enabled module uses here fails deploy_components_test,
// and a call a module makes against the simulator that is missing here fails the tests that
// compare the simulator's record with this (driver_managed_imex_test).
std::set<Grant> ModuleCalls(const SiteView& site) {
  std::set<Grant> calls;
  auto add = [&](const std::string& group, const std::string& resource, std::initializer_list<const char*> verbs,
                 const std::string& scope = "cluster", const std::string& name = "") {
    for (const char* verb : verbs) calls.insert(Grant{scope, group, resource, verb, name});
  };
  // Resolved as src/loop/feature_gates.cpp does: HostManagedIMEX off by default;
  // ComputeDomainCliques on by default and forced off by HostManagedIMEX.
  const bool host_managed = site.Gate("HostManagedIMEX", false);
  const bool cliques = !host_managed && site.Gate("ComputeDomainCliques", true);

  if (site.Enabled("kube")) {
    // src/modules/kube/events.cpp EventRecorder (every module's Events): POST a new Event,
    // merge-PATCH its series.
    add("events.k8s.io", "events", {"create", "patch"});
    // src/modules/kube/leader_election.cpp, kube's own lease when enabled: GET, POST, PUT.
    const auto le = site.Module("kube")["leaderElection"];
    if (le && le["enabled"] && le["enabled"].as<bool>()) {
      add("coordination.k8s.io", "leases", {"get", "create", "update"},
          site.Expand(le["namespace"] ? le["namespace"].as<std::string>() : site.pod_namespace));
    }
  }
  if (site.Enabled("compute-domain-controller")) {
    // leader_election.cpp through the module's leaderElection: the Lease (GET, POST, PUT).
    const auto le = site.Module("compute-domain-controller")["leaderElection"];
    add("coordination.k8s.io", "leases", {"get", "create", "update"},
        site.Expand(le && le["namespace"] ? le["namespace"].as<std::string>() : site.pod_namespace));
    // compute_domain_controller_module.cpp: informer on computedomains (list + watch);
    // reconciler.cpp: GET the domain fresh, PUT finalizers, PUT /status.
    add("resource.nvidia.com", "computedomains", {"list", "watch", "get", "update"});
    add("resource.nvidia.com", "computedomains/status", {"update"});
    // reconciler.cpp: the workload ResourceClaimTemplate (GET, POST, PUT its finalizer,
    // DELETE); the module: an informer on ours (list + watch, label-selected).
    add("resource.k8s.io", "resourceclaimtemplates", {"get", "list", "watch", "create", "update", "delete"});
    if (!host_managed) {
      // Driver-managed: a Node informer, so a vanished node leaves its domains' status.
      add("", "nodes", {"list", "watch"});
    }
    if (cliques) {
      // An informer on the cliques (list + watch); reconciler.cpp JSON-PATCHes out vanished
      // nodes' entries and DELETEs them with their domain.
      add("resource.nvidia.com", "computedomaincliques", {"list", "watch", "patch", "delete"});
    }
  }
  if (site.Enabled("dra-compute-domain")) {
    // dra_module.cpp: GET its Node, GET the claim to prepare, LIST a namespace's
    // ComputeDomains; its ResourceSlice through an informer (list + watch), GET, POST, PUT.
    add("", "nodes", {"get"});
    add("resource.k8s.io", "resourceclaims", {"get"});
    add("resource.nvidia.com", "computedomains", {"list"});
    add("resource.k8s.io", "resourceslices", {"get", "list", "watch", "create", "update"});
    if (!host_managed) {
      // driver_managed.cpp: merge-PATCH its Node's computeDomain label, GET the Node's
      // InternalIP, an informer per served domain (list + watch), its entry in status.nodes
      // (server-side apply; a JSON patch removes one of its node it never owned).
      add("", "nodes", {"get", "patch"});
      add("resource.nvidia.com", "computedomains", {"list", "watch"});
      add("resource.nvidia.com", "computedomains/status", {"patch"});
      if (cliques) {
        // Its entry in its clique's object (apply: PATCH, creating a missing one), a watch on
        // that object (list + watch), a LIST of the domain's cliques when it leaves.
        add("resource.nvidia.com", "computedomaincliques", {"list", "watch", "create", "patch"});
      }
    }
  }
  if (site.Enabled("dra-gpu")) {
    // dra_gpu_module.cpp on the core (dra_plugin/kubelet_plugin, slice_publisher): GET its Node,
    // GET the claim to prepare; its ResourceSlice through an informer (list + watch), GET, POST, PUT.
    add("", "nodes", {"get"});
    add("resource.k8s.io", "resourceclaims", {"get"});
    add("resource.k8s.io", "resourceslices", {"get", "list", "watch", "create", "update"});
  }
  if (site.Enabled("gpu-health")) {
    // gpu_health_module.cpp through kube NodeConditions: GET the Node, merge-PATCH
    // nodes/<n>/status; operator_channel.cpp: its own Node through an informer (list + watch)
    // for the set-healthy annotation, removed with a merge PATCH.
    add("", "nodes", {"get", "list", "watch", "patch"});
    add("", "nodes/status", {"patch"});
  }
  if (site.Enabled("imex-health")) {
    // imex_health_module.cpp: NodeConditions (GET + PATCH status), its own Node through an
    // informer (list + watch) for its InternalIP.
    add("", "nodes", {"get", "list", "watch"});
    add("", "nodes/status", {"patch"});
  }
  if (site.Enabled("imex-peers")) {
    // imex_peers_module.cpp: an informer on the clique's Nodes (list + watch, label-selected),
    // its Node condition (GET + PATCH nodes/status).
    add("", "nodes", {"get", "list", "watch"});
    add("", "nodes/status", {"patch"});
  }
  if (site.Enabled("node-labels")) {
    // node_labels_module.cpp: server-side apply (PATCH) of its own Node's GPU labels.
    add("", "nodes", {"patch"});
  }
  if (site.Enabled("pod-resources")) {
    // pod_resources_module.cpp: the pods of this node through an informer (list + watch,
    // spec.nodeName field selector); a merge PATCH of dgxc.nvidia.com/devices when annotate.
    add("", "pods", {"list", "watch"});
    const auto annotate = site.Module("pod-resources")["annotate"];
    if (!annotate || annotate.as<bool>()) add("", "pods", {"patch"});
  }
  if (site.Enabled("gpu-reset")) {
    // gpu_reset_module.cpp: a GPUReset informer (list + watch), status by merge PATCH; with
    // holders: evict, an Eviction (POST pods/<p>/eviction) per pod holding the GPU.
    add("janitor.dgxc.nvidia.com", "gpuresets", {"list", "watch"});
    add("janitor.dgxc.nvidia.com", "gpuresets/status", {"patch"});
    const auto holders = site.Module("gpu-reset")["holders"];
    if (holders && holders.as<std::string>() == "evict") add("", "pods/eviction", {"create"});
  }
  if (site.Enabled("gkm-agent")) {
    // gkm_agent_module.cpp: informers (list + watch) on GKMCache and ClusterGKMCache;
    // server-side apply (PATCH) of GKMCacheNode / ClusterGKMCacheNode and their status; DELETE
    // with the cache; at start LIST this node's (label gkm.node) and DELETE stale ones; GET of
    // each configured pull secret, by name.
    add("gkm.io", "gkmcaches", {"list", "watch"});
    add("gkm.io", "clustergkmcaches", {"list", "watch"});
    add("gkm.io", "gkmcachenodes", {"list", "patch", "delete"});
    add("gkm.io", "clustergkmcachenodes", {"list", "patch", "delete"});
    add("gkm.io", "gkmcachenodes/status", {"patch"});
    add("gkm.io", "clustergkmcachenodes/status", {"patch"});
    if (const auto secrets = site.Module("gkm-agent")["pullSecrets"]) {
      for (const auto& s : secrets) add("", "secrets", {"get"}, "cluster", s.as<std::string>());
    }
  }
  if (site.Enabled("gkm-controller")) {
    // gkm_controller_module.cpp: its Lease (leader_election.cpp: GET, POST, PUT); informers
    // (list + watch) on the caches and the per-node status objects; server-side apply (PATCH)
    // of each cache's status with the roll-up.
    const auto le = site.Module("gkm-controller")["leaderElection"];
    add("coordination.k8s.io", "leases", {"get", "create", "update"},
        site.Expand(le && le["namespace"] ? le["namespace"].as<std::string>() : site.pod_namespace));
    add("gkm.io", "gkmcaches", {"list", "watch"});
    add("gkm.io", "clustergkmcaches", {"list", "watch"});
    add("gkm.io", "gkmcachenodes", {"list", "watch"});
    add("gkm.io", "clustergkmcachenodes", {"list", "watch"});
    add("", "nodes", {"list", "watch"});  // only nodes of the cluster count (names only)
    add("gkm.io", "gkmcaches/status", {"patch"});
    add("gkm.io", "clustergkmcaches/status", {"patch"});
  }
  // device-plugin, gpu-inventory, metrics, journald, nvsentinel-export: no API calls.
  return calls;
}

std::vector<std::string> RecordedCallsNotIn(const nlohmann::json& recorded, const std::set<Grant>& calls) {
  std::vector<std::string> missing;
  for (const auto& c : recorded) {
    const std::string group = c.at("group").get<std::string>();
    std::string resource = c.at("resource").get<std::string>();
    if (!c.at("subresource").get<std::string>().empty()) resource += "/" + c.at("subresource").get<std::string>();
    const std::string verb = c.at("verb").get<std::string>();
    bool covered = false;
    for (const auto& g : calls) covered = covered || (g.group == group && g.resource == resource && g.verb == verb);
    if (!covered) missing.push_back((group.empty() ? "core" : group) + "/" + resource + " " + verb);
  }
  return missing;
}

}  // namespace gns::test
