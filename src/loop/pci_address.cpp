// One PCI address type (see pci_address.hpp).
#include "loop/pci_address.hpp"

namespace gns {
namespace {

constexpr char kDigits[] = "0123456789abcdef";

// A whole field of 1..max_digits hex digits (any case), at most max_value.
bool HexField(std::string_view text, std::size_t max_digits, uint32_t max_value, uint32_t& out) noexcept {
  if (text.empty() || text.size() > max_digits) return false;
  uint32_t value = 0;
  for (const char c : text) {
    uint32_t digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      digit = static_cast<uint32_t>(c - 'A' + 10);
    } else {
      return false;
    }
    value = value * 16 + digit;
  }
  if (value > max_value) return false;
  out = value;
  return true;
}

std::size_t FormatDevice(const PciAddress& p, char* buf) {
  std::size_t n = 0;
  int digits = 8;
  while (digits > 4 && ((p.domain >> ((digits - 1) * 4)) & 0xF) == 0) --digits;
  for (int d = digits - 1; d >= 0; --d) buf[n++] = kDigits[(p.domain >> (d * 4)) & 0xF];
  buf[n++] = ':';
  buf[n++] = kDigits[p.bus >> 4];
  buf[n++] = kDigits[p.bus & 0xF];
  buf[n++] = ':';
  buf[n++] = kDigits[p.device >> 4];
  buf[n++] = kDigits[p.device & 0xF];
  return n;
}

}  // namespace

std::string PciAddress::DeviceString() const {
  char buf[16];  // at most 14 characters: the string stays inline (no allocation)
  return std::string(buf, FormatDevice(*this, buf));
}

std::string PciAddress::ToString() const {
  char buf[24];
  std::size_t n = FormatDevice(*this, buf);
  buf[n++] = '.';
  buf[n++] = kDigits[function & 0x7];
  return std::string(buf, n);
}

std::optional<PciAddress> PciAddress::Parse(std::string_view text) noexcept {
  // Split on ':' into 2 (bus:device[.function]) or 3 (domain:bus:device[.function]) fields.
  std::string_view fields[3];
  std::size_t count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t colon = text.find(':', start);
    if (count == 3) return std::nullopt;
    fields[count++] = text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start);
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (count < 2) return std::nullopt;
  PciAddress address;
  uint32_t value = 0;
  std::size_t i = 0;
  if (count == 3) {
    if (!HexField(fields[i++], 8, 0xFFFFFFFFu, value)) return std::nullopt;
    address.domain = value;
  }
  if (!HexField(fields[i++], 2, 0xFFu, value)) return std::nullopt;
  address.bus = static_cast<uint8_t>(value);
  std::string_view device = fields[i];
  if (const std::size_t dot = device.find('.'); dot != std::string_view::npos) {
    if (!HexField(device.substr(dot + 1), 1, 7u, value)) return std::nullopt;
    address.function = static_cast<uint8_t>(value);
    address.has_function = true;
    device = device.substr(0, dot);
  }
  if (!HexField(device, 2, 0x1Fu, value)) return std::nullopt;
  address.device = static_cast<uint8_t>(value);
  return address;
}

}  // namespace gns
