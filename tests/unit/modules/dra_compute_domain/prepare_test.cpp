// The HostManagedIMEX prepare decision as a table: every seed 000 §14.1 kubelet-side item and
// every §13 row the driver owns, plus a fault at each §7.2 step (and proof that later steps,
// such as the ComputeDomain lookup, are not reached after an earlier failure).
#include "modules/dra_compute_domain/prepare.hpp"

#include <gtest/gtest.h>

#include <functional>

namespace gns::dra {
namespace {

using nlohmann::json;

constexpr const char* kClaimUid = "c1a1b2c3-0000-4000-8000-000000000001";
constexpr const char* kOtherUid = "c1a1b2c3-0000-4000-8000-000000000002";
constexpr const char* kDomainUid = "d0d0d0d0-0000-4000-8000-00000000cd01";
constexpr const char* kNode = "gb200-node-07";
constexpr const char* kClique = "7f3e2c1a-5b4d-4c6e-8f9a-0b1c2d3e4f50.32766";

json ChannelParams(json allocation_mode = "Single") {
  json params{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "ComputeDomainChannelConfig"},
              {"domainID", kDomainUid}};
  if (!allocation_mode.is_null()) params["allocationMode"] = std::move(allocation_mode);
  return params;
}

// A channel claim as the controller's ResourceClaimTemplate produces it, allocated on kNode.
json GoodClaim() {
  return json{
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "train-a-pod-0-imex-x7k2p"}, {"namespace", "team-a"}, {"uid", kClaimUid}}},
      {"spec",
       {{"devices",
         {{"requests", json::array({{{"name", "channel"},
                                     {"exactly", {{"deviceClassName", "compute-domain-default-channel.nvidia.com"}}}}})}}}}},
      {"status",
       {{"allocation",
         {{"devices",
           {{"results", json::array({{{"request", "channel"},
                                      {"driver", "compute-domain.nvidia.com"},
                                      {"pool", kNode},
                                      {"device", "channel-0"}}})},
            {"config", json::array({{{"source", "FromClaim"},
                                     {"requests", json::array({"channel"})},
                                     {"opaque", {{"driver", "compute-domain.nvidia.com"},
                                                 {"parameters", ChannelParams()}}}}})}}},
          {"nodeSelector", {{"nodeSelectorTerms", json::array()}}}}}}}};
}

PreparedClaim CompletedEntry(const std::string& uid, const std::string& name) {
  PreparedClaim entry;
  entry.uid = uid;
  entry.namespace_name = "team-b";
  entry.name = name;
  entry.state = ClaimState::kPrepareCompleted;
  SetChannelClaimFields(entry, "other-domain", 1);
  entry.device = "channel-0";
  entry.pool_name = kNode;
  entry.request_names = {"channel"};
  entry.cdi_spec_file = "k8s.compute-domain.nvidia.com-claim_" + uid + ".json";
  entry.cdi_device_id = "k8s.compute-domain.nvidia.com/claim=" + uid + "-channel-0";
  entry.started_unix_ms = 1;
  entry.completed_unix_ms = 2;
  return entry;
}

struct Case {
  const char* name;
  std::function<void(json& claim)> edit_claim = [](json&) {};
  std::function<void(PrepareContext& context, Checkpoint& checkpoint)> edit_context = [](PrepareContext&, Checkpoint&) {};
  DomainLookup lookup = DomainLookup::Found({kDomainUid, "team-a", "train-a"});
  PrepareOutcome outcome = PrepareOutcome::kPrepare;
  std::string error_contains = {};  // for the error outcomes
  bool lookup_called = true;
};

json& Results(json& claim) { return claim["status"]["allocation"]["devices"]["results"]; }
json& Configs(json& claim) { return claim["status"]["allocation"]["devices"]["config"]; }
json& ClaimParams(json& claim) { return Configs(claim)[0]["opaque"]["parameters"]; }

class PrepareDecisionTest : public ::testing::TestWithParam<Case> {};

TEST_P(PrepareDecisionTest, Decides) {
  const Case& c = GetParam();
  json claim = GoodClaim();
  c.edit_claim(claim);
  Checkpoint checkpoint;
  PrepareContext context{kNode, kClique, true, &checkpoint};
  c.edit_context(context, checkpoint);
  int lookups = 0;
  std::string looked_up;
  const PrepareDecision decision = DecidePrepare(claim, kClaimUid, context, [&](std::string_view uid) {
    ++lookups;
    looked_up = uid;
    return c.lookup;
  });
  EXPECT_EQ(ToString(decision.outcome), ToString(c.outcome)) << decision.error;
  EXPECT_EQ(lookups, c.lookup_called ? 1 : 0) << "the ComputeDomain lookup is step 6";
  if (c.lookup_called) {
    EXPECT_EQ(looked_up, kDomainUid);
  }
  if (!c.error_contains.empty()) {
    EXPECT_NE(decision.error.find(c.error_contains), std::string::npos) << decision.error;
  }
  if (c.outcome == PrepareOutcome::kPermanentError || c.outcome == PrepareOutcome::kRetryableError) {
    EXPECT_FALSE(decision.ok());
    EXPECT_EQ(decision.error.rfind("ResourceClaim ", 0), 0u) << "names the claim first: " << decision.error;
  }
  if (c.outcome == PrepareOutcome::kPrepare) {
    EXPECT_EQ(decision.domain_uid, kDomainUid);
    EXPECT_EQ(decision.device_name, "channel-0");
    EXPECT_EQ(decision.pool_name, kNode);
    EXPECT_EQ(decision.request_names, std::vector<std::string>{"channel"});
    EXPECT_EQ(decision.claim_namespace, "team-a");
    EXPECT_EQ(decision.claim_name, "train-a-pod-0-imex-x7k2p");
  }
}

const Case kCases[] = {
    // --- accepted ---
    {.name = "SingleIsPrepared"},
    {.name = "EmptyAllocationModeIsPrepared", .edit_claim = [](json& c) { ClaimParams(c)["allocationMode"] = ""; }},
    {.name = "AbsentAllocationModeIsPrepared", .edit_claim = [](json& c) { ClaimParams(c).erase("allocationMode"); }},
    // §14.1 "channel prepare skips AssertComputeDomainReady": the lookup result carries no
    // readiness, so no row here could fail; DraModuleTest.AComputeDomainThatIsNotReadyStillPrepares
    // shows it with a NotReady domain in the API.
    // §13 "Nonzero numNodes: silently ignored": nothing the kubelet side reads depends on it, and
    // unknown opaque fields do not fail the decode.
    {.name = "ExtraOpaqueFieldsAreIgnored", .edit_claim = [](json& c) { ClaimParams(c)["numNodes"] = 4; }},
    {.name = "ConfigFromTheClassApplies",
     .edit_claim = [](json& c) { Configs(c)[0]["source"] = "FromClass"; Configs(c)[0].erase("requests"); }},
    // A crashed earlier attempt of the same claim (PrepareStarted) is redone, not a conflict.
    {.name = "OwnStartedEntryIsRedone",
     .edit_context =
         [](PrepareContext&, Checkpoint& cp) {
           PreparedClaim own = CompletedEntry(kClaimUid, "train-a-pod-0-imex-x7k2p");
           own.state = ClaimState::kPrepareStarted;
           cp.claims[kClaimUid] = own;
         }},
    // Another claim's PrepareStarted entry holds nothing yet (upstream checks completed ones).
    {.name = "OtherStartedEntryIsNoConflict",
     .edit_context =
         [](PrepareContext&, Checkpoint& cp) {
           PreparedClaim other = CompletedEntry(kOtherUid, "other");
           other.state = ClaimState::kPrepareStarted;
           cp.claims[kOtherUid] = other;
         }},
    {.name = "OtherDriversResultsAreIgnored",
     .edit_claim =
         [](json& c) {
           Results(c).push_back({{"request", "gpu"}, {"driver", "gpu.nvidia.com"}, {"pool", kNode}, {"device", "gpu-0"}});
         }},

    // --- step 0: identity and the gate ---
    {.name = "UidMismatchIsPermanent",
     .edit_claim = [](json& c) { c["metadata"]["uid"] = "recreated-uid"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "metadata.uid is \"recreated-uid\", the kubelet asked for \"" + std::string(kClaimUid) + "\"",
     .lookup_called = false},
    {.name = "NotAnObjectIsPermanent",
     .edit_claim = [](json& c) { c = json::array(); },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "expected a ResourceClaim object",
     .lookup_called = false},
    // --- the gate off: driver-managed IMEX (issue #16) ---
    {.name = "GateOffPreparesSingle",
     .edit_context = [](PrepareContext& ctx, Checkpoint&) { ctx.host_managed = false; }},
    {.name = "GateOffPreparesAll",
     .edit_claim = [](json& c) { ClaimParams(c)["allocationMode"] = "All"; },
     .edit_context = [](PrepareContext& ctx, Checkpoint&) { ctx.host_managed = false; }},
    {.name = "GateOffClaimsOfOneDomainShareTheChannels",
     .edit_context =
         [](PrepareContext& ctx, Checkpoint& cp) {
           ctx.host_managed = false;
           cp.claims[kOtherUid] = CompletedEntry(kOtherUid, "job-b");
           SetChannelClaimFields(cp.claims[kOtherUid], kDomainUid, 1);
         }},
    {.name = "GateOffAnotherDomainsClaimHoldingTheChannelsIsRetryable",
     .edit_context =
         [](PrepareContext& ctx, Checkpoint& cp) {
           ctx.host_managed = false;
           cp.claims[kOtherUid] = CompletedEntry(kOtherUid, "job-b");
         },
     .outcome = PrepareOutcome::kRetryableError,
     .error_contains = "requested device channel-0 is already prepared for claim team-b/job-b",
     .lookup_called = false},
    {.name = "GateOffUnknownModeIsRejected",
     .edit_claim = [](json& c) { ClaimParams(c)["allocationMode"] = "Some"; },
     .edit_context = [](PrepareContext& ctx, Checkpoint&) { ctx.host_managed = false; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "allocationMode: \"Some\" is not supported (only \"Single\", \"All\" or empty)",
     .lookup_called = false},

    // --- step 1: opaque config ---
    {.name = "NotAllocatedIsPermanent",
     .edit_claim = [](json& c) { c["status"].erase("allocation"); },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "status.allocation is not set",
     .lookup_called = false},
    {.name = "BadOpaqueConfigIsPermanent",
     .edit_claim = [](json& c) { ClaimParams(c)["apiVersion"] = "resource.nvidia.com/v1alpha1"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "invalid opaque config: status.allocation.devices.config[0].opaque.parameters.apiVersion",
     .lookup_called = false},
    // §14.1 "daemon prepare returns permanent error under the gate"; §13 "Daemon claim reaches Prepare".
    {.name = "DaemonConfigIsDisabled",
     .edit_claim =
         [](json& c) {
           ClaimParams(c) = {{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "ComputeDomainDaemonConfig"},
                        {"domainID", kDomainUid}};
           Results(c)[0]["device"] = "daemon-0";
         },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "daemon claims are disabled under HostManagedIMEX",
     .lookup_called = false},
    {.name = "NoConfigForTheRequestIsPermanent",
     .edit_claim = [](json& c) { Configs(c) = json::array(); },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "no ComputeDomainChannelConfig for driver compute-domain.nvidia.com applies to request \"channel\"",
     .lookup_called = false},
    {.name = "ConfigForAnotherRequestDoesNotApply",
     .edit_claim = [](json& c) { Configs(c)[0]["requests"] = json::array({"other"}); },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "applies to request \"channel\"",
     .lookup_called = false},

    // --- step 2: exactly one result ---
    {.name = "NoResultOfOursIsPermanent",
     .edit_claim = [](json& c) { Results(c)[0]["driver"] = "gpu.nvidia.com"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "expected exactly 1 allocation result for driver compute-domain.nvidia.com, got 0",
     .lookup_called = false},
    {.name = "TwoResultsArePermanent",
     .edit_claim = [](json& c) { Results(c).push_back(Results(c)[0]); },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "got 2",
     .lookup_called = false},
    {.name = "AnotherChannelIsPermanent",
     .edit_claim = [](json& c) { Results(c)[0]["device"] = "channel-5"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "status.allocation.devices.results[0].device: channel-5 cannot be prepared under HostManagedIMEX",
     .lookup_called = false},
    {.name = "AnotherNodesPoolIsPermanent",
     .edit_claim = [](json& c) { Results(c)[0]["pool"] = "gb200-node-08"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "pool: gb200-node-08 is not this node's pool (gb200-node-07)",
     .lookup_called = false},
    {.name = "ResultsNotAnArrayIsPermanent",
     .edit_claim = [](json& c) { Results(c) = "x"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "status.allocation.devices.results: expected an array",
     .lookup_called = false},

    // --- step 3: the allocationMode allowlist (§14.1, §13 rows "All" and unknown) ---
    {.name = "AllIsRejected",
     .edit_claim = [](json& c) { ClaimParams(c)["allocationMode"] = "All"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "allocationMode: \"All\" is not supported under HostManagedIMEX (only \"Single\" or empty)",
     .lookup_called = false},
    {.name = "UnknownModeIsRejected",
     .edit_claim = [](json& c) { ClaimParams(c)["allocationMode"] = "foo"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "allocationMode: \"foo\" is not supported",
     .lookup_called = false},
    {.name = "ModeIsCaseSensitive",
     .edit_claim = [](json& c) { ClaimParams(c)["allocationMode"] = "single"; },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "\"single\"",
     .lookup_called = false},

    // --- step 5: node-local channel conflict (§13 "Two channel claims on one node") ---
    {.name = "ChannelHeldByAnotherClaimIsRetryable",
     .edit_context = [](PrepareContext&, Checkpoint& cp) { cp.claims[kOtherUid] = CompletedEntry(kOtherUid, "job-b"); },
     .outcome = PrepareOutcome::kRetryableError,
     .error_contains = "requested device channel-0 is already prepared for claim team-b/job-b (uid " +
                       std::string(kOtherUid) + ")",
     .lookup_called = false},

    // --- step 6: the ComputeDomain ---
    {.name = "MissingComputeDomainIsPermanent",
     .lookup = DomainLookup::NotFound(),
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "ComputeDomain with UID " + std::string(kDomainUid) + " not found"},
    {.name = "ComputeDomainInAnotherNamespaceIsPermanent",
     .lookup = DomainLookup::Found({kDomainUid, "team-b", "train-a"}),
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "ComputeDomain team-b/train-a (UID " + std::string(kDomainUid) +
                       ") is not in the claim's namespace team-a"},
    {.name = "LookupFailureIsRetryable",
     .lookup = DomainLookup::Error("apiserver unavailable"),
     .outcome = PrepareOutcome::kRetryableError,
     .error_contains = "cannot look up ComputeDomain with UID " + std::string(kDomainUid) + ": apiserver unavailable"},

    // --- step 7: the clique (§14.1, §13 "Empty local clique ID at Prepare") ---
    {.name = "NoCliqueIsPermanent",
     .edit_context = [](PrepareContext& ctx, Checkpoint&) { ctx.clique_id.clear(); },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "host-managed IMEX requires an NVLink clique on this node; NVML reports none"},
    {.name = "NoCliqueNamesTheReason",
     .edit_context =
         [](PrepareContext& ctx, Checkpoint&) {
           ctx.clique_id.clear();
           ctx.clique_reason = "no multi-node NVLink";
         },
     .outcome = PrepareOutcome::kPermanentError,
     .error_contains = "NVML reports none (no multi-node NVLink)"},
    {.name = "CliqueNotKnownYetIsRetryable",
     .edit_context =
         [](PrepareContext& ctx, Checkpoint&) {
           ctx.clique_id.clear();
           ctx.clique_known = false;
           ctx.clique_reason = "NVML unavailable: opening";
         },
     .outcome = PrepareOutcome::kRetryableError,
     .error_contains = "the node's NVLink clique is not known yet (gpu-inventory has not read NVML's fabric info); "
                       "retry (NVML unavailable: opening)"},
};

INSTANTIATE_TEST_SUITE_P(HostManagedImex, PrepareDecisionTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(PrepareTest, CompletedClaimIsIdempotentWithoutLookingAtTheClaim) {
  Checkpoint checkpoint;
  const PreparedClaim entry = CompletedEntry(kClaimUid, "train-a-pod-0-imex-x7k2p");
  checkpoint.claims[kClaimUid] = entry;
  PrepareContext context{kNode, "", true, &checkpoint};  // even without a clique now
  int lookups = 0;
  const auto lookup = [&](std::string_view) {
    ++lookups;
    return DomainLookup::NotFound();
  };
  for (const json& claim : {GoodClaim(), json(nullptr)}) {
    const PrepareDecision decision = DecidePrepare(claim, kClaimUid, context, lookup);
    ASSERT_EQ(decision.outcome, PrepareOutcome::kAlreadyPrepared) << decision.error;
    EXPECT_TRUE(decision.ok());
    EXPECT_EQ(decision.existing, entry);
  }
  EXPECT_EQ(lookups, 0);
  ASSERT_TRUE(CompletedPrepare(checkpoint, kClaimUid));
  EXPECT_FALSE(CompletedPrepare(checkpoint, kOtherUid));
}

TEST(PrepareTest, ConflictIsCheckedBeforeTheComputeDomain) {
  // §7.2 order: step 5 (checkpoint) comes before step 6 (lookup) and step 7 (clique).
  Checkpoint checkpoint;
  checkpoint.claims[kOtherUid] = CompletedEntry(kOtherUid, "job-b");
  PrepareContext context{kNode, "", true, &checkpoint};
  const auto decision = DecidePrepare(GoodClaim(), kClaimUid, context, [](std::string_view) { return DomainLookup::NotFound(); });
  EXPECT_EQ(decision.outcome, PrepareOutcome::kRetryableError) << decision.error;
}

TEST(PrepareTest, NoLookupFunctionIsRetryableNotACrash) {
  Checkpoint checkpoint;
  PrepareContext context{kNode, kClique, true, &checkpoint};
  EXPECT_EQ(DecidePrepare(GoodClaim(), kClaimUid, context, nullptr).outcome, PrepareOutcome::kRetryableError);
  context.checkpoint = nullptr;  // reads as empty
  EXPECT_EQ(DecidePrepare(GoodClaim(), kClaimUid, context, [](std::string_view) {
              return DomainLookup::Found({kDomainUid, "team-a", "train-a"});
            }).outcome,
            PrepareOutcome::kPrepare);
}

// §14.1 "unprepare skips RemoveNodeLabel and still removes CDI/checkpoint state".
TEST(UnprepareTest, KnownClaimsAreCleanedUpUnknownOnesAreIdempotent) {
  Checkpoint checkpoint;
  checkpoint.claims[kClaimUid] = CompletedEntry(kClaimUid, "a");
  PreparedClaim started = CompletedEntry(kOtherUid, "b");
  started.state = ClaimState::kPrepareStarted;
  checkpoint.claims[kOtherUid] = started;

  const auto known = DecideUnprepare(checkpoint, kClaimUid);
  EXPECT_TRUE(known.known);
  EXPECT_EQ(known.existing.cdi_spec_file, "k8s.compute-domain.nvidia.com-claim_" + std::string(kClaimUid) + ".json");
  EXPECT_TRUE(DecideUnprepare(checkpoint, kOtherUid).known) << "a half-prepared claim is cleaned up too";
  EXPECT_FALSE(DecideUnprepare(checkpoint, "never-seen").known);
  EXPECT_FALSE(DecideUnprepare(Checkpoint{}, kClaimUid).known);
}

}  // namespace
}  // namespace gns::dra
