// Site config: typed reading, precise errors (file:line:column and key path), env expansion,
// overlays, command-line overrides and feature-gate resolution.
#include "loop/config.hpp"
#include "loop/feature_gates.hpp"
#include "loop/site_loader.hpp"
#include "modules/manifest.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace gns {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gns-config-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // Loads `text` and returns the ConfigError message ("" if it loaded).
  std::string ErrorOf(const std::string& text, CommandLineOverrides overrides = {}) {
    const auto path = Write("site.yaml", text);
    try {
      LoadSiteConfig({path}, overrides, ModuleManifest());
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static constexpr const char* kMinimal =
      "version: v1\n"
      "nodeName: node-a\n"
      "paths:\n"
      "  kubeletDir: /var/lib/kubelet\n"
      "  cdiDir: /var/run/cdi\n"
      "  stateDir: /var/lib/gns\n"
      "  hostRoot: /host\n";

  fs::path dir_;
};

TEST_F(ConfigTest, MinimalConfigLoadsWithDefaults) {
  const auto config = LoadSiteConfig({Write("site.yaml", kMinimal)}, {}, ModuleManifest());
  EXPECT_EQ(config.site.node_name, "node-a");
  EXPECT_EQ(config.site.paths.kubelet_dir, "/var/lib/kubelet");
  EXPECT_EQ(config.site.paths.host_root, "/host");
  EXPECT_TRUE(config.modules.empty());
  EXPECT_FALSE(config.site.gates.Enabled(gates::kHostManagedIMEX));
  EXPECT_EQ(config.runtime.supervisor.stop_timeout, std::chrono::milliseconds(5000));
}

TEST_F(ConfigTest, ModulesDeclareTheModulesWhoseServicesTheyHold) {
  std::vector<std::string_view> earlier;
  for (const auto& descriptor : ModuleManifest()) {
    for (const auto used : descriptor.uses) {
      EXPECT_NE(std::find(earlier.begin(), earlier.end(), used), earlier.end())
          << descriptor.name << " uses " << used << ", which must come before it in the manifest";
    }
    earlier.push_back(descriptor.name);
  }
  const auto uses_of = [](std::string_view name) {
    for (const auto& descriptor : ModuleManifest())
      if (descriptor.name == name) return descriptor.uses;
    return std::vector<std::string_view>{"(no such module)"};
  };
  const std::vector<std::string_view> kube = {"kube"};
  EXPECT_EQ(uses_of("compute-domain-controller"), kube);
  EXPECT_EQ(uses_of("dra-compute-domain"), kube);
  // gpu-health must run without the API server: it follows kube instead of using it.
  EXPECT_TRUE(uses_of("gpu-health").empty());
  for (const auto& descriptor : ModuleManifest()) {
    if (descriptor.name == "gpu-health") {
      EXPECT_EQ(descriptor.follows, kube);
    }
  }

  CommandLineOverrides overrides;
  overrides.enable = {"kube", "compute-domain-controller"};
  const auto config = LoadSiteConfig({Write("site.yaml", kMinimal)}, overrides, ModuleManifest());
  ASSERT_EQ(config.modules.size(), 2u);
  EXPECT_EQ(config.modules[1].name, "compute-domain-controller");
  EXPECT_EQ(config.modules[1].uses, std::vector<std::string>{"kube"});
  overrides.enable = {"kube", "gpu-health"};
  const auto following = LoadSiteConfig({Write("site.yaml", kMinimal)}, overrides, ModuleManifest());
  ASSERT_EQ(following.modules.size(), 2u);
  EXPECT_EQ(following.modules[1].follows, std::vector<std::string>{"kube"});
}

TEST_F(ConfigTest, UnknownTopLevelKeyNamesFileLineColumnAndKey) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "nodname: typo\n"),
            Path("site.yaml") + ":8:1: nodname: unknown key (expected one of: featureGates, logging, modules, "
                                "nodeName, paths, runtime, version)");
}

TEST_F(ConfigTest, UnknownModuleKeyNamesTheKeyPath) {
  const auto error = ErrorOf(std::string(kMinimal) +
                             "modules:\n"
                             "  metrics:\n"
                             "    enabled: true\n"
                             "    listn: 127.0.0.1:1\n");
  EXPECT_NE(error.find(Path("site.yaml") + ":11:5: modules.metrics.listn: unknown key"), std::string::npos) << error;
}

TEST_F(ConfigTest, WrongTypeIsAnError) {
  EXPECT_EQ(ErrorOf("version: v1\nnodeName: n\npaths: [a, b]\n"),
            Path("site.yaml") + ":3:8: paths: expected a map, got a list");
  const auto error = ErrorOf(std::string(kMinimal) + "modules:\n  metrics:\n    enabled: yes please\n");
  EXPECT_EQ(error, Path("site.yaml") + ":10:14: modules.metrics.enabled: expected true or false, got \"yes please\"");
}

TEST_F(ConfigTest, MissingRequiredKeyIsAnError) {
  EXPECT_EQ(ErrorOf("version: v1\npaths: {}\n"), Path("site.yaml") + ":1:1: nodeName: required key is missing");
  const auto error = ErrorOf("version: v1\nnodeName: n\npaths:\n  kubeletDir: /k\n");
  EXPECT_EQ(error, Path("site.yaml") + ":4:3: paths.cdiDir: required key is missing");
  const auto modules = ErrorOf(std::string(kMinimal) + "modules:\n  metrics:\n    listen: 127.0.0.1:1\n");
  EXPECT_EQ(modules, Path("site.yaml") + ":10:5: modules.metrics.enabled: required key is missing");
}

TEST_F(ConfigTest, BadEnumValueListsTheAllowedOnes) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "logging:\n  format: xml\n"),
            Path("site.yaml") + ":9:11: logging.format: \"xml\" is not one of: text, json");
  EXPECT_EQ(ErrorOf("version: v2\n"), Path("site.yaml") + ":1:10: version: \"v2\" is not one of: v1");
}

TEST_F(ConfigTest, BadModuleValuesAreRejectedByTheModulesOwnParser) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  metrics:\n    enabled: true\n    listen: 9464\n"),
            Path("site.yaml") +
                ":11:13: modules.metrics.listen: expected IP:PORT (e.g. 0.0.0.0:9464 or [::1]:9464), got \"9464\"");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  metrics:\n    enabled: true\n    readTimeout: 10 seconds\n"),
            Path("site.yaml") +
                ":11:18: modules.metrics.readTimeout: expected a duration such as 500ms, 30s, 5m or 1h, got \"10 "
                "seconds\"");
}

TEST_F(ConfigTest, DisabledModuleSectionsAreValidatedToo) {
  const auto error = ErrorOf(std::string(kMinimal) + "modules:\n  metrics:\n    enabled: false\n    bogus: 1\n");
  EXPECT_NE(error.find(":11:5: modules.metrics.bogus: unknown key"), std::string::npos) << error;
}

TEST_F(ConfigTest, UnknownModuleAndGateAreErrors) {
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "modules:\n  gpu-magic: {enabled: true}\n")
                .find(":9:3: modules.gpu-magic: unknown module (known: metrics"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "featureGates:\n  WarpDrive: true\n")
                .find(":9:3: featureGates.WarpDrive: unknown feature gate"),
            std::string::npos);
}

TEST_F(ConfigTest, SyntaxErrorAndDuplicateKeyHavePositions) {
  EXPECT_EQ(ErrorOf("version: v1\nnodeName: [unclosed\n").rfind(Path("site.yaml") + ":", 0), 0u);
  EXPECT_NE(ErrorOf("version: v1\nnodeName: [unclosed\n").find("invalid YAML"), std::string::npos);
  EXPECT_EQ(ErrorOf("version: v1\nversion: v1\n"), Path("site.yaml") + ":2:1: version: duplicate key");
}

TEST_F(ConfigTest, MissingFileIsAClearError) {
  try {
    LoadSiteConfig({Path("nope.yaml")}, {}, ModuleManifest());
    FAIL() << "loaded a missing file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), Path("nope.yaml") + ": cannot read config file: No such file or directory");
  }
}

TEST_F(ConfigTest, EnvironmentReferencesExpandOrFailLoudly) {
  ::setenv("GNS_TEST_NODE", "gpu-17", 1);
  ::unsetenv("GNS_TEST_UNSET");
  auto text = std::string(kMinimal);
  text.replace(text.find("node-a"), 6, "${GNS_TEST_NODE}");
  EXPECT_EQ(LoadSiteConfig({Write("site.yaml", text)}, {}, ModuleManifest()).site.node_name, "gpu-17");

  text = std::string(kMinimal);
  text.replace(text.find("node-a"), 6, "${GNS_TEST_UNSET:-fallback}");
  EXPECT_EQ(LoadSiteConfig({Write("site.yaml", text)}, {}, ModuleManifest()).site.node_name, "fallback");

  text = std::string(kMinimal);
  text.replace(text.find("node-a"), 6, "${GNS_TEST_UNSET}");
  EXPECT_EQ(ErrorOf(text), Path("site.yaml") +
                               ":2:11: nodeName: environment variable GNS_TEST_UNSET is not set (use "
                               "${GNS_TEST_UNSET:-default} for a default)");
}

TEST_F(ConfigTest, PathsMustBeAbsolute) {
  auto text = std::string(kMinimal);
  text.replace(text.find("/host"), 5, "host");
  EXPECT_EQ(ErrorOf(text), Path("site.yaml") + ":7:13: paths.hostRoot: must be an absolute path, got \"host\"");
}

TEST_F(ConfigTest, OverlayMergesMapsAndErrorsNameTheOverlayFile) {
  const auto base = Write("base.yaml", std::string(kMinimal) + "modules:\n  metrics:\n    enabled: false\n");
  const auto site = Write("site.yaml", "nodeName: overlay-node\nmodules:\n  metrics:\n    enabled: true\n");
  const auto config = LoadSiteConfig({base, site}, {}, ModuleManifest());
  EXPECT_EQ(config.site.node_name, "overlay-node");
  EXPECT_EQ(config.site.paths.state_dir, "/var/lib/gns");
  ASSERT_EQ(config.modules.size(), 1u);
  EXPECT_EQ(config.modules[0].name, "metrics");

  const auto bad = Write("bad.yaml", "modules:\n  metrics:\n    enabled: true\n    maxConnections: 0\n");
  try {
    LoadSiteConfig({base, bad}, {}, ModuleManifest());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), bad + ":4:21: modules.metrics.maxConnections: value 0 is out of range [1, 4096]");
  }
}

TEST_F(ConfigTest, CommandLineOverridesTheFile) {
  const auto path = Write("site.yaml", std::string(kMinimal) + "modules:\n  metrics:\n    enabled: false\n");
  CommandLineOverrides enable;
  enable.enable = {"metrics"};
  EXPECT_EQ(LoadSiteConfig({path}, enable, ModuleManifest()).modules.size(), 1u);

  const auto on = Write("on.yaml", std::string(kMinimal) + "modules:\n  metrics:\n    enabled: true\n");
  CommandLineOverrides disable;
  disable.disable = {"metrics"};
  EXPECT_TRUE(LoadSiteConfig({on}, disable, ModuleManifest()).modules.empty());

  CommandLineOverrides unknown;
  unknown.enable = {"nope"};
  EXPECT_EQ(ErrorOf(kMinimal, unknown).rfind("--enable: unknown module \"nope\"", 0), 0u);

  CommandLineOverrides level;
  level.log_level = "debug";
  level.log_format = "json";
  const auto config = LoadSiteConfig({on}, level, ModuleManifest());
  EXPECT_EQ(config.logging.level, spdlog::level::debug);
  EXPECT_EQ(config.logging.format, LoggingConfig::Format::kJson);
}

TEST_F(ConfigTest, HostManagedImexForcesIncompatibleGatesOff) {
  CommandLineOverrides overrides;
  ASSERT_EQ(ParseFeatureGateList("HostManagedIMEXDaemon=true", overrides.feature_gates), "");
  const auto config = LoadSiteConfig({Write("site.yaml", kMinimal)}, overrides, ModuleManifest());
  EXPECT_TRUE(config.site.gates.Enabled(gates::kHostManagedIMEX));
  EXPECT_FALSE(config.site.gates.Enabled(gates::kIMEXDaemonsWithDNSNames));
  EXPECT_FALSE(config.site.gates.Enabled(gates::kComputeDomainCliques));
  EXPECT_EQ(config.gate_overrides,
            (std::vector<std::string>{"HostManagedIMEX is enabled; forcing IMEXDaemonsWithDNSNames=false",
                                      "HostManagedIMEX is enabled; forcing ComputeDomainCliques=false"}));

  const auto plain = LoadSiteConfig({Write("site.yaml", kMinimal)}, {}, ModuleManifest());
  EXPECT_TRUE(plain.site.gates.Enabled(gates::kIMEXDaemonsWithDNSNames));
  EXPECT_TRUE(plain.gate_overrides.empty());
}

TEST(FeatureGateList, RejectsMalformedItems) {
  std::map<std::string, bool> out;
  EXPECT_EQ(ParseFeatureGateList("HostManagedIMEX", out), "feature gate \"HostManagedIMEX\" must be NAME=true|false");
  EXPECT_EQ(ParseFeatureGateList("Nope=true", out), "unknown feature gate \"Nope\"");
  EXPECT_EQ(ParseFeatureGateList("HostManagedIMEX=1", out),
            "feature gate HostManagedIMEX: expected true or false, got \"1\"");
}

TEST(Duration, ParsesUnitsAndRejectsGarbage) {
  using std::chrono::milliseconds;
  EXPECT_EQ(ParseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(ParseDuration("1m30s"), milliseconds(90000));
  EXPECT_EQ(ParseDuration("2h"), milliseconds(7200000));
  EXPECT_EQ(ParseDuration("0"), milliseconds(0));
  EXPECT_FALSE(ParseDuration("10"));
  EXPECT_FALSE(ParseDuration("s"));
  EXPECT_FALSE(ParseDuration("-5s"));
  EXPECT_FALSE(ParseDuration("5 s"));
  EXPECT_FALSE(ParseDuration("5d"));
}

TEST_F(ConfigTest, ShippedConfigsValidate) {
  const std::string root = std::getenv("GNS_SOURCE_DIR");
  ::setenv("NODE_NAME", "node-from-env", 1);
  ::setenv("GNS_SANDBOX", "/tmp/gns-sandbox", 1);
  const auto example = LoadSiteConfig({root + "/config/example.yaml"}, {}, ModuleManifest());
  EXPECT_EQ(example.site.node_name, "node-from-env");
  const auto local = LoadSiteConfig({root + "/config/local.yaml"}, {}, ModuleManifest());
  EXPECT_EQ(local.site.paths.kubelet_dir, "/tmp/gns-sandbox/var/lib/kubelet");
  EXPECT_TRUE(local.site.gates.Enabled(gates::kHostManagedIMEX));
}

}  // namespace
}  // namespace gns
