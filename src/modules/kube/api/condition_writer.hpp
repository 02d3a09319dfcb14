#pragma once
// One Node condition that its owner module keeps up to date (ImexHealthy, ImexRestartPending):
// the owner says what the condition is now; the writer sends it through NodeConditions with at
// most one write in flight, and what the owner decides meanwhile is coalesced into one write of
// the latest value after it. The client is looked up when a write is due, and forgotten with
// Reset() when the kube module goes away, so a restarted kube module is picked up without the
// owner holding a stopped client. A failed write is reported to `on_error`; the next change
// writes again.

#include "loop/clock.hpp"
#include "modules/kube/api/events.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace gns::kube {

class KubeClient;

class NodeConditionWriter {
 public:
  struct Options {
    std::string node_name;      // empty: nothing is written
    std::string field_manager;  // the owner module's name
  };
  NodeConditionWriter(const Clock& clock, Options options, std::function<std::shared_ptr<KubeClient>()> find_client,
                      std::function<void(const std::string& error)> on_error);
  ~NodeConditionWriter();
  NodeConditionWriter(const NodeConditionWriter&) = delete;
  NodeConditionWriter& operator=(const NodeConditionWriter&) = delete;

  // The condition as it is now; written unless the same was written last.
  void Set(NodeCondition condition);
  // The client went away (or came back): drop it and the write in flight, then write the
  // latest condition through the client found now, if any.
  void Reset();

 private:
  void Write();

  const Clock& clock_;
  Options options_;
  std::function<std::shared_ptr<KubeClient>()> find_client_;
  std::function<void(const std::string&)> on_error_;
  std::shared_ptr<NodeConditions> conditions_;
  std::optional<NodeCondition> desired_;
  std::optional<NodeCondition> written_;
  bool in_flight_ = false;
  bool dirty_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace gns::kube
