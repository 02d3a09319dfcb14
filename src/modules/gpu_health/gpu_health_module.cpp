// The gpu-health module.
#include "modules/gpu_health/gpu_health_module.hpp"

#include "loop/atomic_file.hpp"
#include "modules/gpu_health/admin_socket.hpp"
#include "modules/kube/client.hpp"
#include "modules/kube/events.hpp"
#include "modules/kube/informer.hpp"
#include "modules/kube/kube_module.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <sys/stat.h>
#include <system_error>

namespace gns::gpu_health {
namespace {

constexpr std::size_t kMaxPending = 64;
constexpr std::size_t kMaxXidSeries = 256;
constexpr std::size_t kMaxStateBytes = 1 << 20;  // devices.json: far more than 1024 verdicts need
constexpr std::size_t kMaxSavedDevices = 1024;
constexpr std::size_t kMaxSavedText = 1024;  // reason, action, pci

// The site config tree as a YAML node, for ParseSiteOverrides (scalars stay text; the parser
// converts them).
YAML::Node ToYaml(const ConfigValue& value) {
  switch (value.kind) {
    case ConfigValue::Kind::kNull:
      return YAML::Node();
    case ConfigValue::Kind::kScalar:
      return YAML::Node(value.scalar);
    case ConfigValue::Kind::kSequence: {
      YAML::Node out(YAML::NodeType::Sequence);
      for (const auto& item : value.items) out.push_back(ToYaml(item));
      return out;
    }
    case ConfigValue::Kind::kMap: {
      YAML::Node out(YAML::NodeType::Map);
      for (const auto& entry : value.entries) out[entry.key] = ToYaml(entry.value);
      return out;
    }
  }
  return YAML::Node();
}

// Metric label values for malformed lines, by what the line started like.
std::string_view MalformedKind(LineKind attempted) {
  switch (attempted) {
    case LineKind::kXid: return "malformed_xid";
    case LineKind::kGpuUuid: return "malformed_gpu_uuid";
    case LineKind::kFallenOffBus: return "malformed_fallen_off_bus";
    case LineKind::kResetAck: return "malformed_reset_ack";
    default: return "malformed_other";
  }
}

int64_t UnixMs(const Clock& clock) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock.WallNow().time_since_epoch()).count();
}

}  // namespace

GpuHealthModule::Config GpuHealthModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  Config config;
  config.catalog_path = section.String("catalog", std::string(kDefaultCatalog));
  try {
    config.catalog = XidCatalog::LoadFile(config.catalog_path);
  } catch (const gpu_health::ConfigError& e) {
    section.Fail("catalog", e.what());
  }
  if (const ConfigValue* overrides = section.Raw("overrides"); overrides != nullptr) {
    try {
      config.overrides = ParseSiteOverrides(ToYaml(*overrides), overrides->where.ToString(), section.Path() + ".overrides");
    } catch (const gpu_health::ConfigError& e) {
      section.Fail("overrides", e.key_path() + ": " + e.message());
    }
  }
  config.check_name = section.String("checkName", config.check_name);
  config.condition_type = section.String("conditionType", config.condition_type);
  if (config.condition_type.empty()) section.Fail("conditionType", "must not be empty");
  config.agent = section.String("agent", config.agent);
  config.admin_socket = section.Bool("adminSocket", true);
  config.watch_annotation = section.Bool("watchAnnotation", true);
  config.recent_events = static_cast<std::size_t>(section.Int("recentEvents", 0, 1000, 32));
  return config;
}

GpuHealthModule::GpuHealthModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      policy_(config.catalog, config.overrides),
      warn_(context.GetClock()) {
  if (config_.admin_socket && !context.Site().paths.state_dir.empty()) {
    admin_path_ = context.Site().paths.state_dir + "/admin.sock";
  }
  auto& m = context.Metrics();
  const std::string devices = "gpu_node_supervisor_gpu_health_devices";
  const char* devices_help = "GPUs by health as decided by gpu-health";
  healthy_gauge_ = &m.Gauge(devices, devices_help, {{"health", "Healthy"}});
  unhealthy_gauge_ = &m.Gauge(devices, devices_help, {{"health", "Unhealthy"}});
  events_total_ = &m.Counter("gpu_node_supervisor_gpu_health_events_total", "Health events emitted");
  suppressed_total_ = &m.Counter("gpu_node_supervisor_gpu_health_suppressed_total",
                                 "XID occurrences swallowed by the per-(GPU, XID) rate limit");
  duplicates_total_ = &m.Counter("gpu_node_supervisor_gpu_health_xid_duplicates_total",
                                 "XID reports folded into one occurrence (NVML and the kernel log both saw it)");
  recoveries_total_ = &m.Counter("gpu_node_supervisor_gpu_health_recoveries_total",
                                 "Devices made Healthy again (reset ack, new boot, operator)");
  state_writes_failed_ = &m.Counter("gpu_node_supervisor_gpu_health_state_write_failures_total",
                                    "Failed writes of gpu-health/devices.json");
  state_corrupt_ = &m.Counter("gpu_node_supervisor_gpu_health_state_file_corrupt_total",
                              "gpu-health/devices.json files found corrupt or of an unknown version and moved aside");
  restored_total_ = &m.Counter("gpu_node_supervisor_gpu_health_restored_total",
                               "Unhealthy verdicts of the same boot restored from gpu-health/devices.json");
  if (!context.Site().paths.state_dir.empty()) {
    state_path_ = context.Site().paths.state_dir + "/gpu-health/devices.json";
  }
}

GpuHealthModule::~GpuHealthModule() {
  *alive_ = false;
  *writer_alive_ = false;
}

void GpuHealthModule::Start() {
  // Before anything can change a verdict: what this boot already decided.
  LoadVerdicts();
  auto& bus = context_.GetBus();
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>(
      [this](const gpu_inventory::GpuInventory& inv) { OnInventory(inv); });
  kernel_sub_ = bus.Subscribe<journald::KernelLine>(
      [this](const journald::KernelLine& line) { OnKernelLine(line, false); });
  unit_sub_ = bus.Subscribe<journald::UnitLine>([this](const journald::UnitLine& line) {
    if (line.acknowledgement) OnKernelLine(line, true);
  });
  journal_state_sub_ = bus.Subscribe<journald::JournalState>([this](const journald::JournalState& state) {
    if (!state.boot_id.empty()) OnBoot(state.boot_id);
  });
  nvml_sub_ = bus.Subscribe<gpu_inventory::XidObservation>(
      [this](const gpu_inventory::XidObservation& xid) { OnNvmlXid(xid); });
  if (!admin_path_.empty()) {
    admin_ = std::make_unique<AdminSocket>(context_.GetLoop().Io(), admin_path_,
                                           [this](std::string_view line) { return HandleAdminLine(line); });
    admin_->Start();
  }
  module_states_sub_ =
      bus.Subscribe<ModuleStates>([this](const ModuleStates& states) { OnModuleStates(states); });
  WatchAnnotation();
  UpdateGauges();
  PublishState();
  UpdateCondition();
  context_.Log().info("XID catalog {} ({} entries), {} ignored, {} critical, {} thresholds{}", config_.catalog_path,
                      config_.catalog.size(), config_.overrides.ignore.size(), config_.overrides.critical.size(),
                      config_.overrides.thresholds.size(), admin_ ? ", admin socket " + admin_path_ : "");
}

void GpuHealthModule::Stop(std::function<void()> done) {
  if (admin_) admin_->Stop();
  module_states_sub_.Reset();
  node_sub_.Reset();
  node_informer_.reset();
  *alive_ = false;
  // Done once the verdicts are on disk: the write in flight, then whatever changed since.
  stopping_ = true;
  stop_done_ = std::move(done);
  Flush();
}

// --- inputs -------------------------------------------------------------------------------

void GpuHealthModule::OnInventory(const gpu_inventory::GpuInventory& inventory) {
  if (!inventory.gpus.empty()) {
    gpus_ = inventory.gpus;
    directory_.SetInventory(gpus_);
  }
  // XIDs that arrived before we knew which GPU sits at their PCI address.
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::string uuid(directory_.UuidForPci(it->second.address));
    if (uuid.empty()) {
      ++it;
      continue;
    }
    MarkUnhealthy(uuid, it->second.pci, it->second.reason, it->second.xid, it->second.action);
    it = pending_.erase(it);
  }
  UpdateGauges();
  PublishState();
}

void GpuHealthModule::OnBoot(const std::string& boot_id) {
  if (boot_id == boot_id_) return;
  const bool first = boot_id_.empty();
  boot_id_ = boot_id;
  if (first) {
    ResolveBoot(boot_id);
    return;
  }
  // A reboot resets every GPU: whatever was unhealthy in the previous boot is not any more.
  context_.Log().info("new boot {}: every device is Healthy again", boot_id);
  policy_ = XidPolicy(config_.catalog, config_.overrides);
  pending_.clear();
  bool any = false;
  for (auto& [uuid, device] : devices_) any = MarkHealthy(uuid, "new boot") || any;
  // Without the host's boot ID the verdicts belong to the boot journald reports.
  if (!boot_from_host_) {
    if (const auto normal = NormalizeBootId(boot_id); !normal.empty() && normal != persist_boot_) {
      persist_boot_ = normal;
      Persist();
    }
  }
  // Seed 003: after a reboot the monitor sends a healthy event without entities (all of them).
  auto event = NewEvent("boot");
  event.is_fatal = true;
  event.is_healthy = true;
  event.message = "new boot " + boot_id;
  Emit(std::move(event), any, "Normal", "GpuHealthyAfterBoot");
}

void GpuHealthModule::OnKernelLine(const journald::JournalLine& line, bool acknowledgement) {
  if (!line.boot_id.empty()) OnBoot(line.boot_id);
  const ParsedLine parsed = ParseKernelLine(line.message);
  const Timestamp at(static_cast<int64_t>(line.realtime_usec));
  // The acknowledgement identifier is trusted for reset acknowledgements only.
  if (acknowledgement && parsed.kind() != LineKind::kResetAck) return;
  switch (parsed.kind()) {
    case LineKind::kUnrelated:
      return;
    case LineKind::kXid: {
      const XidLine& x = *parsed.xid();
      HandleXid(directory_.SubjectFor(x.pci), x.xid, at, "kernel", x.raw_detail);
      return;
    }
    case LineKind::kGpuUuid:
      Learn(parsed.gpu_uuid()->pci, parsed.gpu_uuid()->uuid);
      return;
    case LineKind::kFallenOffBus: {
      const auto& f = *parsed.fallen_off_bus();
      if (!f.pci) {
        Bad("fallen_off_bus_without_pci", "a \"fallen off the bus\" line without a PCI address: " + line.message.substr(0, 200));
        return;
      }
      // The driver reports it as XID 79 too; the policy's dedup folds the two together.
      HandleXid(directory_.SubjectFor(*f.pci), 79, at, "kernel", "GPU has fallen off the bus");
      return;
    }
    case LineKind::kResetAck:
      HandleResetAck(parsed.reset_ack()->uuid, parsed.reset_ack()->success);
      return;
    case LineKind::kMalformed: {
      const auto& m = *parsed.malformed();
      Bad(MalformedKind(m.attempted), m.Reason());
      return;
    }
  }
}

void GpuHealthModule::OnNvmlXid(const gpu_inventory::XidObservation& xid) {
  if (xid.uuid.empty() || xid.xid == 0 || xid.xid > UINT32_MAX) {
    Bad("bad_nvml_xid", "an NVML XID without a GPU or with XID " + std::to_string(xid.xid));
    return;
  }
  std::optional<PciAddress> pci;
  if (const auto text = directory_.PciForUuid(xid.uuid); !text.empty()) pci = ParsePciAddress(text);
  const int64_t ms = xid.observed_unix_ms != 0 ? xid.observed_unix_ms : UnixMs(context_.GetClock());
  HandleXid(XidSubject(xid.uuid, pci), static_cast<uint32_t>(xid.xid), Timestamp(ms * 1000), "nvml", {});
}

// --- decisions ----------------------------------------------------------------------------

void GpuHealthModule::HandleXid(const XidSubject& who, uint32_t xid, Timestamp at, std::string_view source,
                                std::string_view detail) {
  // Runs for every Xid line: nothing here allocates until something is reported or changes.
  const std::string_view uuid = who.uuid();
  const std::optional<PciAddress>& pci = who.address();
  const XidDecision decision =
      policy_.Decide(who.policy_id(), xid, at, source == "nvml" ? XidSource::kNvml : XidSource::kKernel);
  if (decision.verdict == Verdict::kDuplicate) {
    duplicates_total_->Inc();
    return;
  }
  // Occurrences, not reports: the second source's report of one was folded just above.
  if (uuid.empty()) {
    XidCounter(who.pci(), xid).Inc();  // labelled by PCI address until the UUID is known
  } else {
    XidCounter(uuid, xid).Inc();
  }
  if (decision.verdict == Verdict::kIgnored) return;
  if (!decision.known_xid) Bad("unknown_xid", "XID " + std::to_string(xid) + " is not in the catalog: CONTACT_SUPPORT");
  if (uuid.empty() && !gpus_.empty()) {
    Bad("unknown_pci", "XID " + std::to_string(xid) + " on PCI " + who.pci() + ", which is none of our GPUs");
  }
  if (!decision.emit) suppressed_total_->Inc();
  auto name = [&] {
    return decision.mnemonic.empty() ? "XID " + std::to_string(xid) : std::string(decision.mnemonic);
  };
  if (decision.verdict == Verdict::kFatal) {
    auto reason = [&] { return "XID " + std::to_string(xid) + " (" + name() + ")"; };
    if (!uuid.empty()) {
      // Already Unhealthy for this XID: MarkUnhealthy would change nothing.
      const auto it = devices_.find(uuid);
      if (it == devices_.end() || !it->second.published || it->second.health.healthy || it->second.health.xid != xid) {
        MarkUnhealthy(std::string(uuid), who.pci(), reason(), xid, decision.action);
      }
    } else if (pci && (pending_.size() < kMaxPending || pending_.count(pci->DeviceKey()))) {
      pending_[pci->DeviceKey()] = Pending{*pci, who.pci(), reason(), xid, decision.action};
    }
  }
  if (!decision.emit) return;
  auto event = NewEvent(source);
  event.is_fatal = decision.verdict == Verdict::kFatal;
  event.is_healthy = false;
  event.message = name();
  // Sanitised only now: most occurrences are not emitted.
  if (!detail.empty()) event.message += ": " + SanitizedText(detail, kMaxDetailBytes).substr(0, 512);
  if (decision.verdict == Verdict::kBelowThreshold) {
    event.message += " (" + std::to_string(decision.count_in_window) + " of " + std::to_string(decision.threshold) +
                     " within the window)";
  }
  event.recommended_action = static_cast<int>(decision.action);
  event.recommended_action_name = std::string(ActionName(decision.action));
  event.error_code = {std::to_string(xid)};
  if (pci) event.entities_impacted.push_back({"PCI", who.pci()});
  if (!uuid.empty()) event.entities_impacted.push_back({"GPU_UUID", std::string(uuid)});
  event.suppressed_before = decision.suppressed_before;
  const bool reportable = decision.verdict == Verdict::kFatal || decision.verdict == Verdict::kNonFatal;
  Emit(std::move(event), reportable, "Warning", decision.verdict == Verdict::kFatal ? "GpuXidFatal" : "GpuXid");
}

void GpuHealthModule::HandleResetAck(const std::string& uuid, std::optional<bool> success) {
  if (success.has_value() && !*success) {
    Bad("reset_failed", "the reset job reported a failed reset of " + uuid);
    auto event = NewEvent("reset-ack");
    event.is_fatal = true;
    event.message = "GPU reset failed";
    event.entities_impacted.push_back({"GPU_UUID", uuid});
    Emit(std::move(event), true, "Warning", "GpuResetFailed");
    return;
  }
  policy_.ForgetGpu(uuid);
  const std::string pci = directory_.PciForUuid(uuid);
  if (!pci.empty()) policy_.ForgetGpu(PciPolicyId(pci));
  const bool changed = MarkHealthy(uuid, "GPU reset occurred");
  // Seed 003: the healthy event names the GPU and its PCI address so the unhealthy one it
  // clears can be found.
  auto event = NewEvent("reset-ack");
  event.is_fatal = true;
  event.is_healthy = true;
  event.message = "GPU reset occurred";
  if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
  event.entities_impacted.push_back({"GPU_UUID", uuid});
  Emit(std::move(event), changed, "Normal", "GpuReset");
}

std::string GpuHealthModule::SetHealthy(std::string_view target, std::string_view who) {
  std::vector<std::string> uuids;
  if (target == "all") {
    for (const auto& [uuid, device] : devices_) {
      if (!device.health.healthy) uuids.push_back(uuid);
    }
  } else {
    if (target.size() < 5 || target.substr(0, 4) != "GPU-" || target.size() > kMaxUuidBytes) {
      return "error: expected a GPU UUID (GPU-…) or all, got \"" + std::string(target.substr(0, 80)) + "\"";
    }
    uuids.emplace_back(target);
  }
  std::size_t changed = 0;
  for (const auto& uuid : uuids) {
    policy_.ForgetGpu(uuid);
    const std::string pci = directory_.PciForUuid(uuid);
    if (!pci.empty()) policy_.ForgetGpu(PciPolicyId(pci));
    if (!MarkHealthy(uuid, "set healthy by " + std::string(who))) continue;
    ++changed;
    auto event = NewEvent("operator");
    event.is_fatal = true;
    event.is_healthy = true;
    event.message = "set healthy by " + std::string(who);
    if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
    event.entities_impacted.push_back({"GPU_UUID", uuid});
    Emit(std::move(event), true, "Normal", "GpuSetHealthy");
  }
  context_.Log().info("set-healthy {} by {}: {} device(s) made Healthy", target, who, changed);
  if (target != "all" && changed == 0) {
    return "ok: " + std::string(target) + " was not unhealthy";
  }
  return "ok: " + std::to_string(changed) + " device(s) set healthy";
}

std::string GpuHealthModule::HandleAdminLine(std::string_view line) {
  std::istringstream in{std::string(line)};
  std::string verb;
  std::string arg;
  std::string extra;
  in >> verb >> arg >> extra;
  if (verb == "set-healthy" && !arg.empty() && extra.empty()) return SetHealthy(arg, "admin socket");
  if (verb == "status" && arg.empty()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [uuid, device] : devices_) out[uuid] = device.health;
    return "ok: " + out.dump();
  }
  return "error: unknown request (expected \"set-healthy <GPU-uuid>|all\" or \"status\")";
}

// --- device state -------------------------------------------------------------------------

bool GpuHealthModule::MarkUnhealthy(const std::string& uuid, const std::string& pci, const std::string& reason,
                                    uint32_t xid, RecommendedAction action) {
  auto& device = devices_[uuid];
  if (device.published && !device.health.healthy && device.health.xid == xid) return false;
  const bool was_healthy = !device.published || device.health.healthy;
  device.health.uuid = uuid;
  device.health.healthy = false;
  device.health.reason = reason;
  device.health.xid = xid;
  device.health.recommended_action = std::string(ActionName(action));
  device.health.pci = pci.empty() ? directory_.PciForUuid(uuid) : pci;
  if (was_healthy) device.health.since_unix_ms = UnixMs(context_.GetClock());
  device.published = true;
  context_.Log().warn("{} is Unhealthy: {}, recommended action {}", uuid, reason, device.health.recommended_action);
  context_.GetBus().Publish(device.health);
  Persist();
  UpdateGauges();
  PublishState();
  UpdateCondition();
  return true;
}

bool GpuHealthModule::MarkHealthy(const std::string& uuid, const std::string& reason) {
  const auto it = devices_.find(uuid);
  if (it == devices_.end() || it->second.health.healthy) return false;
  auto& h = it->second.health;
  h.healthy = true;
  h.reason = reason;
  h.xid = 0;
  h.recommended_action.clear();
  h.since_unix_ms = UnixMs(context_.GetClock());
  recoveries_total_->Inc();
  context_.Log().info("{} is Healthy again: {}", uuid, reason);
  context_.GetBus().Publish(h);
  Persist();
  UpdateGauges();
  PublishState();
  UpdateCondition();
  return true;
}

void GpuHealthModule::Learn(const PciAddress& pci, const std::string& uuid) {
  const auto key = pci.DeviceKey();
  switch (directory_.Learn(pci, uuid)) {
    case GpuDirectory::LearnResult::kKnown:
      return;
    case GpuDirectory::LearnResult::kFull:
      Bad("too_many_gpu_uuid_lines", "more than " + std::to_string(GpuDirectory::kMaxLearned) +
                                         " PCI addresses learned; ignoring " + pci.ToString());
      return;
    case GpuDirectory::LearnResult::kLearned:
      break;
  }
  context_.Log().info("learned {} at PCI {} from the kernel log", uuid, pci.ToString());
  if (const auto p = pending_.find(key); p != pending_.end()) {
    MarkUnhealthy(uuid, p->second.pci, p->second.reason, p->second.xid, p->second.action);
    pending_.erase(p);
  }
  PublishState();
}

// --- outputs ------------------------------------------------------------------------------

HealthEvent GpuHealthModule::NewEvent(std::string_view source) const {
  HealthEvent event;
  event.agent = config_.agent;
  event.check_name = config_.check_name;
  event.node_name = context_.Site().node_name;
  event.source = std::string(source);
  const auto since_epoch = context_.GetClock().WallNow().time_since_epoch();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  event.generated_seconds = seconds.count();
  event.generated_nanos =
      static_cast<int32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - seconds).count());
  return event;
}

void GpuHealthModule::Emit(HealthEvent event, bool kube_event, std::string_view k8s_type,
                           std::string_view k8s_reason) {
  events_total_->Inc();
  if (kube_event && !event.node_name.empty()) {
    if (auto recorder = context_.GetServices().Find<kube::EventRecorder>()) {
      kube::ObjectReference node;
      node.name = event.node_name;
      std::string note = event.message;
      for (const auto& entity : event.entities_impacted) note += " " + entity.type + "=" + entity.value;
      if (!event.recommended_action_name.empty() && !event.is_healthy) {
        note += "; recommended action " + event.recommended_action_name;
      }
      recorder->Record(node, k8s_type, k8s_reason, event.is_healthy ? "Recovered" : "XidReported", note);
    }
  }
  if (config_.recent_events > 0) {
    recent_.push_back(event);
    while (recent_.size() > config_.recent_events) recent_.pop_front();
  }
  context_.GetBus().Publish(std::move(event));
  PublishState();
}

void GpuHealthModule::Bad(std::string_view kind, std::string_view what) {
  context_.Metrics()
      .Counter("gpu_node_supervisor_gpu_health_bad_input_total", "Unusable or unexpected input, by kind",
               {{"kind", std::string(kind)}})
      .Inc();
  warn_.Warn(context_.Log(), kind, what);
}

MetricsRegistry::Series& GpuHealthModule::XidCounter(std::string_view gpu, uint32_t xid) {
  if (const auto it = xid_series_.find(std::make_pair(gpu, xid)); it != xid_series_.end()) return *it->second;
  auto key = std::make_pair(std::string(gpu), xid);
  // Label values come from the input: cap the series so garbage cannot grow the registry.
  if (xid_series_.size() >= kMaxXidSeries) key = {"other", 0};
  if (const auto it = xid_series_.find(key); it != xid_series_.end()) return *it->second;
  auto& series = context_.Metrics().Counter(
      "gpu_node_supervisor_xid_errors_total", "XIDs seen, by GPU (UUID, or PCI address when unknown) and XID",
      {{"gpu", key.first.empty() ? "unknown" : key.first}, {"xid", key.second == 0 ? "other" : std::to_string(key.second)}});
  xid_series_.emplace(key, &series);
  return series;
}

void GpuHealthModule::UpdateGauges() {
  std::size_t unhealthy = 0;
  for (const auto& [uuid, device] : devices_) unhealthy += device.health.healthy ? 0 : 1;
  std::size_t total = gpus_.size();
  for (const auto& [uuid, device] : devices_) {
    if (std::none_of(gpus_.begin(), gpus_.end(), [&](const auto& g) { return g.uuid == uuid; })) ++total;
  }
  healthy_gauge_->Set(static_cast<double>(total - unhealthy));
  unhealthy_gauge_->Set(static_cast<double>(unhealthy));
  for (const auto& [uuid, device] : devices_) {
    context_.Metrics()
        .Gauge("gpu_node_supervisor_gpu_healthy", "1 while the GPU is Healthy, 0 while Unhealthy", {{"gpu", uuid}})
        .Set(device.health.healthy ? 1 : 0);
  }
}

void GpuHealthModule::PublishState() {
  GpuHealthState state;
  state.boot_id = boot_id_;
  state.catalog_source = config_.catalog_path;
  for (const auto& [uuid, device] : devices_) state.devices.push_back(device.health);
  state.recent_events.assign(recent_.begin(), recent_.end());
  state.pci_to_uuid = directory_.Learned();
  context_.GetBus().Publish(std::move(state));
}

void GpuHealthModule::UpdateCondition() {
  if (context_.Site().node_name.empty()) return;
  if (!conditions_) {
    auto client = context_.GetServices().Find<kube::KubeClient>();
    if (!client) return;
    conditions_ = std::make_shared<kube::NodeConditions>(client, context_.GetClock(), std::string(kName));
    WatchAnnotation();
  }
  if (condition_in_flight_) {
    condition_dirty_ = true;
    return;
  }
  kube::NodeCondition condition;
  condition.type = config_.condition_type;
  std::vector<std::string> bad;
  for (const auto& [uuid, device] : devices_) {
    if (!device.health.healthy) bad.push_back(uuid + ": " + device.health.reason + " → " + device.health.recommended_action);
  }
  if (bad.empty()) {
    condition.status = "True";
    condition.reason = "NoFatalXid";
    condition.message = "no GPU has an unrecovered fatal XID";
  } else {
    condition.status = "False";
    condition.reason = "FatalXid";
    condition.message = std::to_string(bad.size()) + " GPU(s) unhealthy: ";
    for (std::size_t i = 0; i < bad.size(); ++i) condition.message += (i ? "; " : "") + bad[i];
  }
  condition_in_flight_ = true;
  conditions_->Set(context_.Site().node_name, condition, [this, alive = alive_](kube::Result result) {
    if (!*alive) return;
    condition_in_flight_ = false;
    if (!result.Ok()) warn_.Warn(context_.Log(), "node_condition_failed", result.error);
    if (condition_dirty_) {
      condition_dirty_ = false;
      UpdateCondition();
    }
  });
}

void GpuHealthModule::OnModuleStates(const ModuleStates& states) {
  const auto kube = std::find_if(states.modules.begin(), states.modules.end(),
                                 [](const ModuleStatus& m) { return m.name == kube::KubeModule::kName; });
  if (kube == states.modules.end()) return;  // not enabled: nothing to follow
  const bool running = kube->state == ModuleState::kRunning;
  const bool first = !kube_running_.has_value();
  if (!first && *kube_running_ == running) return;
  kube_running_ = running;
  if (first) return;  // Start() already used whatever was there
  // Built on the instance that went away (or on none): drop, and if it runs again, rebuild.
  conditions_.reset();
  node_sub_.Reset();
  node_informer_.reset();
  condition_in_flight_ = false;  // an answer from the stopped client may never come
  if (!running) return;
  context_.Log().info("the kube module runs again: Node condition and annotation watch follow it");
  WatchAnnotation();
  UpdateCondition();
}

void GpuHealthModule::WatchAnnotation() {
  if (!config_.watch_annotation || node_informer_ || context_.Site().node_name.empty()) return;
  auto registry = context_.GetServices().Find<kube::InformerRegistry>();
  if (!registry) return;
  kube::InformerSpec spec;
  spec.path = kube::ResourcePath::Core("nodes").Collection();
  spec.field_selector = "metadata.name=" + context_.Site().node_name;
  informer_key_ = spec.Key();
  node_sub_ = context_.GetBus().Subscribe<kube::ResourceEvent>(
      [this](const kube::ResourceEvent& event) { OnNodeEvent(event); });
  node_informer_ = registry->Acquire(spec);
}

void GpuHealthModule::OnNodeEvent(const kube::ResourceEvent& event) {
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
    const auto answer = SetHealthy(target, "Node annotation");
    if (answer.rfind("error", 0) == 0) Bad("bad_set_healthy_annotation", answer);
  }
  // One-shot: take the annotation off so the same request can be made again later.
  if (auto client = context_.GetServices().Find<kube::KubeClient>()) {
    nlohmann::json patch = {{"metadata", {{"annotations", {{key, nullptr}}}}}};
    client->Patch(kube::ResourcePath::Core("nodes").Object(context_.Site().node_name), kube::PatchType::kMerge, patch,
                  std::string(kName), [this, alive = alive_](kube::Result result) {
                    if (*alive && !result.Ok()) warn_.Warn(context_.Log(), "annotation_clear_failed", result.error);
                  });
  }
}

// --- persistence: <stateDir>/gpu-health/devices.json ----------------------------------------

std::string GpuHealthModule::NormalizeBootId(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  std::string out;
  std::size_t dashes = 0;
  for (const char c : text) {
    if (c == '-') {
      ++dashes;
      continue;
    }
    if (!std::isxdigit(static_cast<unsigned char>(c))) return {};
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (out.size() != 32 || (dashes != 0 && dashes != 4)) return {};
  return out;
}

std::string GpuHealthModule::SerializeVerdicts(const SavedVerdicts& saved) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& d : saved.devices) {
    devices.push_back({{"uuid", d.uuid},
                       {"healthy", d.healthy},
                       {"reason", d.reason},
                       {"xid", d.xid},
                       {"recommendedAction", d.recommended_action},
                       {"sinceUnixMs", d.since_unix_ms},
                       {"pci", d.pci}});
  }
  return nlohmann::json{{"version", kStateFileVersion}, {"bootId", saved.boot_id}, {"devices", devices}}.dump(2) +
         "\n";
}

std::optional<GpuHealthModule::SavedVerdicts> GpuHealthModule::ParseVerdicts(std::string_view text,
                                                                             std::string& error) {
  if (text.size() > kMaxStateBytes) {
    error = "larger than " + std::to_string(kMaxStateBytes) + " bytes";
    return std::nullopt;
  }
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) {
    error = "not valid JSON (truncated or garbled)";
    return std::nullopt;
  }
  if (!doc.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    error = "no integer version";
    return std::nullopt;
  }
  if (version->get<int64_t>() != kStateFileVersion) {
    error = "unknown version " + std::to_string(version->get<int64_t>()) + " (this build reads " +
            std::to_string(kStateFileVersion) + ")";
    return std::nullopt;
  }
  SavedVerdicts out;
  const auto boot = doc.find("bootId");
  if (boot == doc.end() || !boot->is_string() ||
      (!boot->get<std::string>().empty() && NormalizeBootId(boot->get<std::string>()) != boot->get<std::string>())) {
    error = "bootId is not 32 lowercase hex digits";
    return std::nullopt;
  }
  out.boot_id = boot->get<std::string>();
  const auto devices = doc.find("devices");
  if (devices == doc.end() || !devices->is_array() || devices->size() > kMaxSavedDevices) {
    error = "devices is not an array of at most " + std::to_string(kMaxSavedDevices) + " entries";
    return std::nullopt;
  }
  auto text_field = [](const nlohmann::json& d, const char* key, std::string& into) {
    const auto it = d.find(key);
    if (it == d.end() || !it->is_string() || it->get_ref<const std::string&>().size() > kMaxSavedText) return false;
    into = it->get<std::string>();
    return true;
  };
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const auto& d = (*devices)[i];
    const std::string where = "devices[" + std::to_string(i) + "]";
    DeviceHealth h;
    if (!d.is_object()) {
      error = where + " is not an object";
      return std::nullopt;
    }
    if (!text_field(d, "uuid", h.uuid) || h.uuid.size() < 5 || h.uuid.rfind("GPU-", 0) != 0 ||
        h.uuid.size() > kMaxUuidBytes) {
      error = where + ".uuid is not a GPU UUID";
      return std::nullopt;
    }
    const auto healthy = d.find("healthy");
    const auto xid = d.find("xid");
    const auto since = d.find("sinceUnixMs");
    if (healthy == d.end() || !healthy->is_boolean() || xid == d.end() || !xid->is_number_unsigned() ||
        xid->get<uint64_t>() > std::numeric_limits<uint32_t>::max() || since == d.end() ||
        !since->is_number_integer() || !text_field(d, "reason", h.reason) ||
        !text_field(d, "recommendedAction", h.recommended_action) || !text_field(d, "pci", h.pci)) {
      error = where + " (" + h.uuid + "): healthy, reason, xid, recommendedAction, sinceUnixMs or pci missing or "
              "of the wrong type";
      return std::nullopt;
    }
    h.healthy = healthy->get<bool>();
    h.xid = xid->get<uint64_t>();
    h.since_unix_ms = since->get<int64_t>();
    if (std::any_of(out.devices.begin(), out.devices.end(), [&](const auto& o) { return o.uuid == h.uuid; })) {
      error = where + ": " + h.uuid + " appears twice";
      return std::nullopt;
    }
    out.devices.push_back(std::move(h));
  }
  return out;
}

void GpuHealthModule::LoadVerdicts() {
  if (state_path_.empty()) return;
  namespace fs = std::filesystem;
  const std::string& root = context_.Site().paths.host_root;
  const std::string boot_path = (fs::path(root.empty() ? "/" : root) / "proc/sys/kernel/random/boot_id").string();
  std::string text;
  std::string error;
  if (ReadWholeFile(boot_path, text, error)) {
    persist_boot_ = NormalizeBootId(text);
    if (persist_boot_.empty()) Bad("bad_boot_id", boot_path + " does not hold a boot ID");
  }
  boot_from_host_ = !persist_boot_.empty();
  if (!boot_from_host_) {
    context_.Log().info("{} unreadable: the saved verdicts wait for the boot journald reports", boot_path);
  }

  std::error_code ec;
  if (!fs::exists(state_path_, ec)) return;
  if (!ReadWholeFile(state_path_, text, error)) {
    Bad("unreadable_state_file", error + "; starting with every device Healthy");
    return;
  }
  auto saved = ParseVerdicts(text, error);
  if (!saved) {
    const int64_t now_s = UnixMs(context_.GetClock()) / 1000;
    const std::string aside = state_path_ + ".corrupt-" + std::to_string(now_s);
    fs::rename(state_path_, aside, ec);
    state_corrupt_->Inc();
    context_.Log().error("{}: {}; {}, starting with every device Healthy", state_path_, error,
                         ec ? "could not move it aside (" + ec.message() + ")" : "moved to " + aside);
    return;
  }
  if (!boot_from_host_) {
    awaiting_boot_ = std::move(*saved);
    return;
  }
  if (saved->boot_id == persist_boot_) {
    Restore(*saved);
    return;
  }
  context_.Log().info("the saved verdicts belong to boot {}, this is boot {}: every device starts Healthy",
                      saved->boot_id.empty() ? "(unknown)" : saved->boot_id, persist_boot_);
  Persist();  // the file now says which boot it is
}

void GpuHealthModule::ResolveBoot(const std::string& boot_id) {
  if (boot_from_host_ || state_path_.empty()) return;
  const std::string normal = NormalizeBootId(boot_id);
  if (normal.empty()) return;
  persist_boot_ = normal;
  if (awaiting_boot_) {
    auto saved = std::move(*awaiting_boot_);
    awaiting_boot_.reset();
    if (saved.boot_id == normal) {
      Restore(saved);
      UpdateGauges();
      PublishState();
      UpdateCondition();
    } else {
      context_.Log().info("the saved verdicts belong to boot {}, journald reports boot {}: not restored",
                          saved.boot_id.empty() ? "(unknown)" : saved.boot_id, normal);
    }
  }
  // Whatever this run decided while the boot was unknown, and the file's boot.
  Persist();
}

void GpuHealthModule::Restore(const SavedVerdicts& saved) {
  std::size_t restored = 0;
  for (const auto& h : saved.devices) {
    if (h.healthy) continue;  // Healthy is where every device starts
    auto& device = devices_[h.uuid];
    if (device.published) continue;  // a verdict of this run is newer
    device.health = h;
    device.published = true;
    ++restored;
    context_.Log().warn("{} stays Unhealthy (restored, boot {}): {}, recommended action {}", h.uuid, saved.boot_id,
                        h.reason, h.recommended_action);
    context_.GetBus().Publish(device.health);
  }
  restored_total_->Inc(static_cast<double>(restored));
}

void GpuHealthModule::Persist() {
  if (state_path_.empty()) return;
  dirty_ = true;
  Flush();
}

void GpuHealthModule::Flush() {
  // One write at a time, each of the newest verdicts: an older one never lands after a newer.
  // Nothing is written while the boot is unknown: such a file could never be restored.
  if (!dirty_ || writing_ || state_path_.empty() || persist_boot_.empty()) {
    if (stopping_ && !writing_) FinishStop();
    return;
  }
  dirty_ = false;
  writing_ = true;
  SavedVerdicts saved;
  saved.boot_id = persist_boot_;
  for (const auto& [uuid, device] : devices_) {
    if (device.published) saved.devices.push_back(device.health);
  }
  context_.Pool().Run(
      [path = state_path_, content = SerializeVerdicts(saved)] {
        const std::filesystem::path dir = std::filesystem::path(path).parent_path();
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) return FileWriteResult{false, "creating " + dir.string() + ": " + ec.message()};
        if (::chmod(dir.c_str(), 0700) != 0) {
          return FileWriteResult{false, "chmod 0700 " + dir.string() + ": " + std::strerror(errno)};
        }
        return WriteFileAtomically(path, content, 0600);
      },
      [this, alive = writer_alive_](FileWriteResult result, std::exception_ptr error) {
        if (!*alive) return;
        writing_ = false;
        if (error || !result) {
          state_writes_failed_->Inc();
          warn_.Warn(context_.Log(), "state_write_failed", error ? "exception writing " + state_path_ : result.error);
        }
        Flush();  // what changed meanwhile, or the end of a stop
      });
}

void GpuHealthModule::FinishStop() {
  if (!stop_done_) return;
  auto done = std::move(stop_done_);
  stop_done_ = nullptr;
  done();
}

}  // namespace gns::gpu_health
