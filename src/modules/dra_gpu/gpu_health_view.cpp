// gpu-health's verdicts as Kubernetes sees them (taints, health stream).
#include "modules/dra_gpu/gpu_health_view.hpp"

#include <cctype>
#include <ctime>

namespace gns::dra_gpu {

namespace {

constexpr std::size_t kMaxLabelValue = 63;

bool Alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool LabelChar(char c) { return Alnum(c) || c == '-' || c == '_' || c == '.'; }

// What a verdict without a named cause (xid, sxid, check: a reset in progress, a failed reset)
// is about: its reason, up to a colon.
std::string_view ReasonHead(std::string_view reason) {
  const auto colon = reason.find(':');
  return colon == std::string_view::npos ? reason : reason.substr(0, colon);
}

}  // namespace

std::string_view TaintEffectName(TaintEffect effect) {
  return effect == TaintEffect::kNoExecute ? "NoExecute" : "NoSchedule";
}

std::string_view HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kHealthy:
      return "Healthy";
    case HealthStatus::kUnhealthy:
      return "Unhealthy";
    case HealthStatus::kUnknown:
      break;
  }
  return "Unknown";
}

std::string LabelValue(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (LabelChar(c)) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  if (out.size() > kMaxLabelValue) out.resize(kMaxLabelValue);
  while (!out.empty() && !Alnum(out.back())) out.pop_back();
  std::size_t first = 0;
  while (first < out.size() && !Alnum(out[first])) ++first;
  return out.substr(first);
}

std::string Rfc3339(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[32];
  const std::size_t n = std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buffer, n);
}

bool GpuHealthView::JudgeSeen(int64_t now_unix_ms) {
  if (JudgeKnown()) return false;
  judge_since_unix_ms_ = now_unix_ms > 0 ? now_unix_ms : 1;
  return true;
}

bool GpuHealthView::OnVerdict(const gpu_health::DeviceHealth& verdict) {
  const std::string key = verdict.RetainKey();
  const GpuHealth before = OfKey(key);
  verdicts_.insert_or_assign(key, verdict);
  return OfKey(key) != before;
}

GpuHealth GpuHealthView::Of(const std::string& uuid) const {
  return OfKey(gpu_health::DeviceHealth::KeyOf(uuid, gpu_health::kWholeGpu));
}

GpuHealth GpuHealthView::OfMig(const std::string& parent_uuid, uint32_t gpu_instance) const {
  GpuHealth whole = Of(parent_uuid);
  if (whole.status == HealthStatus::kUnhealthy) return whole;
  const auto it = verdicts_.find(gpu_health::DeviceHealth::KeyOf(parent_uuid, gpu_instance));
  if (it == verdicts_.end()) return whole;
  GpuHealth own = OfKey(it->first);
  // A GPU instance's healthy verdict says nothing the whole GPU's health does not (Unknown
  // without a judge stays Unknown).
  return own.status == HealthStatus::kUnhealthy ? own : whole;
}

GpuHealth GpuHealthView::OfKey(const std::string& key) const {
  GpuHealth out;
  const auto it = verdicts_.find(key);
  if (it == verdicts_.end()) {
    // No verdict: gpu-health says nothing of a GPU it never found unhealthy. That means Healthy
    // only while gpu-health runs; without it nobody watches the GPU.
    if (JudgeKnown()) {
      out.status = HealthStatus::kHealthy;
      out.since_unix_ms = judge_since_unix_ms_;
    }
    return out;
  }
  const gpu_health::DeviceHealth& verdict = it->second;
  out.since_unix_ms = verdict.since_unix_ms;
  out.message = verdict.reason;
  if (verdict.healthy) {
    out.status = HealthStatus::kHealthy;
    return out;
  }
  out.status = HealthStatus::kUnhealthy;
  // The cause as gpu-health names it on the verdict (one judge): never read back from prose.
  if (verdict.xid != 0) {
    out.taint_key = std::string(kTaintKeyXid);
    out.taint_value = std::to_string(verdict.xid);
  } else if (verdict.sxid != 0) {
    out.taint_key = std::string(kTaintKeySxid);
    out.taint_value = std::to_string(verdict.sxid);
  } else if (verdict.check == kGpuLostCheck) {
    out.taint_key = std::string(kTaintKeyGpuLost);
    out.taint_value = std::string(kGpuLostCheck);
  } else {
    out.taint_key = std::string(kTaintKeyUnhealthy);
    out.taint_value = LabelValue(verdict.check.empty() ? ReasonHead(verdict.reason) : verdict.check);
  }
  return out;
}

nlohmann::json UnmonitoredTaint(int64_t since_unix_ms) {
  return nlohmann::json{{"key", kTaintKeyUnmonitored}, {"effect", "None"}, {"timeAdded", Rfc3339(since_unix_ms)}};
}

nlohmann::json TaintsFor(const GpuHealth& health, TaintEffect effect) {
  nlohmann::json taints = nlohmann::json::array();
  if (health.status != HealthStatus::kUnhealthy) return taints;
  nlohmann::json taint{{"key", health.taint_key}, {"effect", TaintEffectName(effect)}};
  if (!health.taint_value.empty()) taint["value"] = health.taint_value;
  if (health.since_unix_ms > 0) taint["timeAdded"] = Rfc3339(health.since_unix_ms);
  taints.push_back(std::move(taint));
  return taints;
}

}  // namespace gns::dra_gpu
