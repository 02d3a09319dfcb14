// The SXid catalog (config/sxid-catalog.yaml and a site file laid over it): the built-in file
// loads, the line's severity decides unless an entry says otherwise, a site entry replaces the
// built-in one, and every bad entry stops the start with file:line:column: key path: what.
#include "modules/gpu_health/sxid_catalog.hpp"

#include <gtest/gtest.h>

#include <string>

namespace gns::gpu_health {
namespace {

std::string ErrorOf(const std::string& yaml) {
  try {
    (void)SxidCatalog::LoadString(yaml, "site-sxid.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(SxidCatalog, TheBuiltInCatalogLoadsWithItsDefaults) {
  const SxidCatalog& c = SxidCatalog::Builtin();
  EXPECT_GE(c.size(), 5u);
  EXPECT_EQ(c.defaults().action, RecommendedAction::kComponentReset);
  EXPECT_EQ(c.defaults().node_action, RecommendedAction::kContactSupport);
  for (const uint32_t sxid : {11004u, 12028u, 19084u, 20034u, 22013u, 24007u}) {
    ASSERT_NE(c.Find(sxid), nullptr) << sxid;
    EXPECT_FALSE(c.Find(sxid)->description.empty()) << sxid;
  }
}

TEST(SxidCatalog, TheLineDecidesUnlessTheEntrySaysOtherwise) {
  const SxidCatalog& c = SxidCatalog::Builtin();
  // 20034 has no `fatal`: the line's word decides; the default action applies.
  SxidJudgement j = c.Judge(20034, true);
  EXPECT_TRUE(j.fatal);
  EXPECT_FALSE(j.overridden);
  EXPECT_EQ(j.action, RecommendedAction::kComponentReset);
  EXPECT_EQ(j.node_action, RecommendedAction::kContactSupport);
  EXPECT_EQ(j.mnemonic, "LTSSM_FAULT_UP");
  EXPECT_FALSE(c.Judge(20034, false).fatal);
  // 11004 is printed Non-fatal, but stalls the port's traffic: fatal, a reboot, wherever it lands.
  j = c.Judge(11004, false);
  EXPECT_TRUE(j.fatal);
  EXPECT_TRUE(j.overridden);
  EXPECT_EQ(j.action, RecommendedAction::kRestartBm);
  EXPECT_EQ(j.node_action, RecommendedAction::kRestartBm);
  // 22013 (link training at boot) stays counted even if a driver printed it Fatal.
  EXPECT_FALSE(c.Judge(22013, true).fatal);
  // Not in the catalog: the line, with the defaults.
  j = c.Judge(31337, true);
  EXPECT_TRUE(j.fatal);
  EXPECT_TRUE(j.description.empty());
  EXPECT_EQ(j.action, RecommendedAction::kComponentReset);
  j = c.Judge(31337, false);
  EXPECT_FALSE(j.fatal);
  EXPECT_EQ(j.action, RecommendedAction::kNone);
}

TEST(SxidCatalog, ASiteFileIsLaidOverTheBuiltInOne) {
  const SxidCatalog site = SxidCatalog::LoadString(R"(
version: 1
defaults: {node_action: RESTART_BM}
sxids:
  - {sxid: 20034, description: "flapping cables here", fatal: false}
  - {sxid: 40000, description: "a new driver's SXid", fatal: true, action: RESTART_VM}
)", "site-sxid.yaml");
  const SxidCatalog c = SxidCatalog::Builtin().LaidOver(site);
  EXPECT_FALSE(c.Judge(20034, true).fatal);
  EXPECT_TRUE(c.Judge(20034, true).overridden);
  EXPECT_EQ(c.Judge(40000, false).action, RecommendedAction::kRestartVm);
  EXPECT_EQ(c.Judge(24007, true).node_action, RecommendedAction::kRestartBm) << "the site's default";
  EXPECT_EQ(c.Judge(24007, true).action, RecommendedAction::kComponentReset) << "the built-in default stays";
  EXPECT_NE(c.Find(11004), nullptr) << "built-in entries the site does not name stay";
  // An empty site list is allowed.
  EXPECT_EQ(SxidCatalog::LoadString("version: 1\nsxids: []\n", "s").size(), 0u);
}

TEST(SxidCatalog, EveryBadEntryNamesFileLineColumnAndKey) {
  EXPECT_EQ(ErrorOf("version: 1\nsxids:\n  - {sxid: 20034, description: x, fatal: maybe}\n"),
            "site-sxid.yaml:3:42: sxids[0].fatal: expected true or false, got 'maybe'");
  EXPECT_EQ(ErrorOf("version: 1\nsxids:\n  - {sxid: 20034, description: x, fatal: true, action: NONE}\n"),
            "site-sxid.yaml:3:56: sxids[0].action: a fatal SXid needs an action that acts on the device, not NONE");
  EXPECT_EQ(ErrorOf("version: 1\nsxids:\n  - {sxid: 20034, description: x}\n  - {sxid: 20034, description: y}\n"),
            "site-sxid.yaml:4:12: sxids[1].sxid: duplicate SXid 20034 (first defined at line 3)");
  EXPECT_EQ(ErrorOf("version: 1\nsxids:\n  - {sxid: 200340, description: x}\n"),
            "site-sxid.yaml:3:12: sxids[0].sxid: SXid 200340 is out of range (1-99999)");
  EXPECT_EQ(ErrorOf("version: 1\nsxids:\n  - {sxid: 20034}\n"),
            "site-sxid.yaml:3:5: sxids[0].description: missing required key");
  EXPECT_EQ(ErrorOf("version: 1\nsxids:\n  - {sxid: 20034, description: x, severity: fatal}\n"),
            "site-sxid.yaml:3:35: sxids[0].severity: unknown key (allowed: sxid, mnemonic, description, fatal, action)");
  EXPECT_EQ(ErrorOf("version: 1\ndefaults: {action: RESTART_APP}\nsxids: []\n"),
            "site-sxid.yaml:2:20: defaults.action: a fatal SXid needs an action that acts on the device, not "
            "RESTART_APP");
  EXPECT_EQ(ErrorOf("version: 2\nsxids: []\n"), "site-sxid.yaml:1:10: version: unsupported version (expected 1)");
}

TEST(SxidCatalog, AMissingFileIsAConfigError) {
  EXPECT_THROW((void)SxidCatalog::LoadFile("/nonexistent/sxid-catalog.yaml"), ConfigError);
}

}  // namespace
}  // namespace gns::gpu_health
