// A GpuConfig's time-slice interval on the GPU (time_slices.hpp): what the prepared claims ask,
// the book on disk, and the commands that bring the GPUs there.
#include "modules/dra_gpu/time_slices.hpp"

#include "modules/dra_gpu/messages.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace gns::dra_gpu {
namespace {

using nlohmann::json;
const std::string kGpu0 = "GPU-00000000-0000-4000-8000-000000000000";
const std::string kGpu1 = "GPU-11111111-1111-4111-8111-111111111111";

// A prepared record with `sharing` on the whole GPU `uuid` (minor `minor`), or on a MIG device of it.
dra::PreparedClaim Record(const std::string& uid, const std::string& uuid, uint32_t minor, json sharing,
                          bool mig = false) {
  dra::PreparedClaim entry;
  entry.uid = uid;
  gpu_inventory::MigDeviceInfo info;
  info.gi_profile_id = 19;
  info.placement_start = 0;
  info.placement_size = 1;
  json gpu{{"device", mig ? MigDeviceName(minor, info) : GpuDeviceName(minor)}, {"request", "gpu"}, {"uuid", uuid},
           {"minor", minor}};
  if (mig) gpu["mig"] = {{"uuid", "MIG-" + uid}, {"gpuInstance", 9}, {"computeInstance", 0}};
  entry.driver_data["gpus"] = json::array({gpu});
  if (!sharing.is_null()) entry.driver_data["sharing"] = std::move(sharing);
  return entry;
}

TEST(TimeSlicesTest, IntervalsAreUpstreamsNumbers) {
  EXPECT_EQ(TimeSliceValue(""), 0);
  EXPECT_EQ(TimeSliceValue("Default"), 0);
  EXPECT_EQ(TimeSliceValue("Short"), 1);
  EXPECT_EQ(TimeSliceValue("Medium"), 2);
  EXPECT_EQ(TimeSliceValue("Long"), 3);
  EXPECT_EQ(TimeSliceValue("long"), -1);
}

TEST(TimeSlicesTest, OnlyTimeSlicingClaimsOnWholeGpusAtANonDefaultIntervalAskForOne) {
  dra::Checkpoint state;
  state.claims["a"] = Record("a", kGpu0, 0, {{"strategy", "TimeSlicing"}, {"interval", "Long"}});
  state.claims["b"] = Record("b", kGpu1, 1, {{"strategy", "TimeSlicing"}, {"interval", "Default"}});
  state.claims["c"] = Record("c", kGpu1, 1, {{"strategy", "MPS"}, {"interval", "Short"}});
  state.claims["d"] = Record("d", kGpu1, 1, json());
  state.claims["e"] = Record("e", kGpu1, 1, {{"strategy", "TimeSlicing"}, {"interval", "Short"}}, /*mig=*/true);
  EXPECT_EQ(WantedTimeSlices(state), (TimeSlices{{kGpu0, 3}}));

  // A planned claim adds what its record would.
  TimeSlices wanted;
  GpuClaimPlan plan;
  plan.gpus.push_back(ClaimGpu{"gpu", "gpu-1", kGpu1, 1});
  plan.sharing.strategy = "TimeSlicing";
  plan.sharing.interval = "Medium";
  AddWantedTimeSlices(wanted, plan);
  EXPECT_EQ(wanted, (TimeSlices{{kGpu1, 2}}));
  plan.sharing.interval = "Default";
  TimeSlices none;
  AddWantedTimeSlices(none, plan);
  EXPECT_TRUE(none.empty());
}

TEST(TimeSlicesTest, StepsSetWhatIsWantedAgainUntilSeenAndPutTheRestBack) {
  // Nothing booked: the wanted GPU is set.
  EXPECT_EQ(TimeSliceSteps({}, {}, {{kGpu0, 3}}), (std::vector<TimeSliceStep>{{kGpu0, 3}}));
  // Booked but not seen to succeed by this process (a restart, a failure): set again.
  EXPECT_EQ(TimeSliceSteps({{kGpu0, 3}}, {}, {{kGpu0, 3}}), (std::vector<TimeSliceStep>{{kGpu0, 3}}));
  // Booked and confirmed: nothing to do.
  EXPECT_TRUE(TimeSliceSteps({{kGpu0, 3}}, {kGpu0}, {{kGpu0, 3}}).empty());
  // Another interval wanted: set it.
  EXPECT_EQ(TimeSliceSteps({{kGpu0, 3}}, {kGpu0}, {{kGpu0, 1}}), (std::vector<TimeSliceStep>{{kGpu0, 1}}));
  // Booked and no longer wanted: back to Default; in UUID order with the rest.
  EXPECT_EQ(TimeSliceSteps({{kGpu1, 2}}, {kGpu1}, {{kGpu0, 3}}),
            (std::vector<TimeSliceStep>{{kGpu0, 3}, {kGpu1, 0}}));
  EXPECT_TRUE(TimeSliceSteps({}, {}, {}).empty());
}

TEST(TimeSlicesTest, TheBookRoundTripsAndADamagedOneIsMovedAsideWithAWarning) {
  const TimeSlices book{{kGpu0, 3}, {kGpu1, 1}};
  const auto parsed = ParseTimeSliceBook(TimeSliceBookText(book));
  EXPECT_EQ(parsed.error, "");
  EXPECT_EQ(parsed.book, book);
  EXPECT_NE(ParseTimeSliceBook("{").error.find("not JSON"), std::string::npos);
  EXPECT_NE(ParseTimeSliceBook(R"({"version":2,"gpus":{}})").error.find("not a version 1 book"), std::string::npos);
  const auto bad = ParseTimeSliceBook(R"({"version":1,"gpus":{"GPU-x":7}})");
  EXPECT_EQ(bad.error, "gpus.GPU-x: expected a time-slice 0-3");
  EXPECT_TRUE(bad.book.empty());

  test::TempDir dir;
  const std::string path = (std::filesystem::path(dir.Path()) / "time-slices.json").string();
  auto missing = LoadTimeSliceBook(path, 1700000000);
  EXPECT_TRUE(missing.book.empty());
  EXPECT_EQ(missing.warning, "");
  std::ofstream(path) << TimeSliceBookText(book);
  EXPECT_EQ(LoadTimeSliceBook(path, 1700000000).book, book);
  std::ofstream(path) << "garbage";
  const auto damaged = LoadTimeSliceBook(path, 1700000000);
  EXPECT_TRUE(damaged.book.empty());
  EXPECT_NE(damaged.warning.find("not JSON"), std::string::npos) << damaged.warning;
  EXPECT_NE(damaged.warning.find("moved to " + path + ".corrupt-1700000000"), std::string::npos) << damaged.warning;
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(path + ".corrupt-1700000000"));
}

}  // namespace
}  // namespace gns::dra_gpu
