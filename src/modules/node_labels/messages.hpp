#pragma once
// Bus messages of the `node-labels` module.

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <string_view>

namespace gns::node_labels {

// What the module last applied to its Node (retained): shown in /debug/state.
struct NodeLabelsState {
  static constexpr std::string_view kTopic = "node-labels.state";
  static constexpr bool kRetained = true;
  std::map<std::string, std::string> applied;  // as the last successful apply set them
  int applies = 0;                             // successful applies
  std::string last_error;
  std::string waiting_for;  // the inputs not known yet, before the first apply
};

inline void to_json(nlohmann::json& j, const NodeLabelsState& s) {
  j = nlohmann::json{{"applied", s.applied}, {"applies", s.applies}};
  if (!s.last_error.empty()) j["lastError"] = s.last_error;
  if (!s.waiting_for.empty()) j["waitingFor"] = s.waiting_for;
}

}  // namespace gns::node_labels
