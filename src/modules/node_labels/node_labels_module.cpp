// The node-labels module: see node_labels_module.hpp.
#include "modules/node_labels/node_labels_module.hpp"

#include "modules/kube/client.hpp"

namespace gns::node_labels {

NodeLabelsModule::Config NodeLabelsModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  using std::chrono::milliseconds;
  Config config;
  config.field_manager = section.String("fieldManager", config.field_manager);
  if (config.field_manager.empty() || config.field_manager.size() > 128) {
    section.Fail("fieldManager", "must be 1 to 128 characters");
  }
  auto retry = section.Section("retry");
  config.retry.initial = retry.Duration("initial", milliseconds(10), milliseconds(60000), config.retry.initial);
  config.retry.max = retry.Duration("max", config.retry.initial, milliseconds(3600000), config.retry.max);
  retry.Finish();
  return config;
}

NodeLabelsModule::NodeLabelsModule(ModuleContext& context, const Config& config)
    : context_(context), config_(config), backoff_(config.retry), retry_timer_(context.GetLoop().Io()) {
  auto& m = context.Metrics();
  applies_total_ = &m.Counter("gpu_node_supervisor_node_labels_applies_total", "Server-side applies of the node labels");
  failures_total_ =
      &m.Counter("gpu_node_supervisor_node_labels_apply_failures_total", "Failed server-side applies of the node labels");
}

NodeLabelsModule::~NodeLabelsModule() { *alive_ = false; }

void NodeLabelsModule::Start() {
  if (context_.Site().node_name.empty()) throw std::runtime_error("node-labels needs the node name (site nodeName)");
  auto& bus = context_.GetBus();
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory& inv) {
    // While NVML is down the labels stay as they were: the GPUs did not leave.
    if (!inv.available) return;
    inventory_ = inv;
    Recompute();
  });
  clique_sub_ = bus.Subscribe<gpu_inventory::NodeClique>([this](const gpu_inventory::NodeClique& c) {
    if (!c.known) return;  // not read yet: neither a clique nor its absence
    clique_ = c;
    Recompute();
  });
  plugin_sub_ = bus.Subscribe<device_plugin::DevicePluginState>([this](const device_plugin::DevicePluginState& s) {
    plugin_ = s;
    Recompute();
  });
  context_.GetBus().Publish(state_);
}

void NodeLabelsModule::Recompute() {
  Labels next = ComputeLabels(inventory_ ? &*inventory_ : nullptr, clique_ ? &*clique_ : nullptr,
                              plugin_ ? &*plugin_ : nullptr);
  if (next == wanted_ && applied_) return;
  wanted_ = std::move(next);
  // Inputs often change together (the retained topics at start, an inventory re-read): one
  // apply for all of them, at the end of this loop turn.
  if (apply_posted_) return;
  apply_posted_ = true;
  context_.GetLoop().Post([this, alive = alive_] {
    if (!*alive) return;
    apply_posted_ = false;
    Apply();
  });
}

void NodeLabelsModule::Apply() {
  if (in_flight_ || stopping_) return;
  if (applied_ && *applied_ == wanted_) return;
  // Nothing known yet: an empty apply would only remove labels an earlier run of ours set.
  if (!applied_ && wanted_.empty()) return;
  auto client = context_.GetServices().Find<kube::KubeClient>();
  if (!client) {
    context_.SetHealth(ModuleHealth::kUnhealthy, "no Kubernetes client (is the kube module enabled?)");
    return;
  }
  const std::string& node = context_.Site().node_name;
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [k, v] : wanted_) labels[k] = v;
  const nlohmann::json body = {{"apiVersion", "v1"}, {"kind", "Node"},
                               {"metadata", {{"name", node}, {"labels", std::move(labels)}}}};
  in_flight_ = true;
  const Labels sent = wanted_;
  client->Patch(
      kube::ResourcePath::Core("nodes").Object(node), kube::PatchType::kApply, body, config_.field_manager,
      [this, alive = alive_, sent](kube::Result result) {
        if (!*alive) return;
        in_flight_ = false;
        if (stopping_) return;
        if (result.Ok()) {
          applied_ = sent;
          backoff_.Reset();
          applies_total_->Inc();
          state_.applied = sent;
          ++state_.applies;
          state_.last_error.clear();
          context_.SetHealth(ModuleHealth::kOk);
          context_.Log().info("node labels applied ({} labels)", sent.size());
          context_.GetBus().Publish(state_);
          Apply();  // a change that came in meanwhile
          return;
        }
        {
          failures_total_->Inc();
          state_.last_error = result.error;
          const auto delay = backoff_.Next();
          context_.Log().warn("applying the node labels failed: {}; retrying in {} ms", result.error, delay.count());
          context_.SetHealth(ModuleHealth::kDegraded, "node labels not applied: " + result.error);
          retry_timer_.expires_after(delay);
          retry_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
            if (!ec && *alive) Apply();
          });
        }
        context_.GetBus().Publish(state_);
      },
      /*force=*/true);
}

void NodeLabelsModule::Stop(std::function<void()> done) {
  stopping_ = true;
  retry_timer_.cancel();
  inventory_sub_.Reset();
  clique_sub_.Reset();
  plugin_sub_.Reset();
  done();
}

}  // namespace gns::node_labels
