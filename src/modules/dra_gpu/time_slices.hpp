#pragma once
// A GpuConfig's time-slice interval on the GPU itself (issue #28). A TimeSlicing claim whose
// `timeSlicingConfig.interval` is Short, Medium or Long sets its GPUs' scheduler time-slice, as
// upstream's driver does, with `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>` (0
// Default, 1 Short, 2 Medium, 3 Long; NVML has no public call for it).
//
// The setting outlives the claim, so this driver also puts a GPU back to Default once no
// prepared claim on it asks for another interval, which upstream does not. For that it keeps a
// book of the GPUs it set (`time-slices.json` in its state folder), written before the command
// runs and cleared after the GPU is back at Default: a crash at any point leaves no GPU at an
// interval nobody asked for past the next prepare or unprepare call, and a restart sets each
// booked GPU again before relying on it (the GPU may have been reset meanwhile).
//
// The pure parts; the module runs the commands (DraGpuModule::SettleTimeSlices).

#include "dra_plugin/checkpoint.hpp"
#include "modules/dra_gpu/gpu_claims.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra_gpu {

// "" and "Default" → 0, "Short" 1, "Medium" 2, "Long" 3; -1 for anything else.
int TimeSliceValue(std::string_view interval);

using TimeSlices = std::map<std::string, int>;  // by GPU UUID

// What the claims of `state` ask of their whole GPUs: the value of each TimeSlicing claim's
// interval but Default (a GPU wanted at Default is absent). A record whose GPUs cannot be read
// asks nothing.
TimeSlices WantedTimeSlices(const dra::Checkpoint& state);
// Adds what a planned claim asks (as a record of it would).
void AddWantedTimeSlices(TimeSlices& wanted, const GpuClaimPlan& plan);

// The book on disk: {"version":1,"gpus":{"GPU-…":3}}.
std::string TimeSliceBookText(const TimeSlices& book);
struct TimeSliceBookParse {
  TimeSlices book;
  std::string error;  // where and why; the book is then empty
};
TimeSliceBookParse ParseTimeSliceBook(std::string_view text);

// The book at `path`, read at start (blocking: on the pool). A missing file is an empty book; one
// that is not a book is moved aside (state_file.hpp) and `warning` says what was lost.
struct TimeSliceBookLoad {
  TimeSlices book;
  std::string warning;
};
TimeSliceBookLoad LoadTimeSliceBook(const std::string& path, int64_t unix_seconds);
inline constexpr std::string_view kTimeSliceBookFile = "time-slices.json";

struct TimeSliceStep {
  std::string uuid;
  int value = 0;
  bool operator==(const TimeSliceStep&) const = default;
};
// The commands that bring the GPUs to `wanted`, in UUID order: a GPU wanted at a value the book
// does not hold for it, or holds without `confirmed` (not seen to succeed by this process: a set
// before a restart, or one that failed) → set that value; a GPU in the book that nothing wants
// → set 0 (Default).
std::vector<TimeSliceStep> TimeSliceSteps(const TimeSlices& book, const std::set<std::string>& confirmed,
                                          const TimeSlices& wanted);

}  // namespace gns::dra_gpu
