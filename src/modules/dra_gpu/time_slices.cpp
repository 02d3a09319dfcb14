// A GpuConfig's time-slice interval on the GPU (time_slices.hpp).
#include "modules/dra_gpu/time_slices.hpp"

#include "loop/json_fields.hpp"
#include "loop/state_file.hpp"

#include <nlohmann/json.hpp>

namespace gns::dra_gpu {

namespace {

using nlohmann::json;

void Want(TimeSlices& wanted, const std::vector<ClaimGpu>& gpus, int value) {
  if (value <= 0) return;
  for (const ClaimGpu& gpu : gpus) {
    if (!gpu.Mig()) wanted[gpu.uuid] = value;  // a MIG device has no interval of its own
  }
}

}  // namespace

int TimeSliceValue(std::string_view interval) {
  if (interval.empty() || interval == "Default") return 0;
  if (interval == "Short") return 1;
  if (interval == "Medium") return 2;
  if (interval == "Long") return 3;
  return -1;
}

TimeSlices WantedTimeSlices(const dra::Checkpoint& state) {
  TimeSlices wanted;
  for (const auto& [uid, entry] : state.claims) {
    const auto sharing = entry.driver_data.find("sharing");
    if (sharing == entry.driver_data.end() || !sharing->is_object()) continue;
    if (JsonStringAt(*sharing, "/strategy") != "TimeSlicing") continue;
    Want(wanted, GpusOf(entry), TimeSliceValue(JsonStringAt(*sharing, "/interval")));
  }
  return wanted;
}

void AddWantedTimeSlices(TimeSlices& wanted, const GpuClaimPlan& plan) {
  if (plan.sharing.strategy != "TimeSlicing") return;
  Want(wanted, plan.gpus, TimeSliceValue(plan.sharing.interval));
}

std::string TimeSliceBookText(const TimeSlices& book) {
  json gpus = json::object();
  for (const auto& [uuid, value] : book) gpus[uuid] = value;
  return json{{"version", 1}, {"gpus", std::move(gpus)}}.dump() + "\n";
}

TimeSliceBookParse ParseTimeSliceBook(std::string_view text) {
  TimeSliceBookParse out;
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    out.error = std::string("not JSON: ") + e.what();
    return out;
  }
  if (!doc.is_object() || doc.value("version", json()) != json(1)) {
    out.error = "not a version 1 book (expected {\"version\":1,\"gpus\":{…}})";
    return out;
  }
  const auto gpus = doc.find("gpus");
  if (gpus == doc.end() || !gpus->is_object()) {
    out.error = "gpus: expected an object of GPU UUID → time-slice";
    return out;
  }
  for (const auto& [uuid, value] : gpus->items()) {
    if (uuid.empty() || !value.is_number_integer() || value.get<int>() < 0 || value.get<int>() > 3) {
      out.error = "gpus." + uuid + ": expected a time-slice 0-3";
      out.book.clear();
      return out;
    }
    out.book[uuid] = value.get<int>();
  }
  return out;
}

TimeSliceBookLoad LoadTimeSliceBook(const std::string& path, int64_t unix_seconds) {
  TimeSliceBookLoad out;
  const StateFileRead read = ReadStateFile(path, 1u << 20);
  std::string why;
  switch (read.status) {
    case StateFileRead::Status::kMissing:
      return out;
    case StateFileRead::Status::kUnreadable:
      out.warning = read.error + "; GPUs this driver set to a non-default time-slice may stay so until set again";
      return out;
    case StateFileRead::Status::kRejected:
      why = read.error;
      break;
    case StateFileRead::Status::kRead: {
      TimeSliceBookParse parsed = ParseTimeSliceBook(read.content);
      if (parsed.error.empty()) {
        out.book = std::move(parsed.book);
        return out;
      }
      why = path + ": " + parsed.error;
      break;
    }
  }
  const MoveAsideResult moved = MoveStateFileAside(path, unix_seconds);
  out.warning = why + (moved.ok ? "; moved to " + moved.moved_to : "; could not move it aside: " + moved.error) +
                "; GPUs this driver set to a non-default time-slice may stay so until set again";
  return out;
}

std::vector<TimeSliceStep> TimeSliceSteps(const TimeSlices& book, const std::set<std::string>& confirmed,
                                          const TimeSlices& wanted) {
  std::map<std::string, int> steps;
  for (const auto& [uuid, value] : wanted) {
    const auto held = book.find(uuid);
    if (held == book.end() || held->second != value || confirmed.count(uuid) == 0) steps[uuid] = value;
  }
  for (const auto& [uuid, value] : book) {
    if (wanted.count(uuid) == 0) steps[uuid] = 0;
  }
  std::vector<TimeSliceStep> out;
  for (const auto& [uuid, value] : steps) out.push_back(TimeSliceStep{uuid, value});
  return out;
}

}  // namespace gns::dra_gpu
