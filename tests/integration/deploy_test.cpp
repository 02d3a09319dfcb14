// The deploy/ bundle (seed 000 §14.2 without a cluster): every manifest the kustomization lists
// loads; the channel DeviceClass exists with the right CEL; no daemon DeviceClass, daemon RBAC
// or daemon ServiceAccount (the bundle is the HostManagedIMEX one, §8); the DaemonSet passes
// the gate; the ConfigMap's site YAML passes `validate-config`; and the RBAC grants exactly the
// API verbs the code calls, nothing more.
#include "support/subprocess.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;

std::string DeployDir() { return std::string(std::getenv("GNS_SOURCE_DIR")) + "/deploy"; }

// (scope, apiGroup, resource, verb): "cluster" for the ClusterRole, else the Role's namespace.
using Grant = std::tuple<std::string, std::string, std::string, std::string>;

// Every API call the modules make, read from the code. Keep in step with it: a verb added to
// the code without a line here (and in deploy/rbac.yaml) fails this test, and so does a grant
// nobody uses.
const std::set<Grant>& UsedByTheCode() {
  static const std::set<Grant> used = {
      // src/modules/kube/leader_election.cpp: GET, POST (first time), PUT (renew, release)
      // the Lease; used by compute-domain-controller (and kube's own when enabled).
      {"gpu-node-supervisor", "coordination.k8s.io", "leases", "get"},
      {"gpu-node-supervisor", "coordination.k8s.io", "leases", "create"},
      {"gpu-node-supervisor", "coordination.k8s.io", "leases", "update"},
      // src/modules/kube/events.cpp EventRecorder: POST a new Event, merge-PATCH its series.
      {"cluster", "events.k8s.io", "events", "create"},
      {"cluster", "events.k8s.io", "events", "patch"},
      // src/modules/compute_domain_controller/compute_domain_controller_module.cpp: informer on
      // computedomains in all namespaces (list + watch);
      // reconciler.cpp: GET the domain fresh, PUT finalizers, PUT /status.
      {"cluster", "resource.nvidia.com", "computedomains", "list"},
      {"cluster", "resource.nvidia.com", "computedomains", "watch"},
      {"cluster", "resource.nvidia.com", "computedomains", "get"},
      {"cluster", "resource.nvidia.com", "computedomains", "update"},
      {"cluster", "resource.nvidia.com", "computedomains/status", "update"},
      // reconciler.cpp: the workload ResourceClaimTemplate: GET, POST, PUT (its finalizer), DELETE;
      // the module: an informer on our templates (list + watch, label-selected).
      {"cluster", "resource.k8s.io", "resourceclaimtemplates", "list"},
      {"cluster", "resource.k8s.io", "resourceclaimtemplates", "watch"},
      {"cluster", "resource.k8s.io", "resourceclaimtemplates", "get"},
      {"cluster", "resource.k8s.io", "resourceclaimtemplates", "create"},
      {"cluster", "resource.k8s.io", "resourceclaimtemplates", "update"},
      {"cluster", "resource.k8s.io", "resourceclaimtemplates", "delete"},
      // src/modules/dra_compute_domain/dra_module.cpp (kubelet plugin): GET its Node, GET the
      // claim to prepare, LIST a namespace's ComputeDomains (granted above), its node's
      // ResourceSlice through an informer (list + watch), GET, POST and PUT; Events (above).
      {"cluster", "", "nodes", "get"},
      {"cluster", "resource.k8s.io", "resourceclaims", "get"},
      {"cluster", "resource.k8s.io", "resourceslices", "list"},
      {"cluster", "resource.k8s.io", "resourceslices", "watch"},
      {"cluster", "resource.k8s.io", "resourceslices", "get"},
      {"cluster", "resource.k8s.io", "resourceslices", "create"},
      {"cluster", "resource.k8s.io", "resourceslices", "update"},
      // src/modules/gpu_health/gpu_health_module.cpp through kube NodeConditions (events.cpp):
      // GET the Node (granted above), merge-PATCH nodes/<n>/status; Events (above). Its own
      // Node through an informer (list + watch) for the set-healthy annotation, which it
      // removes with a merge PATCH of the Node.
      {"cluster", "", "nodes/status", "patch"},
      {"cluster", "", "nodes", "list"},
      {"cluster", "", "nodes", "watch"},
      {"cluster", "", "nodes", "patch"},
      // src/modules/pod_resources/pod_resources_module.cpp: the pods of this node through an
      // informer (list + watch, spec.nodeName field selector); a merge PATCH of the
      // dgxc.nvidia.com/devices annotation.
      {"cluster", "", "pods", "list"},
      {"cluster", "", "pods", "watch"},
      {"cluster", "", "pods", "patch"},
      // src/modules/imex_health/imex_health_module.cpp: the same calls as gpu-health — GET its
      // Node and merge-PATCH nodes/<n>/status (NodeConditions), its own Node through an
      // informer (list + watch) for its InternalIP, Events; all granted above.
      // src/modules/imex_peers/imex_peers_module.cpp: server-side apply PATCH of its own Node's
      // clique label, an informer on the clique's Nodes (list + watch, label-selected), its
      // Node condition (GET + PATCH nodes/status), Events; all granted above.
      // src/modules/gkm_agent/gkm_agent_module.cpp: informers (list + watch) on GKMCache and
      // ClusterGKMCache; server-side apply (PATCH) of GKMCacheNode / ClusterGKMCacheNode and of
      // their status; DELETE with the cache; GET of pull secrets.
      {"cluster", "gkm.io", "gkmcaches", "list"},
      {"cluster", "gkm.io", "gkmcaches", "watch"},
      {"cluster", "gkm.io", "clustergkmcaches", "list"},
      {"cluster", "gkm.io", "clustergkmcaches", "watch"},
      {"cluster", "gkm.io", "gkmcachenodes", "patch"},
      {"cluster", "gkm.io", "gkmcachenodes", "delete"},
      {"cluster", "gkm.io", "clustergkmcachenodes", "patch"},
      {"cluster", "gkm.io", "clustergkmcachenodes", "delete"},
      {"cluster", "gkm.io", "gkmcachenodes/status", "patch"},
      {"cluster", "gkm.io", "clustergkmcachenodes/status", "patch"},
      {"cluster", "", "secrets", "get"},
      // device-plugin, gpu-inventory, metrics, journald: no API calls.
  };
  return used;
}

class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto kustomization = YAML::LoadFile(DeployDir() + "/kustomization.yaml");
    namespace_ = kustomization["namespace"].as<std::string>();
    for (const auto& resource : kustomization["resources"]) {
      const auto file = resource.as<std::string>();
      std::ifstream in(DeployDir() + "/" + file);
      ASSERT_TRUE(in) << file;
      std::stringstream text;
      text << in.rdbuf();
      for (const auto& doc : YAML::LoadAll(text.str())) {
        if (doc.IsNull()) continue;
        ASSERT_TRUE(doc["apiVersion"] && doc["kind"] && doc["metadata"]["name"]) << file;
        docs_.push_back(doc);
      }
    }
  }

  std::vector<YAML::Node> OfKind(const std::string& kind) const {
    std::vector<YAML::Node> out;
    for (const auto& d : docs_) {
      if (d["kind"].as<std::string>() == kind) out.push_back(d);
    }
    return out;
  }

  YAML::Node One(const std::string& kind, const std::string& name) const {
    for (const auto& d : OfKind(kind)) {
      if (d["metadata"]["name"].as<std::string>() == name) return d;
    }
    ADD_FAILURE() << "no " << kind << " " << name;
    return YAML::Node();
  }

  YAML::Node Container() const {
    const auto ds = One("DaemonSet", "gpu-node-supervisor");
    EXPECT_EQ(ds["spec"]["template"]["spec"]["containers"].size(), 1u);
    return ds["spec"]["template"]["spec"]["containers"][0];
  }

  std::string namespace_;
  std::vector<YAML::Node> docs_;
};

TEST_F(DeployTest, TheChannelDeviceClassExistsWithTheRightCel) {
  const auto dc = One("DeviceClass", "compute-domain-default-channel.nvidia.com");
  ASSERT_TRUE(dc);
  EXPECT_EQ(dc["apiVersion"].as<std::string>(), "resource.k8s.io/v1");
  ASSERT_EQ(dc["spec"]["selectors"].size(), 1u);
  EXPECT_EQ(dc["spec"]["selectors"][0]["cel"]["expression"].as<std::string>(),
            "device.driver == \"compute-domain.nvidia.com\" && "
            "device.attributes[\"compute-domain.nvidia.com\"].type == \"channel\" && "
            "device.attributes[\"compute-domain.nvidia.com\"].id == 0");
}

TEST_F(DeployTest, NoDaemonDeviceClassRbacOrServiceAccountUnderHostManagedImex) {
  EXPECT_EQ(OfKind("DeviceClass").size(), 1u);
  for (const auto& dc : OfKind("DeviceClass")) {
    EXPECT_NE(dc["metadata"]["name"].as<std::string>(), "compute-domain-daemon.nvidia.com");
  }
  for (const auto& kind : {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}) {
    for (const auto& d : OfKind(kind)) {
      EXPECT_EQ(d["metadata"]["name"].as<std::string>().find("daemon"), std::string::npos) << kind;
    }
  }
  ASSERT_EQ(OfKind("ServiceAccount").size(), 1u);
  EXPECT_EQ(OfKind("ServiceAccount")[0]["metadata"]["name"].as<std::string>(), "gpu-node-supervisor");
  for (const auto& kind : {"RoleBinding", "ClusterRoleBinding"}) {
    for (const auto& b : OfKind(kind)) {
      ASSERT_EQ(b["subjects"].size(), 1u);
      EXPECT_EQ(b["subjects"][0]["kind"].as<std::string>(), "ServiceAccount");
      EXPECT_EQ(b["subjects"][0]["name"].as<std::string>(), "gpu-node-supervisor");
    }
  }
  // No generated-daemon objects of any kind.
  EXPECT_EQ(OfKind("DaemonSet").size(), 1u);
  EXPECT_TRUE(OfKind("ResourceClaimTemplate").empty());
}

TEST_F(DeployTest, TheDaemonSetPassesTheFeatureGateAndTheNodeEnvironment) {
  const auto ds = One("DaemonSet", "gpu-node-supervisor");
  const auto pod = ds["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"].as<std::string>(), "gpu-node-supervisor");
  const auto c = Container();
  std::vector<std::string> args;
  for (const auto& a : c["args"]) args.push_back(a.as<std::string>());
  ASSERT_GE(args.size(), 1u);
  EXPECT_EQ(args[0], "run");
  const auto gate_flag = std::find(args.begin(), args.end(), "--feature-gates");
  ASSERT_NE(gate_flag, args.end());
  ASSERT_NE(gate_flag + 1, args.end());
  EXPECT_EQ(*(gate_flag + 1), "$(FEATURE_GATES)");

  std::map<std::string, YAML::Node> env;
  for (const auto& e : c["env"]) env[e["name"].as<std::string>()] = YAML::Node(e);
  ASSERT_TRUE(env.contains("FEATURE_GATES"));
  EXPECT_NE(env["FEATURE_GATES"]["value"].as<std::string>().find("HostManagedIMEX=true"), std::string::npos);
  EXPECT_EQ(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(), "spec.nodeName");
  EXPECT_EQ(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(), "metadata.name");

  EXPECT_EQ(c["livenessProbe"]["httpGet"]["path"].as<std::string>(), "/healthz");
  EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"].as<std::string>(), "/readyz");
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["port"].as<std::string>(), "metrics");
  EXPECT_EQ(c["ports"][0]["name"].as<std::string>(), "metrics");
  EXPECT_EQ(c["ports"][0]["containerPort"].as<int>(), 9464);

  std::set<std::string> host_paths;
  for (const auto& v : pod["volumes"]) {
    if (v["hostPath"]) host_paths.insert(v["hostPath"]["path"].as<std::string>());
  }
  for (const auto* path : {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins",
                           "/var/lib/kubelet/pod-resources",
                           "/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/var/lib/gpu-node-supervisor",
                           "/proc", "/var/log/journal"}) {
    EXPECT_TRUE(host_paths.contains(path)) << path;
  }
}

TEST_F(DeployTest, TheCrdHasTheSchemaAndTheStatusSubresource) {
  const auto crd = One("CustomResourceDefinition", "computedomains.resource.nvidia.com");
  ASSERT_TRUE(crd);
  EXPECT_EQ(crd["spec"]["group"].as<std::string>(), "resource.nvidia.com");
  EXPECT_EQ(crd["spec"]["scope"].as<std::string>(), "Namespaced");
  const auto version = crd["spec"]["versions"][0];
  EXPECT_EQ(version["name"].as<std::string>(), "v1beta1");
  EXPECT_TRUE(version["subresources"]["status"].IsMap());
  const auto props = version["schema"]["openAPIV3Schema"]["properties"];
  EXPECT_EQ(props["spec"]["properties"]["numNodes"]["type"].as<std::string>(), "integer");
  const auto channel = props["spec"]["properties"]["channel"]["properties"];
  EXPECT_EQ(channel["resourceClaimTemplate"]["properties"]["name"]["type"].as<std::string>(), "string");
  EXPECT_EQ(channel["allocationMode"]["enum"].as<std::vector<std::string>>(), (std::vector<std::string>{"All", "Single"}));
  EXPECT_EQ(props["status"]["properties"]["status"]["type"].as<std::string>(), "string");
}

TEST_F(DeployTest, TheConfigMapSiteYamlPassesValidateConfig) {
  const auto cm = One("ConfigMap", "gpu-node-supervisor");
  const auto site = cm["data"]["site.yaml"].as<std::string>();
  const auto dir = fs::temp_directory_path() / ("gns-deploy-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = (dir / "site.yaml").string();
  std::ofstream(path) << site;
  // As the DaemonSet runs it: downward-API environment and the gate flag.
  const auto [code, output] = test::RunToCompletion(
      {std::getenv("GNS_SUPERVISOR_BIN"), "validate-config", "--config", path, "--feature-gates", "HostManagedIMEX=true"},
      {{"NODE_NAME", "gpu-node-1"}, {"POD_NAME", "gpu-node-supervisor-abcde"}, {"POD_NAMESPACE", namespace_}});
  fs::remove_all(dir);
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("config ok: node gpu-node-1"), std::string::npos) << output;
  EXPECT_NE(output.find("compute-domain-controller"), std::string::npos) << output;

  // The DaemonSet mounts the ConfigMap where its --config points.
  const auto c = Container();
  EXPECT_EQ(c["args"][2].as<std::string>(), "/etc/gpu-node-supervisor/site.yaml");
  // The controller's Lease lives where the Role grants it.
  const auto config = YAML::Load(site);
  EXPECT_EQ(config["modules"]["compute-domain-controller"]["leaderElection"]["namespace"].as<std::string>(),
            "${POD_NAMESPACE:-" + namespace_ + "}");
}

TEST_F(DeployTest, RbacGrantsExactlyTheVerbsTheCodeCalls) {
  std::set<Grant> granted;
  auto add_rules = [&](const YAML::Node& role, const std::string& scope) {
    for (const auto& rule : role["rules"]) {
      EXPECT_FALSE(rule["nonResourceURLs"]) << "no non-resource URLs are used";
      for (const auto& group : rule["apiGroups"]) {
        for (const auto& resource : rule["resources"]) {
          for (const auto& verb : rule["verbs"]) {
            const auto g = Grant{scope, group.as<std::string>(), resource.as<std::string>(), verb.as<std::string>()};
            EXPECT_NE(std::get<1>(g), "*");
            EXPECT_NE(std::get<2>(g), "*");
            EXPECT_NE(std::get<3>(g), "*");
            EXPECT_TRUE(granted.insert(g).second) << "granted twice: " << std::get<2>(g) << " " << std::get<3>(g);
          }
        }
      }
    }
  };
  for (const auto& role : OfKind("ClusterRole")) add_rules(role, "cluster");
  for (const auto& role : OfKind("Role")) {
    EXPECT_EQ(role["metadata"]["namespace"].as<std::string>(), namespace_);
    add_rules(role, role["metadata"]["namespace"].as<std::string>());
  }
  for (const auto& g : UsedByTheCode()) {
    EXPECT_TRUE(granted.contains(g)) << "not granted: " << std::get<0>(g) << " " << std::get<1>(g) << "/"
                                     << std::get<2>(g) << " " << std::get<3>(g);
  }
  for (const auto& g : granted) {
    EXPECT_TRUE(UsedByTheCode().contains(g)) << "granted but unused: " << std::get<0>(g) << " " << std::get<1>(g)
                                             << "/" << std::get<2>(g) << " " << std::get<3>(g);
  }
  // Every role is bound to the ServiceAccount.
  EXPECT_EQ(OfKind("ClusterRoleBinding").size(), OfKind("ClusterRole").size());
  EXPECT_EQ(OfKind("RoleBinding").size(), OfKind("Role").size());
}

}  // namespace
}  // namespace gns
