// The line commands of gns-sim-kubelet's control socket (see README.md here), kept apart from the
// socket so tests can drive them in process. One command line in, one JSON object out.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "kubelet_sim.h"

namespace gns::sim {

// Runs one command ("state", "restart", "allocate nvidia.com/gpu GPU-a,GPU-b", ...) and returns
// its reply as one line of JSON (no newline): {"ok":true,...} or {"ok":false,"error":"..."}.
std::string HandleKubeletCommand(KubeletSim& sim, std::string_view line);

// The whole simulator state as the `state` command shows it.
nlohmann::json KubeletStateToJson(const KubeletState& state);

}  // namespace gns::sim
