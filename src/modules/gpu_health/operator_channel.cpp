// The operator's set-healthy channels (see operator_channel.hpp).
#include "modules/gpu_health/operator_channel.hpp"

#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"

#include <algorithm>
#include <sstream>

namespace gns::gpu_health {

OperatorChannel::OperatorChannel(boost::asio::io_context& io, Bus& bus, const Clock& clock, spdlog::logger& log,
                                 std::string node_name, std::string field_manager, SetHealthy set_healthy,
                                 Status status)
    : io_(io),
      bus_(bus),
      log_(log),
      node_name_(std::move(node_name)),
      field_manager_(std::move(field_manager)),
      set_healthy_(std::move(set_healthy)),
      status_(std::move(status)),
      warn_(clock) {}

OperatorChannel::~OperatorChannel() {
  lifetime_.Close();
  Stop();
}

void OperatorChannel::StartSocket(const std::string& path) {
  if (path.empty()) return;
  socket_ = std::make_unique<AdminSocket>(io_, path,
                                          AdminSocket::OneShot([this](std::string_view line) { return HandleLine(line); }));
  socket_->Start();
}

const std::string& OperatorChannel::SocketPath() const {
  static const std::string kNone;
  return socket_ ? socket_->Path() : kNone;
}

void OperatorChannel::Stop() {
  if (socket_) socket_->Stop();
  node_sub_.Reset();
  informer_.reset();
  client_.reset();
}

std::string OperatorChannel::HandleLine(std::string_view line) {
  std::istringstream in{std::string(line)};
  std::string verb;
  std::string arg;
  std::string extra;
  in >> verb >> arg >> extra;
  if (verb == "set-healthy" && !arg.empty() && extra.empty()) return set_healthy_(arg, "admin socket");
  if (verb == "status" && arg.empty()) return "ok: " + status_();
  return "error: unknown request (expected \"set-healthy <GPU-uuid>|all\" or \"status\")";
}

void OperatorChannel::WatchAnnotation(std::shared_ptr<kube::InformerRegistry> registry,
                                      std::shared_ptr<kube::KubeClient> client) {
  if (!registry || node_name_.empty()) return;
  client_ = std::move(client);
  kube::InformerSpec spec;
  spec.path = kube::ResourcePath::Core("nodes").Collection();
  spec.field_selector = "metadata.name=" + node_name_;
  informer_key_ = spec.Key();
  node_sub_ = bus_.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& event) { OnNodeEvent(event); });
  informer_ = registry->Acquire(spec);
}

void OperatorChannel::OnNodeEvent(const kube::ResourceEvent& event) {
  if (event.informer_key != informer_key_ || event.type == kube::ResourceEvent::Type::kDeleted || !event.object) return;
  const auto annotations = event.object->value("/metadata/annotations"_json_pointer, nlohmann::json::object());
  const std::string key(kSetHealthyAnnotation);
  if (!annotations.is_object() || !annotations.contains(key) || !annotations[key].is_string()) {
    last_annotation_.clear();
    return;
  }
  const std::string value = annotations[key].get<std::string>();
  if (value == last_annotation_) return;
  last_annotation_ = value;
  std::string list = value;
  std::replace(list.begin(), list.end(), ',', ' ');
  std::istringstream in(list);
  std::string target;
  while (in >> target) {
    const auto answer = set_healthy_(target, "Node annotation");
    if (answer.rfind("error", 0) == 0) warn_.Warn(log_, "bad_set_healthy_annotation", answer);
  }
  // One-shot: take the annotation off so the same request can be made again later.
  if (client_) {
    nlohmann::json patch = {{"metadata", {{"annotations", {{key, nullptr}}}}}};
    client_->Patch(kube::ResourcePath::Core("nodes").Object(node_name_), kube::PatchType::kMerge, patch, field_manager_,
                   lifetime_.Guard([this](kube::Result result) {
                     if (!result.Ok()) warn_.Warn(log_, "annotation_clear_failed", result.error);
                   }));
  }
}

}  // namespace gns::gpu_health
