// Known feature gates and their resolution.
#include "loop/feature_gates.hpp"

#include <stdexcept>

namespace gns {

namespace {
// Upstream shipped the gate as HostManagedIMEXDaemon; the design (seed 000) calls it
// HostManagedIMEX. Both spellings are accepted and mean the same gate.
constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
    {"HostManagedIMEXDaemon", gates::kHostManagedIMEX},
};
}  // namespace

const std::vector<FeatureGateSpec>& FeatureGates::Known() {
  static const std::vector<FeatureGateSpec> known = {
      {gates::kHostManagedIMEX, false,
       "IMEX runs as a host service (nvidia-imex.service); the driver injects channel 0 and "
       "launches no per-domain IMEX daemons (seed 000)."},
      {gates::kIMEXDaemonsWithDNSNames, true,
       "Driver-managed IMEX daemons address peers by DNS name (forced off by HostManagedIMEX)."},
      {gates::kComputeDomainCliques, true,
       "ComputeDomainClique objects track clique membership (forced off by HostManagedIMEX)."},
  };
  return known;
}

std::string_view FeatureGates::Canonical(std::string_view name) {
  for (const auto& spec : Known())
    if (spec.name == name) return spec.name;
  for (const auto& [alias, canonical] : kAliases)
    if (alias == name) return canonical;
  return {};
}

FeatureGates::FeatureGates() {
  for (const auto& spec : Known()) values_.emplace(std::string(spec.name), spec.default_value);
}

bool FeatureGates::Set(std::string_view name, bool value) {
  const auto canonical = Canonical(name);
  if (canonical.empty()) return false;
  values_.insert_or_assign(std::string(canonical), value);
  explicit_.insert_or_assign(std::string(canonical), value);
  return true;
}

bool FeatureGates::Enabled(std::string_view name) const {
  const auto canonical = Canonical(name);
  const auto it = values_.find(canonical);
  if (canonical.empty() || it == values_.end()) {
    throw std::logic_error("unknown feature gate " + std::string(name));
  }
  return it->second;
}

bool FeatureGates::ExplicitlySet(std::string_view name) const {
  return explicit_.count(Canonical(name)) != 0;
}

std::vector<std::string> FeatureGates::Resolve() {
  std::vector<std::string> forced;
  if (!Enabled(gates::kHostManagedIMEX)) return forced;
  for (auto gate : {gates::kIMEXDaemonsWithDNSNames, gates::kComputeDomainCliques}) {
    if (Enabled(gate)) {
      values_.insert_or_assign(std::string(gate), false);
      forced.push_back("HostManagedIMEX is enabled; forcing " + std::string(gate) + "=false");
    }
  }
  return forced;
}

std::string ParseFeatureGateList(std::string_view text, std::map<std::string, bool>& out) {
  while (!text.empty()) {
    const auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) return "feature gate \"" + std::string(item) + "\" must be NAME=true|false";
    const std::string name(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    if (FeatureGates::Canonical(name).empty()) return "unknown feature gate \"" + name + "\"";
    if (value == "true") out[name] = true;
    else if (value == "false") out[name] = false;
    else return "feature gate " + name + ": expected true or false, got \"" + std::string(value) + "\"";
  }
  return {};
}

}  // namespace gns
