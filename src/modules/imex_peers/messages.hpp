#pragma once
// Bus messages of the `imex-peers` module: its state (retained), shown in /debug/state.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::imex_peers {

struct ImexPeersState {
  static constexpr std::string_view kTopic = "imex-peers.state";
  static constexpr bool kRetained = true;
  std::string clique;
  std::vector<std::string> peers;             // the map as rendered
  std::vector<std::string> without_address;   // clique Nodes left out
  bool restart_pending = false;
  std::string pending_reason;
  std::vector<std::string> loaded;  // the map the running IMEX loaded, when known
  bool loaded_known = false;
  bool diverged = false;            // the loaded map is not (known to be) the clique's
  uint64_t writes = 0;
  uint64_t restarts = 0;
  std::string last_error;
};

inline void to_json(nlohmann::json& j, const ImexPeersState& s) {
  j = nlohmann::json{{"clique", s.clique},           {"peers", s.peers},
                     {"withoutAddress", s.without_address}, {"restartPending", s.restart_pending},
                     {"pendingReason", s.pending_reason}, {"loaded", s.loaded},
                     {"loadedKnown", s.loaded_known},     {"diverged", s.diverged},
                     {"writes", s.writes},
                     {"restarts", s.restarts},       {"lastError", s.last_error}};
}

}  // namespace gns::imex_peers
