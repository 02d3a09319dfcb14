// gpu-health's verdicts as the gpu.nvidia.com driver shows them: the taint each verdict makes
// (key per cause, value in label syntax, effect, time the verdict turned), Healthy again with
// none, Unknown while no judge runs, a GPU instance's verdict on its MIG device only.
#include "modules/dra_gpu/gpu_health_view.hpp"

#include <gtest/gtest.h>

namespace gns::dra_gpu {
namespace {

using nlohmann::json;

const std::string kGpu = "GPU-11111110-2222-3333-4444-555555555555";
constexpr int64_t kTurned = 1795858800000;  // 2026-11-28T09:40:00Z

gpu_health::DeviceHealth Verdict(bool healthy, uint64_t xid, std::string reason, int64_t since = kTurned) {
  gpu_health::DeviceHealth v;
  v.uuid = kGpu;
  v.healthy = healthy;
  v.xid = xid;
  v.reason = std::move(reason);
  v.since_unix_ms = since;
  return v;
}

TEST(GpuHealthViewTest, WithoutAJudgeEveryGpuIsUnknownAndUntainted) {
  GpuHealthView view;
  EXPECT_EQ(view.Of(kGpu).status, HealthStatus::kUnknown);
  EXPECT_TRUE(TaintsFor(view.Of(kGpu), TaintEffect::kNoSchedule).empty());
  EXPECT_TRUE(view.JudgeSeen(kTurned - 5000));
  EXPECT_FALSE(view.JudgeSeen(kTurned)) << "only the first sighting counts";
  EXPECT_EQ(view.Of(kGpu).status, HealthStatus::kHealthy);
  EXPECT_EQ(view.Of(kGpu).since_unix_ms, kTurned - 5000);
}

TEST(GpuHealthViewTest, AFatalXidTaintsUnderTheXidKeyUntilTheVerdictTurnsHealthy) {
  GpuHealthView view;
  view.JudgeSeen(kTurned - 5000);
  ASSERT_TRUE(view.OnVerdict(Verdict(false, 79, "XID 79 (GPU has fallen off the bus)")));
  const GpuHealth sick = view.Of(kGpu);
  EXPECT_EQ(sick.status, HealthStatus::kUnhealthy);
  EXPECT_EQ(TaintsFor(sick, TaintEffect::kNoSchedule),
            json::array({{{"key", "gpu.nvidia.com/xid"},
                          {"value", "79"},
                          {"effect", "NoSchedule"},
                          {"timeAdded", "2026-11-28T09:40:00Z"}}}));
  EXPECT_EQ(TaintsFor(sick, TaintEffect::kNoExecute)[0]["effect"], "NoExecute");
  EXPECT_FALSE(view.OnVerdict(Verdict(false, 79, "XID 79 (GPU has fallen off the bus)"))) << "the same verdict again";

  ASSERT_TRUE(view.OnVerdict(Verdict(true, 0, "GPU reset acknowledged", kTurned + 60000)));
  EXPECT_EQ(view.Of(kGpu).status, HealthStatus::kHealthy);
  EXPECT_EQ(view.Of(kGpu).since_unix_ms, kTurned + 60000);
  EXPECT_TRUE(TaintsFor(view.Of(kGpu), TaintEffect::kNoSchedule).empty());
}

TEST(GpuHealthViewTest, ACheckVerdictNamesItsCheckAndALostGpuHasUpstreamsKey) {
  GpuHealthView view;
  view.JudgeSeen(kTurned);
  auto lost = Verdict(false, 0, "GpuLost: NVML cannot reach the GPU");
  lost.check = "GpuLost";
  view.OnVerdict(lost);
  EXPECT_EQ(view.Of(kGpu).taint_key, "gpu.nvidia.com/gpu-lost");
  EXPECT_EQ(view.Of(kGpu).taint_value, "GpuLost");
  auto remap = Verdict(false, 0, "RowRemapFailure: 2 rows failed to remap");
  remap.check = "RowRemapFailure";
  view.OnVerdict(remap);
  EXPECT_EQ(view.Of(kGpu).taint_key, "gpu.nvidia.com/unhealthy");
  EXPECT_EQ(view.Of(kGpu).taint_value, "RowRemapFailure");
  // The cause is the verdict's field, not the prose: a reason that starts like a check names none.
  view.OnVerdict(Verdict(false, 0, "GpuLost: said by a reason, not by a check"));
  EXPECT_EQ(view.Of(kGpu).taint_key, "gpu.nvidia.com/unhealthy");
  auto sxid = Verdict(false, 0, "SXid 20034 (LTSSM_FAULT_UP) on NVSwitch 0 at 0000:c3:00.0 port 21, wired to GPU 5 link 3");
  sxid.sxid = 20034;
  view.OnVerdict(sxid);
  EXPECT_EQ(view.Of(kGpu).taint_key, "gpu.nvidia.com/sxid");
  EXPECT_EQ(view.Of(kGpu).taint_value, "20034");
  view.OnVerdict(Verdict(false, 0, std::string(gpu_health::kResetInProgress)));
  EXPECT_EQ(view.Of(kGpu).taint_value, "GPU-reset-in-progress");
}

TEST(GpuHealthViewTest, AGpuInstanceVerdictTaintsThatMigDeviceOnlyAndAWholeGpuVerdictAllOfThem) {
  GpuHealthView view;
  view.JudgeSeen(kTurned);
  auto verdict = Verdict(false, 94, "XID 94 (contained ECC error)");
  verdict.gpu_instance = 3;
  EXPECT_TRUE(view.OnVerdict(verdict));
  EXPECT_EQ(view.Of(kGpu).status, HealthStatus::kHealthy) << "the whole GPU is not judged by one instance";
  EXPECT_EQ(view.OfMig(kGpu, 3).status, HealthStatus::kUnhealthy);
  EXPECT_EQ(view.OfMig(kGpu, 3).taint_key, "gpu.nvidia.com/xid");
  EXPECT_EQ(view.OfMig(kGpu, 3).taint_value, "94");
  EXPECT_EQ(view.OfMig(kGpu, 5).status, HealthStatus::kHealthy) << "another GPU instance of the GPU";
  // The whole GPU's verdict covers every GPU instance, and wins over an instance's own.
  EXPECT_TRUE(view.OnVerdict(Verdict(false, 79, "XID 79 (fallen off the bus)")));
  EXPECT_EQ(view.OfMig(kGpu, 5).taint_value, "79");
  EXPECT_EQ(view.OfMig(kGpu, 3).taint_value, "79");
  // Whole GPU healthy again: the instance's own verdict is what is left.
  EXPECT_TRUE(view.OnVerdict(Verdict(true, 0, "validated reset")));
  EXPECT_EQ(view.OfMig(kGpu, 5).status, HealthStatus::kHealthy);
  EXPECT_EQ(view.OfMig(kGpu, 3).taint_value, "94");
  verdict.healthy = true;
  verdict.xid = 0;
  EXPECT_TRUE(view.OnVerdict(verdict));
  EXPECT_TRUE(TaintsFor(view.OfMig(kGpu, 3), TaintEffect::kNoSchedule).empty());
}

TEST(GpuHealthViewTest, TaintValuesKeepTheLabelValueSyntax) {
  EXPECT_EQ(LabelValue("XID 79 (fallen off the bus)"), "XID-79-fallen-off-the-bus");
  EXPECT_EQ(LabelValue("  --weird__name..  "), "weird__name");
  EXPECT_EQ(LabelValue("()"), "");
  const std::string value = LabelValue(std::string(40, 'a') + "-" + std::string(40, 'b'));
  EXPECT_EQ(value.size(), 63u);
  EXPECT_EQ(LabelValue(std::string(62, 'a') + "-b"), std::string(62, 'a')) << "no trailing '-' after the cut";
  EXPECT_EQ(Rfc3339(0), "1970-01-01T00:00:00Z");
}

}  // namespace
}  // namespace gns::dra_gpu
