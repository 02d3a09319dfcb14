// Site config: typed reading, precise errors (file:line:column and key path), env expansion,
// overlays, command-line overrides and feature-gate resolution.
#include "loop/config.hpp"
#include "loop/config_checks.hpp"
#include "loop/feature_gates.hpp"
#include "loop/site_loader.hpp"
#include "modules/manifest.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>

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
  EXPECT_EQ(ErrorOf("version: v1\nversion: v1\n"), Path("site.yaml") + ":2:1: version: duplicate key (first at line 1)");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  metrics: {enabled: true, enabled: false}\n"),
            Path("site.yaml") + ":9:28: modules.metrics.enabled: duplicate key (first at line 9)");
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

// --- issue #24 item 5: text that is not YAML never becomes a config ----------------------

// The shipped ConfigMap's mistake: a value opened with '"' and never closed. yaml-cpp 0.7 took
// the rest of the file into that string and said "config ok" with every module after it off.
TEST_F(ConfigTest, UnclosedQuoteIsAnErrorNotAStringHoldingTheRestOfTheFile) {
  const auto error = ErrorOf("version: v1\n"
                             "nodeName: \"node-a\n"
                             "paths:\n"
                             "  kubeletDir: /var/lib/kubelet\n"
                             "modules:\n"
                             "  metrics:\n"
                             "    enabled: true\n");
  EXPECT_EQ(error.rfind(Path("site.yaml") + ":2:11: (top level): invalid YAML: ", 0), 0u) << error;
}

TEST_F(ConfigTest, TabIndentationAndControlCharactersAreErrors) {
  EXPECT_EQ(ErrorOf("version: v1\npaths:\n\tkubeletDir: /k\n").rfind(Path("site.yaml") + ":3:", 0), 0u)
      << ErrorOf("version: v1\npaths:\n\tkubeletDir: /k\n");
  // libfyaml ends the input at a NUL byte: what follows must not silently vanish.
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + std::string("bogus: 1\0 more\n", 15)),
            Path("site.yaml") + ":8:9: (top level): invalid YAML: control character U+0000 (YAML allows none but "
                                "tab, line feed and carriage return)");
  EXPECT_EQ(ErrorOf("version: v1\nnodeName: n\x01\n"),
            Path("site.yaml") + ":2:12: (top level): invalid YAML: control character U+0001 (YAML allows none but "
                                "tab, line feed and carriage return)");
}

TEST_F(ConfigTest, InvalidUtf8IsAnError) {
  // libfyaml 0.7.12 looped forever on this (found by tests/fuzz/config_yaml_fuzz.cpp).
  EXPECT_EQ(ErrorOf("%: &a [x, x,N1hn8\x8b\x8b" "8 &a [x]\n"),
            Path("site.yaml") + ":1:18: (top level): invalid YAML: not UTF-8 (byte 0x8B)");
}

TEST_F(ConfigTest, ASecondDocumentIsAnError) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "---\nnodeName: other\n"),
            Path("site.yaml") + ":8:1: (top level): a second YAML document: a config file holds exactly one (remove "
                                "the `---` and what follows, or merge it into the first)");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "...\nnodeName: other\n").rfind(Path("site.yaml") + ":9:1: (top level): a second YAML document", 0), 0u)
      << ErrorOf(std::string(kMinimal) + "...\nnodeName: other\n");
  // One document, explicitly started and ended, is fine.
  EXPECT_EQ(ErrorOf("---\n" + std::string(kMinimal) + "...\n"), "");
}

TEST_F(ConfigTest, NonScalarKeysAreErrors) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "? [a, b]\n: 1\n"),
            Path("site.yaml") + ":8:3: (top level): map keys must be plain strings, got a list");
}

TEST_F(ConfigTest, NodeNameMustBeAKubernetesNodeName) {
  for (const std::string& bad : std::vector<std::string>{"Node_A", "node a", "-node", "node-", "a..b", std::string(254, 'a')}) {
    auto text = std::string(kMinimal);
    text.replace(text.find("node-a"), 6, "\"" + bad + "\"");
    EXPECT_NE(ErrorOf(text).find(":2:11: nodeName: not a Kubernetes node name: "), std::string::npos) << bad;
  }
  for (const std::string& good : std::vector<std::string>{"gpu-17", "node-a.rack-3.example.com", "10.0.0.7", std::string(63, 'a')}) {
    auto text = std::string(kMinimal);
    text.replace(text.find("node-a"), 6, good);
    EXPECT_EQ(ErrorOf(text), "") << good;
  }
}

// --- issue #24 item 6: bounded, never blocking, never a crash -----------------------------

TEST_F(ConfigTest, SelfReferencingAliasIsAnErrorNotACrash) {
  EXPECT_EQ(ErrorOf("a: &a [*a]\n"),
            Path("site.yaml") + ":1:8: a[0]: alias *a refers to the node it is part of (a recursive alias)");
  EXPECT_EQ(ErrorOf("a: &a {b: *a}\n"),
            Path("site.yaml") + ":1:11: a.b: alias *a refers to the node it is part of (a recursive alias)");
  EXPECT_EQ(ErrorOf("a: *nowhere\n"), Path("site.yaml") + ":1:4: a: alias *nowhere refers to no anchor &nowhere");
}

TEST_F(ConfigTest, MergeKeyLoopIsAnErrorNotACrash) {
  EXPECT_EQ(ErrorOf("base: &b\n  x: 1\n  <<: *b\n"),
            Path("site.yaml") + ":3:7: base.<<: alias *b refers to the node it is part of (a recursive alias)");
  // A merge key that is not a loop is an ordinary (unknown) key: YAML 1.2 has no merge.
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "defaults: &d {listen: 127.0.0.1:1}\nmodules:\n  metrics:\n    enabled: false\n    <<: *d\n")
                .find("unknown key"),
            std::string::npos);
}

TEST_F(ConfigTest, BillionLaughsStopsAtTheNodeLimit) {
  std::string text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c) {
    text += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) text += std::string(i ? ", " : "") + "*" + static_cast<char>(c - 1);
    text += "]\n";
  }
  const auto error = ErrorOf(text);
  EXPECT_NE(error.find(": more than 100000 YAML nodes (aliases counted as what they copy): refused"), std::string::npos)
      << error;
  // Long strings copied by aliases count too.
  std::string wide = "a: &a \"" + std::string(500 * 1024, 'x') + "\"\nb: [";
  for (int i = 0; i < 16; ++i) wide += std::string(i ? ", " : "") + "*a";
  wide += "]\n";
  EXPECT_NE(ErrorOf(wide).find("bytes of text in values (aliases counted as what they copy): refused"), std::string::npos);
}

TEST_F(ConfigTest, DeepNestingIsAnError) {
  const auto error = ErrorOf("a: " + std::string(100, '[') + std::string(100, ']') + "\n");
  EXPECT_NE(error.find(": nested deeper than 64 levels"), std::string::npos) << error;
}

TEST_F(ConfigTest, OnlyBoundedRegularFilesAreRead) {
  const auto error_of_file = [](const std::string& path) {
    try {
      LoadSiteConfig({path}, {}, ModuleManifest());
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of_file("/dev/zero"), "/dev/zero: cannot read config file: a character device, not a regular file");
  const auto fifo = Path("site.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of_file(fifo), fifo + ": cannot read config file: a FIFO, not a regular file");  // no writer: no hang
  EXPECT_EQ(error_of_file(dir_.string()), dir_.string() + ": cannot read config file: a directory, not a regular file");
  const auto big = Write("big.yaml", std::string(kMinimal) + "# " + std::string(1024 * 1024, 'x') + "\n");
  EXPECT_EQ(error_of_file(big), big + ": cannot read config file: larger than 1048576 bytes");
}

TEST_F(ConfigTest, LargeMapsLoadInLinearTime) {
  // 40 000 keys: the duplicate check, the overlay merge and StringMap are not quadratic.
  std::string base = "labels:\n";
  for (int i = 0; i < 40000; ++i) base += "  k" + std::to_string(i) + ": v\n";
  const auto value = LoadYamlFile(Write("big.yaml", base));
  ConfigValue merged = value;
  MergeOverlay(merged, LoadYamlFile(Write("big2.yaml", base)));
  ConfigMap top(merged, "");
  EXPECT_EQ(top.StringMap("labels").size(), 40000u);
}

// --- issue #24 item 9: what validate-config accepts, run can use ---------------------------

TEST_F(ConfigTest, PathsAreCheckedForWhatTheSystemAccepts) {
  auto nul = std::string(kMinimal);
  nul.replace(nul.find("/var/lib/gns"), 12, "\"/var/lib/\\0gns\"");
  EXPECT_EQ(ErrorOf(nul), Path("site.yaml") + ":6:13: paths.stateDir: contains a NUL character");
  auto longer = std::string(kMinimal);
  longer.replace(longer.find("/var/lib/gns"), 12, "/" + std::string(5000, 'a'));
  EXPECT_EQ(ErrorOf(longer), Path("site.yaml") + ":6:13: paths.stateDir: is 5001 bytes long, more than a path can be (4095)");
  auto component = std::string(kMinimal);
  component.replace(component.find("/var/lib/gns"), 12, "/var/" + std::string(256, 'a'));
  EXPECT_EQ(ErrorOf(component),
            Path("site.yaml") + ":6:13: paths.stateDir: has a component of 256 bytes, more than a file name can be (255)");
}

TEST_F(ConfigTest, ModulePathsMustBeAbsolute) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  journald:\n    enabled: false\n    directory: var/log/journal\n"),
            Path("site.yaml") + ":11:16: modules.journald.directory: must be an absolute path, got \"var/log/journal\"");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  pod-resources:\n    enabled: false\n    socket: kubelet.sock\n"),
            Path("site.yaml") + ":11:13: modules.pod-resources.socket: must be an absolute path, got \"kubelet.sock\"");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  gpu-reset:\n    enabled: false\n    journalSocket: run/j.sock\n"),
            Path("site.yaml") + ":11:20: modules.gpu-reset.journalSocket: must be an absolute path, got \"run/j.sock\"");
}

TEST_F(ConfigTest, SocketPathsMustFitASockaddrUn) {
  const std::string long_dir = "/" + std::string(100, 's');
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  pod-resources:\n    enabled: false\n    socket: " + long_dir +
                    "/kubelet.sock\n"),
            Path("site.yaml") + ":11:13: modules.pod-resources.socket: \"" + long_dir +
                "/kubelet.sock\" is 114 bytes long, too long for a unix socket path (107 at most)");
  const auto name = ErrorOf(std::string(kMinimal) + "modules:\n  device-plugin:\n    enabled: false\n    socketName: " +
                            std::string(100, 'n') + ".sock\n");
  EXPECT_NE(name.find(":11:17: modules.device-plugin.socketName: \"/var/lib/kubelet/device-plugins/"), std::string::npos)
      << name;
  EXPECT_NE(name.find("too long for a unix socket path (107 at most)"), std::string::npos) << name;
  // Sockets the modules derive from paths.stateDir.
  auto deep = std::string(kMinimal);
  deep.replace(deep.find("/var/lib/gns"), 12, long_dir);
  const auto admin = ErrorOf(deep + "modules:\n  gpu-health:\n    enabled: false\n");
  EXPECT_NE(admin.find("modules.gpu-health.adminSocket: admin.sock in paths.stateDir: "), std::string::npos) << admin;
}

TEST_F(ConfigTest, ResourceNamesMustBeExtendedResourceNames) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "modules:\n  device-plugin:\n    enabled: false\n    resourceName: ../gpu\n"),
            Path("site.yaml") +
                ":11:19: modules.device-plugin.resourceName: \"../gpu\": the domain \"..\" is not an RFC 1123 subdomain");
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "modules:\n  device-plugin:\n    enabled: false\n    resourceName: nvidia.com/../x\n")
                .find("is not an extended resource name"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "modules:\n  pod-resources:\n    enabled: false\n    resourceNames: [nvidia.com/g!]\n")
                .find("modules.pod-resources.resourceNames: \"nvidia.com/g!\": the name after the slash"),
            std::string::npos);
  EXPECT_EQ(ExtendedResourceNameProblem("nvidia.com/gpu"), "");
  EXPECT_EQ(ExtendedResourceNameProblem("nvidia.com/mig-1g.10gb"), "");
  EXPECT_NE(ExtendedResourceNameProblem("kubernetes.io/gpu"), "");
  EXPECT_NE(ExtendedResourceNameProblem("requests.nvidia.com/gpu"), "");
}

TEST_F(ConfigTest, LogLevelsNameExistingLoggers) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "logging:\n  levels: {metrics: debug, supervisor: warn}\n"), "");
  const auto error = ErrorOf(std::string(kMinimal) + "logging:\n  levels: {metrcs: debug}\n");
  EXPECT_EQ(error.rfind(Path("site.yaml") + ":9:12: logging.levels.metrcs: no logger of that name (known: supervisor, metrics", 0), 0u)
      << error;
}

}  // namespace
}  // namespace gns
