// XID 154's recovery action (see recovery_action.hpp).
#include "modules/gpu_health/recovery_action.hpp"

#include "modules/gpu_health/kernel_line_parser.hpp"

#include <array>
#include <cctype>

namespace gns::gpu_health {
namespace {

struct KnownAction {
  uint32_t code;
  std::string_view name;
  RecommendedAction action;
};

// Codes and names as the driver prints them; a second name for a code is an older wording.
constexpr std::array<KnownAction, 7> kKnown{{
    {0x0, "None", RecommendedAction::kNone},
    {0x1, "GPU Reset Required", RecommendedAction::kComponentReset},
    {0x2, "Node Reboot Required", RecommendedAction::kRestartBm},
    {0x3, "Drain P2P", RecommendedAction::kComponentReset},
    {0x4, "Drain and Reset", RecommendedAction::kComponentReset},
    {0x1, "PF FLR", RecommendedAction::kComponentReset},
    {0x2, "OS Reboot", RecommendedAction::kRestartBm},
}};

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '.' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

// "0x4" (or "4") at the start of `s`; advances past it.
std::optional<uint32_t> ReadCode(std::string_view& s) {
  std::size_t i = 0;
  if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) i = 2;
  const std::size_t digits_at = i;
  uint64_t value = 0;
  while (i < s.size() && std::isxdigit(static_cast<unsigned char>(s[i])) && i - digits_at < 8) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    value = value * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    ++i;
  }
  if (i == digits_at) return std::nullopt;
  s.remove_prefix(i);
  return static_cast<uint32_t>(value);
}

}  // namespace

std::string_view DriverRecoveryActionName(uint32_t code) noexcept {
  for (const auto& k : kKnown) {
    if (k.code == code) return k.name;  // the first name listed is the current wording
  }
  return {};
}

std::optional<RecoveryActionChange> ParseRecoveryActionChange(std::string_view detail) {
  // The new action follows the last " to ": "changed from 0x0 (None) to 0x4 (Drain and Reset)".
  const std::size_t to = detail.rfind(" to ");
  if (to == std::string_view::npos) return std::nullopt;
  std::string_view rest = Trim(detail.substr(to + 4));
  RecoveryActionChange change;
  change.code = ReadCode(rest);
  rest = Trim(rest);
  if (!rest.empty() && rest.front() == '(') {
    const std::size_t close = rest.find(')');
    const std::string_view name = Trim(rest.substr(1, close == std::string_view::npos ? rest.size() - 1 : close - 1));
    change.name = SanitizedText(name, 64);
  }
  if (!change.code && change.name.empty()) return std::nullopt;
  if (change.code) {
    for (const auto& k : kKnown) {
      if (k.code == *change.code) {
        change.action = k.action;
        return change;
      }
    }
  } else {
    for (const auto& k : kKnown) {
      if (EqualsIgnoringCase(k.name, change.name)) {
        change.action = k.action;
        change.code = k.code;
        return change;
      }
    }
  }
  // A recovery action this build does not know: the driver says the GPU needs something.
  change.known = false;
  change.action = RecommendedAction::kContactSupport;
  return change;
}

}  // namespace gns::gpu_health
