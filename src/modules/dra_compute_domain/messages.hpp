#pragma once
// Bus messages of the `dra-compute-domain` module: its state (retained), shown in /debug/state.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::dra {

struct DraComputeDomainState {
  static constexpr std::string_view kTopic = "dra-compute-domain.state";
  static constexpr bool kRetained = true;
  struct Claim {
    std::string uid;
    std::string namespace_name;
    std::string name;
    std::string state;  // "PrepareStarted" | "PrepareCompleted"
    std::string domain_uid;
  };
  bool host_managed = false;
  bool registered = false;          // what NotifyRegistrationStatus said last
  std::string registration_error;   // the kubelet's error when it refused us
  uint32_t channel_major = 0;
  std::string clique_id;
  bool clique_known = false;            // gpu-inventory has read the fabric (else prepares wait)
  std::size_t waiting_for_clique = 0;   // prepares waiting for the clique to be known
  std::vector<Claim> prepared_claims;  // the checkpoint, by claim UID
  int64_t slice_generation = 0;     // 0 until the slice was published
  uint64_t slice_publishes = 0;
  std::string last_error;
};

inline void to_json(nlohmann::json& j, const DraComputeDomainState& s) {
  nlohmann::json claims = nlohmann::json::object();
  for (const auto& c : s.prepared_claims) {
    claims[c.uid] = {{"claim", c.namespace_name + "/" + c.name}, {"state", c.state}, {"domainUID", c.domain_uid}};
  }
  j = nlohmann::json{{"hostManagedIMEX", s.host_managed},
                     {"registered", s.registered},
                     {"registrationError", s.registration_error},
                     {"channelMajor", s.channel_major},
                     {"cliqueID", s.clique_id},
                     {"cliqueKnown", s.clique_known},
                     {"waitingForClique", s.waiting_for_clique},
                     {"preparedClaims", std::move(claims)},
                     {"sliceGeneration", s.slice_generation},
                     {"slicePublishes", s.slice_publishes},
                     {"lastError", s.last_error}};
}

}  // namespace gns::dra
