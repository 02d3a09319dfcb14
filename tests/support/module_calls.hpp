#pragma once
// The Kubernetes API calls each module makes, as the RBAC of deploy/ must grant them: one
// table, read from the code (each entry names where the call is made), selected by a site
// config. Checked two ways: deploy_components_test renders every combination of deploy/'s
// components and compares its grants with ModuleCalls of its config, and tests that run the
// real binary against the API simulator (driver_managed_imex_test) compare what the simulator
// saw (GET /_sim/stats "calls") with ModuleCalls of their own config: a call made that the
// table lacks fails there.

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

// Every API call the modules `site` enables make.
std::set<Grant> ModuleCalls(const SiteView& site);

// The simulator's recorded calls (the "calls" array of GET /_sim/stats) that `calls` does not
// cover, compared on group, resource and verb (the record has no namespace or object name).
std::vector<std::string> RecordedCallsNotIn(const nlohmann::json& recorded, const std::set<Grant>& calls);

}  // namespace gns::test
