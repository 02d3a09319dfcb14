// The gpu-reset module's durable record, as JSON (see reset_book.hpp).
#include "modules/gpu_reset/reset_book.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace gns::gpu_reset {
namespace {

constexpr std::array<std::pair<Step, std::string_view>, 9> kSteps = {{
    {Step::kQueued, "queued"},
    {Step::kHold, "hold"},
    {Step::kHolders, "holders"},
    {Step::kPersistence, "persistence"},
    {Step::kRelease, "release"},
    {Step::kReset, "reset"},
    {Step::kValidate, "validate"},
    {Step::kRestore, "restore"},
    {Step::kDone, "done"},
}};

constexpr int kVersion = 1;

template <typename T>
T Field(const nlohmann::json& j, const char* key, const std::string& where, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error(where + "." + key + " has the wrong type");
  }
}

}  // namespace

std::string_view StepName(Step step) {
  for (const auto& [s, name] : kSteps) {
    if (s == step) return name;
  }
  return "?";
}

std::optional<Step> ParseStep(std::string_view name) {
  for (const auto& [s, n] : kSteps) {
    if (n == name) return s;
  }
  return std::nullopt;
}

ResetJob* ResetBook::Find(std::string_view id) {
  for (auto& job : jobs) {
    if (job.id == id) return &job;
  }
  return nullptr;
}

ResetJob* ResetBook::FindActiveFor(std::string_view uuid) {
  for (auto& job : jobs) {
    if (job.Finished()) continue;
    for (const auto& gpu : job.gpus) {
      if (gpu.uuid == uuid && gpu.outcome.empty()) return &job;
    }
  }
  return nullptr;
}

void ResetBook::Trim() {
  std::size_t finished = 0;
  for (const auto& job : jobs) finished += job.Finished() ? 1 : 0;
  for (auto it = jobs.begin(); it != jobs.end() && finished > kMaxFinished;) {
    if (it->Finished() && (it->final_status_written || it->source != "GPUReset")) {
      it = jobs.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

void to_json(nlohmann::json& j, const StepLog& s) {
  j = nlohmann::json{{"name", s.name},
                     {"result", s.result},
                     {"startedUnixMs", s.started_unix_ms},
                     {"durationMs", s.duration_ms}};
  if (!s.message.empty()) j["message"] = s.message;
}

void to_json(nlohmann::json& j, const GpuReset& g) {
  j = nlohmann::json{{"uuid", g.uuid}, {"step", StepName(g.step)}, {"released", g.released}, {"steps", g.steps}};
  if (g.persistence_was_on) j["persistenceWasOn"] = *g.persistence_was_on;
  if (!g.outcome.empty()) j["outcome"] = g.outcome;
  if (!g.reason.empty()) j["reason"] = g.reason;
  if (!g.message.empty()) j["message"] = g.message;
  if (!g.command_output.empty()) j["commandOutput"] = g.command_output;
  if (g.command_ms != 0) j["commandMs"] = g.command_ms;
  if (g.total_ms != 0) j["totalMs"] = g.total_ms;
}

void to_json(nlohmann::json& j, const ResetJob& job) {
  j = nlohmann::json{{"id", job.id},
                     {"source", job.source},
                     {"gpus", job.gpus},
                     {"createdUnixMs", job.created_unix_ms},
                     {"phase", job.phase},
                     {"finalStatusWritten", job.final_status_written}};
  if (!job.object_name.empty()) j["objectName"] = job.object_name;
  if (!job.object_uid.empty()) j["objectUid"] = job.object_uid;
  if (job.generation != 0) j["generation"] = job.generation;
  if (job.started_unix_ms != 0) j["startedUnixMs"] = job.started_unix_ms;
  if (job.completed_unix_ms != 0) j["completedUnixMs"] = job.completed_unix_ms;
  if (!job.reason.empty()) j["reason"] = job.reason;
  if (!job.message.empty()) j["message"] = job.message;
}

void to_json(nlohmann::json& j, const ResetBook& book) {
  j = nlohmann::json{{"version", kVersion}, {"nextCli", book.next_cli}, {"jobs", book.jobs}};
}

ResetBook ParseResetBook(std::string_view text) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(std::string("not JSON: ") + e.what());
  }
  if (!root.is_object()) throw std::runtime_error("the top level is not an object");
  const int version = Field<int>(root, "version", "", 0);
  if (version != kVersion) throw std::runtime_error("version " + std::to_string(version) + " is not " + std::to_string(kVersion));
  ResetBook book;
  book.next_cli = Field<uint64_t>(root, "nextCli", "", 1);
  const auto jobs = root.find("jobs");
  if (jobs == root.end() || !jobs->is_array()) throw std::runtime_error("jobs is missing or not a list");
  for (std::size_t i = 0; i < jobs->size(); ++i) {
    const auto& j = (*jobs)[i];
    const std::string where = "jobs[" + std::to_string(i) + "]";
    if (!j.is_object()) throw std::runtime_error(where + " is not an object");
    ResetJob job;
    job.id = Field<std::string>(j, "id", where, "");
    if (job.id.empty()) throw std::runtime_error(where + ".id is missing");
    job.source = Field<std::string>(j, "source", where, "");
    job.object_name = Field<std::string>(j, "objectName", where, "");
    job.object_uid = Field<std::string>(j, "objectUid", where, "");
    job.generation = Field<int64_t>(j, "generation", where, 0);
    job.created_unix_ms = Field<int64_t>(j, "createdUnixMs", where, 0);
    job.started_unix_ms = Field<int64_t>(j, "startedUnixMs", where, 0);
    job.completed_unix_ms = Field<int64_t>(j, "completedUnixMs", where, 0);
    job.phase = Field<std::string>(j, "phase", where, "Pending");
    job.reason = Field<std::string>(j, "reason", where, "");
    job.message = Field<std::string>(j, "message", where, "");
    job.final_status_written = Field<bool>(j, "finalStatusWritten", where, false);
    const auto gpus = j.find("gpus");
    if (gpus == j.end() || !gpus->is_array()) throw std::runtime_error(where + ".gpus is missing or not a list");
    for (std::size_t k = 0; k < gpus->size(); ++k) {
      const auto& g = (*gpus)[k];
      const std::string at = where + ".gpus[" + std::to_string(k) + "]";
      if (!g.is_object()) throw std::runtime_error(at + " is not an object");
      GpuReset gpu;
      gpu.uuid = Field<std::string>(g, "uuid", at, "");
      if (gpu.uuid.empty()) throw std::runtime_error(at + ".uuid is missing");
      const auto step = ParseStep(Field<std::string>(g, "step", at, "queued"));
      if (!step) throw std::runtime_error(at + ".step is not a known step");
      gpu.step = *step;
      if (g.contains("persistenceWasOn")) gpu.persistence_was_on = Field<bool>(g, "persistenceWasOn", at, false);
      gpu.released = Field<bool>(g, "released", at, false);
      gpu.outcome = Field<std::string>(g, "outcome", at, "");
      gpu.reason = Field<std::string>(g, "reason", at, "");
      gpu.message = Field<std::string>(g, "message", at, "");
      gpu.command_output = Field<std::string>(g, "commandOutput", at, "");
      gpu.command_ms = Field<int64_t>(g, "commandMs", at, 0);
      gpu.total_ms = Field<int64_t>(g, "totalMs", at, 0);
      if (const auto steps = g.find("steps"); steps != g.end() && steps->is_array()) {
        for (const auto& s : *steps) {
          StepLog log;
          log.name = Field<std::string>(s, "name", at + ".steps", "");
          log.result = Field<std::string>(s, "result", at + ".steps", "");
          log.started_unix_ms = Field<int64_t>(s, "startedUnixMs", at + ".steps", 0);
          log.duration_ms = Field<int64_t>(s, "durationMs", at + ".steps", 0);
          log.message = Field<std::string>(s, "message", at + ".steps", "");
          gpu.steps.push_back(std::move(log));
        }
      }
      job.gpus.push_back(std::move(gpu));
    }
    if (job.gpus.empty()) throw std::runtime_error(where + " names no GPU");
    book.jobs.push_back(std::move(job));
  }
  return book;
}

}  // namespace gns::gpu_reset
