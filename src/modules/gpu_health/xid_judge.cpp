// The XID judge (see xid_judge.hpp).
#include "modules/gpu_health/xid_judge.hpp"

#include "modules/gpu_health/recovery_action.hpp"

#include <cstdio>
#include <utility>

namespace gns::gpu_health {
namespace {

constexpr std::size_t kMaxPending = 64;

// "7d", "36h", "90m", "45s", "250ms": the largest unit that says the window exactly.
std::string WindowText(std::chrono::milliseconds window) {
  const int64_t ms = window.count();
  constexpr std::pair<int64_t, const char*> kUnits[] = {
      {24 * 3600 * 1000, "d"}, {3600 * 1000, "h"}, {60 * 1000, "m"}, {1000, "s"}};
  for (const auto& [unit, name] : kUnits) {
    if (ms % unit == 0) return std::to_string(ms / unit) + name;
  }
  return std::to_string(ms) + "ms";
}

int64_t UnixMs(Timestamp at) { return at.count() / 1000; }

// Metric label values for malformed lines, by what the line started like.
std::string_view MalformedKind(LineKind attempted) {
  switch (attempted) {
    case LineKind::kXid: return "malformed_xid";
    case LineKind::kGpuUuid: return "malformed_gpu_uuid";
    case LineKind::kFallenOffBus: return "malformed_fallen_off_bus";
    case LineKind::kResetAck: return "malformed_reset_ack";
    case LineKind::kSxid: return "malformed_sxid";
    default: return "malformed_other";
  }
}

}  // namespace

XidJudge::XidJudge(const XidCatalog& catalog, const SiteOverrides& overrides, Settings settings, spdlog::logger& log,
                   Outputs outputs)
    : catalog_(catalog),
      overrides_(overrides),
      settings_(std::move(settings)),
      log_(log),
      out_(std::move(outputs)),
      policy_(catalog, overrides) {}

// --- inputs -------------------------------------------------------------------------------

void XidJudge::OnInventory(const std::vector<gpu_inventory::GpuInfo>& gpus, int64_t now_unix_ms) {
  if (!gpus.empty()) {
    gpus_ = gpus.size();
    directory_.SetInventory(gpus);
    switch_ports_.Update(gpus);
  }
  // XIDs that arrived before we knew which GPU sits at their PCI address.
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::string uuid(directory_.UuidForPci(it->second.address));
    if (uuid.empty()) {
      ++it;
      continue;
    }
    const Pending p = it->second;
    it = pending_.erase(it);
    MarkUnhealthy(uuid, p.pci, p.reason, p.xid, p.action, now_unix_ms, p.gpu_instance);
  }
}

void XidJudge::OnKernelLine(std::string_view message, uint64_t at_usec, bool acknowledgement, int64_t now_unix_ms) {
  const ParsedLine parsed = ParseKernelLine(message);
  const Timestamp at(static_cast<int64_t>(at_usec));
  if (acknowledgement && parsed.kind() != LineKind::kResetAck) return;
  switch (parsed.kind()) {
    case LineKind::kUnrelated:
      return;
    case LineKind::kXid: {
      const XidLine& x = *parsed.xid();
      const XidSubject who = directory_.SubjectFor(x.pci);
      if (x.xid == kRecoveryActionXid) {
        HandleRecoveryAction(who, x, at, now_unix_ms);  // the driver's action is for the GPU
      } else {
        HandleXid(who, x.xid, at, XidSource::kKernel, x.raw_detail, now_unix_ms, x.gpu_instance.value_or(kWholeGpu));
      }
      return;
    }
    case LineKind::kGpuUuid:
      Learn(parsed.gpu_uuid()->pci, parsed.gpu_uuid()->uuid, now_unix_ms);
      return;
    case LineKind::kFallenOffBus: {
      const auto& f = *parsed.fallen_off_bus();
      if (!f.pci) {
        out_.bad("fallen_off_bus_without_pci",
                 "a \"fallen off the bus\" line without a PCI address: " + SanitizedText(message, 200));
        return;
      }
      // The driver reports it as XID 79 too; the policy's dedup folds the two together.
      HandleXid(directory_.SubjectFor(*f.pci), 79, at, XidSource::kKernel, "GPU has fallen off the bus", now_unix_ms);
      return;
    }
    case LineKind::kResetAck:
      HandleResetAck(*parsed.reset_ack(), now_unix_ms);
      return;
    case LineKind::kSxid:
      HandleSxid(*parsed.sxid(), now_unix_ms);
      return;
    case LineKind::kMalformed: {
      const auto& m = *parsed.malformed();
      out_.bad(MalformedKind(m.attempted), m.Reason());
      return;
    }
  }
}

void XidJudge::OnNvmlXid(const gpu_inventory::XidObservation& xid, int64_t now_unix_ms) {
  if (xid.uuid.empty() || xid.xid == 0 || xid.xid > UINT32_MAX) {
    out_.bad("bad_nvml_xid", "an NVML XID without a GPU or with XID " + std::to_string(xid.xid));
    return;
  }
  if (xid.xid == kRecoveryActionXid) {
    // NVML's event carries no recovery action; the kernel line of the same occurrence names
    // it, and it alone decides (counting this report too would count the occurrence twice).
    out_.duplicate();
    return;
  }
  std::optional<PciAddress> pci;
  if (const auto text = directory_.PciForUuid(xid.uuid); !text.empty()) pci = ParsePciAddress(text);
  const int64_t ms = xid.observed_unix_ms != 0 ? xid.observed_unix_ms : now_unix_ms;
  // NVML names the GPU instance the same way (gpuInstanceId; 0xFFFFFFFF when none).
  HandleXid(XidSubject(xid.uuid, pci), static_cast<uint32_t>(xid.xid), Timestamp(ms * 1000), XidSource::kNvml, {},
            now_unix_ms, xid.gpu_instance);
}

void XidJudge::OnNewBoot(const std::string& boot_id, int64_t now_unix_ms) {
  log_.info("new boot {}: every device is Healthy again", boot_id);
  boot_id_ = boot_id;
  policy_ = XidPolicy(catalog_, overrides_);
  pending_.clear();
  counts_.Restore({});
  bool any = false;
  for (const auto& uuid : verdicts_.UnhealthyUuids()) any = MarkHealthy(uuid, "new boot", now_unix_ms) || any;
  // Seed 003: after a reboot the monitor sends a healthy event without entities (all of them).
  auto event = NewEvent("boot", now_unix_ms);
  event.is_fatal = true;
  event.is_healthy = true;
  event.message = "new boot " + boot_id;
  out_.event(std::move(event), KubeEvent{any, "Normal", "GpuHealthyAfterBoot"});
}

std::string XidJudge::SetHealthy(std::string_view target, std::string_view who, int64_t now_unix_ms) {
  std::vector<std::string> uuids;
  if (target == "all") {
    uuids = verdicts_.UnhealthyUuids();
  } else {
    if (target.size() < 5 || target.substr(0, 4) != "GPU-" || target.size() > kMaxUuidBytes) {
      return "error: expected a GPU UUID (GPU-…) or all, got \"" + SanitizedText(target.substr(0, 80), 80) + "\"";
    }
    uuids.emplace_back(target);
  }
  std::size_t changed = 0;
  for (const auto& uuid : uuids) {
    Forget(uuid);
    if (!MarkHealthy(uuid, "set healthy by " + std::string(who), now_unix_ms)) continue;
    ++changed;
    const std::string pci = directory_.PciForUuid(uuid);
    auto event = NewEvent("operator", now_unix_ms);
    event.is_fatal = true;
    event.is_healthy = true;
    event.message = "set healthy by " + std::string(who);
    if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
    event.entities_impacted.push_back({"GPU_UUID", uuid});
    out_.event(std::move(event), KubeEvent{true, "Normal", "GpuSetHealthy"});
  }
  log_.info("set-healthy {} by {}: {} device(s) made Healthy", target, who, changed);
  if (target != "all" && changed == 0) return "ok: " + std::string(target) + " was not unhealthy";
  return "ok: " + std::to_string(changed) + " device(s) set healthy";
}

bool XidJudge::Restore(const DeviceHealth& saved, const std::vector<uint32_t>* held_by) {
  return verdicts_.Restore(saved, held_by);
}

// --- decisions ----------------------------------------------------------------------------

void XidJudge::HandleRecoveryAction(const XidSubject& who, const XidLine& line, Timestamp at, int64_t now_unix_ms) {
  if (BeyondLookback(who, kRecoveryActionXid, at, now_unix_ms)) return;
  const auto change = ParseRecoveryActionChange(line.raw_detail);
  if (!change) {
    out_.bad("xid154_without_action",
             "an Xid 154 line that does not say which recovery action it changed to: " + line.detail().substr(0, 200));
    HandleXid(who, kRecoveryActionXid, at, XidSource::kKernel, line.raw_detail, now_unix_ms);
    return;
  }
  if (!change->known) {
    out_.bad("unknown_recovery_action", "Xid 154 names recovery action " +
                                            (change->code ? std::to_string(*change->code) : std::string("?")) + " (" +
                                            change->name + "), which this build does not know: CONTACT_SUPPORT");
  }
  const XidDecision decision =
      policy_.Decide(who.policy_id(), kRecoveryActionXid, at, XidSource::kKernel, change->action);
  char code[16] = "?";
  if (change->code) std::snprintf(code, sizeof code, "0x%x", *change->code);
  const std::string note = "recovery action " + std::string(code) + " (" + change->name + ")";
  Decided(who, kRecoveryActionXid, decision, at, "kernel", line.raw_detail, note, now_unix_ms);
}

void XidJudge::HandleXid(const XidSubject& who, uint32_t xid, Timestamp at, XidSource source, std::string_view detail,
                         int64_t now_unix_ms, uint32_t gpu_instance) {
  // Runs for every Xid line: nothing here allocates until something is reported or changes
  // (or a GPU instance is named). A GPU instance is a device of its own to the policy too: the
  // two sources' reports fold only when they name the same one (two GPU instances failing at
  // once are two occurrences), and thresholds and the rate limit count per GPU instance.
  if (BeyondLookback(who, xid, at, now_unix_ms)) return;
  std::string instance_id;
  std::string_view policy_id = who.policy_id();
  if (gpu_instance != kWholeGpu) {
    instance_id = DeviceHealth::KeyOf(policy_id, gpu_instance);
    policy_id = instance_id;
  }
  const XidDecision decision = policy_.Decide(policy_id, xid, at, source);
  Decided(who, xid, decision, at, source == XidSource::kNvml ? "nvml" : "kernel", detail, {}, now_unix_ms,
          gpu_instance);
}

void XidJudge::Decided(const XidSubject& who, uint32_t xid, XidDecision decision, Timestamp at,
                       std::string_view source, std::string_view detail, std::string_view action_note,
                       int64_t now_unix_ms, uint32_t gpu_instance) {
  const std::string_view uuid = who.uuid();
  const std::optional<PciAddress>& pci = who.address();
  if (decision.verdict == Verdict::kDuplicate) {
    out_.duplicate();
    return;
  }
  // Occurrences, not reports: the second source's report of one was folded just above.
  const XidCounts::Counted counted = uuid.empty() ? counts_.Add(who.pci(), xid) : counts_.Add(uuid, xid);
  out_.counted(counted.gpu, counted.xid, counted.count);
  if (decision.verdict == Verdict::kIgnored) return;
  if (!decision.known_xid) out_.bad("unknown_xid", "XID " + std::to_string(xid) + " is not in the catalog: CONTACT_SUPPORT");
  if (uuid.empty() && gpus_ != 0) {
    out_.bad("unknown_pci", "XID " + std::to_string(xid) + " on PCI " + who.pci() + ", which is none of our GPUs");
  }
  if (!decision.emit) out_.suppressed();
  // The same XID asking for a reset or reboot in more boots than its escalation allows: the
  // hardware needs inspecting (gpud's reboot threshold), whatever the catalog recommends.
  std::string escalated;
  if (decision.verdict == Verdict::kFatal) {
    std::optional<XidEscalation> escalation;
    if (const uint32_t boots = RecordBoot(who, xid, decision.action, at, escalation); boots != 0) {
      escalated = "XID " + std::to_string(xid) + " in " + std::to_string(boots) + " boots within " +
                  WindowText(escalation->window) + ": hardware inspection instead of " +
                  std::string(ActionName(decision.action));
      decision.action = RecommendedAction::kContactSupport;
    }
  }
  auto name = [&] {
    return decision.mnemonic.empty() ? "XID " + std::to_string(xid) : std::string(decision.mnemonic);
  };
  // What the event recommends: for a fatal XID on an Unhealthy GPU, never less than the GPU's
  // verdict already recommends (the verdict only escalates; NVSentinel is told the same).
  RecommendedAction action = decision.action;
  if (decision.verdict == Verdict::kFatal) {
    std::string reason = "XID " + std::to_string(xid) + " (" + name() + ")";
    if (gpu_instance != kWholeGpu) reason += " on GPU instance " + std::to_string(gpu_instance);
    if (!action_note.empty()) reason += ", " + std::string(action_note);
    if (!escalated.empty()) reason += ", " + escalated;
    if (!uuid.empty()) {
      MarkUnhealthy(std::string(uuid), who.pci(), reason, xid, decision.action, now_unix_ms, gpu_instance);
      for (const uint32_t key : {gpu_instance, kWholeGpu}) {
        const DeviceHealth* h = verdicts_.Find(uuid, key);
        if (h != nullptr && !h->healthy) action = MoreSevere(action, VerdictBook::ActionOf(*h));
      }
    } else if (pci && (pending_.size() < kMaxPending || pending_.count(pci->DeviceKey()))) {
      // One pending verdict per address: the most severe fatal XID (the latest of equals),
      // whichever instance it named.
      const auto known = pending_.find(pci->DeviceKey());
      if (known != pending_.end() && ActionRank(known->second.action) > ActionRank(decision.action)) {
        action = known->second.action;
      } else {
        pending_[pci->DeviceKey()] = Pending{*pci, who.pci(), reason, xid, decision.action, gpu_instance};
      }
    }
  }
  if (!decision.emit) {
    ApplyClears(who, xid, gpu_instance, source, now_unix_ms);
    return;
  }
  auto event = NewEvent(source, now_unix_ms);
  event.is_fatal = decision.verdict == Verdict::kFatal;
  event.is_healthy = false;
  event.message = name();
  if (gpu_instance != kWholeGpu) event.message += " on GPU instance " + std::to_string(gpu_instance);
  // Sanitised only now: most occurrences are not emitted.
  if (!detail.empty()) event.message += ": " + SanitizedText(detail, kMaxDetailBytes).substr(0, 512);
  if (decision.verdict == Verdict::kBelowThreshold) {
    event.message += " (" + std::to_string(decision.count_in_window) + " of " + std::to_string(decision.threshold) +
                     " within the window)";
  }
  if (!escalated.empty()) event.message += " (" + escalated + ")";
  event.recommended_action = static_cast<int>(action);
  event.recommended_action_name = std::string(ActionName(action));
  event.error_code = {std::to_string(xid)};
  if (pci) event.entities_impacted.push_back({"PCI", who.pci()});
  if (!uuid.empty()) event.entities_impacted.push_back({"GPU_UUID", std::string(uuid)});
  event.suppressed_before = decision.suppressed_before;
  const bool reportable = decision.verdict == Verdict::kFatal || decision.verdict == Verdict::kNonFatal;
  out_.event(std::move(event),
             KubeEvent{reportable, "Warning", decision.verdict == Verdict::kFatal ? "GpuXidFatal" : "GpuXid"});
  ApplyClears(who, xid, gpu_instance, source, now_unix_ms);
}

bool XidJudge::BeyondLookback(const XidSubject& who, uint32_t xid, Timestamp at, int64_t now_unix_ms) {
  const auto lookback = policy_.catalog().LookbackFor(xid);
  if (!lookback || now_unix_ms - UnixMs(at) <= lookback->count()) return false;
  // Read too late to act on (a restart after a long downtime, a journal read again from an old
  // position): history only. The count and the boot history keep it; no verdict, no event.
  const std::string_view uuid = who.uuid();
  const XidCounts::Counted counted = uuid.empty() ? counts_.Add(who.pci(), xid) : counts_.Add(uuid, xid);
  out_.counted(counted.gpu, counted.xid, counted.count);
  if (const XidPolicy::Standing standing = policy_.StandingOf(xid); standing.fatal) {
    std::optional<XidEscalation> escalation;
    (void)RecordBoot(who, xid, standing.action, at, escalation);
  }
  if (out_.beyond_lookback) out_.beyond_lookback(xid);
  return true;
}

uint32_t XidJudge::RecordBoot(const XidSubject& who, uint32_t xid, RecommendedAction action, Timestamp at,
                              std::optional<XidEscalation>& escalation) {
  // A reset or a reboot (anything that acts on the device short of a human): CONTACT_SUPPORT
  // itself has nowhere to escalate to.
  if (!ActsOnDevice(action) || ActionRank(action) >= ActionRank(RecommendedAction::kContactSupport)) return 0;
  escalation = policy_.catalog().EscalationFor(xid);
  if (!escalation) return 0;
  // The whole GPU's history, whichever GPU instance the report named: hardware is per GPU.
  const std::string_view gpu = who.uuid().empty() ? who.policy_id() : who.uuid();
  const uint32_t boots = boots_.Record(gpu, xid, boot_id_, UnixMs(at), escalation->window);
  return boots > escalation->boots ? boots : 0;
}

void XidJudge::ApplyClears(const XidSubject& who, uint32_t xid, uint32_t gpu_instance, std::string_view source,
                           int64_t now_unix_ms) {
  const XidInfo* info = policy_.catalog().Find(xid);
  if (info == nullptr || info->clears.empty()) return;
  const std::string uuid(who.uuid());
  const std::string pci = uuid.empty() ? who.pci() : directory_.PciForUuid(uuid);
  const std::string name = "XID " + std::to_string(xid) + " (" + info->mnemonic + ")";
  for (const uint32_t cleared : info->clears) {
    // Its threshold counts and rate limit start again, under either name of the GPU.
    policy_.ForgetXid(who.policy_id(), cleared);
    if (!uuid.empty() && !pci.empty()) policy_.ForgetXid(PciPolicyId(pci), cleared);
    if (const auto& address = who.address(); address) {
      if (const auto p = pending_.find(address->DeviceKey()); p != pending_.end() && p->second.xid == cleared) {
        pending_.erase(p);
      }
    }
    if (uuid.empty()) continue;
    const std::string reason = name + " clears XID " + std::to_string(cleared);
    const std::vector<DeviceHealth> changed = verdicts_.Clear(uuid, gpu_instance, cleared, reason, now_unix_ms);
    if (changed.empty()) continue;
    for (const DeviceHealth& h : changed) {
      log_.info("{} is Healthy again: {}", h.RetainKey(), reason);
      out_.recovered();
      out_.verdict(h);
    }
    auto event = NewEvent(source, now_unix_ms);
    event.is_fatal = true;
    event.is_healthy = true;
    event.message = reason;
    event.error_code = {std::to_string(xid)};
    event.recommended_action = static_cast<int>(RecommendedAction::kNone);
    event.recommended_action_name = std::string(ActionName(RecommendedAction::kNone));
    if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
    event.entities_impacted.push_back({"GPU_UUID", uuid});
    out_.event(std::move(event), KubeEvent{true, "Normal", "GpuXidCleared"});
  }
}

void XidJudge::HandleResetAck(const ResetAckLine& ack, int64_t now_unix_ms) {
  const std::string& uuid = ack.uuid;
  if (ack.started) {
    // A reset begins: nothing new may land on the GPU. An Unhealthy verdict keeps its XID and
    // action (the reason the GPU is being reset); a Healthy one turns Unhealthy for maintenance,
    // with no remediation of its own (no HealthEvent: a hold is not a fault).
    const DeviceHealth* current = verdicts_.Find(uuid);
    if (current != nullptr && !current->healthy) return;
    MarkUnhealthy(uuid, "", std::string(kResetInProgress), 0, RecommendedAction::kNone, now_unix_ms);
    return;
  }
  if (ack.success.has_value() && !*ack.success) {
    // A failed reset leaves the GPU Unhealthy whatever it was, and only a reboot is left.
    out_.bad("reset_failed", "a failed reset of " + uuid + " was reported");
    MarkUnhealthy(uuid, "", "GPU reset failed", 0, RecommendedAction::kRestartBm, now_unix_ms);
    // RESTART_BM, or what the verdict recommends already when that ranks higher.
    const DeviceHealth* h = verdicts_.Find(uuid);
    const RecommendedAction action =
        MoreSevere(RecommendedAction::kRestartBm, h != nullptr ? VerdictBook::ActionOf(*h) : RecommendedAction::kNone);
    auto event = NewEvent("reset-ack", now_unix_ms);
    event.is_fatal = true;
    event.message = "GPU reset failed";
    event.recommended_action = static_cast<int>(action);
    event.recommended_action_name = std::string(ActionName(action));
    const std::string pci = directory_.PciForUuid(uuid);
    if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
    event.entities_impacted.push_back({"GPU_UUID", uuid});
    out_.event(std::move(event), KubeEvent{true, "Warning", "GpuResetFailed"});
    return;
  }
  Forget(uuid);
  if (reset_healed_) reset_healed_(uuid);
  const bool changed = MarkHealthy(uuid, "GPU reset occurred", now_unix_ms);
  // Seed 003: the healthy event names the GPU and its PCI address so the unhealthy one it
  // clears can be found.
  const std::string pci = directory_.PciForUuid(uuid);
  auto event = NewEvent("reset-ack", now_unix_ms);
  event.is_fatal = true;
  event.is_healthy = true;
  event.message = "GPU reset occurred";
  if (!pci.empty()) event.entities_impacted.push_back({"PCI", pci});
  event.entities_impacted.push_back({"GPU_UUID", uuid});
  out_.event(std::move(event), KubeEvent{changed, "Normal", "GpuReset"});
}

void XidJudge::Learn(const PciAddress& pci, const std::string& uuid, int64_t now_unix_ms) {
  switch (directory_.Learn(pci, uuid)) {
    case GpuDirectory::LearnResult::kKnown:
      return;
    case GpuDirectory::LearnResult::kFull:
      out_.bad("too_many_gpu_uuid_lines", "more than " + std::to_string(GpuDirectory::kMaxLearned) +
                                              " PCI addresses learned; ignoring " + pci.DeviceString());
      return;
    case GpuDirectory::LearnResult::kLearned:
      break;
  }
  log_.info("learned {} at PCI {} from the kernel log", uuid, pci.DeviceString());
  if (const auto p = pending_.find(pci.DeviceKey()); p != pending_.end()) {
    const Pending pending = p->second;
    pending_.erase(p);
    MarkUnhealthy(uuid, pending.pci, pending.reason, pending.xid, pending.action, now_unix_ms, pending.gpu_instance);
  }
}

void XidJudge::Forget(const std::string& uuid) {
  policy_.ForgetGpu(uuid);
  const std::string pci = directory_.PciForUuid(uuid);
  if (!pci.empty()) policy_.ForgetGpu(PciPolicyId(pci));
}

// --- verdicts -----------------------------------------------------------------------------

void XidJudge::MarkUnhealthy(const std::string& uuid, const std::string& pci, const std::string& reason, uint32_t xid,
                             RecommendedAction action, int64_t now_unix_ms, uint32_t gpu_instance, uint32_t sxid) {
  const DeviceHealth* h = verdicts_.MarkUnhealthy(uuid, pci.empty() ? directory_.PciForUuid(uuid) : pci, reason, xid,
                                                  action, now_unix_ms, gpu_instance, sxid);
  if (h == nullptr) return;
  log_.warn("{} is Unhealthy: {}, recommended action {}", h->RetainKey(), reason, h->recommended_action);
  out_.verdict(*h);
}

bool XidJudge::MarkHealthy(const std::string& uuid, const std::string& reason, int64_t now_unix_ms) {
  const std::vector<DeviceHealth> changed = verdicts_.MarkHealthy(uuid, reason, now_unix_ms);
  for (const DeviceHealth& h : changed) {
    log_.info("{} is Healthy again: {}", h.RetainKey(), reason);
    out_.recovered();
    out_.verdict(h);
  }
  return !changed.empty();
}

// An SXid is the NVSwitch's. Its severity is the line's ("Fatal" / "Non-fatal" / "Correctable")
// unless the SXid catalog says otherwise. Every report is counted; a non-fatal one is only
// counted. A fatal one on a port wired to a GPU of ours (the inventory's NVLink map) makes that
// GPU Unhealthy with the catalog's action, and its HealthEvent names the GPU; a fatal one of the
// switch itself (no link) or of a port with no GPU of ours is a node-level finding: a HealthEvent
// for the switch (no GPU entity) with the catalog's node action, a Node Event and the log — never
// some GPU picked at random. The check is NVSentinel's syslog monitor's (SysLogsSXIDError,
// component NVSWITCH; entities NVSWITCH, PCI, NVLINK, and GPU_UUID when mapped).
void XidJudge::HandleSxid(const SxidLine& line, int64_t now_unix_ms) {
  const SxidJudgement judged = sxid_catalog_->Judge(line.sxid, line.fatal);
  const NvSwitchPortMap::Gpu* gpu = line.link ? switch_ports_.Find(line.pci, *line.link) : nullptr;
  if (out_.sxid) out_.sxid(line.sxid, judged.fatal, gpu != nullptr);
  const std::string link = line.link ? " port " + std::to_string(*line.link) : std::string();
  const std::string where = "NVSwitch " + (line.nvswitch ? std::to_string(*line.nvswitch) + " " : std::string()) +
                            "at " + line.pci.ToString() + link;
  const std::string name = "SXid " + std::to_string(line.sxid) +
                           (judged.mnemonic.empty() ? std::string() : " (" + std::string(judged.mnemonic) + ")");
  if (!judged.fatal) {
    if (judged.overridden) {
      log_.info("{} on {}: Fatal on the line, not fatal by the SXid catalog: counted only", name, where);
    }
    return;
  }
  RecommendedAction action = gpu != nullptr ? judged.action : judged.node_action;
  HealthEvent event = NewEvent("kernel", now_unix_ms);
  event.check_name = "SysLogsSXIDError";
  event.component_class = "NVSWITCH";
  event.is_fatal = true;
  event.is_healthy = false;
  event.error_code = {std::to_string(line.sxid)};
  if (line.nvswitch) event.entities_impacted.push_back({"NVSWITCH", std::to_string(*line.nvswitch)});
  event.entities_impacted.push_back({"PCI", line.pci.ToString()});
  if (line.link) event.entities_impacted.push_back({"NVLINK", std::to_string(*line.link)});
  const std::string severity = judged.overridden ? " (fatal by the SXid catalog)" : std::string();
  if (gpu != nullptr) {
    const std::string reason = name + severity + " on " + where + ", wired to GPU " + std::to_string(gpu->index) +
                               " link " + std::to_string(gpu->link);
    // xid 0: no XID holds it, so no clearing XID releases it; a validated reset, a new boot or
    // set-healthy does, as for a fatal XID.
    MarkUnhealthy(gpu->uuid, "", reason, 0, action, now_unix_ms, kWholeGpu, line.sxid);
    if (const DeviceHealth* h = verdicts_.Find(gpu->uuid); h != nullptr && !h->healthy) {
      action = MoreSevere(action, VerdictBook::ActionOf(*h));
    }
    event.entities_impacted.push_back({"GPU_UUID", gpu->uuid});
    event.message = reason + ": " + line.detail();
  } else {
    event.message = where + ": fatal " + name + severity +
                    (line.link ? ", no GPU of ours on that port" : ", an error of the switch itself") + ": " +
                    line.detail();
  }
  event.recommended_action = static_cast<int>(action);
  event.recommended_action_name = std::string(ActionName(action));
  log_.warn("{}", event.message);
  out_.event(std::move(event), KubeEvent{true, "Warning", "NvSwitchSxidFatal"});
}

HealthEvent XidJudge::NewEvent(std::string_view source, int64_t now_unix_ms) const {
  HealthEvent event;
  event.agent = settings_.agent;
  event.check_name = settings_.check_name;
  event.node_name = settings_.node_name;
  event.source = std::string(source);
  event.generated_seconds = now_unix_ms / 1000;
  event.generated_nanos = static_cast<int32_t>((now_unix_ms % 1000) * 1'000'000);
  return event;
}

}  // namespace gns::gpu_health
