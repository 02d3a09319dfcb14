// XID catalog and site overrides: the shipped config/xid-catalog.yaml loads and says what we
// expect for the common XIDs; broken files fail with the exact file:line:column, key path
// and message; overrides parse and reject conflicts.
#include "modules/gpu_health/xid_catalog.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace gns::gpu_health {
namespace {

// The repository root, from the environment gns_test (cmake/GnsTests.cmake) sets for ctest.
std::string SourceDir() {
  const char* dir = std::getenv("GNS_SOURCE_DIR");
  EXPECT_NE(dir, nullptr) << "GNS_SOURCE_DIR is not set: run this test through ctest";
  return dir != nullptr ? dir : ".";
}

// Writes `text` to a file of its own and returns the path.
std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "gns_xid_catalog_" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

// Loads `text` from a real file and returns the error text ("" when it loaded).
std::string CatalogError(const std::string& name, const std::string& text, std::string* path_out) {
  const std::string path = WriteFile(name, text);
  *path_out = path;
  try {
    (void)XidCatalog::LoadFile(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string OverridesError(const std::string& text) {
  try {
    (void)LoadSiteOverridesString(text, "site.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kGoodEntry =
    "version: 1\n"
    "xids:\n"
    "  - xid: 13\n"
    "    mnemonic: ROBUST_CHANNEL_GR_EXCEPTION\n"
    "    description: Graphics Engine Exception\n"
    "    fatal: false\n"
    "    action: RESTART_APP\n";

TEST(XidCatalog, TheBuiltInCatalogIsTheShippedFile) {
  const XidCatalog file = XidCatalog::LoadFile(SourceDir() + "/config/xid-catalog.yaml");
  const XidCatalog& builtin = XidCatalog::Builtin();
  ASSERT_EQ(builtin.size(), file.size());
  for (uint32_t xid = 1; xid <= kMaxXid; ++xid) {
    const XidInfo* a = builtin.Find(xid);
    const XidInfo* b = file.Find(xid);
    ASSERT_EQ(a == nullptr, b == nullptr) << xid;
    if (a == nullptr) continue;
    EXPECT_EQ(a->mnemonic, b->mnemonic) << xid;
    EXPECT_EQ(a->fatal, b->fatal) << xid;
    EXPECT_EQ(a->action, b->action) << xid;
  }
  EXPECT_EQ(builtin.source(), file.source());
}

TEST(XidCatalog, ShippedCatalogLoads) {
  const XidCatalog catalog = XidCatalog::LoadFile(SourceDir() + "/config/xid-catalog.yaml");
  EXPECT_GE(catalog.size(), 90u);
  EXPECT_NE(catalog.source().find("analyzing-xid-catalog"), std::string::npos);

  for (uint32_t xid : {13u, 31u, 32u, 43u, 45u, 48u, 61u, 62u, 63u, 64u, 68u, 69u, 74u, 79u, 92u,
                       94u, 95u, 109u, 119u, 120u, 121u, 140u, 143u, 144u, 145u, 146u, 147u, 148u,
                       149u, 150u}) {
    EXPECT_TRUE(catalog.Lookup(xid).known) << xid;
  }

  const XidLookup dbe = catalog.Lookup(48);
  EXPECT_TRUE(dbe.fatal);
  EXPECT_EQ(dbe.action, RecommendedAction::kComponentReset);
  EXPECT_EQ(dbe.mnemonic, "ROBUST_CHANNEL_GPU_ECC_DBE");
  EXPECT_EQ(catalog.Find(48)->nvidia_bucket, "WORKFLOW_XID_48");

  EXPECT_EQ(catalog.Lookup(79).action, RecommendedAction::kRestartBm);
  EXPECT_TRUE(catalog.Lookup(79).fatal);
  EXPECT_EQ(catalog.Lookup(95).action, RecommendedAction::kComponentReset);
  EXPECT_EQ(catalog.Lookup(119).action, RecommendedAction::kComponentReset);
  EXPECT_EQ(catalog.Lookup(151).action, RecommendedAction::kRestartVm);

  EXPECT_FALSE(catalog.Lookup(13).fatal);
  EXPECT_EQ(catalog.Lookup(13).action, RecommendedAction::kRestartApp);
  EXPECT_EQ(catalog.Lookup(13).description, "Graphics Engine Exception");
  EXPECT_FALSE(catalog.Lookup(63).fatal);
  EXPECT_EQ(catalog.Lookup(63).action, RecommendedAction::kNone);
  EXPECT_FALSE(catalog.Lookup(94).fatal);

  // Every fatal entry recommends something that acts on the device.
  for (uint32_t xid = 1; xid <= kMaxXid; ++xid) {
    if (const XidInfo* info = catalog.Find(xid); info != nullptr && info->fatal) {
      EXPECT_TRUE(ActsOnDevice(info->action)) << xid;
    }
  }
}

TEST(XidCatalog, UnknownXidIsContactSupportAndFlagged) {
  const XidCatalog catalog = XidCatalog::LoadString(kGoodEntry, "inline.yaml");
  for (uint32_t xid : {2u, 999u, 4000000000u}) {
    const XidLookup l = catalog.Lookup(xid);
    EXPECT_FALSE(l.known);
    EXPECT_TRUE(l.fatal);
    EXPECT_EQ(l.action, RecommendedAction::kContactSupport);
    EXPECT_EQ(l.xid, xid);
    EXPECT_EQ(l.mnemonic, "UNKNOWN_XID");
  }
  EXPECT_EQ(catalog.Find(999), nullptr);
}

TEST(XidCatalog, ActionNamesMatchNvsentinelEnum) {
  struct Row {
    RecommendedAction action;
    const char* name;
    int value;
  };
  for (const Row& r : {Row{RecommendedAction::kNone, "NONE", 0},
                       Row{RecommendedAction::kComponentReset, "COMPONENT_RESET", 2},
                       Row{RecommendedAction::kContactSupport, "CONTACT_SUPPORT", 5},
                       Row{RecommendedAction::kRunFieldDiag, "RUN_FIELDDIAG", 6},
                       Row{RecommendedAction::kRestartVm, "RESTART_VM", 15},
                       Row{RecommendedAction::kRestartBm, "RESTART_BM", 24},
                       Row{RecommendedAction::kReplaceVm, "REPLACE_VM", 25},
                       Row{RecommendedAction::kRunDcgmEud, "RUN_DCGMEUD", 26},
                       Row{RecommendedAction::kRestartApp, "RESTART_APP", 39},
                       Row{RecommendedAction::kUnknown, "UNKNOWN", 99}}) {
    EXPECT_EQ(ActionName(r.action), r.name);
    EXPECT_EQ(ParseActionName(r.name), r.action);
    EXPECT_EQ(static_cast<int>(r.action), r.value);
  }
  EXPECT_FALSE(ParseActionName("RESET_GPU").has_value());
  EXPECT_FALSE(ActsOnDevice(RecommendedAction::kRestartApp));
  EXPECT_TRUE(ActsOnDevice(RecommendedAction::kContactSupport));
}

TEST(XidCatalog, ActionsRankInOneEscalationOrder) {
  // Least disruptive first; every action has a place of its own.
  const RecommendedAction order[] = {
      RecommendedAction::kNone,       RecommendedAction::kRestartApp,   RecommendedAction::kUnknown,
      RecommendedAction::kComponentReset, RecommendedAction::kRunDcgmEud, RecommendedAction::kRestartVm,
      RecommendedAction::kRestartBm,  RecommendedAction::kRunFieldDiag, RecommendedAction::kReplaceVm,
      RecommendedAction::kContactSupport};
  for (std::size_t i = 1; i < std::size(order); ++i) {
    EXPECT_LT(ActionRank(order[i - 1]), ActionRank(order[i])) << ActionName(order[i - 1]) << " < " << ActionName(order[i]);
  }
  EXPECT_EQ(MoreSevere(RecommendedAction::kRestartBm, RecommendedAction::kComponentReset), RecommendedAction::kRestartBm);
  EXPECT_EQ(MoreSevere(RecommendedAction::kComponentReset, RecommendedAction::kRestartBm), RecommendedAction::kRestartBm);
  // Every action that takes the device out of service ranks above every one that does not.
  for (const auto acts : order) {
    for (const auto leaves : order) {
      if (ActsOnDevice(acts) && !ActsOnDevice(leaves)) {
        EXPECT_GT(ActionRank(acts), ActionRank(leaves));
      }
    }
  }
}

struct BrokenCase {
  std::string name;
  std::string yaml;
  std::string location;  // ":line:column: key path: message" after the file name
};

class BrokenCatalog : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenCatalog, PointsAtTheProblem) {
  const BrokenCase& c = GetParam();
  std::string path;
  const std::string error = CatalogError(c.name + ".yaml", c.yaml, &path);
  EXPECT_EQ(error, path + c.location);
}

INSTANTIATE_TEST_SUITE_P(
    Files, BrokenCatalog,
    ::testing::Values(
        BrokenCase{"WrongTypeForFatal",
                   "version: 1\n"
                   "xids:\n"
                   "  - xid: 13\n"
                   "    mnemonic: X\n"
                   "    description: d\n"
                   "    fatal: maybe\n"
                   "    action: NONE\n",
                   ":6:12: xids[0].fatal: expected true or false, got 'maybe'"},
        BrokenCase{"UnknownKey",
                   std::string(kGoodEntry) + "    severity: high\n",
                   ":8:5: xids[0].severity: unknown key (allowed: xid, mnemonic, description, "
                   "fatal, action, nvidia_bucket, threshold, escalation, clears, lookback)"},
        BrokenCase{"BadActionName",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 46, mnemonic: M, description: d, fatal: true, action: RESET_GPU}\n",
                   ":3:65: xids[0].action: unknown action 'RESET_GPU' (expected one of NONE, "
                   "COMPONENT_RESET, CONTACT_SUPPORT, RUN_FIELDDIAG, RESTART_VM, RESTART_BM, "
                   "REPLACE_VM, RUN_DCGMEUD, RESTART_APP)"},
        BrokenCase{"DuplicateXid",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 48, mnemonic: A, description: d, fatal: true, action: COMPONENT_RESET}\n"
                   "  - {xid: 79, mnemonic: B, description: d, fatal: true, action: RESTART_BM}\n"
                   "  - {xid: 48, mnemonic: C, description: d, fatal: true, action: COMPONENT_RESET}\n",
                   ":5:11: xids[2].xid: duplicate XID 48 (first defined at line 3)"},
        BrokenCase{"XidZero",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 0, mnemonic: A, description: d, fatal: false, action: NONE}\n",
                   ":3:11: xids[0].xid: XID 0 is out of range (1-1023)"},
        BrokenCase{"XidTooLarge",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 5000, mnemonic: A, description: d, fatal: false, action: NONE}\n",
                   ":3:11: xids[0].xid: XID 5000 is out of range (1-1023)"},
        BrokenCase{"XidNotANumber",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 0x30, mnemonic: A, description: d, fatal: false, action: NONE}\n",
                   ":3:11: xids[0].xid: expected an integer, got '0x30'"},
        BrokenCase{"QuotedXid",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: \"13\", mnemonic: A, description: d, fatal: false, action: NONE}\n",
                   ":3:11: xids[0].xid: expected an integer, got the quoted string '13'"},
        BrokenCase{"MissingAction",
                   "version: 1\n"
                   "xids:\n"
                   "  - xid: 13\n"
                   "    mnemonic: X\n"
                   "    description: d\n"
                   "    fatal: false\n",
                   ":3:5: xids[0].action: missing required key"},
        BrokenCase{"FatalWithoutDeviceAction",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 48, mnemonic: A, description: d, fatal: true, action: RESTART_APP}\n",
                   ":3:65: xids[0].action: a fatal XID needs an action that acts on the device, "
                   "not RESTART_APP"},
        BrokenCase{"EntryIsAList",
                   "version: 1\n"
                   "xids:\n"
                   "  - [13, X]\n",
                   ":3:5: xids[0]: expected a mapping, got a sequence"},
        BrokenCase{"UnknownTopLevelKey", std::string(kGoodEntry) + "extra: 1\n",
                   ":8:1: extra: unknown key (allowed: version, source, defaults, xids)"},
        BrokenCase{"DuplicateTopLevelKey", std::string(kGoodEntry) + "version: 1\n",
                   ":8:1: version: duplicate key (first at line 1)"},
        BrokenCase{"WrongVersion",
                   "version: 2\n"
                   "xids: []\n",
                   ":1:10: version: unsupported version (expected 1)"},
        BrokenCase{"EmptyList",
                   "version: 1\n"
                   "xids: []\n",
                   ":2:7: xids: the catalog has no entries"},
        BrokenCase{"XidsNotAList",
                   "version: 1\n"
                   "xids: 13\n",
                   ":2:7: xids: expected a sequence, got '13'"},
        BrokenCase{"EmptyFile", "",
                   ":1:1: (root): expected a mapping with version and xids, got nothing"},
        BrokenCase{"NotAMapping", "- 1\n- 2\n",
                   ":1:1: (root): expected a mapping with version and xids, got a sequence"},
        BrokenCase{"SyntaxError",
                   "version: 1\n"
                   "xids:\n"
                   "  - {xid: 13, mnemonic: [unclosed\n",
                   ":4:1: (syntax): invalid YAML: flow sequence without a closing bracket"},
        // Issue #24: no crash, no gigabytes, one document.
        BrokenCase{"AliasLoop", "version: 1\nxids: &x [*x]\n",
                   ":2:11: xids[0]: alias *x refers to the node it is part of (a recursive alias)"},
        BrokenCase{"SecondDocument", std::string(kGoodEntry) + "---\nversion: 1\n",
                   ":8:1: (syntax): a second YAML document: a config file holds exactly one (remove the `---` "
                   "and what follows, or merge it into the first)"}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) { return info.param.name; });

TEST(XidCatalog, MissingFileIsAConfigError) {
  const std::string path = ::testing::TempDir() + "gns_xid_catalog_does_not_exist.yaml";
  try {
    (void)XidCatalog::LoadFile(path);
    FAIL() << "loaded a missing file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":0:0: (file): cannot read config file: No such file or directory");
    EXPECT_EQ(e.key_path(), "(file)");
  }
}

TEST(XidCatalog, OnlyBoundedRegularFilesAreRead) {
  try {
    (void)XidCatalog::LoadFile("/dev/zero");
    FAIL() << "read /dev/zero";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "/dev/zero:0:0: (file): cannot read config file: a character device, not a regular file");
  }
}

TEST(XidCatalog, ConfigErrorCarriesItsParts) {
  try {
    (void)XidCatalog::LoadString("version: 1\nxids:\n  - {xid: 13, mnemonic: A, description: d, "
                                 "fatal: no, action: NONE}\n",
                                 "inline.yaml");
    FAIL() << "accepted 'no' as a boolean";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.file(), "inline.yaml");
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.column(), 51);
    EXPECT_EQ(e.key_path(), "xids[0].fatal");
    EXPECT_EQ(e.message(), "expected true or false, got 'no'");
  }
}

TEST(SiteOverrides, ParsesEveryKey) {
  const SiteOverrides o = LoadSiteOverridesString(
      "ignore: [43, 63]\n"
      "critical:\n"
      "  - 31\n"
      "  - {xid: 94, action: RESTART_BM}\n"
      "thresholds:\n"
      "  - {xid: 13, count: 3, window: 10m}\n"
      "  - {xid: 119, count: 2, window: 1h30m}\n"
      "dedup_window: 90s\n"
      "cross_source_window: 500ms\n",
      "site.yaml");
  EXPECT_EQ(o.ignore, (std::set<uint32_t>{43, 63}));
  ASSERT_EQ(o.critical.size(), 2u);
  EXPECT_FALSE(o.critical.at(31).has_value());
  EXPECT_EQ(o.critical.at(94), RecommendedAction::kRestartBm);
  ASSERT_EQ(o.thresholds.size(), 2u);
  EXPECT_EQ(o.thresholds.at(13).count, 3u);
  EXPECT_EQ(o.thresholds.at(13).window, std::chrono::minutes(10));
  EXPECT_EQ(o.thresholds.at(119).window, std::chrono::minutes(90));
  EXPECT_EQ(o.dedup_window, std::chrono::seconds(90));
  EXPECT_EQ(o.cross_source_window, std::chrono::milliseconds(500));
}

TEST(SiteOverrides, EmptyMeansDefaults) {
  for (const char* text : {"", "~\n", "{}\n"}) {
    const SiteOverrides o = LoadSiteOverridesString(text, "site.yaml");
    EXPECT_TRUE(o.ignore.empty());
    EXPECT_TRUE(o.critical.empty());
    EXPECT_TRUE(o.thresholds.empty());
    EXPECT_EQ(o.dedup_window, kDefaultDedupWindow);
    EXPECT_EQ(o.cross_source_window, kDefaultCrossSourceWindow);
  }
}

TEST(SiteOverrides, ErrorsPointAtTheProblem) {
  EXPECT_EQ(OverridesError("thresholds:\n  - {xid: 13, count: 3, window: 10}\n"),
            "site.yaml:2:33: thresholds[0].window: expected a duration like 30s, 10m, 1h30m or 7d "
            "(more than 0, at most 7 days), got '10'");
  EXPECT_EQ(OverridesError("thresholds:\n  - {xid: 13, count: 3, window: 0s}\n"),
            "site.yaml:2:33: thresholds[0].window: expected a duration like 30s, 10m, 1h30m or 7d "
            "(more than 0, at most 7 days), got '0s'");
  EXPECT_EQ(OverridesError("thresholds:\n  - {xid: 13, count: 0, window: 1m}\n"),
            "site.yaml:2:22: thresholds[0].count: count 0 is out of range (1-100)");
  EXPECT_EQ(OverridesError("thresholds:\n  - {xid: 13, count: 101, window: 1m}\n"),
            "site.yaml:2:22: thresholds[0].count: count 101 is out of range (1-100)");
  EXPECT_EQ(OverridesError("thresholds:\n  - {xid: 13, window: 1m}\n"),
            "site.yaml:2:5: thresholds[0].count: missing required key");
  EXPECT_EQ(OverridesError("ignore: [13]\nthreshold: []\n"),
            "site.yaml:2:1: threshold: unknown key (allowed: ignore, critical, thresholds, "
            "dedup_window, cross_source_window, defaults, xids)");
  EXPECT_EQ(OverridesError("ignore: [13, abc]\n"),
            "site.yaml:1:14: ignore[1]: expected an integer, got 'abc'");
  EXPECT_EQ(OverridesError("ignore: 13\n"), "site.yaml:1:9: ignore: expected a sequence, got '13'");
  EXPECT_EQ(OverridesError("ignore: [13, 13]\n"),
            "site.yaml:1:14: ignore[1]: XID 13 is already listed (line 1); an XID may appear "
            "once, in one of ignore, critical, thresholds and xids");
  EXPECT_EQ(OverridesError("ignore: [13]\ncritical: [31, 13]\n"),
            "site.yaml:2:16: critical[1]: XID 13 is also listed in ignore (line 1); an XID may "
            "appear once, in one of ignore, critical, thresholds and xids");
  EXPECT_EQ(OverridesError("critical: [31]\nthresholds:\n  - {xid: 31, count: 2, window: 1m}\n"),
            "site.yaml:3:11: thresholds[0].xid: XID 31 is also listed in critical (line 1); an "
            "XID may appear once, in one of ignore, critical, thresholds and xids");
  EXPECT_EQ(OverridesError("critical:\n  - {xid: 13, action: NONE}\n"),
            "site.yaml:2:23: critical[0].action: a critical XID needs an action that acts on the "
            "device, not NONE");
  EXPECT_EQ(OverridesError("critical:\n  - {action: RESTART_BM}\n"),
            "site.yaml:2:5: critical[0].xid: missing required key");
  EXPECT_EQ(OverridesError("critical: [2000]\n"),
            "site.yaml:1:12: critical[0]: XID 2000 is out of range (1-1023)");
  EXPECT_EQ(OverridesError("dedup_window: forever\n"),
            "site.yaml:1:15: dedup_window: expected a duration like 30s, 10m, 1h30m or 7d (more than "
            "0, at most 7 days), got 'forever'");
  EXPECT_EQ(OverridesError("- 13\n"), "site.yaml:1:1: (root): expected a mapping, got a sequence");
}

TEST(SiteOverrides, KeyPathsIncludeTheEnclosingDocument) {
  const YAML::Node doc = YAML::Load(
      "modules:\n"
      "  gpu_health:\n"
      "    xid:\n"
      "      ignore: [abc]\n");
  try {
    (void)ParseSiteOverrides(doc["modules"]["gpu_health"]["xid"], "supervisor.yaml",
                             "modules.gpu_health.xid");
    FAIL() << "accepted 'abc' as an XID";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "supervisor.yaml:4:16: modules.gpu_health.xid.ignore[0]: expected an integer, got "
              "'abc'");
  }
}

TEST(ParseDuration, AcceptsGoStyleUnits) {
  using std::chrono::milliseconds;
  EXPECT_EQ(ParseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(ParseDuration("30s"), milliseconds(30000));
  EXPECT_EQ(ParseDuration("10m"), milliseconds(600000));
  EXPECT_EQ(ParseDuration("1h30m"), milliseconds(5400000));
  EXPECT_EQ(ParseDuration("168h"), kMaxWindow);
  EXPECT_EQ(ParseDuration("7d"), kMaxWindow);
  EXPECT_EQ(ParseDuration("1d12h"), milliseconds(36 * 3600 * 1000));
  for (std::string_view bad : {"", "10", "m", "8d", "-5m", "1.5h", "0s", "169h", "1h 30m",
                               "9999999999h", "5M"}) {
    EXPECT_FALSE(ParseDuration(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace gns::gpu_health
