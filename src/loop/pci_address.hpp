// One PCI address type for every module: NVML's "00000000:3B:00.0", sysfs's "0000:3b:00.0",
// the kernel's Xid-line "0000:3b:00" and lspci's "3b:00.0" all name the same device, compared
// numerically, never as text. Plain value, no dependencies (the kernel-line parser's fuzz target
// builds it alone).
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gns {

struct PciAddress {
  uint32_t domain = 0;
  uint8_t bus = 0;
  uint8_t device = 0;
  uint8_t function = 0;
  // Whether the text it was read from named the function (Xid lines never do; a GPU is
  // function 0 anyway).
  bool has_function = false;

  // Domain, bus, device and function; has_function is how it was written, not which device.
  friend bool operator==(const PciAddress& a, const PciAddress& b) noexcept {
    return a.domain == b.domain && a.bus == b.bus && a.device == b.device && a.function == b.function;
  }
  friend std::strong_ordering operator<=>(const PciAddress& a, const PciAddress& b) noexcept {
    if (auto c = a.domain <=> b.domain; c != 0) return c;
    if (auto c = a.bus <=> b.bus; c != 0) return c;
    if (auto c = a.device <=> b.device; c != 0) return c;
    return a.function <=> b.function;
  }

  // True when domain, bus and device match, whatever the function.
  [[nodiscard]] bool SameDevice(const PciAddress& other) const noexcept { return DeviceKey() == other.DeviceKey(); }
  // (domain, bus, device) packed into one integer, for maps keyed by GPU.
  [[nodiscard]] uint64_t DeviceKey() const noexcept {
    return (static_cast<uint64_t>(domain) << 16) | (static_cast<uint64_t>(bus) << 8) | device;
  }
  // "0000:3b:00.0": the kernel's sysfs form (domain at least 4 digits).
  [[nodiscard]] std::string ToString() const;
  // "0000:3b:00": the form Xid lines use and NVSentinel reports as the PCI entity. Formatted
  // by hand, without snprintf: gpu-health formats the address of every Xid line it reports.
  [[nodiscard]] std::string DeviceString() const;

  // Reads a whole string: "DDDD:BB:DD.F" (domain 1–8 hex digits), "DDDD:BB:DD" (no function),
  // "BB:DD.F" and "BB:DD" (domain 0); hex, any case. nullopt for anything else.
  [[nodiscard]] static std::optional<PciAddress> Parse(std::string_view text) noexcept;
};

// PciAddress::Parse, as a free function.
[[nodiscard]] inline std::optional<PciAddress> ParsePciAddress(std::string_view text) noexcept {
  return PciAddress::Parse(text);
}

}  // namespace gns
