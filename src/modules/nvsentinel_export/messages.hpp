#pragma once
// Bus messages of the `nvsentinel-export` module: where the export stands (retained, shown in
// /debug/state).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gns::nvsentinel_export {

struct NvsentinelExportState {
  static constexpr std::string_view kTopic = "nvsentinel-export.state";
  static constexpr bool kRetained = true;
  std::string target;          // the connector's socket
  uint64_t queued = 0;         // events on disk, not yet delivered
  uint64_t writing = 0;        // events taken, being written to disk
  uint64_t delivered = 0;      // events the connector took (this run)
  uint64_t failed_calls = 0;   // calls that failed (this run)
  uint64_t dropped = 0;        // events dropped because the queue was full (this run)
  int64_t last_success_unix_ms = 0;
  std::string last_error;      // of the last failed call or write, "" after a success
};

inline void to_json(nlohmann::json& j, const NvsentinelExportState& s) {
  j = nlohmann::json{{"target", s.target},       {"queued", s.queued}, {"writing", s.writing},
                     {"delivered", s.delivered}, {"failedCalls", s.failed_calls},
                     {"dropped", s.dropped},     {"lastSuccessUnixMs", s.last_success_unix_ms}};
  if (!s.last_error.empty()) j["lastError"] = s.last_error;
}

}  // namespace gns::nvsentinel_export
