// The deploy/ bundle (seed 000 §14.2 without a cluster): every manifest the kustomization lists
// loads; the channel DeviceClass exists with the right CEL; no daemon DeviceClass, daemon RBAC
// or daemon ServiceAccount (the bundle is the HostManagedIMEX one, §8); the DaemonSet passes
// the gate; the ConfigMap's site YAML passes `validate-config`. The RBAC of the base and of
// every combination of components: deploy_components_test.cpp.
#include "support/subprocess.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unistd.h>

namespace gns {
namespace {

namespace fs = std::filesystem;

std::string DeployDir() { return std::string(std::getenv("GNS_SOURCE_DIR")) + "/deploy"; }

class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto kustomization = YAML::LoadFile(DeployDir() + "/kustomization.yaml");
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
    // Every namespaced object is in the ServiceAccount's namespace (the kustomization sets
    // none: it would give the cluster-scoped ValidatingAdmissionPolicy one).
    ASSERT_EQ(OfKind("ServiceAccount").size(), 1u);
    namespace_ = OfKind("ServiceAccount")[0]["metadata"]["namespace"].as<std::string>();
    for (const auto* kind : {"ConfigMap", "DaemonSet", "Role", "RoleBinding"}) {
      for (const auto& d : OfKind(kind)) EXPECT_EQ(d["metadata"]["namespace"].as<std::string>(), namespace_) << kind;
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

// imex-health runs <hostRoot><domainCheck.command> from the ConfigMap: some read-only mount of
// the DaemonSet must put the host's file at exactly that container path (its hostPath plus the
// rest of the path is the command on the host), and the pod must share the host's network,
// where the tool reaches nvidia-imex.service's command port.
TEST_F(DeployTest, TheHostsImexCtlIsMountedWhereImexHealthRunsIt) {
  const auto site = YAML::Load(One("ConfigMap", "gpu-node-supervisor")["data"]["site.yaml"].as<std::string>());
  const auto imex = site["modules"]["imex-health"];
  ASSERT_TRUE(imex && imex["enabled"].as<bool>()) << "the bundle runs imex-health";
  ASSERT_TRUE(imex["domainCheck"]["command"]) << "the ConfigMap names the tool's host path (the mount follows it)";
  const auto command = imex["domainCheck"]["command"].as<std::string>();
  const auto in_container = site["paths"]["hostRoot"].as<std::string>() + command;

  const auto pod = One("DaemonSet", "gpu-node-supervisor")["spec"]["template"]["spec"];
  EXPECT_TRUE(pod["hostNetwork"] && pod["hostNetwork"].as<bool>());
  std::map<std::string, std::string> host_path_of;  // volume name → host path
  for (const auto& v : pod["volumes"]) {
    if (v["hostPath"]) host_path_of[v["name"].as<std::string>()] = v["hostPath"]["path"].as<std::string>();
  }
  bool found = false;
  bool read_only = false;
  size_t mount_path_length = 0;
  std::string host_file;
  const auto mounts = Container()["volumeMounts"];
  for (const auto& m : mounts) {
    const auto at = m["mountPath"].as<std::string>();
    if (in_container.rfind(at + "/", 0) != 0) continue;  // a directory holding the tool
    const auto name = m["name"].as<std::string>();
    ASSERT_TRUE(host_path_of.contains(name)) << name << " is not a hostPath volume";
    // The deepest mount wins, as in the container's mount table.
    if (found && at.size() < mount_path_length) continue;
    found = true;
    mount_path_length = at.size();
    host_file = host_path_of[name] + in_container.substr(at.size());
    read_only = m["readOnly"] && m["readOnly"].as<bool>();
  }
  ASSERT_TRUE(found) << "nothing mounted over " << in_container;
  EXPECT_EQ(host_file, command) << "the mount shows another host file at " << in_container;
  EXPECT_TRUE(read_only);
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
  // Driver-managed: each node applies its own entry (server-side apply); that takes a map list
  // keyed by name, as upstream's CRD declares it. The entry's fields survive pruning.
  const auto nodes = props["status"]["properties"]["nodes"];
  EXPECT_EQ(nodes["x-kubernetes-list-type"].as<std::string>(), "map");
  EXPECT_EQ(nodes["x-kubernetes-list-map-keys"].as<std::vector<std::string>>(), (std::vector<std::string>{"name"}));
  for (const char* field : {"name", "ipAddress", "cliqueID", "index", "status"}) {
    EXPECT_TRUE(nodes["items"]["properties"][field].IsMap()) << field;
  }
  EXPECT_EQ(nodes["items"]["properties"]["status"]["enum"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"Ready", "NotReady"}));
}

TEST_F(DeployTest, TheCliqueCrdIsUpstreamsShapeWithDaemonsAsAListMap) {
  const auto crd = One("CustomResourceDefinition", "computedomaincliques.resource.nvidia.com");
  ASSERT_TRUE(crd);
  EXPECT_EQ(crd["spec"]["group"].as<std::string>(), "resource.nvidia.com");
  EXPECT_EQ(crd["spec"]["scope"].as<std::string>(), "Namespaced");
  EXPECT_EQ(crd["spec"]["names"]["kind"].as<std::string>(), "ComputeDomainClique");
  EXPECT_EQ(crd["spec"]["names"]["plural"].as<std::string>(), "computedomaincliques");
  const auto version = crd["spec"]["versions"][0];
  EXPECT_EQ(version["name"].as<std::string>(), "v1beta1");
  EXPECT_FALSE(version["subresources"]) << "upstream's clique object has no status subresource";
  // Top-level daemons, each node's entry its own (server-side apply keyed by nodeName).
  const auto daemons = version["schema"]["openAPIV3Schema"]["properties"]["daemons"];
  EXPECT_EQ(daemons["x-kubernetes-list-type"].as<std::string>(), "map");
  EXPECT_EQ(daemons["x-kubernetes-list-map-keys"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"nodeName"}));
  for (const char* field : {"nodeName", "ipAddress", "cliqueID", "index", "status"}) {
    EXPECT_TRUE(daemons["items"]["properties"][field].IsMap()) << field;
  }
  EXPECT_EQ(daemons["items"]["properties"]["status"]["enum"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"Ready", "NotReady"}));
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

}  // namespace
}  // namespace gns
