// The imex-peers module: see imex_peers_module.hpp.
#include "modules/imex_peers/imex_peers_module.hpp"
#include "modules/imex_peers/api/node_address.hpp"

#include "loop/atomic_file.hpp"
#include "modules/imex_health/api/unit_control.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/condition_writer.hpp"
#include "modules/kube/api/events.hpp"
#include "modules/kube/api/informer.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <sstream>

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
  diverged_gauge_ = &m.Gauge("gpu_node_supervisor_imex_peers_map_diverged",
                             "1 while the map the running IMEX loaded is not (known to be) the clique's");
  condition_ = std::make_unique<kube::NodeConditionWriter>(
      context.GetClock(), kube::NodeConditionWriter::Options{context.Site().node_name, std::string(kName)},
      [&context] { return context.GetServices().Find<kube::KubeClient>(); },
      [this](const std::string& error) { context_.Log().warn("Node condition {}: {}", config_.condition_type, error); });
}

ImexPeersModule::~ImexPeersModule() { lifetime_.Close(); }

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
  health_sub_ = bus.Subscribe<imex_health::ImexHealth>([this](const imex_health::ImexHealth& h) { OnImexHealth(h); });
  SetPending(false, "NoChange", "waiting for this node's clique");
  Publish();
}

void ImexPeersModule::Stop(std::function<void()> done) {
  lifetime_.Close();
  clique_sub_.Reset();
  resource_sub_.Reset();
  synced_sub_.Reset();
  dra_sub_.Reset();
  states_sub_.Reset();
  health_sub_.Reset();
  informer_.reset();
  self_informer_.reset();
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
  auto registry = context_.GetServices().Find<kube::InformerRegistry>();
  if (!registry) return;
  WatchSelf();
  kube::InformerSpec spec;
  spec.path = kube::ResourcePath::Core("nodes").Collection();
  spec.label_selector = config_.clique_label + "=" + clique_;
  informer_key_ = spec.Key();
  informer_ = registry->Acquire(spec);
  Publish();
}

// This node's own Node, by name: the map's own entry, whether or not the clique label is on
// it yet (node-labels applies it at start, after we may have listed the clique).
void ImexPeersModule::WatchSelf() {
  if (self_informer_) return;
  if (context_.Site().node_name.empty()) {
    state_.last_error = "the site has no nodeName: this node's own entry is not known, so the map is not written";
    context_.Log().warn("{}", state_.last_error);
    return;
  }
  auto registry = context_.GetServices().Find<kube::InformerRegistry>();
  if (!registry) return;
  kube::InformerSpec spec;
  spec.path = kube::ResourcePath::Core("nodes").Collection();
  spec.field_selector = "metadata.name=" + context_.Site().node_name;
  self_key_ = spec.Key();
  self_informer_ = registry->Acquire(spec);
  ReadSelf();  // shared with imex-health: it may have listed already
}

void ImexPeersModule::ReadSelf() {
  if (!self_informer_ || !self_informer_->Synced()) return;
  const auto node = self_informer_->Get(context_.Site().node_name);
  std::optional<std::string> address;
  if (node) address = NodeAddressOf(*node, config_.address_type);
  if (address == self_address_) return;
  self_address_ = std::move(address);
  if (synced_) Reconcile();
}

void ImexPeersModule::OnResourceEvent(const kube::ResourceEvent& event) {
  if (!self_key_.empty() && event.informer_key == self_key_) {
    ReadSelf();
    return;
  }
  if (event.informer_key != informer_key_ || !event.object) return;
  const auto meta = kube::ObjectMeta::From(*event.object);
  if (!meta) return;
  if (event.type == kube::ResourceEvent::Type::kDeleted) {
    addresses_.erase(meta->name);
  } else {
    addresses_[meta->name] = NodeAddressOf(*event.object, config_.address_type);
  }
  if (synced_) Reconcile();
}

void ImexPeersModule::OnSynced(const kube::InformerSynced& synced) {
  if (!self_key_.empty() && synced.informer_key == self_key_) {
    ReadSelf();
    return;
  }
  if (synced.informer_key != informer_key_ || !synced.synced || synced_) return;
  synced_ = true;
  Reconcile();
}

void ImexPeersModule::Reconcile() {
  // This node's own entry comes from its own Node, never from the label (which may not be on
  // it yet): without it, no map is written at all.
  const std::string& self = context_.Site().node_name;
  if (self.empty() || !self_address_ || self_address_->empty()) {
    if (!self.empty() && self_informer_ && self_informer_->Synced()) {  // not listed yet: just wait
      self_error_ = !self_address_ ? "this node's own Node " + self + " is not listed: the map is not written"
                                   : "this node's own Node " + self + " has no " + config_.address_type +
                                         " address: the map is not written (it must contain this node)";
      if (state_.last_error != self_error_) context_.Log().warn("{}", self_error_);
      state_.last_error = self_error_;
    }
    Publish();
    return;
  }
  if (!self_error_.empty() && state_.last_error == self_error_) state_.last_error.clear();
  self_error_.clear();
  std::vector<std::string> addresses{*self_address_};
  state_.without_address.clear();
  for (const auto& [name, address] : addresses_) {
    if (name == self) continue;
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
  if (on_disk_ && *on_disk_ == desired) {
    CheckConsistency();
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
      lifetime_.Guard([this, desired](std::pair<bool, std::string> result, std::exception_ptr) {
        writing_ = false;
        if (result.first) {
          on_disk_ = desired;
          ++state_.writes;
          writes_total_->Inc();
          state_.last_error.clear();
          context_.Log().info("{} rewritten: {}", path_, JoinList(state_.peers));
          pending_for_divergence_ = false;  // the write is the cause now
          // Due, and TryRestart says why it waits or that it restarts: one condition write with
          // the real reason, not a provisional one replaced a moment later.
          state_.restart_pending = true;
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
      }));
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
  // Why a restart is due: our write, or a running map that diverges from the clique's.
  auto wait = [&](const char* reason, const std::string& why) {
    if (pending_for_divergence_) SetPending(true, "LoadedMapDiverges", divergence_message_ + "; " + why);
    else SetPending(true, reason, "nodes_config.cfg changed; " + why);
  };
  if (config_.restart_policy == "never") {
    wait("RestartPolicyNever", "restartPolicy never: drain, then systemctl restart the IMEX unit by hand");
    return;
  }
  if (config_.restart_policy == "whenIdle") {
    if (!dra_enabled_ || !prepared_claims_) {
      wait("PreparedClaimsUnknown",
           "the dra-compute-domain module is not running, so prepared channel claims cannot be known: restart by "
           "hand after draining");
      return;
    }
    if (*prepared_claims_ > 0) {
      wait("ChannelClaimPrepared", std::to_string(*prepared_claims_) +
                                       " channel claim(s) prepared on this node: the IMEX restart waits for their "
                                       "unprepare");
      return;
    }
  }
  auto control = context_.GetServices().Find<imex_health::ImexUnitControl>();
  if (!control) {
    wait("ImexHealthNotRunning", "imex-health (the systemd connection) is not running");
    return;
  }
  restarting_ = true;
  restarted_run_ = run_;  // consistency is judged again on the run the restart starts
  wait("Restarting", "restarting " + control->Unit());
  context_.Log().info("restarting {} to load the {}", control->Unit(),
                      pending_for_divergence_ ? "clique's map (the running map diverges)" : "new node map");
  control->Restart(lifetime_.Guard([this, unit = control->Unit()](std::string error) {
    restarting_ = false;
    if (!error.empty()) {
      restarted_run_ = 0;
      state_.last_error = "restarting " + unit + ": " + error;
      SetPending(true, "RestartFailed", state_.last_error);
      Publish();
      return;
    }
    ++state_.restarts;
    restarts_total_->Inc();
    pending_for_divergence_ = false;
    SetPending(false, "MapLoaded", unit + " restarted with the current node map");
    if (auto recorder = context_.GetServices().Find<kube::EventRecorder>(); recorder && !context_.Site().node_name.empty()) {
      kube::ObjectReference node;
      node.name = context_.Site().node_name;
      recorder->Record(node, "Normal", "ImexRestarted", "RestartUnit", unit + " restarted to load " + path_);
    }
    Publish();
  }));
}

void ImexPeersModule::OnImexHealth(const imex_health::ImexHealth& health) {
  const bool active = health.active_state == "active" || health.active_state == "reloading";
  const uint64_t run = active ? health.active_enter_usec : 0;
  if (run == run_) return;
  run_ = run;
  ReadLoaded();
}

void ImexPeersModule::ReadLoaded() {
  if (run_ == 0 || loaded_run_ == run_ || reading_loaded_) {
    CheckConsistency();
    return;
  }
  // A new run: it loaded the file as it is now, unless the file changed after the run began
  // (then what it loaded is not known).
  reading_loaded_ = true;
  const uint64_t run = run_;
  context_.Pool().Run(
      [path = path_] {
        std::pair<std::optional<std::string>, uint64_t> out{std::nullopt, 0};
        struct stat st {};
        std::string text, error;
        if (::stat(path.c_str(), &st) == 0 && ReadWholeFile(path, text, error)) {
          out.first = std::move(text);
          out.second = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000u + static_cast<uint64_t>(st.st_mtim.tv_nsec) / 1000u;
        }
        return out;
      },
      lifetime_.Guard([this, run](std::pair<std::optional<std::string>, uint64_t> read, std::exception_ptr) {
        reading_loaded_ = false;
        loaded_run_ = run;
        if (read.first) on_disk_ = *read.first;  // a hand edit is seen here, and put right below
        loaded_known_ = read.first.has_value() && read.second <= run;
        loaded_.clear();
        if (loaded_known_) {
          std::istringstream in(*read.first);
          for (std::string line; std::getline(in, line);) {
            if (!line.empty()) loaded_.push_back(line);
          }
          std::sort(loaded_.begin(), loaded_.end());
          loaded_.erase(std::unique(loaded_.begin(), loaded_.end()), loaded_.end());
        }
        if (run_ != run) {
          ReadLoaded();  // another run began meanwhile
        } else if (synced_) {
          Reconcile();  // rewrites a file that is not the clique's map, then judges consistency
        } else {
          CheckConsistency();
        }
      }));
}

void ImexPeersModule::CheckConsistency() {
  const bool this_run = run_ != 0 && loaded_run_ == run_ && !reading_loaded_;
  state_.loaded_known = this_run && loaded_known_;
  state_.loaded = state_.loaded_known ? loaded_ : std::vector<std::string>{};
  bool diverged = false;
  std::string why;
  if (this_run && synced_ && !state_.peers.empty()) {
    if (!loaded_known_) {
      diverged = true;
      why = path_ + " changed after the running IMEX started: the map it loaded is not known to be the clique's (" +
            JoinList(state_.peers) + ")";
    } else if (loaded_ != state_.peers) {
      diverged = true;
      why = "the running IMEX loaded " + (loaded_.empty() ? std::string("an empty map") : JoinList(loaded_)) +
            "; the clique's Nodes give " + JoinList(state_.peers);
    }
  }
  state_.diverged = diverged;
  diverged_gauge_->Set(diverged ? 1 : 0);
  const bool ours_in_motion = restarting_ || writing_ || (restarted_run_ != 0 && run_ == restarted_run_) ||
                              !on_disk_ || *on_disk_ != Render(state_.peers);
  if (!ours_in_motion && this_run && synced_) {
    if (diverged && (!state_.restart_pending || pending_for_divergence_)) {
      if (!pending_for_divergence_ || why != divergence_message_) {
        context_.Log().warn("{}", why);
      }
      pending_for_divergence_ = true;
      divergence_message_ = why;
      SetPending(true, "LoadedMapDiverges", why);
      TryRestart();
    } else if (!diverged && pending_for_divergence_) {
      pending_for_divergence_ = false;
      SetPending(false, "MapLoaded", "the running IMEX loaded the clique's map");
    }
  }
  Publish();
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
  condition_->Set(kube::NodeCondition{config_.condition_type, state_.restart_pending ? "True" : "False",
                                      state_.pending_reason, pending_message_});
}

void ImexPeersModule::Publish() { context_.GetBus().Publish(state_); }

}  // namespace gns::imex_peers
