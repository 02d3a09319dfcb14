// The imex-peers module: see imex_peers_module.hpp.
#include "modules/imex_peers/imex_peers_module.hpp"

#include "loop/atomic_file.hpp"
#include "modules/imex_health/unit_control.hpp"
#include "modules/kube/client.hpp"
#include "modules/kube/events.hpp"
#include "modules/kube/informer.hpp"

#include <algorithm>

namespace gns::imex_peers {
namespace {

constexpr std::string_view kDraModule = "dra-compute-domain";

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

ImexPeersModule::Config ImexPeersModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  Config config;
  config.clique_label = section.String("cliqueLabel", config.clique_label);
  if (config.clique_label.empty() || config.clique_label.find_first_of("=, ") != std::string::npos) {
    section.Fail("cliqueLabel", "not a label key: \"" + config.clique_label + "\"");
  }
  config.nodes_config = section.String("nodesConfig", config.nodes_config);
  if (config.nodes_config.empty() || config.nodes_config.front() != '/') section.Fail("nodesConfig", "not an absolute path");
  const auto address = section.Enum("addressType", {"internalIP", "hostname"}, "internalIP");
  config.address_type = address == "hostname" ? "Hostname" : "InternalIP";
  config.restart_policy = section.Enum("restartPolicy", {"never", "whenIdle", "always"}, config.restart_policy);
  config.label_node = section.Bool("labelNode", config.label_node);
  config.condition_type = section.String("conditionType", config.condition_type);
  if (config.condition_type.empty()) section.Fail("conditionType", "must not be empty");
  return config;
}

ImexPeersModule::ImexPeersModule(ModuleContext& context, const Config& config)
    : context_(context), config_(config) {
  std::string root = context.Site().paths.host_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  path_ = (root.empty() || root == "/") ? config_.nodes_config : root + config_.nodes_config;
  auto& m = context.Metrics();
  writes_total_ = &m.Counter("gpu_node_supervisor_imex_peers_writes_total", "nodes_config.cfg rewrites");
  restarts_total_ = &m.Counter("gpu_node_supervisor_imex_peers_restarts_total", "IMEX unit restarts asked by imex-peers");
  pending_gauge_ = &m.Gauge("gpu_node_supervisor_imex_peers_restart_pending", "1 while a map change waits for a restart");
  peers_gauge_ = &m.Gauge("gpu_node_supervisor_imex_peers_peers", "Peers in the rendered node map");
}

ImexPeersModule::~ImexPeersModule() { *alive_ = false; }

std::string ImexPeersModule::Render(std::vector<std::string> addresses) {
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  std::string out;
  for (const auto& a : addresses) {
    if (!a.empty()) out += a + "\n";
  }
  return out;
}

void ImexPeersModule::Start() {
  std::string text;
  std::string error;
  if (ReadWholeFile(path_, text, error)) on_disk_ = text;  // small; missing is fine (nullopt)
  auto& bus = context_.GetBus();
  states_sub_ = bus.Subscribe<ModuleStates>([this](const ModuleStates& s) { OnModuleStates(s); });
  dra_sub_ = bus.Subscribe<dra::DraComputeDomainState>([this](const dra::DraComputeDomainState& s) { OnDraState(s); });
  resource_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& e) { OnResourceEvent(e); });
  synced_sub_ = bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced& s) { OnSynced(s); });
  clique_sub_ = bus.Subscribe<gpu_inventory::NodeClique>([this](const gpu_inventory::NodeClique& c) { OnClique(c); });
  SetPending(false, "NoChange", "waiting for this node's clique");
  Publish();
}

void ImexPeersModule::Stop(std::function<void()> done) {
  *alive_ = false;
  clique_sub_.Reset();
  resource_sub_.Reset();
  synced_sub_.Reset();
  dra_sub_.Reset();
  states_sub_.Reset();
  informer_.reset();
  done();
}

void ImexPeersModule::OnClique(const gpu_inventory::NodeClique& clique) {
  if (clique.clique_id == clique_) return;
  clique_ = clique.clique_id;
  state_.clique = clique_;
  informer_.reset();
  addresses_.clear();
  synced_ = false;
  if (clique_.empty()) {
    context_.Log().warn("no NVLink clique ({}): the node map is left as it is", clique.reason);
    Publish();
    return;
  }
  LabelNode();
  auto registry = context_.GetServices().Find<kube::InformerRegistry>();
  if (!registry) return;
  kube::InformerSpec spec;
  spec.path = kube::ResourcePath::Core("nodes").Collection();
  spec.label_selector = config_.clique_label + "=" + clique_;
  informer_key_ = spec.Key();
  informer_ = registry->Acquire(spec);
  Publish();
}

void ImexPeersModule::LabelNode() {
  if (!config_.label_node || context_.Site().node_name.empty()) return;
  auto client = context_.GetServices().Find<kube::KubeClient>();
  if (!client) return;
  // Server-side apply with our own field manager: we own just this label, nothing else.
  nlohmann::json body = {{"apiVersion", "v1"},
                         {"kind", "Node"},
                         {"metadata", {{"name", context_.Site().node_name}, {"labels", {{config_.clique_label, clique_}}}}}};
  client->Patch(kube::ResourcePath::Core("nodes").Object(context_.Site().node_name), kube::PatchType::kApply, body,
                std::string(kName), [this, alive = alive_](kube::Result result) {
                  if (!*alive) return;
                  if (!result.Ok()) {
                    state_.last_error = "labelling the Node: " + result.error;
                    context_.Log().warn("{}", state_.last_error);
                    Publish();
                  }
                });
}

void ImexPeersModule::OnResourceEvent(const kube::ResourceEvent& event) {
  if (event.informer_key != informer_key_ || !event.object) return;
  const auto meta = kube::ObjectMeta::From(*event.object);
  if (!meta) return;
  if (event.type == kube::ResourceEvent::Type::kDeleted) {
    addresses_.erase(meta->name);
  } else {
    std::string address;
    const auto list = event.object->value("/status/addresses"_json_pointer, nlohmann::json::array());
    for (const auto& a : list.is_array() ? list : nlohmann::json::array()) {
      if (a.is_object() && a.value("type", "") == config_.address_type && a.contains("address") &&
          a["address"].is_string()) {
        address = a["address"].get<std::string>();
        break;
      }
    }
    addresses_[meta->name] = address;
  }
  if (synced_) Reconcile();
}

void ImexPeersModule::OnSynced(const kube::InformerSynced& synced) {
  if (synced.informer_key != informer_key_ || !synced.synced || synced_) return;
  synced_ = true;
  Reconcile();
}

void ImexPeersModule::Reconcile() {
  std::vector<std::string> addresses;
  state_.without_address.clear();
  for (const auto& [name, address] : addresses_) {
    if (address.empty()) state_.without_address.push_back(name);
    else addresses.push_back(address);
  }
  const std::string desired = Render(addresses);
  state_.peers.clear();
  for (const auto& a : addresses) state_.peers.push_back(a);
  std::sort(state_.peers.begin(), state_.peers.end());
  state_.peers.erase(std::unique(state_.peers.begin(), state_.peers.end()), state_.peers.end());
  peers_gauge_->Set(static_cast<double>(state_.peers.size()));
  if (!state_.without_address.empty()) {
    context_.Log().warn("clique Nodes without an {} address, left out of the map: {}", config_.address_type,
                        JoinList(state_.without_address));
  }
  if (desired.empty()) {
    // Never write an empty map (IMEX would fail to start): this node's own Node is missing.
    state_.last_error = "no clique Node has an " + config_.address_type + " address: the map is left as it is";
    Publish();
    return;
  }
  if (on_disk_ && *on_disk_ == desired) {
    Publish();
    return;
  }
  if (writing_) {
    write_again_ = true;
    return;
  }
  writing_ = true;
  context_.Pool().Run(
      [path = path_, desired] {
        auto result = WriteFileAtomically(path, desired, 0644);
        return std::make_pair(result.ok, result.error);
      },
      [this, alive = alive_, desired](std::pair<bool, std::string> result, std::exception_ptr) {
        if (!*alive) return;
        writing_ = false;
        if (result.first) {
          on_disk_ = desired;
          ++state_.writes;
          writes_total_->Inc();
          state_.last_error.clear();
          context_.Log().info("{} rewritten: {}", path_, JoinList(state_.peers));
          SetPending(true, "MapChanged", "nodes_config.cfg changed; IMEX restart due");
          TryRestart();
        } else {
          state_.last_error = result.second;
          context_.Log().error("writing {}: {}", path_, result.second);
        }
        if (write_again_) {
          write_again_ = false;
          Reconcile();
        }
        Publish();
      });
}

void ImexPeersModule::OnDraState(const dra::DraComputeDomainState& state) {
  prepared_claims_ = state.prepared_claims.size();
  TryRestart();
}

void ImexPeersModule::OnModuleStates(const ModuleStates& states) {
  const auto dra = std::find_if(states.modules.begin(), states.modules.end(),
                                [](const ModuleStatus& m) { return m.name == kDraModule; });
  const bool enabled = dra != states.modules.end() && dra->state == ModuleState::kRunning;
  if (enabled == dra_enabled_) return;
  dra_enabled_ = enabled;
  TryRestart();
}

void ImexPeersModule::TryRestart() {
  if (!state_.restart_pending || restarting_) return;
  if (config_.restart_policy == "never") {
    SetPending(true, "RestartPolicyNever", "nodes_config.cfg changed; restartPolicy never: drain, then "
                                           "systemctl restart the IMEX unit by hand");
    return;
  }
  if (config_.restart_policy == "whenIdle") {
    if (!dra_enabled_ || !prepared_claims_) {
      SetPending(true, "PreparedClaimsUnknown",
                 "nodes_config.cfg changed; the dra-compute-domain module is not running, so prepared channel claims "
                 "cannot be known: restart by hand after draining");
      return;
    }
    if (*prepared_claims_ > 0) {
      SetPending(true, "ChannelClaimPrepared",
                 "nodes_config.cfg changed; " + std::to_string(*prepared_claims_) +
                     " channel claim(s) prepared on this node: the IMEX restart waits for their unprepare");
      return;
    }
  }
  auto control = context_.GetServices().Find<imex_health::ImexUnitControl>();
  if (!control) {
    SetPending(true, "ImexHealthNotRunning", "nodes_config.cfg changed; imex-health (the systemd connection) is not running");
    return;
  }
  restarting_ = true;
  context_.Log().info("restarting {} to load the new node map", control->Unit());
  control->Restart([this, alive = alive_, unit = control->Unit()](std::string error) {
    if (!*alive) return;
    restarting_ = false;
    if (!error.empty()) {
      state_.last_error = "restarting " + unit + ": " + error;
      SetPending(true, "RestartFailed", state_.last_error);
      Publish();
      return;
    }
    ++state_.restarts;
    restarts_total_->Inc();
    SetPending(false, "MapLoaded", unit + " restarted with the current node map");
    if (auto recorder = context_.GetServices().Find<kube::EventRecorder>(); recorder && !context_.Site().node_name.empty()) {
      kube::ObjectReference node;
      node.name = context_.Site().node_name;
      recorder->Record(node, "Normal", "ImexRestarted", "RestartUnit", unit + " restarted to load " + path_);
    }
    Publish();
  });
}

void ImexPeersModule::SetPending(bool pending, std::string reason, std::string message) {
  const bool changed = pending != state_.restart_pending || reason != state_.pending_reason || message != pending_message_;
  state_.restart_pending = pending;
  state_.pending_reason = std::move(reason);
  pending_message_ = std::move(message);
  pending_gauge_->Set(pending ? 1 : 0);
  if (changed) {
    Publish();
    UpdateCondition();
  }
}

void ImexPeersModule::UpdateCondition() {
  if (context_.Site().node_name.empty()) return;
  if (!conditions_) {
    auto client = context_.GetServices().Find<kube::KubeClient>();
    if (!client) return;
    conditions_ = std::make_shared<kube::NodeConditions>(client, context_.GetClock(), std::string(kName));
  }
  if (condition_in_flight_) {
    condition_dirty_ = true;
    return;
  }
  kube::NodeCondition condition;
  condition.type = config_.condition_type;
  condition.status = state_.restart_pending ? "True" : "False";
  condition.reason = state_.pending_reason;
  condition.message = pending_message_;
  condition_in_flight_ = true;
  conditions_->Set(context_.Site().node_name, condition, [this, alive = alive_](kube::Result result) {
    if (!*alive) return;
    condition_in_flight_ = false;
    if (!result.Ok()) context_.Log().warn("Node condition {}: {}", config_.condition_type, result.error);
    if (condition_dirty_) {
      condition_dirty_ = false;
      UpdateCondition();
    }
  });
}

void ImexPeersModule::Publish() { context_.GetBus().Publish(state_); }

}  // namespace gns::imex_peers
