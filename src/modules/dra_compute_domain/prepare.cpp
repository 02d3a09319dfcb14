// The HostManagedIMEX prepare/unprepare decisions.
#include "modules/dra_compute_domain/prepare.hpp"

#include "loop/json_fields.hpp"
#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/dra_compute_domain/opaque_config.hpp"

namespace gns::dra {

namespace {

using nlohmann::json;

struct OurResult {
  std::string request;
  std::string pool;
  std::string device;
  std::string where;
};

struct ResultsScan {
  bool ok = true;
  std::string error;
  bool has_allocation = false;
  std::vector<OurResult> ours;
};

ResultsScan ScanResults(const json& claim) {
  ResultsScan scan;
  const json* allocation = nullptr;
  if (const auto status = claim.find("status"); status != claim.end() && status->is_object()) {
    if (const auto it = status->find("allocation"); it != status->end() && it->is_object()) allocation = &*it;
  }
  if (allocation == nullptr) return scan;
  scan.has_allocation = true;
  const auto devices = allocation->find("devices");
  if (devices == allocation->end() || devices->is_null()) return scan;
  const auto results = devices->find("results");
  if (results == devices->end() || results->is_null()) return scan;
  const std::string base = "status.allocation.devices.results";
  if (!results->is_array()) {
    scan.ok = false;
    scan.error = base + ": expected an array, got " + std::string(results->type_name());
    return scan;
  }
  for (std::size_t i = 0; i < results->size(); ++i) {
    const json& entry = (*results)[i];
    const std::string where = base + "[" + std::to_string(i) + "]";
    if (!entry.is_object()) {
      scan.ok = false;
      scan.error = where + ": expected an object, got " + std::string(entry.type_name());
      return scan;
    }
    if (JsonStringAt(entry, "/driver") != kDriverName) continue;
    OurResult result{JsonStringAt(entry, "/request"), JsonStringAt(entry, "/pool"), JsonStringAt(entry, "/device"), where};
    if (result.request.empty() || result.device.empty()) {
      scan.ok = false;
      scan.error = where + ": request and device must be non-empty strings";
      return scan;
    }
    scan.ours.push_back(std::move(result));
  }
  return scan;
}

PrepareDecision Fail(PrepareOutcome outcome, const std::string& claim_ref, std::string why) {
  PrepareDecision decision;
  decision.outcome = outcome;
  decision.error = claim_ref + ": " + std::move(why);
  return decision;
}

// Steps 1–4: everything that depends only on the claim object and the gate.
PrepareDecision AnalyzeClaim(const json& claim, const PrepareContext& context, std::string& domain_uid) {
  const std::string ns = JsonStringAt(claim, "/metadata/namespace");
  const std::string name = JsonStringAt(claim, "/metadata/name");
  const std::string ref = "ResourceClaim " + ns + "/" + name;
  const auto permanent = [&](std::string why) { return Fail(PrepareOutcome::kPermanentError, ref, std::move(why)); };

  const ResultsScan scan = ScanResults(claim);
  if (!scan.ok) return permanent(scan.error);
  if (!scan.has_allocation) return permanent("status.allocation is not set (the claim is not allocated)");

  // Step 1: decode and validate our opaque configs.
  const ClaimConfigsResult configs = DecodeClaimConfigs(claim);
  if (!configs.ok) return permanent("invalid opaque config: " + configs.error);
  for (const auto& config : configs.configs) {
    if (config.kind == ConfigKind::kDaemon) {
      return permanent(std::string(context.host_managed ? kDaemonDisabledMessage : kDaemonUnusedMessage) + " (" +
                       config.where + " is a " +
                       std::string(kDaemonConfigKind) + ")");
    }
  }

  // Step 2: exactly one allocation result of ours.
  if (scan.ours.size() != 1) {
    return permanent("expected exactly 1 allocation result for driver " + std::string(kDriverName) + ", got " +
                     std::to_string(scan.ours.size()));
  }
  const OurResult& result = scan.ours.front();
  if (result.device != kChannelDeviceName) {
    return permanent(result.where + ".device: " + result.device + " cannot be prepared under HostManagedIMEX (only " +
                     std::string(kChannelDeviceName) + " is published)");
  }
  if (result.pool != context.node_name) {
    return permanent(result.where + ".pool: " + result.pool + " is not this node's pool (" + context.node_name + ")");
  }
  const OpaqueConfig* config = ConfigForRequest(configs.configs, result.request);
  if (config == nullptr) {
    return permanent("no " + std::string(kChannelConfigKind) + " for driver " + std::string(kDriverName) +
                     " applies to request \"" + result.request + "\" (the ComputeDomain's claim template sets one)");
  }

  // Step 3: an explicit allowlist, not an "== All" check (seed 000 §7.2 step 3).
  // Driver-managed mode also serves "All" (every channel of the domain, as upstream).
  const bool all_allowed = !context.host_managed && config->allocation_mode == "All";
  if (!config->allocation_mode.empty() && config->allocation_mode != "Single" && !all_allowed) {
    return permanent(config->where + ".opaque.parameters.allocationMode: \"" + config->allocation_mode +
                     "\" is not supported" +
                     (context.host_managed ? std::string(" under HostManagedIMEX (only \"Single\" or empty)")
                                           : std::string(" (only \"Single\", \"All\" or empty)")));
  }

  // Step 4: the config state.
  PrepareDecision decision;
  decision.outcome = PrepareOutcome::kPrepare;
  decision.domain_uid = config->domain_id;
  decision.allocation_mode = config->allocation_mode;
  decision.device_name = std::string(kChannelDeviceName);
  decision.request_names = {result.request};
  decision.pool_name = context.node_name;
  decision.claim_namespace = ns;
  decision.claim_name = name;
  domain_uid = config->domain_id;
  return decision;
}

}  // namespace

std::string_view ToString(PrepareOutcome outcome) {
  switch (outcome) {
    case PrepareOutcome::kPrepare:
      return "prepare";
    case PrepareOutcome::kAlreadyPrepared:
      return "already-prepared";
    case PrepareOutcome::kPermanentError:
      return "permanent-error";
    case PrepareOutcome::kRetryableError:
      return "retryable-error";
  }
  return "unknown";
}

void SetChannelClaimFields(PreparedClaim& entry, const std::string& domain_uid, uint32_t channels) {
  entry.driver_data["domainUID"] = domain_uid;
  if (channels != 1) {
    entry.driver_data["channels"] = channels;
  } else {
    entry.driver_data.erase("channels");
  }
}

std::string DomainUidOf(const PreparedClaim& entry) {
  const auto it = entry.driver_data.find("domainUID");
  return it != entry.driver_data.end() && it->is_string() ? it->get<std::string>() : std::string();
}

uint32_t ChannelsOf(const PreparedClaim& entry) {
  const auto it = entry.driver_data.find("channels");
  if (it == entry.driver_data.end()) return 1;
  if (!it->is_number_integer()) return 0;
  const auto channels = it->get<int64_t>();
  return channels >= 1 && channels <= 65536 ? static_cast<uint32_t>(channels) : 0;
}

std::optional<PreparedClaim> CompletedPrepare(const Checkpoint& checkpoint, std::string_view claim_uid) {
  const PreparedClaim* existing = checkpoint.Find(claim_uid);
  if (existing == nullptr || existing->state != ClaimState::kPrepareCompleted) return std::nullopt;
  return *existing;
}

PrepareDecision DecidePrepare(const json& claim, std::string_view expected_uid, const PrepareContext& context,
                              const DomainLookupFn& lookup) {
  static const Checkpoint kEmpty;
  const Checkpoint& checkpoint = context.checkpoint ? *context.checkpoint : kEmpty;

  // Step 0: a repeated Prepare of a completed claim answers from the checkpoint, whatever the
  // claim object says now (the kubelet retries after a lost response).
  if (auto existing = CompletedPrepare(checkpoint, expected_uid)) {
    PrepareDecision decision;
    decision.outcome = PrepareOutcome::kAlreadyPrepared;
    decision.existing = std::move(*existing);
    return decision;
  }
  if (!claim.is_object()) {
    return Fail(PrepareOutcome::kPermanentError, "ResourceClaim " + std::string(expected_uid),
                std::string("expected a ResourceClaim object, got ") + claim.type_name());
  }
  const std::string uid = JsonStringAt(claim, "/metadata/uid");
  if (uid != expected_uid) {
    // The claim was deleted and recreated under the same name: not the one the kubelet means.
    return Fail(PrepareOutcome::kPermanentError,
                "ResourceClaim " + JsonStringAt(claim, "/metadata/namespace") + "/" + JsonStringAt(claim, "/metadata/name"),
                "metadata.uid is \"" + uid + "\", the kubelet asked for \"" + std::string(expected_uid) + "\"");
  }

  std::string domain_uid;
  PrepareDecision decision = AnalyzeClaim(claim, context, domain_uid);
  if (decision.outcome != PrepareOutcome::kPrepare) return decision;
  const std::string ref = "ResourceClaim " + decision.claim_namespace + "/" + decision.claim_name;

  // Step 5: channel-0 is node-local and single: another completed claim holding it is a
  // conflict. Retryable, as upstream: the other claim may be on its way out.
  // Driver-managed: claims of the same domain share the node's channels (several pods of one
  // job on a node); another domain's claim holding them is the conflict.
  const PreparedClaim* holder = nullptr;
  for (const auto& [uid, entry] : checkpoint.claims) {
    if (uid == expected_uid || entry.state != ClaimState::kPrepareCompleted || entry.device != decision.device_name) {
      continue;
    }
    if (!context.host_managed && DomainUidOf(entry) == decision.domain_uid) continue;
    holder = &entry;
    break;
  }
  if (holder != nullptr) {
    return Fail(PrepareOutcome::kRetryableError, ref,
                "requested device " + decision.device_name + " is already prepared for claim " +
                    holder->namespace_name + "/" + holder->name + " (uid " + holder->uid + ") on this node");
  }

  // Step 6: the ComputeDomain must exist in the claim's namespace.
  const DomainLookup found = lookup ? lookup(domain_uid) : DomainLookup::Error("no ComputeDomain lookup configured");
  switch (found.kind) {
    case DomainLookup::Kind::kError:
      return Fail(PrepareOutcome::kRetryableError, ref,
                  "cannot look up ComputeDomain with UID " + domain_uid + ": " + found.error);
    case DomainLookup::Kind::kNotFound:
      return Fail(PrepareOutcome::kPermanentError, ref, "ComputeDomain with UID " + domain_uid + " not found");
    case DomainLookup::Kind::kFound:
      break;
  }
  if (found.domain.namespace_name != decision.claim_namespace) {
    return Fail(PrepareOutcome::kPermanentError, ref,
                "ComputeDomain " + found.domain.namespace_name + "/" + found.domain.name + " (UID " + domain_uid +
                    ") is not in the claim's namespace " + decision.claim_namespace);
  }

  // Step 7: host-managed IMEX needs the node's NVLink clique (replaces upstream's silent skip).
  if (context.clique_id.empty()) {
    if (!context.clique_known) {
      PrepareDecision unknown =
          Fail(PrepareOutcome::kRetryableError, ref,
               std::string(kCliqueUnknownMessage) +
                   (context.clique_reason.empty() ? std::string{} : " (" + context.clique_reason + ")"));
      unknown.waits_for_clique = true;
      return unknown;
    }
    return Fail(PrepareOutcome::kPermanentError, ref,
                std::string(kNoCliqueMessage) +
                    (context.clique_reason.empty() ? std::string{} : " (" + context.clique_reason + ")"));
  }
  return decision;
}

UnprepareDecision DecideUnprepare(const Checkpoint& checkpoint, std::string_view claim_uid) {
  UnprepareDecision decision;
  if (const PreparedClaim* existing = checkpoint.Find(claim_uid)) {
    decision.known = true;
    decision.existing = *existing;
  }
  return decision;
}

}  // namespace gns::dra
