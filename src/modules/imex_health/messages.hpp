#pragma once
// Bus messages of the `imex-health` module: the host IMEX verdict (retained). One judge: this
// module decides whether host IMEX is ready; the DRA module's requireImexReady gate and
// imex-peers follow it.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::imex_health {

struct ImexHealth {
  static constexpr std::string_view kTopic = "imex-health.state";
  static constexpr bool kRetained = true;
  bool ready = false;       // the ImexHealthy condition is True
  std::string status;       // "True", "False", "Unknown" (as the Node condition)
  std::string reason;       // ImexHealthy, ServiceInactive, ServiceFailed, RestartLoop, …
  std::string message;
  std::string unit;
  std::string load_state;
  std::string active_state;
  std::string sub_state;
  uint32_t n_restarts = 0;
  uint32_t restarts_in_window = 0;
  int32_t exec_main_status = 0;
  uint64_t active_enter_usec = 0;
  bool bus_connected = false;
  uint32_t channel_major = 0;  // 0: not registered
  bool channel0_present = false;
  std::vector<std::string> peers;  // nodes_config.cfg as read (valid or not)
  std::string nodes_config_path;
  uint64_t log_errors_in_window = 0;
  bool domain_checked = false;  // nvidia-imex-ctl answered for the current run of the unit
  bool domain_ready = false;
  std::string domain_state;     // "READY/UP"; what -q (and -N) said
  std::vector<std::string> warnings;  // what is wrong but does not fail the condition (seed 000 §13)
};

inline void to_json(nlohmann::json& j, const ImexHealth& s) {
  j = nlohmann::json{{"ready", s.ready},
                     {"status", s.status},
                     {"reason", s.reason},
                     {"message", s.message},
                     {"unit", s.unit},
                     {"loadState", s.load_state},
                     {"activeState", s.active_state},
                     {"subState", s.sub_state},
                     {"nRestarts", s.n_restarts},
                     {"restartsInWindow", s.restarts_in_window},
                     {"execMainStatus", s.exec_main_status},
                     {"activeEnterTimestampUsec", s.active_enter_usec},
                     {"busConnected", s.bus_connected},
                     {"channelMajor", s.channel_major},
                     {"channel0Present", s.channel0_present},
                     {"peers", s.peers},
                     {"nodesConfig", s.nodes_config_path},
                     {"logErrorsInWindow", s.log_errors_in_window},
                     {"domainChecked", s.domain_checked},
                     {"domainReady", s.domain_ready},
                     {"domainState", s.domain_state},
                     {"warnings", s.warnings}};
}

}  // namespace gns::imex_health
