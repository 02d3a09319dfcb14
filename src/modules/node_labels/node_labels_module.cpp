// The node-labels module: see node_labels_module.hpp.
#include "modules/node_labels/node_labels_module.hpp"

#include "loop/supervisor_messages.hpp"
#include "modules/kube/api/client.hpp"

#include <algorithm>

namespace gns::node_labels {

namespace {

// The modules whose messages carry our inputs (their kName; only messages.hpp crosses a module
// wall, so the names are spelled here).
constexpr std::string_view kInventoryModule = "gpu-inventory";
constexpr std::string_view kPluginModule = "device-plugin";

}  // namespace

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

NodeLabelsModule::~NodeLabelsModule() { lifetime_.Close(); }

void NodeLabelsModule::Start() {
  if (context_.Site().node_name.empty()) throw std::runtime_error("node-labels needs the node name (site nodeName)");
  auto& bus = context_.GetBus();
  // Which inputs will come: the supervisor's retained snapshot lists every enabled module
  // before any starts. Without it (a test wiring the module alone) none is awaited.
  if (const auto* states = bus.Latest<ModuleStates>(); states != nullptr) {
    auto enabled = [states](std::string_view name) {
      return std::any_of(states->modules.begin(), states->modules.end(),
                         [name](const ModuleStatus& m) { return m.name == name; });
    };
    await_inventory_ = enabled(kInventoryModule);
    await_plugin_ = enabled(kPluginModule);
  }
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
    // Before the plugin has read the GPUs its resources (and so the MIG and sharing labels)
    // are not known: the last known state stands.
    if (!s.inventory_read) return;
    plugin_ = s;
    Recompute();
  });
  context_.GetBus().Publish(state_);
  Recompute();  // says what is awaited when nothing known has come yet
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
  context_.GetLoop().Post(lifetime_.Guard([this] {
    apply_posted_ = false;
    Apply();
  }));
}

std::string NodeLabelsModule::Unknown() const {
  std::string missing;
  auto add = [&missing](const char* what) { missing += (missing.empty() ? "" : ", ") + std::string(what); };
  if (await_inventory_ && !inventory_) add("the GPU inventory (gpu-inventory has not read the GPUs)");
  if (await_inventory_ && !clique_) add("the node's clique (gpu-inventory has not read it)");
  if (await_plugin_ && !plugin_) add("the device plugin's resources (device-plugin has not read the GPUs)");
  return missing;
}

void NodeLabelsModule::Apply() {
  if (in_flight_ || stopping_) return;
  if (applied_ && *applied_ == wanted_) return;
  // A server-side apply sets exactly the labels it carries: one our field manager owned and
  // left out is removed. So nothing is applied before every input is known (an apply of the
  // MIG strategy alone, before the GPUs are read, would drop every GPU label of an earlier
  // run); after that each input keeps its last known value (NVML down, the plugin restarting).
  if (const std::string missing = Unknown(); !missing.empty()) {
    if (state_.waiting_for != missing) {
      context_.Log().info("not applying the node labels before {} is known", missing);
      state_.waiting_for = missing;
      context_.GetBus().Publish(state_);
    }
    return;
  }
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
      [this, alive = lifetime_.Watch(), sent](kube::Result result) {
        if (!alive) return;
        in_flight_ = false;
        if (stopping_) return;
        if (result.Ok()) {
          applied_ = sent;
          state_.waiting_for.clear();
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
            if (!ec && alive) Apply();
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
