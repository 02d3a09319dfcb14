#pragma once
// The decision for one NodePrepareResources claim under HostManagedIMEX, as a pure function over
// plain inputs: the ResourceClaim as fetched from the API, the UID the kubelet asked for, the
// ComputeDomain lookup, the node's clique ID and the claim state. No I/O: the module fetches,
// then decides, then writes the CDI spec and one claim-log record (claim_log.hpp).
//
// Order (seed 000 §7.2, with the upstream plugin's two preliminaries):
//   0. the same claim already PrepareCompleted in the checkpoint → its stored result (idempotent);
//      the claim's metadata.uid must be the UID the kubelet asked for;
//   1. decode our opaque configs (a daemon config → "daemon claims are disabled");
//   2. exactly one allocation result of our driver (device channel-0, pool = this node);
//   3. allocationMode is "" or "Single" (an allowlist: "All", "foo"… are rejected), and "All"
//      too with the gate off (driver-managed IMEX, issue #16);
//   4. (the config state: the domain UID)
//   5. channel-0 not PrepareCompleted for another claim (retryable: the other may be unpreparing);
//      with the gate off, claims of the same ComputeDomain share it;
//   6. the ComputeDomain with that UID exists, in the claim's namespace;
//   7. the node has a clique ID (retryable while gpu-inventory has not read the fabric yet:
//      right after start "no clique" is not known to be true).
// Permanent errors are not retried by the module within the kubelet's call; retryable ones are.

#include "dra_plugin/checkpoint.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

inline constexpr std::string_view kNoCliqueMessage =
    "host-managed IMEX requires an NVLink clique on this node; NVML reports none";
inline constexpr std::string_view kCliqueUnknownMessage =
    "the node's NVLink clique is not known yet (gpu-inventory has not read NVML's fabric info); retry";
inline constexpr std::string_view kDaemonDisabledMessage = "daemon claims are disabled under HostManagedIMEX";
inline constexpr std::string_view kDaemonUnusedMessage =
    "daemon claims are not used: in driver-managed mode the supervisor runs each ComputeDomain's IMEX daemon itself";

struct ComputeDomainInfo {
  std::string uid;
  std::string namespace_name;
  std::string name;
};

// What the module's ComputeDomain lookup (informer cache or GET) found for a UID.
struct DomainLookup {
  enum class Kind { kFound, kNotFound, kError };
  Kind kind = Kind::kNotFound;
  ComputeDomainInfo domain;  // kFound
  std::string error;         // kError: the API could not answer (retryable)

  static DomainLookup Found(ComputeDomainInfo domain) { return {Kind::kFound, std::move(domain), {}}; }
  static DomainLookup NotFound() { return {Kind::kNotFound, {}, {}}; }
  static DomainLookup Error(std::string why) { return {Kind::kError, {}, std::move(why)}; }
};
using DomainLookupFn = std::function<DomainLookup(std::string_view domain_uid)>;

struct PrepareContext {
  std::string node_name;      // pool name and the pool results must come from
  std::string clique_id;      // NodeClique::clique_id; empty when the node has none
  bool host_managed = true;   // the HostManagedIMEX gate
  const Checkpoint* checkpoint = nullptr;  // nullptr reads as empty
  bool clique_known = true;   // NodeClique::known: false before NVML's fabric info was read
  std::string clique_reason = {};  // NodeClique::reason, for the error text
};

enum class PrepareOutcome {
  kPrepare,          // go ahead: write the CDI spec, append the claim's record
  kAlreadyPrepared,  // the claim is PrepareCompleted: answer with `existing`, touch nothing
  kPermanentError,
  kRetryableError,
};
std::string_view ToString(PrepareOutcome outcome);

struct PrepareDecision {
  PrepareOutcome outcome = PrepareOutcome::kPermanentError;
  std::string error;  // for the two error outcomes; starts with the claim's namespace/name
  // kPrepare:
  std::string domain_uid;
  std::string allocation_mode;             // "", "Single" or (driver-managed) "All"
  std::string device_name;                 // "channel-0"
  std::vector<std::string> request_names;  // of the allocation result
  std::string pool_name;                   // = node name
  std::string claim_namespace;
  std::string claim_name;
  // kAlreadyPrepared:
  PreparedClaim existing;
  // kRetryableError only because the clique is not known yet: deciding again once it is known
  // may succeed, so the module may wait for it (within the prepare deadline).
  bool waits_for_clique = false;

  bool ok() const { return outcome == PrepareOutcome::kPrepare || outcome == PrepareOutcome::kAlreadyPrepared; }
};

// This driver's members of a claim record (PreparedClaim::driver_data): "domainUID" (always
// written, as every release has) and "channels" (IMEX channels in the spec; written only when
// not 1, absent in older files).
void SetChannelClaimFields(PreparedClaim& entry, const std::string& domain_uid, uint32_t channels);
std::string DomainUidOf(const PreparedClaim& entry);
// 1 when absent; 0 when present but not an integer in 1..65536 (a spec cannot be made from it).
uint32_t ChannelsOf(const PreparedClaim& entry);

// The checkpoint short-cut alone (step 0), so the module can answer a repeated Prepare without
// fetching the claim: set when `claim_uid` is PrepareCompleted.
std::optional<PreparedClaim> CompletedPrepare(const Checkpoint& checkpoint, std::string_view claim_uid);

// The decision. `lookup` is called at most once, and only when steps 0–5 passed.
PrepareDecision DecidePrepare(const nlohmann::json& claim, std::string_view expected_uid, const PrepareContext& context,
                              const DomainLookupFn& lookup);

struct UnprepareDecision {
  bool known = false;      // false: nothing of ours to clean up; answer success (idempotent)
  PreparedClaim existing;  // known: delete its CDI spec, then drop the checkpoint entry
};
UnprepareDecision DecideUnprepare(const Checkpoint& checkpoint, std::string_view claim_uid);

}  // namespace gns::dra
