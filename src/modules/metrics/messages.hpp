#pragma once
// Bus messages of the metrics module.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace gns::metrics {

// Where the HTTP endpoints are served (retained): tests and tools find the port here.
struct MetricsEndpoint {
  static constexpr std::string_view kTopic = "metrics.endpoint";
  static constexpr bool kRetained = true;
  std::string address;        // "127.0.0.1:9464": /metrics, /healthz, /readyz
  std::string debug_address;  // where /debug/state is served ("" nowhere): loopback only
  std::string gpu_metrics_address = {};  // gpuMetrics.listen's own /metrics ("" none)
};

inline void to_json(nlohmann::json& j, const MetricsEndpoint& m) {
  j = nlohmann::json{{"address", m.address}, {"debugAddress", m.debug_address}, {"gpuMetricsAddress", m.gpu_metrics_address}};
}

}  // namespace gns::metrics
