#pragma once
// The Kubernetes API calls each module makes, as deploy/'s RBAC must grant them, read from
// recordings of real runs rather than typed by hand. The integration tests that run the real
// binary against the API simulator (metrics_lint_test.py: the `make run` demo walk over every
// module; driver_managed_imex_test, with ComputeDomainCliques on and off; gpu_reset_test) take
// the simulator's record by module (GET /_sim/stats "callsByAgent": each request names its
// module in its User-Agent, src/modules/kube/api/client.hpp ModuleAgent) and compare it with
// deploy/recorded-api-calls/<scenario>.json: a call the file lacks fails the test, with how to
// re-record (GNS_RECORD_API_CALLS=1 adds the run's calls to the file instead).
//
// ModuleCalls(site) is what deploy_components_test checks every component combination's grants
// against, both ways: the union, over the modules the site enables, of what the recordings say
// each called. Where a site's settings change which calls a module makes, the recording is
// selected or refined by those settings, and nothing else is added:
//   - the IMEX mode (HostManagedIMEX, and ComputeDomainCliques when driver-managed) changes the
//     calls of dra-compute-domain and compute-domain-controller: theirs come only from the
//     recordings made with the site's mode (each file says its featureGates); every other
//     module's come from all recordings;
//   - a Lease call is granted in the namespace of that module's leaderElection (kube's only
//     when its leaderElection is enabled);
//   - gkm-agent's `get` on secrets is granted by name, one per modules.gkm-agent.pullSecrets
//     entry (none: no grant);
//   - gpu-reset's eviction (`create` pods/eviction) only with `holders: evict`, pod-resources'
//     pod `patch` only with `annotate` on (its default).
// The recordings' own runs have these settings on (config/local.yaml), so every call is seen.

#include <nlohmann/json_fwd.hpp>
#include <yaml-cpp/yaml.h>

#include <compare>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gns::test {

// One permission: scope ("cluster", or a Role's namespace), API group, resource (with
// "/subresource"), verb, and the one object a rule is restricted to ("" = any).
struct Grant {
  std::string scope, group, resource, verb, name;
  auto operator<=>(const Grant&) const = default;
};
std::string Describe(const Grant& g);

// Deep merge, as the supervisor lays a --config overlay over the site file (maps merge key by
// key, anything else is replaced).
YAML::Node MergeConfig(const YAML::Node& base, const YAML::Node& overlay);

// A site config as the modules see it.
struct SiteView {
  YAML::Node config;                  // the site file with its overlays merged
  std::map<std::string, bool> gates;  // --feature-gates (they win over the file's featureGates)
  std::string pod_namespace;          // what ${POD_NAMESPACE...} expands to

  YAML::Node Module(const std::string& name) const;
  bool Enabled(const std::string& name) const;
  bool Gate(const std::string& name, bool fallback) const;
  std::string Expand(const std::string& value) const;
};

// Every API call the modules `site` enables make, from the recordings (see above).
std::set<Grant> ModuleCalls(const SiteView& site);

// deploy/recorded-api-calls under $GNS_SOURCE_DIR (ctest sets it), or under the source tree
// this was built from.
std::string RecordingsDir();

// A run's calls by module, from GET /_sim/stats: {module: ["<group or core>/<resource>[/<sub>]
// <verb>", ...] sorted}. Only the supervisor's agents ("gpu-node-supervisor/<module>") count;
// its calls outside any module ("gpu-node-supervisor") are under "(process)".
nlohmann::json CallsByModule(const nlohmann::json& stats);

// Compares a run's calls (`stats` of GET /_sim/stats) with the recording `scenario`: one line
// per call the recording lacks, naming the module and how to re-record (`test` is the ctest
// name to re-run). With GNS_RECORD_API_CALLS=1 the run's calls are added to the recording
// instead (written with `gates`, the run's HostManagedIMEX and ComputeDomainCliques as
// resolved), and nothing is reported.
std::vector<std::string> CheckRecordedCalls(const std::string& scenario, const std::string& test,
                                            const nlohmann::json& stats, const std::map<std::string, bool>& gates);

// HostManagedIMEX and ComputeDomainCliques as src/loop/feature_gates.cpp resolves them
// (cliques on by default, forced off by HostManagedIMEX).
std::map<std::string, bool> ResolvedImexGates(const SiteView& site);

}  // namespace gns::test
