// The host services' judge: what systemd says of nvidia-persistenced / nvidia-fabricmanager →
// the node's finding (holds, clear, or not judged).
#include "modules/gpu_health/host_services.hpp"

#include <gtest/gtest.h>

namespace gns::gpu_health {
namespace {

imex_health::UnitState Unit(std::string active, std::string sub, std::string file_state = "enabled") {
  imex_health::UnitState unit;
  unit.bus_connected = true;
  unit.systemd_present = true;
  unit.known = true;
  unit.load_state = "loaded";
  unit.active_state = std::move(active);
  unit.sub_state = std::move(sub);
  unit.unit_file_state = std::move(file_state);
  return unit;
}

HostService FabricManager() {
  HostServicesSettings settings;
  settings.persistenced = false;
  const auto services = HostServices(settings);
  EXPECT_EQ(services.size(), 1u);
  return services.at(0);
}

TEST(HostServicesTest, TheSettingsChooseTheUnits) {
  HostServicesSettings settings;
  auto both = HostServices(settings);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].check, "PersistencedNotRunning");
  EXPECT_EQ(both[0].unit, "nvidia-persistenced.service");
  EXPECT_EQ(both[0].severity, Severity::kWarning);
  EXPECT_EQ(both[1].check, "FabricManagerNotRunning");
  EXPECT_EQ(both[1].unit, "nvidia-fabricmanager.service");
  EXPECT_EQ(both[1].severity, Severity::kNonFatal);
  EXPECT_EQ(both[1].action, RecommendedAction::kRestartBm);
  settings.fabric_manager = false;
  settings.persistenced_unit = "persistenced-site.service";
  auto one = HostServices(settings);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].unit, "persistenced-site.service");
}

TEST(HostServicesTest, AFailedEnabledUnitHoldsWithWhatSystemdSaid) {
  auto unit = Unit("failed", "failed");
  unit.result = "exit-code";
  unit.exec_main_code = 1;
  unit.exec_main_status = 3;
  unit.n_restarts = 2;
  const auto finding = JudgeHostService(FabricManager(), unit);
  ASSERT_TRUE(finding.has_value());
  ASSERT_TRUE(finding->holds.has_value());
  EXPECT_EQ(finding->check, "FabricManagerNotRunning");
  EXPECT_EQ(finding->holds->component, Component::kHost);
  EXPECT_EQ(finding->holds->severity, Severity::kNonFatal);
  const std::string& message = finding->holds->message;
  EXPECT_NE(message.find("nvidia-fabricmanager.service is failed"), std::string::npos) << message;
  EXPECT_NE(message.find("result exit-code"), std::string::npos) << message;
  EXPECT_NE(message.find("exit status 3"), std::string::npos) << message;
  EXPECT_NE(message.find("2 automatic restart(s)"), std::string::npos) << message;
}

TEST(HostServicesTest, StoppedOrRestartingInALoopHolds) {
  for (const auto& unit : {Unit("inactive", "dead"), Unit("activating", "auto-restart"), Unit("failed", "failed", "static")}) {
    const auto finding = JudgeHostService(FabricManager(), unit);
    ASSERT_TRUE(finding.has_value()) << unit.active_state << "/" << unit.sub_state;
    EXPECT_TRUE(finding->holds.has_value()) << unit.active_state << "/" << unit.sub_state;
  }
}

TEST(HostServicesTest, ARunningUnitIsJudgedClear) {
  for (const auto& unit : {Unit("active", "running"), Unit("reloading", "reload")}) {
    const auto finding = JudgeHostService(FabricManager(), unit);
    ASSERT_TRUE(finding.has_value());
    EXPECT_FALSE(finding->holds.has_value());
  }
}

TEST(HostServicesTest, AUnitThisNodeDoesNotRunIsJudgedClear) {
  auto missing = Unit("inactive", "dead", "");
  missing.load_state = "not-found";
  auto masked = Unit("inactive", "dead", "masked");
  masked.load_state = "masked";
  const auto disabled = Unit("inactive", "dead", "disabled");
  for (const auto& unit : {missing, masked, disabled}) {
    const auto finding = JudgeHostService(FabricManager(), unit);
    ASSERT_TRUE(finding.has_value()) << unit.load_state << "/" << unit.unit_file_state;
    EXPECT_FALSE(finding->holds.has_value()) << unit.load_state << "/" << unit.unit_file_state;
  }
}

TEST(HostServicesTest, UnknownOrInTransitionIsNotJudged) {
  imex_health::UnitState unknown;
  unknown.error = "connecting to the system bus: No such file or directory";
  EXPECT_FALSE(JudgeHostService(FabricManager(), unknown).has_value());
  EXPECT_FALSE(JudgeHostService(FabricManager(), Unit("activating", "start")).has_value());
  EXPECT_FALSE(JudgeHostService(FabricManager(), Unit("deactivating", "stop-sigterm")).has_value());
}

}  // namespace
}  // namespace gns::gpu_health
