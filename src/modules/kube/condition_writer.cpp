// One Node condition kept up to date: see condition_writer.hpp.
#include "modules/kube/api/condition_writer.hpp"

namespace gns::kube {
namespace {

bool Same(const NodeCondition& a, const NodeCondition& b) {
  return a.type == b.type && a.status == b.status && a.reason == b.reason && a.message == b.message;
}

}  // namespace

NodeConditionWriter::NodeConditionWriter(const Clock& clock, Options options,
                                         std::function<std::shared_ptr<KubeClient>()> find_client,
                                         std::function<void(const std::string& error)> on_error)
    : clock_(clock),
      options_(std::move(options)),
      find_client_(std::move(find_client)),
      on_error_(std::move(on_error)) {}

NodeConditionWriter::~NodeConditionWriter() { *alive_ = false; }

void NodeConditionWriter::Set(NodeCondition condition) {
  if (desired_ && Same(*desired_, condition)) return;
  desired_ = std::move(condition);
  Write();
}

void NodeConditionWriter::Reset() {
  conditions_.reset();  // its answers, if any, are dropped with it
  in_flight_ = false;
  dirty_ = false;
  written_.reset();
  Write();
}

void NodeConditionWriter::Write() {
  if (!desired_ || options_.node_name.empty()) return;
  if (in_flight_) {
    dirty_ = true;  // judged against what that write leaves when it is done
    return;
  }
  if (written_ && Same(*written_, *desired_)) return;
  if (!conditions_) {
    auto client = find_client_ ? find_client_() : nullptr;
    if (!client) return;  // written once a client is there (Reset)
    conditions_ = std::make_shared<NodeConditions>(std::move(client), clock_, options_.field_manager);
  }
  in_flight_ = true;
  const NodeCondition sent = *desired_;
  conditions_->Set(options_.node_name, sent, [this, alive = alive_, sent](Result result) {
    if (!*alive) return;
    in_flight_ = false;
    if (result.Ok()) {
      written_ = sent;
    } else if (on_error_) {
      on_error_(result.error);
    }
    if (dirty_) {
      dirty_ = false;
      Write();
    }
  });
}

}  // namespace gns::kube
