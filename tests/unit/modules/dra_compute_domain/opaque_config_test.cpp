// Opaque config decoding: the happy shapes, and an error for every way an entry can be wrong,
// each naming the JSON path and the reason.
#include "modules/dra_compute_domain/opaque_config.hpp"

#include <gtest/gtest.h>

namespace gns::dra {
namespace {

using nlohmann::json;

json Params(const std::string& kind = "ComputeDomainChannelConfig") {
  return json{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", kind}, {"domainID", "cd-uid-1"},
              {"allocationMode", "Single"}};
}

json ClaimWithConfig(json config_list) {
  return json{{"status", {{"allocation", {{"devices", {{"results", json::array()}, {"config", std::move(config_list)}}}}}}}};
}

json ConfigEntry(json parameters, const std::string& source = "FromClaim", json requests = json::array({"channel"}),
           const std::string& driver = "compute-domain.nvidia.com") {
  return json{{"source", source},
              {"requests", std::move(requests)},
              {"opaque", {{"driver", driver}, {"parameters", std::move(parameters)}}}};
}

TEST(OpaqueConfigTest, DecodesAChannelConfig) {
  const auto decoded = DecodeOpaqueParameters(Params(), "p");
  ASSERT_TRUE(decoded.config) << decoded.error;
  EXPECT_EQ(decoded.config->kind, ConfigKind::kChannel);
  EXPECT_EQ(decoded.config->domain_id, "cd-uid-1");
  EXPECT_EQ(decoded.config->allocation_mode, "Single");
}

TEST(OpaqueConfigTest, AllocationModeMayBeAbsentAndExtraFieldsAreIgnored) {
  json params = Params();
  params.erase("allocationMode");
  params["protocol"] = "v1";  // a newer controller's field must not break prepare
  const auto decoded = DecodeOpaqueParameters(params, "p");
  ASSERT_TRUE(decoded.config) << decoded.error;
  EXPECT_EQ(decoded.config->allocation_mode, "");
}

TEST(OpaqueConfigTest, DecodesADaemonConfig) {
  json params = Params("ComputeDomainDaemonConfig");
  params.erase("allocationMode");
  const auto decoded = DecodeOpaqueParameters(params, "p");
  ASSERT_TRUE(decoded.config) << decoded.error;
  EXPECT_EQ(decoded.config->kind, ConfigKind::kDaemon);
}

struct BadCase {
  const char* name;
  json parameters;
  const char* error;
};

class BadParametersTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadParametersTest, SaysWhatWhereAndWhy) {
  const auto decoded = DecodeOpaqueParameters(GetParam().parameters, "status.allocation.devices.config[0].opaque.parameters");
  EXPECT_FALSE(decoded.config);
  EXPECT_EQ(decoded.error, GetParam().error);
}

json Without(json j, const char* key) {
  j.erase(key);
  return j;
}
json With(json j, const char* key, json value) {
  j[key] = std::move(value);
  return j;
}

#define P "status.allocation.devices.config[0].opaque.parameters"
INSTANTIATE_TEST_SUITE_P(
    Variants, BadParametersTest,
    ::testing::Values(
        BadCase{"NotAnObject", json("x"), P ": expected an object, got string"},
        BadCase{"NoApiVersion", Without(Params(), "apiVersion"), P ".apiVersion: missing"},
        BadCase{"WrongApiVersion", With(Params(), "apiVersion", "resource.nvidia.com/v1alpha1"),
                P ".apiVersion: \"resource.nvidia.com/v1alpha1\" is not supported (expected \"resource.nvidia.com/v1beta1\")"},
        BadCase{"ApiVersionNotAString", With(Params(), "apiVersion", 1), P ".apiVersion: expected a string, got number"},
        BadCase{"NoKind", Without(Params(), "kind"), P ".kind: missing"},
        BadCase{"UnknownKind", With(Params(), "kind", "GpuConfig"),
                P ".kind: unknown kind \"GpuConfig\" (expected \"ComputeDomainChannelConfig\" or \"ComputeDomainDaemonConfig\")"},
        BadCase{"NoDomainId", Without(Params(), "domainID"), P ".domainID: missing"},
        BadCase{"EmptyDomainId", With(Params(), "domainID", ""), P ".domainID: empty (it must be the ComputeDomain's UID)"},
        BadCase{"DomainIdNotAString", With(Params(), "domainID", json::object()), P ".domainID: expected a string, got object"},
        BadCase{"AllocationModeNotAString", With(Params(), "allocationMode", true),
                P ".allocationMode: expected a string, got boolean"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });
#undef P

TEST(OpaqueConfigTest, CollectsOurEntriesClassFirstAndSkipsOtherDrivers) {
  json class_params = Params();
  class_params["domainID"] = "from-class";
  const json claim = ClaimWithConfig(json::array({
      ConfigEntry(Params(), "FromClaim"),
      ConfigEntry(json{{"anything", 1}}, "FromClaim", json::array(), "gpu.nvidia.com"),
      ConfigEntry(class_params, "FromClass", json::array()),
      json{{"source", "FromClaim"}},  // no opaque member: not ours
  }));
  const auto configs = DecodeClaimConfigs(claim);
  ASSERT_TRUE(configs.ok) << configs.error;
  ASSERT_EQ(configs.configs.size(), 2u);
  EXPECT_EQ(configs.configs[0].domain_id, "from-class");
  EXPECT_EQ(configs.configs[0].where, "status.allocation.devices.config[2]");
  EXPECT_EQ(configs.configs[1].domain_id, "cd-uid-1");
  // The claim's own config overrides the class's for the request it names.
  EXPECT_EQ(ConfigForRequest(configs.configs, "channel")->domain_id, "cd-uid-1");
  EXPECT_EQ(ConfigForRequest(configs.configs, "other")->domain_id, "from-class");
  // A firstAvailable pick "channel/sub" is configured through its main request.
  EXPECT_EQ(ConfigForRequest(configs.configs, "channel/sub")->domain_id, "cd-uid-1");
}

TEST(OpaqueConfigTest, NoConfigListIsEmptyNotAnError) {
  EXPECT_TRUE(DecodeClaimConfigs(json::object()).ok);
  EXPECT_TRUE(DecodeClaimConfigs(json{{"status", {{"allocation", {{"devices", json::object()}}}}}}).configs.empty());
  EXPECT_EQ(ConfigForRequest({}, "channel"), nullptr);
}

TEST(OpaqueConfigTest, BadEntriesNameTheirIndex) {
  auto error_of = [](json list) { return DecodeClaimConfigs(ClaimWithConfig(std::move(list))).error; };
  EXPECT_EQ(error_of(json("x")), "status.allocation.devices.config: expected an array, got string");
  EXPECT_EQ(error_of(json::array({ConfigEntry(Params()), 5})), "status.allocation.devices.config[1]: expected an object, got number");
  EXPECT_EQ(error_of(json::array({json{{"opaque", "x"}}})), "status.allocation.devices.config[0].opaque: expected an object, got string");
  EXPECT_EQ(error_of(json::array({json{{"opaque", {{"driver", "compute-domain.nvidia.com"}}}}})),
            "status.allocation.devices.config[0].opaque.parameters: missing");
  EXPECT_EQ(error_of(json::array({ConfigEntry(Params(), "FromClaim", json("channel"))})),
            "status.allocation.devices.config[0].requests: expected an array, got string");
  EXPECT_EQ(error_of(json::array({ConfigEntry(Params(), "FromClaim", json::array({1}))})),
            "status.allocation.devices.config[0].requests[]: expected strings");
  EXPECT_EQ(error_of(json::array({ConfigEntry(Without(Params(), "kind"))})),
            "status.allocation.devices.config[0].opaque.parameters.kind: missing");
}

}  // namespace
}  // namespace gns::dra
