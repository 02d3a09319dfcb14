#pragma once
// Install-wide feature gates: the known set with defaults, aliases, and the resolution rules
// that run before anything reads them (seed 000 §5: HostManagedIMEX forces the two gates it is
// incompatible with off, and the forced values are logged at startup).

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gns {

struct FeatureGateSpec {
  std::string_view name;
  bool default_value;
  std::string_view description;
};

namespace gates {
inline constexpr std::string_view kHostManagedIMEX = "HostManagedIMEX";
inline constexpr std::string_view kIMEXDaemonsWithDNSNames = "IMEXDaemonsWithDNSNames";
inline constexpr std::string_view kComputeDomainCliques = "ComputeDomainCliques";
}  // namespace gates

class FeatureGates {
 public:
  FeatureGates();

  static const std::vector<FeatureGateSpec>& Known();
  // Canonical name for `name` or an accepted alias; empty if unknown.
  static std::string_view Canonical(std::string_view name);

  // Sets a gate explicitly. Returns false if the name is unknown.
  bool Set(std::string_view name, bool value);
  // Reads a gate; an unknown name is a programming error and throws std::logic_error.
  bool Enabled(std::string_view name) const;
  bool ExplicitlySet(std::string_view name) const;

  // Applies cross-gate rules. Returns one line per forced change, for the startup log.
  std::vector<std::string> Resolve();

  const std::map<std::string, bool, std::less<>>& Values() const { return values_; }

 private:
  std::map<std::string, bool, std::less<>> values_;
  std::map<std::string, bool, std::less<>> explicit_;
};

// Parses "A=true,B=false" (flag syntax). Returns an error message, or empty on success.
std::string ParseFeatureGateList(std::string_view text, std::map<std::string, bool>& out);

}  // namespace gns
