#pragma once
// What the nvsentinel-export module sends, decided without I/O: our health facts as NVSentinel
// HealthEvents (datamodels.HealthEvent, newest revision), the stable id of each, and the book
// of what was last exported for the facts that come as retained state (check conditions, IMEX
// health, reset outcomes, GPU verdicts), which the module persists and diffs against.
//
// Ids: every event's id is a hash of what makes it that event (its source, node, entity and
// the instant or generation of the change), never of when we happened to send it. The same
// fact therefore gets the same id after any restart (a re-diff after a kill -9, an event resent
// because its removal was not persisted), and the receiver dedupes on it.

#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_reset/messages.hpp"
#include "modules/imex_health/messages.hpp"
#include "nvsentinel/v1/api.pb.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gns::nvsentinel_export {

struct ExportSettings {
  std::string node_name;
  datamodels::ProcessingStrategy strategy = datamodels::EXECUTE_REMEDIATION;
  std::string agent = "gpu-node-supervisor";
};

// "8c3f…-…" (a UUID-shaped 128-bit hash of the parts, each length-prefixed).
std::string StableId(std::initializer_list<std::string_view> parts);
std::string StableId(const std::vector<std::string>& parts);

// Our recommended-action name as the newest revision's enum. RESTART_APP (an older revision's
// value 39, still in our catalog) has no number there: it goes as NONE with the name in
// metadata["recommendedActionName"] (so the receiver does not act on the node for it). An
// unknown name is UNKNOWN.
datamodels::RecommendedAction ActionFromName(std::string_view name);

// An XID event or a recovery from gpu-health's event topic.
datamodels::HealthEvent FromGpuHealthEvent(const gpu_health::HealthEvent& event, const ExportSettings& settings);

// The stable id of a gpu-health event (what it says, and when it was generated).
std::string IdOfGpuHealthEvent(const gpu_health::HealthEvent& event, const std::string& node_name);

// What was last exported of the retained facts, persisted as JSON (export-book.json).
struct ExportBook {
  struct Verdict {
    bool healthy = true;
    uint64_t xid = 0;
    int64_t since_unix_ms = 0;
    bool operator==(const Verdict&) const = default;
  };
  struct Condition {
    std::string severity;
    int64_t since_unix_ms = 0;
    bool operator==(const Condition&) const = default;
  };
  // Absent: never seen (a fresh install): the first snapshot exports what is unhealthy in it.
  std::optional<std::map<std::string, Verdict>> verdicts;      // by DeviceHealth::RetainKey
  std::optional<std::map<std::string, Condition>> conditions;  // by "<gpu>/<check>"
  struct Imex {
    std::string status;
    std::string reason;
    uint64_t generation = 0;  // one more for every exported change (part of the id)
    bool operator==(const Imex&) const = default;
  };
  std::optional<Imex> imex;
  std::optional<std::set<std::string>> resets;  // "<job id>/<phase>" of finished jobs, exported or seen
  // Ids of gpu-health events taken into the queue, oldest first, at most kMaxTakenEvents.
  // Absent: a book written before this field (its build delivered what the log holds). A
  // fresh node's book has it, empty.
  std::optional<std::vector<std::string>> taken_events;
  static constexpr std::size_t kMaxTakenEvents = 2048;
  bool operator==(const ExportBook&) const = default;
};
nlohmann::json BookToJson(const ExportBook& book);
// Throws std::runtime_error naming what is wrong.
ExportBook BookFromJson(const nlohmann::json& j);

// The diffs: the events that take the receiver from `book` to the snapshot, and the book
// updated. `now_unix_ms` stamps events whose fact carries no instant (a condition that cleared).
// `pci_of` maps a GPU UUID to its PCI address where known.
std::vector<datamodels::HealthEvent> DiffConditions(ExportBook& book, const gpu_health::GpuHealthChecks& checks,
                                                    const std::map<std::string, std::string>& pci_of,
                                                    const ExportSettings& settings, int64_t now_unix_ms);
std::vector<datamodels::HealthEvent> DiffImex(ExportBook& book, const imex_health::ImexHealth& imex,
                                              const ExportSettings& settings, int64_t now_unix_ms);
std::vector<datamodels::HealthEvent> DiffResets(ExportBook& book, const gpu_reset::GpuResetState& state,
                                                const std::map<std::string, std::string>& pci_of,
                                                const ExportSettings& settings, int64_t now_unix_ms);
// GPU verdicts: run once at start, against what gpu-health holds then (a verdict that changed
// while we were not running, or whose event a kill -9 took before it reached our queue).
std::vector<datamodels::HealthEvent> DiffVerdicts(ExportBook& book, const std::vector<gpu_health::DeviceHealth>& now,
                                                  const ExportSettings& settings, int64_t now_unix_ms);
// The book's verdicts set to `now` without exporting (what the event topic already carried).
void RecordVerdicts(ExportBook& book, const std::vector<gpu_health::DeviceHealth>& now);

}  // namespace gns::nvsentinel_export
