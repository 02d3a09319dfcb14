// A GPUReset's spec.selector: only a selector that names GPUs, or says all: true, selects any;
// every malformed one is an invalid request whose message names the field (issue #24, item 1).
#include "modules/gpu_reset/reset_request.hpp"

#include <gtest/gtest.h>

namespace gns::gpu_reset {
namespace {

using nlohmann::json;

constexpr const char* kUuid = "GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10";

GpuSelection Parse(const char* spec_text) { return ParseGpuSelector(json::parse(spec_text)); }

TEST(GpuResetSelector, NamedGpusAreSelected) {
  auto s = Parse(R"({"nodeName":"n1","selector":{"uuids":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"]}})");
  EXPECT_EQ(s.error, "");
  EXPECT_FALSE(s.all);
  EXPECT_EQ(s.uuids, std::vector<std::string>{kUuid});
  s = Parse(R"({"nodeName":"n1","selector":{"pciBusIDs":["0000:3b:00.0"],"all":false}})");
  EXPECT_EQ(s.error, "");
  EXPECT_EQ(s.pci_bus_ids, std::vector<std::string>{"0000:3b:00.0"});
  s = Parse(R"({"selector":{"uuids":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"],"pciBusIDs":["0000:3b:00.0"]}})");
  EXPECT_EQ(s.error, "");
  EXPECT_EQ(s.uuids.size() + s.pci_bus_ids.size(), 2u);
}

TEST(GpuResetSelector, EveryGpuOnlyWhenAskedForExplicitly) {
  const auto s = Parse(R"({"nodeName":"n1","selector":{"all":true}})");
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(s.all);
  EXPECT_TRUE(s.uuids.empty() && s.pci_bus_ids.empty());
}

TEST(GpuResetSelector, EveryMalformedSelectorIsRefusedNamingTheField) {
  struct Case {
    const char* spec;
    const char* message;  // the start of the error
  };
  const Case cases[] = {
      // No selector, or one that names nothing: upstream's "every GPU", refused here.
      {R"({"nodeName":"n1"})", "spec.selector: missing; name the GPUs in uuids or pciBusIDs, or ask for every GPU"},
      {R"({"nodeName":"n1","selector":{}})", "spec.selector: is empty (a misspelt key such as uuid: arrives so"},
      {R"({"nodeName":"n1","selector":null})", "spec.selector: expected an object (uuids, pciBusIDs or all), got null"},
      {R"({"nodeName":"n1","selector":{"all":false}})", "spec.selector: names no GPU (all: false, no uuids, no pciBusIDs)"},
      // The selector of the wrong type.
      {R"({"nodeName":"n1","selector":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"]})",
       "spec.selector: expected an object (uuids, pciBusIDs or all), got a list"},
      {R"({"nodeName":"n1","selector":"GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"})",
       "spec.selector: expected an object (uuids, pciBusIDs or all), got a string"},
      // A misspelt key that no schema pruned.
      {R"({"nodeName":"n1","selector":{"uuid":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"]}})",
       "spec.selector.uuid: unknown field (expected uuids, pciBusIDs or all)"},
      // uuids of the wrong type, empty, or holding something else.
      {R"({"nodeName":"n1","selector":{"uuids":"GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"}})",
       "spec.selector.uuids: expected a non-empty list of GPU UUIDs, got a string"},
      {R"({"nodeName":"n1","selector":{"uuids":7}})", "spec.selector.uuids: expected a non-empty list of GPU UUIDs, got a number"},
      {R"({"nodeName":"n1","selector":{"uuids":null}})", "spec.selector.uuids: expected a non-empty list of GPU UUIDs, got null"},
      {R"({"nodeName":"n1","selector":{"uuids":[]}})",
       "spec.selector.uuids: expected a non-empty list of GPU UUIDs, got an empty list"},
      {R"({"nodeName":"n1","selector":{"uuids":{}}})",
       "spec.selector.uuids: expected a non-empty list of GPU UUIDs, got an empty object"},
      {R"({"nodeName":"n1","selector":{"uuids":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10", 3]}})",
       "spec.selector.uuids[1]: expected a GPU UUID (GPU-…), got a number"},
      {R"({"nodeName":"n1","selector":{"uuids":["gpu0"]}})", "spec.selector.uuids[0]: expected a GPU UUID (GPU-…), got \"gpu0\""},
      {R"({"nodeName":"n1","selector":{"uuids":[null]}})", "spec.selector.uuids[0]: expected a GPU UUID (GPU-…), got null"},
      // pciBusIDs likewise.
      {R"({"nodeName":"n1","selector":{"pciBusIDs":"0000:3b:00.0"}})",
       "spec.selector.pciBusIDs: expected a non-empty list of PCI bus IDs, got a string"},
      {R"({"nodeName":"n1","selector":{"pciBusIDs":[]}})",
       "spec.selector.pciBusIDs: expected a non-empty list of PCI bus IDs, got an empty list"},
      {R"({"nodeName":"n1","selector":{"pciBusIDs":["slot 3"]}})",
       "spec.selector.pciBusIDs[0]: expected a PCI bus ID (0000:3b:00.0), got \"slot 3\""},
      // all: only a boolean, and never beside named GPUs.
      {R"({"nodeName":"n1","selector":{"all":"true"}})", "spec.selector.all: expected true or false, got a string"},
      {R"({"nodeName":"n1","selector":{"all":1}})", "spec.selector.all: expected true or false, got a number"},
      {R"({"nodeName":"n1","selector":{"all":true,"uuids":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"]}})",
       "spec.selector: all: true cannot be combined with uuids or pciBusIDs"},
      // A wrong type beside a good list still refuses the whole request.
      {R"({"nodeName":"n1","selector":{"uuids":["GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"],"pciBusIDs":"x"}})",
       "spec.selector.pciBusIDs: expected a non-empty list of PCI bus IDs, got a string"},
  };
  for (const auto& c : cases) {
    const auto s = Parse(c.spec);
    EXPECT_EQ(s.error.rfind(c.message, 0), 0u) << c.spec << "\n  got: " << s.error;
    EXPECT_FALSE(s.all) << c.spec;
  }
}

TEST(GpuResetSelector, ASpecThatIsNoObjectSelectsNothing) {
  for (const char* spec : {"null", "[]", "\"n1\"", "3"}) {
    const auto s = Parse(spec);
    EXPECT_FALSE(s.error.empty()) << spec;
    EXPECT_FALSE(s.all) << spec;
    EXPECT_TRUE(s.uuids.empty() && s.pci_bus_ids.empty()) << spec;
  }
}

TEST(GpuResetSelector, GpuUuidShape) {
  EXPECT_TRUE(LooksLikeGpuUuid(kUuid));
  EXPECT_FALSE(LooksLikeGpuUuid("GPU-"));
  EXPECT_FALSE(LooksLikeGpuUuid("MIG-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"));
  EXPECT_FALSE(LooksLikeGpuUuid("GPU-3f8a1c52 7e00"));
}

}  // namespace
}  // namespace gns::gpu_reset
